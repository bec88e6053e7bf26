"""Keep the console examples in README.md and docs/*.md true: run them, then check or rewrite
the output they show.

An example is a fenced block tagged `console` whose lines starting with `$ ` are commands (a
command ending in a backslash continues on the next line); the lines after a command, up to the
next one, are what it printed on stdout. A command shows stderr too only if it says so (`2>&1`),
as in a terminal. An HTML comment on the line right above the fence (invisible on GitHub) marks
the example, marks separated by `;`:

    <!-- example: slow -->          run only with --slow (training, the full test set many times);
                                    the test suite checks its commands' options, not its output
    <!-- example: fails -->         every command must exit non-zero (an error message)
    <!-- example: vary=REGEX -->    text matching REGEX may differ between runs (timings); it
                                    is kept as last written, and --check ignores it

Every command runs in bash, in a fresh empty directory (`--cwd` to choose one), with `ponder`
running this checkout's code, COLUMNS=80, unbuffered output and PONDER_DATA_DIR from the
environment or `--data-dir`. A command fails if it exits non-zero (unless marked `fails`) or
prints a Python traceback on either stream. Trailing spaces are dropped from every line.

Output is compared text for text, except that two numbers written with a decimal point or an
exponent agree when within a relative FLOAT_TOLERANCE of each other: a float32 result printed in
full (CSV, JSON) differs in its last digits between CPUs (see FLOAT_TOLERANCE). A number within
it is kept as last written by --write, so the docs do not churn between machines.

    python tools/docs_examples.py                    # check the fast examples; exit 1 on a difference
    python tools/docs_examples.py --write            # rewrite the fast examples' output in place
    python tools/docs_examples.py --write --slow     # every example, slow ones too
    python tools/docs_examples.py -k sweep --write   # only examples whose commands contain "sweep"
    python tools/docs_examples.py --list             # where the examples are, and their marks

The same module finds every `ponder` command line in the docs (console and shell blocks, inline
code) and parses it against the real CLI without running it (`parse_problem`); tests/test_docs.py
uses both.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKS = re.compile(r"^\s*<!--\s*example:(.*?)-->\s*$")
PROMPT = "$ "
TRACEBACK = "Traceback (most recent call last)"
SHELLS = {"bash", "sh", "shell", "console"}


def doc_files(root: Path = REPO) -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# Reading the docs --------------------------------------------------------------------------------

@dataclass
class Command:
    lines: list[str]  # as written, without the prompt (continuation lines included)
    shown: list[str]  # the output the doc shows

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Example:
    path: Path
    line: int  # 1-based line of the opening fence
    body: tuple[int, int]  # 0-based [start, end) of the lines between the fences
    commands: list[Command]
    slow: bool = False
    fails: bool = False
    vary: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{_relative(self.path)}:{self.line}"

    def needs_mnist(self) -> bool:
        """Whether running it reads MNIST: every ponder command but --help and --version does."""
        return any(not ({"--help", "-h", "--version"} & set(argv))
                   for command in self.commands for argv in invocations(command.text))


@dataclass
class Block:
    path: Path
    line: int
    info: str  # the fence's language tag
    lines: list[str]
    marks: str


def _relative(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(REPO))
    return str(path)


def blocks(path: Path) -> Iterator[Block]:
    """Every fenced code block of a Markdown file, with the marks comment right above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group(2)
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        marks = MARKS.match(lines[i - 1]) if i > 0 else None
        yield Block(path, i + 1, opening.group(3).lower(), lines[i + 1:end], marks.group(1) if marks else "")
        i = end + 1


def _parse_marks(text: str, where: str) -> dict:
    marks: dict = {"slow": False, "fails": False, "vary": []}
    for mark in filter(None, (m.strip() for m in text.split(";"))):
        key, _, value = mark.partition("=")
        key = key.strip()
        if key == "vary" and value:
            re.compile(value)  # a bad pattern fails here, naming itself
            marks["vary"].append(value)
        elif key in ("slow", "fails") and not value:
            marks[key] = True
        else:
            raise ValueError(f"{where}: unknown example mark {mark!r} (slow, fails, vary=REGEX)")
    return marks


def find_examples(path: Path) -> list[Example]:
    found = []
    for block in blocks(path):
        if block.info != "console" or not block.lines or not block.lines[0].startswith(PROMPT):
            continue
        commands: list[Command] = []
        continued = False
        for text in block.lines:
            if continued:
                commands[-1].lines.append(text)
            elif text.startswith(PROMPT):
                commands.append(Command([text[len(PROMPT):]], []))
            else:
                commands[-1].shown.append(text)
                continue
            continued = text.endswith("\\")
        start = block.line  # the line after the fence, 0-based
        found.append(Example(path, block.line, (start, start + len(block.lines)), commands,
                             **_parse_marks(block.marks, f"{_relative(path)}:{block.line}")))
    return found


# Which ponder commands a line of shell runs ------------------------------------------------------

_SUBSTITUTION = re.compile(r"\$\([^()]*\)")
_REDIRECT = re.compile(r"(?<![\w-])\d*(?:>>?|<)(?:&-|&\d+|\s*[^\s|;&<>]+)")
_FOR = re.compile(r"\bfor\s+(\w+)\s+in\s+([^;\n]+)")
_KEYWORDS = {"do", "then", "else", "elif", "time", "!", "{", "(", "exec", "nohup"}  # a command follows
_RESERVED = {"for", "while", "until", "if", "case", "done", "fi", "esac", "}", ")"}  # no command follows


def _segments(text: str, variables: Optional[dict[str, str]] = None) -> list[list[str]]:
    """The simple commands of a shell line, as words: split at pipes, `;`, `&&` and `||`, with
    redirections and comments dropped, `$(...)` as one word, and `$VAR` replaced from
    `variables`. Quotes are honoured, so a `|` inside a jq filter stays where it is."""
    text = text.replace("\\\n", " ")
    for name, value in (variables or {}).items():
        text = re.sub(rf"\$(?:{name}\b|\{{{name}\}})", value, text)
    text = _REDIRECT.sub(" ", _SUBSTITUTION.sub("X", text))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: not a command line
        return []
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token and set(token) <= set(";&|"):
            segments.append([])
        else:
            segments[-1].append(token)
    return [words for words in segments if words]


def programs(text: str) -> set[str]:
    """The programs a shell line runs (`ponder`, `jq`, `cut`, ...)."""
    found = set()
    for words in _segments(text):
        while words and (words[0] in _KEYWORDS or re.fullmatch(r"\w+=\S*", words[0])):
            words = words[1:]
        if words and words[0] not in _RESERVED:
            found.add(words[0])
    return found


def invocations(text: str, variables: Optional[dict[str, str]] = None) -> list[list[str]]:
    """The argument lists of the ponder commands a shell line runs (`ponder ARGS`,
    `python -m ponder_cli ARGS`, `torchrun ... -m ponder_cli ARGS`), with `$VAR` replaced from
    `variables`; commands with a variable left unresolved are left out."""
    found = []
    for words in _segments(text, variables):
        while words and (words[0] in _KEYWORDS or re.fullmatch(r"\w+=\S*", words[0])):
            words = words[1:]
        args = None
        if words[:1] == ["ponder"]:
            args = words[1:]
        elif words and words[0] in ("python", "python3", "torchrun") and "-m" in words:
            at = words.index("-m")
            if words[at + 1:at + 2] == ["ponder_cli"]:
                args = words[at + 2:]
        if args is not None and not any("$" in arg for arg in args):
            found.append(args)
    return found


@dataclass
class Invocation:
    where: str
    args: list[str]

    def __str__(self) -> str:
        return f"{self.where}: ponder {shlex.join(self.args)}"


_INLINE = re.compile(r"(?<!`)`(ponder [^`]+)`(?!`)")
_PLACEHOLDER = re.compile(r"…|\.\.\.|(?<![\w.-])[A-Z][A-Z_]*(?![\w-])")


def find_invocations(path: Path) -> list[Invocation]:
    """Every ponder command line the page shows: in console and shell blocks (a `for VAR in A B`
    loop's variable taking its first value), and in inline code that starts with `ponder `, goes
    on past the command's name and holds no placeholder (an upper-case word such as N or DIR, or
    an ellipsis)."""
    found: list[Invocation] = []
    examples = {example.line: example for example in find_examples(path)}
    for block in blocks(path):
        if block.info not in SHELLS:
            continue
        if block.line in examples:
            if examples[block.line].fails:
                continue  # it shows a refusal, perhaps of the options themselves
            texts = [command.text for command in examples[block.line].commands]
            offsets = [block.line] * len(texts)
        else:
            texts, offsets = _logical_lines(block)
        text_all = "\n".join(block.lines)
        variables = {name: values.split()[0] for name, values in _FOR.findall(text_all)}
        for text, line in zip(texts, offsets):
            for args in invocations(text, variables):
                found.append(Invocation(f"{_relative(path)}:{line}", args))
    for line, text in _prose(path):
        for match in _INLINE.finditer(text):
            span = match.group(1)
            if not _PLACEHOLDER.search(span):
                for args in invocations(span):
                    if len(args) > 1:  # `ponder compare` alone names a command; it is no command line
                        found.append(Invocation(f"{_relative(path)}:{line}", args))
    return found


def _logical_lines(block: Block) -> tuple[list[str], list[int]]:
    """A shell block's lines with backslash continuations joined, and where each starts."""
    texts, offsets, pending, start = [], [], "", 0
    for i, text in enumerate(block.lines):
        if not pending:
            start = block.line + 1 + i
        pending += text + "\n"
        if not text.endswith("\\"):
            texts.append(pending.rstrip("\n"))
            offsets.append(start)
            pending = ""
    if pending:
        texts.append(pending)
        offsets.append(start)
    return texts, offsets


@functools.lru_cache(maxsize=None)
def _cli():
    """The `ponder` command group, as Typer builds it from the app."""
    import typer.main

    from ponder_cli.cli import app

    return typer.main.get_command(app)


def parse_problem(args: list[str]) -> Optional[str]:
    """Why the real CLI would refuse these arguments while parsing them (an unknown command or
    option, a value of the wrong type or outside its choices), or None. Nothing is run: the
    commands' own checks (of angles, checkpoints, data) are left to running the examples."""
    import typer

    group = _cli()
    position = next((i for i, arg in enumerate(args) if not arg.startswith("-")), len(args))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            ctx = group.make_context("ponder", args[:position + 1])
            if position == len(args):
                return None
            command = group.get_command(ctx, args[position])
            if command is None:
                return f"no such command {args[position]!r}"
            command.make_context(args[position], args[position + 1:], parent=ctx)
        except typer.Exit:  # --help or --version: parsed, and would print and stop there
            return None
        except SystemExit as done:  # --show-completion: parsed, printed its script and stopped there
            return None if done.code in (0, None) else f"exits with status {done.code}"
        except Exception as exc:  # click's UsageError family, whose module Typer keeps private
            return exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return None


# Links ------------------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+).*?\1")


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """The page's paragraphs outside code blocks, each joined into one line, with where it starts."""
    lines = path.read_text(encoding="utf-8").splitlines()
    fenced = set()
    for block in blocks(path):
        fenced.update(range(block.line - 1, block.line + len(block.lines) + 1))
    paragraph: list[tuple[int, str]] = []
    for i, text in enumerate([*lines, ""]):
        if i < len(lines) and i not in fenced and text.strip():
            paragraph.append((i + 1, text))
        elif paragraph:
            yield paragraph[0][0], " ".join(t.strip() for _, t in paragraph)
            paragraph = []


def slugs(path: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2, ..."""
    found: set[str] = set()
    for _, text in _prose(path):
        heading = re.match(r"#{1,6}\s+(.*)", text)
        if not heading:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", words.strip().lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def broken_links(path: Path) -> list[str]:
    """Relative links and #anchors of the page that lead nowhere (web links are not followed)."""
    problems = []
    for line, text in _prose(path):
        for target in _LINK.findall(_CODE_SPAN.sub("", text)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{_relative(path)}:{line}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in slugs(linked):
                problems.append(f"{_relative(path)}:{line}: {target}: no heading with that anchor")
    return problems


# Running ------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    example: Example
    outputs: list[Optional[list[str]]]  # per command, what it printed; None where it failed
    failures: list[str]  # commands that failed (non-zero exit, a traceback, a timeout)
    differences: list[str]  # commands whose output is not what the doc shows (a diff each)

    @property
    def problems(self) -> list[str]:
        return self.failures + self.differences


def _clean(text: str, cwd: Path) -> list[str]:
    text = text.replace(f"{cwd}{os.sep}", "")
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _masked(lines: list[str], patterns: list[str]) -> list[str]:
    for pattern in patterns:
        lines = [re.sub(pattern, "…", line) for line in lines]
    return lines


# Float32 carries about 7 significant digits (6e-8 relative per operation), and the models
# compute in float32 with kernels that differ between instruction sets (AVX2, AVX-512 sum in
# other orders), so a probability printed to 16 digits may differ from the 7th on: 0.9998444318771362
# on one CPU is 0.9998443126678467 on another. A figure rounded for reading (0.9890, 5.84) or a
# count is still compared exactly in effect: any change of it is far larger than this.
FLOAT_TOLERANCE = 1e-6
_NUMBER = re.compile(r"([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)")


def _same_number(shown: str, printed: str) -> bool:
    if shown == printed:
        return True
    if not any(c in text for text in (shown, printed) for c in ".eE"):
        return False  # integers (counts, seeds, steps) must match exactly
    return math.isclose(float(shown), float(printed), rel_tol=FLOAT_TOLERANCE, abs_tol=0.0)


def _same_line(shown: str, printed: str) -> bool:
    """The same text around the same numbers, floats within FLOAT_TOLERANCE."""
    if shown == printed:
        return True
    shown_parts, printed_parts = _NUMBER.split(shown), _NUMBER.split(printed)
    # re.split with a group: text at even positions, numbers at odd ones
    return len(shown_parts) == len(printed_parts) and all(
        a == b if i % 2 == 0 else _same_number(a, b) for i, (a, b) in enumerate(zip(shown_parts, printed_parts)))


def agrees(shown: list[str], printed: list[str], vary: list[str]) -> bool:
    """Whether a command printed what the doc shows: text marked as varying masked, floats
    within FLOAT_TOLERANCE."""
    shown, printed = _masked(shown, vary), _masked(printed, vary)
    return len(shown) == len(printed) and all(_same_line(a, b) for a, b in zip(shown, printed))


@contextlib.contextmanager
def _environment(data_dir: Optional[str]) -> Iterator[dict]:
    """The commands' environment: `ponder` and `python` are this interpreter running this
    checkout; a fixed terminal width; no colour."""
    with tempfile.TemporaryDirectory(prefix="ponder-docs-bin-") as bin_dir:
        shim = Path(bin_dir) / "ponder"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ponder_cli "$@"\n')
        shim.chmod(0o755)
        env = {key: value for key, value in os.environ.items()
               if key not in ("FORCE_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
        env.update(PATH=os.pathsep.join([bin_dir, str(Path(sys.executable).parent), env.get("PATH", "")]),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                   COLUMNS="80", LINES="50", NO_COLOR="1", PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
        if data_dir:
            env["PONDER_DATA_DIR"] = str(data_dir)
        yield env


def run_example(example: Example, *, data_dir: Optional[str] = None, cwd: Optional[Path] = None,
                timeout: Optional[float] = None) -> Outcome:
    """Run the example's commands one after another in one directory; compare what they print
    with what the doc shows."""
    outcome = Outcome(example, [], [], [])
    with _environment(data_dir) as env, contextlib.ExitStack() as stack:
        if cwd is None:
            # A scratch folder that looks like a clone's root: ponder_cli/ in it (a link to this
            # checkout's package) comes first on the path, so the shipped models print as
            # ponder_cli/checkpoints/... on every machine, as they do from a clone's root.
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ponder-docs-")))
            (where / "ponder_cli").symlink_to(REPO / "ponder_cli", target_is_directory=True)
            env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH")]))}
        else:
            where = cwd
        for command in example.commands:
            try:
                done = subprocess.run(["bash", "-o", "pipefail", "-c", command.text], cwd=where, env=env,
                                      capture_output=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                outcome.outputs.append(None)
                outcome.failures.append(f"$ {command.text}\n  did not finish within {timeout:g} s")
                continue
            stdout = done.stdout.decode("utf-8", "replace")
            stderr = done.stderr.decode("utf-8", "replace")
            traceback = TRACEBACK in stdout or TRACEBACK in stderr
            if traceback or (done.returncode == 0) == example.fails:
                why = "succeeded, but the example is marked fails" if done.returncode == 0 else \
                    f"exited {done.returncode}"
                tail = "\n".join("  | " + line for line in (stderr or stdout).rstrip().splitlines()[-15:])
                outcome.outputs.append(None)
                outcome.failures.append(f"$ {command.text}\n  {why}{' with a traceback' if traceback else ''}\n{tail}")
                continue
            output = _clean(stdout, where)
            outcome.outputs.append(output)
            if not agrees(command.shown, output, example.vary):
                diff = difflib.unified_diff(command.shown, output, "shown", "printed now", lineterm="", n=1)
                outcome.differences.append(f"$ {command.text}\n" + "\n".join("  " + line for line in diff))
    return outcome


def rewrite(path: Path, outcomes: list[Outcome]) -> bool:
    """Put each example's fresh output under its commands; a command that failed keeps what the
    doc shows, and so does one whose output agrees with it (differs only in text marked as
    varying or in floats within FLOAT_TOLERANCE). Returns whether the file changed."""
    original = path.read_text(encoding="utf-8")
    lines = original.splitlines()
    for outcome in sorted(outcomes, key=lambda o: o.example.body[0], reverse=True):
        body = []
        for command, output in zip(outcome.example.commands, outcome.outputs):
            if output is None or agrees(command.shown, output, outcome.example.vary):
                output = command.shown
            body += [PROMPT + command.lines[0], *command.lines[1:], *output]
        start, end = outcome.example.body
        lines[start:end] = body
    text = "\n".join(lines) + "\n"
    if text == original:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See docs/development.md, 'Examples that stay true'.")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="report differences, exit 1 if any (the default)")
    action.add_argument("--write", action="store_true", help="rewrite the examples' output in place")
    action.add_argument("--list", action="store_true", help="list the examples and their marks, run nothing")
    parser.add_argument("--slow", action="store_true", help="also run the examples marked slow")
    parser.add_argument("-k", dest="only", metavar="TEXT",
                        help="only examples whose commands contain TEXT (or whose file:line does)")
    parser.add_argument("--data-dir", default=os.environ.get("PONDER_DATA_DIR"),
                        help="MNIST for the commands (PONDER_DATA_DIR) [default: $PONDER_DATA_DIR]")
    parser.add_argument("--cwd", type=Path, help="run every example in this directory [default: a fresh empty "
                                                 "one per example]")
    parser.add_argument("--timeout", type=float, help="seconds a command may take")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files [default: README.md docs/*.md]")
    args = parser.parse_args(argv)

    files = args.files or doc_files()
    chosen = []
    for path in files:
        for example in find_examples(path):
            if args.only and not any(args.only in c.text for c in example.commands) and args.only not in example.where:
                continue
            chosen.append(example)
    if args.list:
        for example in chosen:
            marks = [m for m in ("slow", "fails") if getattr(example, m)] + [f"vary={v}" for v in example.vary]
            print(f"{example.where}  [{', '.join(marks) or 'fast'}]")
            for command in example.commands:
                print(f"    $ {command.lines[0]}{' …' if len(command.lines) > 1 else ''}")
        return 0
    if not args.data_dir and any(e.needs_mnist() for e in chosen):
        print("note: neither --data-dir nor PONDER_DATA_DIR is set: MNIST will be downloaded", file=sys.stderr)

    # The cheap checks first: every command line parses, every link resolves.
    static = [f"{invocation}: {problem}" for path in files for invocation in find_invocations(path)
              if (problem := parse_problem(invocation.args))]
    static += [problem for path in files for problem in broken_links(path)]
    for problem in static:
        print(problem, file=sys.stderr)

    by_file: dict[Path, list[Outcome]] = {}
    skipped = 0
    for example in chosen:
        if example.slow and not args.slow:
            skipped += 1
            continue
        print(f"{example.where}: $ {example.commands[0].lines[0]}", file=sys.stderr, flush=True)
        outcome = run_example(example, data_dir=args.data_dir, cwd=args.cwd, timeout=args.timeout)
        by_file.setdefault(example.path, []).append(outcome)
        for problem in outcome.problems:
            print(problem, file=sys.stderr)
    outcomes = [o for found in by_file.values() for o in found]
    failures = sum(len(o.failures) for o in outcomes)
    differences = sum(len(o.differences) for o in outcomes)
    if args.write:
        for path, found in by_file.items():
            if rewrite(path, found):
                print(f"rewrote {_relative(path)}", file=sys.stderr)
    print(f"{len(outcomes)} examples run ({skipped} slow ones skipped: --slow runs them); {failures} commands "
          f"failed, {differences} {'rewritten' if args.write else 'differ'}; {len(static)} command lines that do "
          f"not parse or links that lead nowhere", file=sys.stderr)
    # With --write a difference is fixed, not a failure; a command that fails still is one.
    return 1 if failures or static or (differences and not args.write) else 0


if __name__ == "__main__":
    sys.exit(main())
