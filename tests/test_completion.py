"""Shell completion: each shell's own script, installed where that shell reads it, and the values
a shell offers at Tab (choices, checkpoints), without loading torch."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ponder_cli.cli import app
from ponder_cli.folders import SHIPPED

# what only each shell's script holds
MARKS = {"bash": "complete -o default -F _ponder_completion ponder", "zsh": "#compdef ponder",
         "fish": "complete --command ponder", "powershell": "Register-ArgumentCompleter -Native -CommandName ponder"}


def _run(*args, env=None):
    return CliRunner().invoke(app, list(args), env=env, prog_name="ponder")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish", "powershell"])
def test_show_completion_prints_the_named_shells_script(shell):
    result = _run("--show-completion", shell)
    assert result.exit_code == 0, result.output
    script = result.stdout
    assert MARKS[shell] in script and "_PONDER_COMPLETE" in script and f"complete_{shell}" in script
    assert [other for other, mark in MARKS.items() if mark in script] == [shell]


def test_bare_show_completion_is_the_shell_it_runs_under(monkeypatch):
    import shellingham

    monkeypatch.setattr(shellingham, "detect_shell", lambda: ("fish", "/usr/bin/fish"))
    assert _run("--show-completion").stdout.startswith(MARKS["fish"])
    monkeypatch.setattr(shellingham, "detect_shell", lambda: ("tcsh", "/bin/tcsh"))
    result = _run("--show-completion")
    assert result.exit_code == 2 and "cannot tell which shell this is (tcsh); name one: --show-completion " \
        "bash|zsh|fish|powershell" in result.stderr
    result = _run("--show-completion", "train")
    assert result.exit_code == 2 and "'train' is not one of bash, zsh, fish, powershell, pwsh" in result.stderr


@pytest.mark.parametrize("shell, script, rc", [("bash", ".bash_completions/ponder.sh", ".bashrc"),
                                               ("zsh", ".zfunc/_ponder", ".zshrc"),
                                               ("fish", ".config/fish/completions/ponder.fish", None)])
def test_install_completion_writes_the_named_shells_script_into_home(shell, script, rc, tmp_path):
    if rc:
        (tmp_path / rc).write_text("alias ll='ls -l'\n")  # the user's own lines stay
    for _ in range(2):  # installing again adds nothing twice
        result = _run("--install-completion", shell, env={"HOME": str(tmp_path)})
        assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{shell} completion installed in {tmp_path / script}")
    assert MARKS[shell] in (tmp_path / script).read_text()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(filter(None, (script, rc)))
    if rc:
        text = (tmp_path / rc).read_text()
        assert text.startswith("alias ll='ls -l'\n")
        loader = {"bash": f"source '{tmp_path / script}'", "zsh": "fpath+=~/.zfunc"}[shell]
        assert text.count(loader) == 1


def _offered(line: str, shell: str = "bash", cwd=None) -> list[str]:
    """What `ponder` offers at Tab after `line` (complete words end with a space)."""
    words = line.split()
    env = {"_PONDER_COMPLETE": f"complete_{shell}", "_TYPER_COMPLETE_ARGS": line,
           "COMP_WORDS": line, "COMP_CWORD": str(len(words) - (not line.endswith(" "))),
           "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = _run(env=env)
    finally:
        os.chdir(before)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines() if shell == "fish" else result.stdout.split()


def test_choices_are_offered():
    assert _offered("ponder train --method ") == ["pondernet", "act", "plain"]
    assert _offered("ponder train --step ") == ["mlp", "align", "rnn", "gru"]
    assert _offered("ponder train --task p") == ["parity"]
    assert _offered("ponder eval --halting ") == ["sample", "median", "expected", "quantile:", "patience:",
                                                  "confidence:", "threshold:", "fixed:"]
    # calibrate's rules halt at one step: not expected's average
    assert _offered("ponder calibrate --rules ") == ["sample", "median", "quantile:", "patience:", "confidence:",
                                                     "threshold:", "fixed:"]
    assert _offered("ponder runs --sort best_val") == ["best_val_accuracy", "best_val_steps", "best_val_acc"]
    assert _offered("ponder eval -f ") == ["table", "json", "csv"]
    # zsh and fish get the same values in their own formats
    assert _offered("ponder train --method a", "zsh") == ["_arguments", "'*:", ':(("act"))\'']
    assert _offered("ponder train --method a", "fish") == ["act"]


def test_checkpoints_are_offered(tmp_path):
    run = tmp_path / "runs" / "sweep" / "pondernet-mlp-seed1"
    run.mkdir(parents=True)
    (run / "best.pt").write_bytes(b"")  # a run folder holds a checkpoint
    (tmp_path / "mine.pt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / ".hidden").mkdir()
    assert _offered("ponder eval ", cwd=tmp_path) == [*SHIPPED, "latest", "runs/sweep/pondernet-mlp-seed1",
                                                     "mine.pt", "runs/"]
    assert _offered("ponder eval parity16-e", cwd=tmp_path) == ["parity16-extrapolation", "parity16-extrapolation-act"]
    # the run, once (not again as a folder: typing its / offers what it holds)
    assert _offered("ponder predict runs/sweep/", cwd=tmp_path) == ["runs/sweep/pondernet-mlp-seed1"]
    assert _offered("ponder info runs/sweep/pondernet-mlp-seed1/", cwd=tmp_path) == \
        ["runs/sweep/pondernet-mlp-seed1/best.pt"]
    assert _offered("ponder compare reference l", cwd=tmp_path) == ["latest"]
    assert _offered("ponder train --resume m", cwd=tmp_path) == ["mine.pt"]
    # --resume refuses a shipped model: none is offered there, as after --init-from they are
    assert _offered("ponder train --resume ", cwd=tmp_path) == ["latest", "runs/sweep/pondernet-mlp-seed1",
                                                               "mine.pt", "runs/"]
    assert _offered("ponder train --init-from al", cwd=tmp_path) == ["align"]
    assert _offered("ponder diff runs/sweep/pondernet-mlp-seed1 al", cwd=tmp_path) == ["align"]
    assert _offered("ponder train --init-from l", cwd=tmp_path) == ["latest"]


def test_runs_rm_offers_the_runs_and_restore_the_trashed_ones(tmp_path):
    """`runs rm` offers run folders (never a shipped model: they are not runs to remove); with
    --restore the path each trashed run had, as `ponder runs rm --restore` takes it."""
    for run in ("runs/a", "runs/sweep/b", "mine"):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "last.pt").write_bytes(b"")
    entry = tmp_path / "runs" / ".trash" / "old.20261128T090000Z"
    (entry / "run").mkdir(parents=True)
    (entry / "trashed.json").write_text(json.dumps({"original": str(tmp_path / "runs" / "old"), "removed": "x"}))
    assert _offered("ponder runs rm ", cwd=tmp_path) == ["runs/a", "runs/sweep/b", "mine", "runs/"]
    assert _offered("ponder runs rm runs/s", cwd=tmp_path) == ["runs/sweep/b", "runs/sweep/"]
    assert _offered("ponder runs rm --restore ", cwd=tmp_path) == ["runs/old"]


def test_hidden_options_are_completed_once_their_name_is_begun():
    assert _offered("ponder train --halting-ta") == ["--halting-target"]
    assert set(_offered("ponder train --halting-t")) == {"--halting-target", "--halting-threshold"}
    assert "--cuda-graphs" in _offered("ponder train --cuda")
    assert "--halting-target" not in _offered("ponder train --")  # the bare list stays --help's


def test_zsh_adds_no_space_after_a_rules_prefix_or_a_folder(tmp_path):
    """zsh: whole words through _arguments, as Typer answers; a prefix (`threshold:`) or a folder
    (`runs/`) with compadd -S '' (no space after it)."""
    assert _offered("ponder eval --halting thr", "zsh") == ["compadd", "-S", "''", "--", "'threshold:'"]
    both = _offered("ponder eval --halting ", "zsh")
    assert both[:2] == ["_arguments", "'*:"] and '"sample"' in " ".join(both)
    assert " ".join(both).endswith("compadd -S '' -- 'quantile:' 'patience:' 'confidence:' 'threshold:' 'fixed:'")
    (tmp_path / "runs").mkdir()
    assert _offered("ponder eval ru", "zsh", cwd=tmp_path) == ["compadd", "-S", "''", "--", "'runs/'"]


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_bash_adds_no_space_after_a_rules_prefix_or_a_folder(tmp_path):
    """The script `--show-completion bash` prints, run by bash as Tab runs it (compopt, which only
    works inside a real completion, stood in for): one reply that is a prefix or a folder asks for
    no space; a whole word leaves bash's space."""
    script = tmp_path / "ponder.sh"
    script.write_text(_run("--show-completion", "bash").stdout)
    program = tmp_path / "ponder"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from ponder_cli.cli import run; run()" "$@"\n')
    program.chmod(0o755)
    (tmp_path / "runs").mkdir()

    def tab(*words):
        shell = (f"source {script}; compopt() {{ echo \"compopt $*\"; }}; COMP_WORDS=({' '.join(words)}); "
                 f"COMP_CWORD={len(words) - 1}; _ponder_completion {program}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        done = subprocess.run(["bash", "--norc", "-c", shell], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert tab("ponder", "eval", "--halting", "thr") == ["compopt", "-o", "nospace", "threshold:"]
    assert tab("ponder", "eval", "--halting", "med") == ["median"]
    assert tab("ponder", "eval", "ru") == ["compopt", "-o", "nospace", "runs/"]


def test_completion_loads_no_torch(tmp_path):
    """A shell asks at every Tab: a CHECKPOINT, --sort and --method complete without torch."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))))\n"
            "from ponder_cli.cli import run\n"
            "run()")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "last.pt").write_bytes(b"")
    for line, cword in (("ponder eval ", 2), ("ponder runs --sort ", 3), ("ponder train --method ", 3),
                        ("ponder runs rm ", 3)):
        env = {**os.environ, "_PONDER_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(cword)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        *offered, loaded = done.stdout.splitlines()
        assert offered and loaded == "[]", (line, done.stdout)


@pytest.mark.parametrize("shell", ["powershell", "pwsh"])
def test_install_completion_appends_to_the_powershell_profile_and_changes_no_policy(shell, tmp_path):
    """A stand-in pwsh on PATH answers $profile and logs every call: the script goes into that
    profile once, after the user's lines, and no call touches the execution policy (Typer's own
    installer sets it to Unrestricted)."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    profile = home / ".config" / "powershell" / "Microsoft.PowerShell_profile.ps1"
    calls = tmp_path / "calls"
    fake = bin_dir / "pwsh"  # on Linux PowerShell is pwsh, whichever name was given
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\necho "{profile}"\n')
    fake.chmod(0o755)
    profile.parent.mkdir(parents=True)
    profile.write_text("Set-Alias ll Get-ChildItem")  # the user's own line, with no newline at its end
    env = {"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    first, again = (_run("--install-completion", shell, env=env) for _ in range(2))
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert first.stdout == (f"{shell} completion installed in {profile}; it takes effect in a new shell; PowerShell "
                            "must allow profile scripts (Get-ExecutionPolicy; ponder changes no policy)\n")
    assert again.stdout.startswith(f"{shell} completion already in {profile}")
    text = profile.read_text()
    assert text.startswith("Set-Alias ll Get-ChildItem\nImport-Module PSReadLine\n")
    assert text.count(MARKS["powershell"]) == 1 and text.endswith("-ScriptBlock $scriptblock\n")
    assert "ExecutionPolicy" not in calls.read_text() and calls.read_text().count("-NoProfile -Command echo") == 2


def test_install_completion_without_powershell_is_one_error_line(tmp_path):
    result = _run("--install-completion", "pwsh", env={"HOME": str(tmp_path), "PATH": str(tmp_path)})
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and len(result.stderr.splitlines()) == 1
    assert all(name in result.stderr for name in ("pwsh", "powershell", "PATH"))
    assert not any(tmp_path.iterdir())
