"""What the `ponder` commands share: options, list arguments, the CHECKPOINT argument and shell
completion (Typer objects only, no torch: a shell asks at every Tab)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from . import BadValue
from . import durations
from .folders import BEST, DEFAULT, LATEST, RUNS_DIR, SHIPPED, accepted_forms
from .registry import DEVICE_CHOICES, HALTING_RULES, PIECES, device_problem, known
from .render import OutputFormat


# list options: `--angles 22.5 45` for `--angles 22.5 --angles 45` ----------------------------

def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _is_count_range(token: str) -> bool:
    return re.fullmatch(r"\d+(-\d+)?", token) is not None


def expand_angles(args: list[str], name: str = "--angles", is_value=_is_number, what: str = "angle") -> list[str]:
    """`--angles 22.5 45` -> `--angles 22.5 --angles 45`: the values end at the first token that
    is not one, so checkpoints may come before or after the list; `--angles=45 90` too."""
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
        if not values:  # not a value where one is due: hand the token to the library's message
            values = [args[i]] if i < len(args) and not args[i].startswith("-") else []
            i += len(values)
        if not values:
            raise typer.BadParameter(f"needs at least one {what}", param_hint=f"'{name}'")
        for value in values:
            expanded += [name, value]
    return expanded


LISTS = (("--angles", _is_number, "angle"), ("--counts", _is_count_range, "count range LO-HI"),
         ("--buckets", lambda token: _is_number(token) or _is_count_range(token), "bucket"),
         ("--rules", lambda token: token.partition(":")[0].strip().lower() in HALTING_RULES, "halting rule"))


class CompletesHidden:
    """Hidden options (kept out of --help) are completed too once their name is begun (`--halting-t`)."""

    def shell_complete(self, ctx, incomplete: str):
        from typer._click.core import ParameterSource  # the click that Typer carries
        from typer._click.shell_completion import CompletionItem
        from typer.core import TyperOption

        results = super().shell_complete(ctx, incomplete)
        if not incomplete.startswith("--") or len(incomplete) < 3:
            return results
        offered = {item.value for item in results}
        for param in self.get_params(ctx):
            if isinstance(param, TyperOption) and param.hidden and (
                    param.multiple or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE):
                results += [CompletionItem(name, help=param.help) for name in [*param.opts, *param.secondary_opts]
                            if name.startswith(incomplete) and name not in offered]
        return results


class ListsCommand(CompletesHidden, TyperCommand):
    """A command whose list options (LISTS) take several values after one flag."""

    def parse_args(self, ctx, args):
        try:
            for name, is_value, what in LISTS:
                args = expand_angles(list(args), name, is_value, what)
        except typer.BadParameter:
            if not ctx.resilient_parsing:  # a shell completing `--rules ` asks before the value is there
                raise
        return super().parse_args(ctx, args)


class TrainCommand(CompletesHidden, TyperCommand):
    pass


# shared options --------------------------------------------------------------------------------

def non_empty_path(text: str) -> Path:
    """A path option's value; an empty one (an unset variable: --out "$DIR") would silently be
    the current folder."""
    if not text.strip():
        raise typer.BadParameter("an empty path (an unset variable?); name a file or folder")
    return Path(text)


def path_option(*names: str, **options):
    return typer.Option(None, *names, parser=non_empty_path, metavar="<path>", **options)


def _device(value: str) -> str:
    problem = device_problem(value)  # checked before torch loads
    if problem is not None:
        raise BadValue(problem)
    return value


DataDirOption = path_option("--data-dir", help="Where MNIST lives or is downloaded to "
                             "(MNIST/raw/ inside it). [default: $PONDER_DATA_DIR, else ~/.cache/ponder_cli]")
DownloadOption = typer.Option(True, "--download/--no-download",
                              help="Download MNIST into --data-dir when it is not there.")
TimeLimitOption = typer.Option(None, "--time-limit", metavar="DURATION", show_default=False,
                               callback=lambda value: None if value is None else durations.parse(value),
                               help="Stop cleanly after the last epoch that fits in this long (90s, 9m, 2h, "
                                    "1h30m), counted from when training starts in this process; judged from the "
                                    "epochs it has timed (the first always runs), it saves and prints the resume "
                                    "command. Not a setting of the run: --resume may give another.")
DeviceOption = typer.Option("auto", "--device", callback=_device, help=f"{DEVICE_CHOICES}.",
                            autocompletion=lambda incomplete: _offer(("auto", "cpu", "cuda"), incomplete))
AmpOption = typer.Option(None, "--amp/--no-amp", help="Mixed precision: fp16 with a GradScaler on CUDA, bf16 on "
                         "the CPU. [default: off, float32]")
FormatOption = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.", case_sensitive=False)
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress bars or messages on stderr; errors, "
                           "warnings and results still show.")


def checkpoint_forms(file: str = BEST) -> str:
    """The forms a CHECKPOINT takes, as every help says them (folders.accepted_forms)."""
    return accepted_forms(file).replace("`", "")


def checkpoint_argument(help: str = f"{checkpoint_forms().capitalize()}. [default: {DEFAULT}]", default=None):
    return typer.Argument(default, metavar="CHECKPOINT", show_default=False, help=help,
                          autocompletion=lambda incomplete: complete_checkpoint(incomplete))


def piece_choice(kind: str):
    """--task's, --step's or --method's check: a name in the registry when the command runs (a
    piece registered later, or by an installed package, can be chosen); any case."""
    table = PIECES[kind]

    def check(value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        name = value.lower() if value.lower() in table else value
        if not known(kind, name):
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, table))}.")
        return name

    return check


# completion ------------------------------------------------------------------------------------
# `--show-completion SHELL` and `--install-completion SHELL` (bare: the shell ponder runs under),
# through Typer's scripts and installers, and the values a shell offers at Tab.

SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
POWERSHELLS = SHELLS[3:]
COMPLETION_OPTIONS = ("--install-completion", "--show-completion")

# bash and zsh, as Typer's scripts run them, put a space after every value offered; a value that
# is not a whole word (a rule's prefix, `threshold:`, or a folder, `runs/`) is to be typed on from
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
    """Typer's completion, with bash's script above and zsh's answer adding unfinished values
    with no space after them."""
    from typer import _completion_shared
    from typer._click.shell_completion import add_completion_class
    from typer._completion_classes import ZshComplete, completion_init

    class ZshCompletion(ZshComplete):
        def complete(self) -> str:
            items = self.get_completions(*self.get_completion_args())
            words = [self.format_completion(item) for item in items if not item.value.endswith((":", "/"))]
            unfinished = ["'" + item.value.replace("'", "'\\''") + "'" for item in items
                          if item.value.endswith((":", "/"))]
            said = [f"_arguments '*: :(({chr(10).join(words)}))'"] if words else []
            said += ["compadd -S '' -- " + " ".join(unfinished)] if unfinished else []
            return "; ".join(said) or "_files"

    completion_init()
    add_completion_class(ZshCompletion, "zsh")
    _completion_shared._completion_scripts["bash"] = BASH_SCRIPT


def bare_completion_options(args: list[str]) -> list[str]:
    """`ponder --show-completion` alone as `--show-completion ""` (Typer's take no shell where one
    can be detected); only the app's own options, before the command, are looked at."""
    args, i = list(args), 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in COMPLETION_OPTIONS and (i + 1 == len(args) or args[i + 1].startswith("-")):
            args.insert(i + 1, "")
        i += 1 + (args[i] in COMPLETION_OPTIONS)
    return args


NAMES = {"prog_name": "ponder", "complete_var": "_PONDER_COMPLETE"}  # what Typer's scripts call us


def _completion(install: bool):
    """--install-completion's or --show-completion's callback: the shell named ("": the one ponder
    runs under), its script printed or installed, and exit."""
    def callback(ctx, param, value: Optional[str]) -> None:
        from typer._completion_shared import get_completion_script, install as install_script

        if value is None or ctx.resilient_parsing:
            return
        shell = value.lower()
        if not shell:
            import shellingham
            try:
                shell = shellingham.detect_shell()[0]
            except (shellingham.ShellDetectionFailure, RuntimeError):
                shell = ""
            if shell not in SHELLS:
                raise typer.BadParameter(f"cannot tell which shell this is{f' ({shell})' if shell else ''}; name "
                                         f"one: {param.opts[0]} {'|'.join(SHELLS[:4])}")
        elif shell not in SHELLS:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(SHELLS)}")
        use_ponder_completion()
        if not install:
            typer.echo(get_completion_script(shell=shell, **NAMES))
            ctx.exit(0)
        try:
            if shell in POWERSHELLS:
                path, done = _install_powershell(shell)
            else:
                (shell, path), done = install_script(shell=shell, **NAMES), True
        except OSError as exc:  # a profile that cannot be written, PowerShell not installed
            typer.echo(f"Error: cannot install {shell} completion: {exc.strerror or exc}"
                       f"{f' ({exc.filename})' if exc.filename else ''}", err=True)
            ctx.exit(1)
        typer.echo(f"{shell} completion {'installed' if done else 'already'} in {path}; it takes effect in a new "
                   "shell" + ("; PowerShell must allow profile scripts (Get-ExecutionPolicy; ponder changes no "
                              "policy)" if shell in POWERSHELLS else ""))
        ctx.exit(0)
    return callback


def _install_powershell(shell: str) -> tuple[Path, bool]:
    """The script appended once to the user's PowerShell profile (the shell's own $profile), and
    whether it was written. Typer's installer also runs `Set-ExecutionPolicy Unrestricted`, a
    change to the user's security policy that installing completion must not make."""
    import subprocess

    from typer._completion_shared import get_completion_script

    for command in (shell, *(other for other in POWERSHELLS if other != shell)):  # Linux and macOS: pwsh
        try:
            found = subprocess.run([command, "-NoProfile", "-Command", "echo", "$profile"], capture_output=True)
            break
        except FileNotFoundError:
            continue
    else:
        raise OSError(f"neither {' nor '.join(POWERSHELLS)} is on PATH")
    profile = ""
    for encoding in ("utf-8", "windows-1252", "cp850"):  # PowerShell on Windows may answer in its code page
        try:
            profile = found.stdout.decode(encoding).strip()
            break
        except UnicodeDecodeError:
            continue
    if found.returncode != 0 or not profile:
        raise OSError(f"PowerShell did not say where its profile is (exit {found.returncode})")
    path = Path(profile)
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    if f"Register-ArgumentCompleter -Native -CommandName {NAMES['prog_name']} " in text:
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as profile_file:
        script = get_completion_script(shell=shell, **NAMES)
        profile_file.write(("\n" if text and not text.endswith("\n") else "") + script.rstrip("\n") + "\n")
    return path, True


def completion_option(name: str, install: bool, help: str):
    return typer.Option(None, name, metavar="[SHELL]", callback=_completion(install), expose_value=False,
                        is_eager=True, autocompletion=lambda incomplete: _offer(SHELLS, incomplete),
                        show_default=False, help=help)


InstallCompletionOption = completion_option(
    COMPLETION_OPTIONS[0], True,
    f"Install completion for SHELL ({', '.join(SHELLS[:4])}; default: the shell this runs under).")
ShowCompletionOption = completion_option(
    COMPLETION_OPTIONS[1], False,
    "Print SHELL's completion script (default: the shell this runs under), to copy it or customize the installation.")


def _offer(values, incomplete: str) -> list[str]:
    return [value for value in values if value.startswith(incomplete)]


def complete_piece(kind: str):
    """--task's, --step's or --method's values: the registered pieces, entry points too."""
    def complete(incomplete: str) -> list[str]:
        from importlib.metadata import entry_points

        from .registry import ENTRY_POINTS
        return _offer([*PIECES[kind], *(point.name for point in entry_points(group=ENTRY_POINTS[kind]))], incomplete)
    return complete


def complete_rule(exit_rules_only: bool = False):
    """--halting's rules (calibrate's --rules: those that halt at one step), `quantile:` to finish."""
    def complete(incomplete: str) -> list[str]:
        from .registry import AVERAGING_RULES, RULE_PARAMETERS
        return _offer([f"{name}:" if name in RULE_PARAMETERS else name for name in HALTING_RULES
                       if not (exit_rules_only and name in AVERAGING_RULES)], incomplete)
    return complete


def complete_run_key(incomplete: str) -> list[str]:
    from .reports.runs import run_keys
    return _offer(run_keys(), incomplete)


def complete_run(ctx: typer.Context, incomplete: str) -> list[str]:
    """`ponder runs rm RUN`: the runs under runs/ and here, then folders; with --restore, the
    paths the trashed runs had."""
    from .folders import runs_under, trashed_runs

    if ctx.params.get("restore"):
        return _offer(trashed_runs([".", RUNS_DIR]), incomplete)
    runs = [str(run) for run in dict.fromkeys([*runs_under(Path(RUNS_DIR)), *runs_under(Path("."))]) if str(run) != "."]
    return _offer(_once([*runs, *_folders(incomplete)], runs), incomplete)


def _folders(incomplete: str, suffix: Optional[str] = None) -> list[str]:
    """The folders (and files ending in `suffix`) at the path typed, hidden ones only when typed."""
    start = incomplete.rpartition("/")[2]
    prefix = incomplete[:len(incomplete) - len(start)]
    try:
        entries = sorted(Path(prefix or ".").iterdir())
    except OSError:
        entries = []
    names = []
    for entry in entries:
        hidden = entry.name.startswith((".", "__"))  # .git, __pycache__
        if entry.name.startswith(start) and (start.startswith((".", "_")) or not hidden):
            if entry.is_dir():
                names.append(f"{prefix}{entry.name}/")
            elif suffix is not None and entry.suffix == suffix:
                names.append(prefix + entry.name)
    return names


def complete_checkpoints(incomplete: str, shipped: bool) -> list[str]:
    """A CHECKPOINT: the shipped models' names (where `shipped`: --resume refuses them), `latest`,
    the runs under runs/, then folders and .pt files at the path typed."""
    from .folders import runs_under

    runs = [str(run) for run in runs_under(RUNS_DIR)]
    names = [*(SHIPPED if shipped else ()), LATEST, *runs, *_folders(incomplete, ".pt")]
    return _offer(_once(names, runs), incomplete)


def complete_checkpoint(incomplete: str) -> list[str]:
    return complete_checkpoints(incomplete, shipped=True)


def _once(names: list[str], runs: list[str]) -> list[str]:
    """Each candidate once: a run offered by its path is not offered again as a folder (`run/`)."""
    taken = {f"{run}/" for run in runs}
    return [name for name in dict.fromkeys(names) if name not in taken]
