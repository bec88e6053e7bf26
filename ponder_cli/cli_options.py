"""The option groups and argument parsing that the `ponder` commands share (Typer objects only:
choices come from the registry, defaults from the config)."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from . import BadValue
from .config import parse_duration
from .folders import DEFAULT, LATEST, RUNS_DIR, SHIPPED
from .registry import (DEVICE_CHOICES, HALTING_RULES, PIECES, PROTOCOLS, device_problem, known, parse_exit_rule,
                       parse_halting_rule, rule_choices)
from .render import OutputFormat


def _choices(name: str, values) -> type[Enum]:
    return Enum(name, {value: value for value in values}, type=str)


Protocol = _choices("Protocol", PROTOCOLS)


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _is_count_range(token: str) -> bool:
    return re.fullmatch(r"\d+(-\d+)?", token) is not None


def _is_spec(token: str) -> bool:
    """A --buckets value as the list expands it: a number or a range LO-HI (a task spelling its
    buckets otherwise takes one value per flag)."""
    return _is_number(token) or _is_count_range(token)


def _is_rule(token: str) -> bool:
    """A --halting spelling (median, quantile:0.9, ...), checked in full later."""
    return token.partition(":")[0].strip().lower() in HALTING_RULES


def expand_angles(args: list[str], name: str = "--angles", is_value=_is_number, what: str = "angle") -> list[str]:
    """`--angles 22.5 45` -> `--angles 22.5 --angles 45`: one flag, several values.

    The values end at the first token that is not a number, so checkpoints may come before or
    after the list; `--angles=45 90` works too. The same for `--counts 1-16 17-32` (values:
    count ranges LO-HI or single counts).
    """
    expanded, i = [], 0
    while i < len(args):
        token = args[i]
        i += 1
        if token != name and not token.startswith(name + "="):
            expanded.append(token)
            continue
        values = [token.split("=", 1)[1]] if "=" in token else []
        while i < len(args) and is_value(args[i]):
            values.append(args[i])
            i += 1
        if not values:
            # Not a number where one is due: hand the token to the library's message.
            values = [args[i]] if i < len(args) and not args[i].startswith("-") else []
            i += len(values)
        if not values:
            raise typer.BadParameter(f"needs at least one {what}", param_hint=f"'{name}'")
        for value in values:
            expanded += [name, value]
    return expanded


def expand_lists(args: list[str]) -> list[str]:
    """The list options: --buckets (any task's), --angles (MNIST's), --counts (parity's) and
    calibrate's --rules."""
    args = expand_angles(expand_angles(list(args)), "--counts", _is_count_range, "count range LO-HI")
    args = expand_angles(args, "--buckets", _is_spec, "bucket")
    return expand_angles(args, "--rules", _is_rule, "halting rule")


class CompletesHidden:
    """A command whose hidden options (rarer ones, kept out of --help) are completed too, once
    their name is begun (`--halting-t`): click offers visible ones alone."""

    def shell_complete(self, ctx, incomplete: str):
        from typer._click.core import ParameterSource  # the click that Typer carries, whose objects these are
        from typer.core import TyperOption
        from typer._click.shell_completion import CompletionItem

        results = super().shell_complete(ctx, incomplete)
        if not incomplete.startswith("--") or len(incomplete) < 3:
            return results
        offered = {item.value for item in results}
        for param in self.get_params(ctx):
            if not isinstance(param, TyperOption) or not param.hidden or (
                    not param.multiple and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE):
                continue
            results += [CompletionItem(name, help=param.help) for name in [*param.opts, *param.secondary_opts]
                        if name.startswith(incomplete) and name not in offered]
        return results


class AnglesCommand(CompletesHidden, TyperCommand):
    def parse_args(self, ctx, args):
        try:
            args = expand_lists(list(args))
        except typer.BadParameter:
            if not ctx.resilient_parsing:  # a shell completing `--rules ` asks before the value is there
                raise
        return super().parse_args(ctx, args)


class TrainCommand(CompletesHidden, TyperCommand):
    """`ponder train`."""


# Shared options --------------------------------------------------------------------------------

def non_empty_path(text: str) -> Path:
    """A path option's value. An empty one, most often an unset variable (--out "$DIR"), is
    refused: as a Path it would silently be the current folder."""
    if not text.strip():
        raise typer.BadParameter("an empty path (an unset variable?); name a file or folder")
    return Path(text)


def path_option(*names: str, **options):
    """A typer.Option holding a path, never an empty one (non_empty_path)."""
    return typer.Option(None, *names, parser=non_empty_path, metavar="<path>", **options)


DataDirOption = path_option("--data-dir", help="Where MNIST lives or is downloaded to "
                             "(MNIST/raw/ inside it). [default: $PONDER_DATA_DIR, else ~/.cache/ponder_cli]")
DownloadOption = typer.Option(True, "--download/--no-download",
                              help="Download MNIST into --data-dir when it is not there.")
def _device(value: str) -> str:
    """--device, its spelling checked before torch loads (registry.device_problem)."""
    problem = device_problem(value)
    if problem is not None:
        raise BadValue(problem)
    return value


def _time_limit(value: Optional[str]) -> Optional[float]:
    """--time-limit, in seconds, checked before torch loads (config.parse_duration)."""
    return None if value is None else parse_duration(value)


TimeLimitOption = typer.Option(None, "--time-limit", metavar="DURATION", callback=_time_limit, show_default=False,
                               help="Stop cleanly after the last epoch that fits in this long (90s, 9m, 2h, "
                                    "1h30m), counted from when training starts in this process; judged from the "
                                    "epochs it has timed (the first always runs), it saves and prints the resume "
                                    "command. Not a setting of the run: --resume may give another.")
DeviceOption = typer.Option("auto", "--device", callback=_device, help=f"{DEVICE_CHOICES}.",
                            autocompletion=lambda incomplete: _offer(("auto", "cpu", "cuda"), incomplete))
AmpOption = typer.Option(None, "--amp/--no-amp", help="Mixed precision: fp16 with a GradScaler on CUDA, bf16 on "
                         "the CPU. [default: off, float32]")
FormatOption = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.", case_sensitive=False)
CheckpointArgument = typer.Argument(
    None, metavar="CHECKPOINT", show_default=False, autocompletion=lambda incomplete: complete_checkpoint(incomplete),
    help=f"A checkpoint file, a run folder (its best.pt), {LATEST} (the newest run under {RUNS_DIR}/), or a shipped "
         f"model: {'; '.join(f'{name} ({text})' for name, (_, text) in SHIPPED.items())}. [default: {DEFAULT}]")
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress bars or messages on stderr; errors, "
                           "warnings and results still show.")
EvalSeedOption = typer.Option(None, "--seed", help="Seed of the test rotations and halting coin flips, drawn "
                              "per input (MNIST: --limit N evaluates the first N images exactly as the full "
                              "evaluation does). [default: the checkpoint's training seed]")
RepeatsOption = typer.Option(1, "--repeats", min=1, help="Independent draws of rotations and halting coins "
                             "(seeds seed, seed+1, ...): means and 95% intervals per bucket.")
LimitOption = typer.Option(0, "--limit", min=0, help="Evaluate only the first N test images (0: all); parity: N "
                           "vectors per non-zero count (0: 256).")
EvalBatchOption = typer.Option(1000, "--batch-size", min=1, help="Images per evaluation batch.")
ProtocolOption = typer.Option(None, "--protocol", case_sensitive=False, show_default=False,
                              help="How MNIST test images are rotated: uniform (the default): within ±angle "
                                   "(reference); band: |rotation| between the previous angle and this one; fixed: "
                                   "exactly ±angle. Parity checkpoints refuse it.")


def piece_choice(kind: str):
    """The callback of --task, --step or --method: a name in the registry when the command runs
    (not a choice fixed at import), so that a piece registered later, or by an installed package,
    can be chosen; any case."""
    table = PIECES[kind]

    def check(value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        name = value.lower() if value.lower() in table else value
        if not known(kind, name):
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, table))}.")
        return name

    return check


def piece_metavar(kind: str) -> str:
    """<mnist|parity>: the built-in pieces of a kind."""
    return f"<{'|'.join(PIECES[kind])}>"


def _halting_rule(value: Optional[str]) -> Optional[str]:
    """--halting as spelled (quantile:0.9 stays quantile:0.9), checked before any work; None
    when not given (the method's own: sample, or ACT's)."""
    if value is None:
        return None
    try:
        return parse_halting_rule(value).spelling
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def halting_rules(values: Optional[list[str]]) -> Optional[list[str]]:
    """calibrate's --rules, each checked as --halting is and as one that halts at one step
    (before any work, naming the option)."""
    return None if values is None else [_exit_rule(value) for value in values]


def _exit_rule(value: str) -> str:
    try:
        return parse_exit_rule(value).spelling
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


HaltingOption = typer.Option(None, "--halting", metavar="RULE", callback=_halting_rule,
                             autocompletion=lambda incomplete: complete_rule()(incomplete),
                             help=f"{rule_choices()}. sample: Bernoulli(λ_n) coin per step (paper); median: "
                                  "first step where the cumulative halting probability reaches 0.5; quantile:Q: "
                                  "where it reaches Q (median = quantile:0.5); patience:K: first step whose "
                                  "predicted class is also that of the K steps before it; confidence:C: first "
                                  "step whose top class probability reaches C; threshold:T: first step whose λ_n "
                                  "reaches T (a head trained by --halting-target final or correct); fixed:N: every "
                                  "input stops at step N (a fixed budget, the control; any method); expected: p-weighted "
                                  "average of all steps' outputs, steps = Σ n·p_n. Default: sample; ACT halts by "
                                  "its own rule and refuses every other but fixed:N. See ponder calibrate.")
MaxStepsOption = typer.Option(None, "--max-steps", metavar="N", show_default=False,
                              help="Run up to N steps, whatever the checkpoint trained with (1 to 100; more than "
                                   "it trained with too): the halting forced at step N, as at training's last "
                                   "step. A one-step model (plain) refuses it. [default: the checkpoint's]")
DetailOption = typer.Option(False, "--detail", help="Also show, per halting step, how many images halted there "
                            "and the accuracy if every image stopped there (runs all steps).")
PlotOption = path_option("--plot", help="Write a figure (PNG, or another format matplotlib knows by the "
                          "file's extension) of accuracy and ponder steps against angle and the halting-step "
                          "distributions (needs matplotlib: pip install matplotlib).")


RequiredCheckpointArgument = typer.Argument(
    ..., metavar="CHECKPOINT", show_default=False, autocompletion=lambda incomplete: complete_checkpoint(incomplete),
    help=f"A checkpoint file, a run folder (its best.pt), {LATEST} (the newest run under {RUNS_DIR}/), or a shipped "
         f"model: {', '.join(SHIPPED)}.")


def counts_option(default: str):
    """--counts: parity's buckets, None unless given (the task then picks its default)."""
    return typer.Option(None, "--counts", metavar="LO-HI...", show_default=False,
                        help=f"Parity checkpoints: one bucket per range of non-zero counts, e.g. --counts 1-16 17-32 "
                             f"(a single count: 5). [default: {default}]")


def buckets_option(default: str):
    """--buckets: the checkpoint's task's buckets in its own terms, None unless given."""
    return typer.Option(None, "--buckets", metavar="SPEC...", show_default=False,
                        help=f"One bucket per spec, in the terms of the checkpoint's task (MNIST: angles, as "
                             f"--angles; parity: count ranges, as --counts; another task: its own). Several values "
                             f"after one flag when they are numbers or ranges LO-HI. [default: {default}]")


def angles_text(angles) -> list[str]:
    """Angles in degrees as --angles spells them: 22.5, 45."""
    return [f"{angle:g}" for angle in angles]


def angles_option(default: list[str], what: str):
    """--angles: None unless given (so that an alternative, eval's --rotation, can tell), shown with its default."""
    return typer.Option(None, "--angles", metavar="DEG...", show_default=False,
                        help=f"{what} Several values after one flag: --angles 22.5 45; checkpoints may come before "
                             f"or after the list. MNIST checkpoints only. [default: {' '.join(default)}]")


# Completion ------------------------------------------------------------------------------------
# `--show-completion SHELL` and `--install-completion SHELL` for the shell named (without one: the
# shell ponder runs under), and the values a shell offers at Tab: choices and checkpoints. A shell
# asks at every Tab, so nothing here loads torch.

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _shell(ctx, param, value: Optional[str]) -> Optional[str]:
    """The shell a completion option names ("" when given bare: the one ponder runs under)."""
    if value is None or ctx.resilient_parsing:
        return None
    shell = value.lower()
    if not shell:
        import shellingham
        try:
            shell = shellingham.detect_shell()[0]
        except (shellingham.ShellDetectionFailure, RuntimeError):
            shell = ""
        if shell not in SHELLS:
            raise typer.BadParameter(f"cannot tell which shell this is{f' ({shell})' if shell else ''}; name one: "
                                     f"{param.opts[0]} {'|'.join(SHELLS[:4])}")
    elif shell not in SHELLS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(SHELLS)}")
    return shell


def _show_completion(ctx, param, value: Optional[str]) -> None:
    from typer._completion_shared import get_completion_script
    use_ponder_completion()

    shell = _shell(ctx, param, value)
    if shell is not None:
        typer.echo(get_completion_script(prog_name=_prog(ctx), complete_var=_complete_var(ctx), shell=shell))
        ctx.exit(0)


def _install_completion(ctx, param, value: Optional[str]) -> None:
    from typer._completion_shared import install
    use_ponder_completion()

    shell = _shell(ctx, param, value)
    if shell is None:
        return
    try:
        if shell in POWERSHELLS:
            path, done = _install_powershell(shell, _prog(ctx), _complete_var(ctx))
        else:
            (shell, path), done = install(shell=shell, prog_name=_prog(ctx), complete_var=_complete_var(ctx)), True
    except OSError as exc:  # a profile that cannot be written, PowerShell not installed
        typer.echo(f"Error: cannot install {shell} completion: {exc.strerror or exc}"
                   f"{f' ({exc.filename})' if exc.filename else ''}", err=True)
        ctx.exit(1)
    typer.echo(f"{shell} completion {'installed' if done else 'already'} in {path}; it takes effect in a new shell"
               + ("; PowerShell must allow profile scripts (Get-ExecutionPolicy; ponder changes no policy)"
                  if shell in POWERSHELLS else ""))
    ctx.exit(0)


POWERSHELLS = ("powershell", "pwsh")


def _install_powershell(shell: str, prog: str, complete_var: str) -> tuple[Path, bool]:
    """The completion script appended once to the user's PowerShell profile, found as Typer finds it
    (the shell's own $profile), the lines already there kept. Typer's installer also runs
    `Set-ExecutionPolicy Unrestricted -Scope CurrentUser`, a change to the user's security policy that
    installing completion must not make: none is made here. Returns the profile and whether it was
    written (False: the script was there already)."""
    import subprocess

    from typer._completion_shared import get_completion_script

    found = None
    for command in (shell, *(other for other in POWERSHELLS if other != shell)):  # Linux and macOS: pwsh
        try:
            found = subprocess.run([command, "-NoProfile", "-Command", "echo", "$profile"], capture_output=True)
            break
        except FileNotFoundError:
            continue
    if found is None:
        raise OSError(f"neither {' nor '.join(POWERSHELLS)} is on PATH")
    profile = next((text.strip() for text in (_decoded(found.stdout),) if text and text.strip()), None)
    if found.returncode != 0 or not profile:
        raise OSError(f"PowerShell did not say where its profile is (exit {found.returncode})")
    path = Path(profile)
    script = get_completion_script(prog_name=prog, complete_var=complete_var, shell=shell)
    mark = f"Register-ArgumentCompleter -Native -CommandName {prog} "
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    if mark in text:
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as profile_file:
        profile_file.write(("\n" if text and not text.endswith("\n") else "") + script.rstrip("\n") + "\n")
    return path, True


def _decoded(raw: bytes) -> str:
    for encoding in ("utf-8", "windows-1252", "cp850"):  # PowerShell on Windows may answer in its code page
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return ""


def _prog(ctx) -> str:
    return ctx.find_root().info_name or "ponder"


def _complete_var(ctx) -> str:
    return "_{}_COMPLETE".format(_prog(ctx).replace("-", "_").upper())


def _offer(values, incomplete: str) -> list[str]:
    return [value for value in values if value.startswith(incomplete)]


COMPLETION_OPTIONS = ("--install-completion", "--show-completion")

# bash and zsh, as Typer's scripts run them, put a space after every value offered; a value that
# is not a whole word (a rule's prefix, `threshold:`, or a folder, `runs/`) is to be typed on
# from, so each shell is told to add none after it: bash's script asks compopt when it is the one
# reply, zsh's answer adds those values with an empty suffix.
UNFINISHED = (":", "/")

BASH_SCRIPT = """
%(complete_func)s() {
    local IFS=$'\\n'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \\
                   COMP_CWORD=$COMP_CWORD \\
                   %(autocomplete_var)s=complete_bash $1 ) )
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *[:/] ]]; then
        compopt -o nospace  # a rule's prefix (threshold:) or a folder (runs/): go on typing after it
    fi
    return 0
}

complete -o default -F %(complete_func)s %(prog_name)s
"""


def use_ponder_completion() -> None:
    """Typer's completion for each shell, bash's script and zsh's answers as above (UNFINISHED);
    before a script is shown or installed, and before a shell's question is answered."""
    from typer._click.shell_completion import add_completion_class
    from typer import _completion_shared
    from typer._completion_classes import ZshComplete, completion_init

    class ZshCompletion(ZshComplete):
        def complete(self) -> str:
            args, incomplete = self.get_completion_args()
            items = self.get_completions(args, incomplete)
            words = [self.format_completion(item) for item in items if not item.value.endswith(UNFINISHED)]
            unfinished = [item.value for item in items if item.value.endswith(UNFINISHED)]
            said = [f"_arguments '*: :(({chr(10).join(words)}))'"] if words else []
            if unfinished:
                said.append("compadd -S '' -- " + " ".join("'" + value.replace("'", "'\\''") + "'"
                                                           for value in unfinished))
            return "; ".join(said) or "_files"

    completion_init()
    add_completion_class(ZshCompletion, "zsh")
    _completion_shared._completion_scripts["bash"] = BASH_SCRIPT


def bare_completion_options(args: list[str]) -> list[str]:
    """`ponder --show-completion` alone (no shell after it) as `--show-completion ""`: the shell
    is then the one ponder runs under. (Typer's own options take no value where the shell can be
    detected, so `--show-completion zsh` printed bash's script.) Only the app's own options,
    before the command, are looked at."""
    args, i = list(args), 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in COMPLETION_OPTIONS and (i + 1 == len(args) or args[i + 1].startswith("-")):
            args.insert(i + 1, "")
        i += 1 + (args[i] in COMPLETION_OPTIONS)
    return args


InstallCompletionOption = typer.Option(
    None, *COMPLETION_OPTIONS[:1], metavar="[SHELL]", callback=_install_completion, expose_value=False, is_eager=True,
    autocompletion=lambda incomplete: _offer(SHELLS, incomplete), show_default=False,
    help=f"Install completion for SHELL ({', '.join(SHELLS[:4])}; default: the shell this runs under).")
ShowCompletionOption = typer.Option(
    None, *COMPLETION_OPTIONS[1:], metavar="[SHELL]", callback=_show_completion, expose_value=False, is_eager=True,
    autocompletion=lambda incomplete: _offer(SHELLS, incomplete), show_default=False,
    help="Print SHELL's completion script (default: the shell this runs under), to copy it or customize the "
         "installation.")


def complete_piece(kind: str):
    """The values of --task, --step or --method: the registered pieces (entry points too)."""
    def complete(incomplete: str) -> list[str]:
        from importlib.metadata import entry_points

        from .registry import ENTRY_POINTS
        return _offer([*PIECES[kind], *(point.name for point in entry_points(group=ENTRY_POINTS[kind]))], incomplete)
    return complete


def complete_rule(exit_rules_only: bool = False):
    """--halting's rules (calibrate's --rules: those that halt at one step), a parameter's as
    `quantile:`, for the user to finish."""
    def complete(incomplete: str) -> list[str]:
        from .registry import AVERAGING_RULES, RULE_PARAMETERS
        return _offer([f"{name}:" if name in RULE_PARAMETERS else name for name in HALTING_RULES
                       if not (exit_rules_only and name in AVERAGING_RULES)], incomplete)
    return complete


def complete_run_key(incomplete: str) -> list[str]:
    """--sort's and --where's keys (reports.runs.run_keys)."""
    from .reports.runs import run_keys
    return _offer(run_keys(), incomplete)


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    """`ponder runs rm RUN`: the runs under runs/ and here, then folders at the path typed; with
    --restore, the paths the runs in the trash had (beside runs under runs/ and here)."""
    from .folders import runs_under, trashed_runs

    if ctx.params.get("restore"):
        return _offer(trashed_runs([".", RUNS_DIR]), incomplete)
    runs = [str(run) for run in dict.fromkeys([*runs_under(Path(RUNS_DIR)), *runs_under(Path("."))]) if str(run) != "."]
    return _offer(_once([*runs, *_folders(incomplete)], runs), incomplete)


def _folders(incomplete: str, suffix: Optional[str] = None) -> list[str]:
    """The folders (and files ending in `suffix`) at the path typed, hidden ones only when typed."""
    start = incomplete.rpartition("/")[2]
    prefix = incomplete[:len(incomplete) - len(start)]  # the folder typed, up to its last /
    try:
        entries = sorted(Path(prefix or ".").iterdir())
    except OSError:
        entries = []
    names = []
    for entry in entries:
        hidden = entry.name.startswith((".", "__"))  # .git, __pycache__: only when typed
        if entry.name.startswith(start) and (start.startswith((".", "_")) or not hidden):
            if entry.is_dir():
                names.append(f"{prefix}{entry.name}/")
            elif suffix is not None and entry.suffix == suffix:
                names.append(prefix + entry.name)
    return names


def complete_checkpoint(incomplete: str) -> list[str]:
    """A CHECKPOINT: the shipped models' names and `latest`, the runs under runs/ (folders.
    runs_under, as `ponder runs` finds them), then folders and .pt files at the path typed."""
    return _checkpoints(incomplete, shipped=True)


def complete_resumable(incomplete: str) -> list[str]:
    """--resume's CHECKPOINT: as complete_checkpoint, but no shipped model (--resume refuses them)."""
    return _checkpoints(incomplete, shipped=False)


def _checkpoints(incomplete: str, shipped: bool) -> list[str]:
    from .folders import runs_under

    runs = [str(run) for run in runs_under(RUNS_DIR)]
    names = [*(SHIPPED if shipped else ()), LATEST, *runs, *_folders(incomplete, ".pt")]
    return _offer(_once(names, runs), incomplete)


def _once(names: list[str], runs: list[str]) -> list[str]:
    """Each candidate once: a run offered by its path is not offered again as a folder (`run/`);
    typing its `/` offers what it holds."""
    taken = {f"{run}/" for run in runs}
    return [name for name in dict.fromkeys(names) if name not in taken]
