"""The docs stay true: every `ponder` command line in README.md and docs/*.md parses against the
real CLI, every console example not marked slow prints what it shows (floats printed in full
within docs_examples.FLOAT_TOLERANCE, whatever the CPU), every link resolves, the architecture
page's step function plugs in, and the README stays short.

tools/docs_examples.py regenerates the examples (`--write`); see docs/development.md.
"""

import importlib.util
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ponder_cli
from ponder_cli.config import PonderConfig
from ponder_cli.model import PonderNet, Sample, halting_steps

REPO = Path(__file__).resolve().parent.parent


def _load_tool():
    spec = importlib.util.spec_from_file_location("docs_examples", REPO / "tools" / "docs_examples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


docs = _load_tool()
PAGES = docs.doc_files(REPO)
EXAMPLES = [example for page in PAGES for example in docs.find_examples(page)]
DATA_DIR = os.environ.get("PONDER_DATA_DIR")
HAVE_MNIST = bool(DATA_DIR) and (Path(DATA_DIR) / "MNIST" / "raw" / "t10k-images-idx3-ubyte").exists()
REGENERATE = "if the change is intended: python tools/docs_examples.py --write (see docs/development.md)"


def test_the_docs_are_a_short_readme_and_pages_by_topic():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    names = {page.name for page in PAGES}
    assert {"commands.md", "cli-reference.md", "mnist-results.md", "align.md", "architecture.md",
            "development.md"} <= names


# Every command line parses --------------------------------------------------------------------

def test_every_documented_ponder_command_parses():
    invocations = [invocation for page in PAGES for invocation in docs.find_invocations(page)]
    # The docs show every command, many times over: an extraction that found nothing must fail.
    assert {invocation.args[0] for invocation in invocations if invocation.args} >= \
        {"train", "eval", "extrapolate", "sweep", "compare"}
    assert len(invocations) >= 40
    problems = [f"{invocation}: {problem}" for invocation in invocations
                if (problem := docs.parse_problem(invocation.args))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("args,complaint", [
    (["train", "--bogus"], "--bogus"),
    (["eval", "--halting", "nope"], "nope"),
    (["train", "--epochs", "x"], "--epochs"),
    (["sweep", "--repeats", "0"], "--repeats"),
    (["evaluate"], "evaluate"),
    (["--bogus"], "--bogus"),
])
def test_parse_problem_names_what_the_cli_refuses(args, complaint):
    problem = docs.parse_problem(args)
    assert problem is not None and complaint in problem


@pytest.mark.parametrize("args", [
    ["extrapolate", "--angles", "22.5", "45", "align"],  # the angle list ends at the checkpoint
    ["compare", "a.pt", "b.pt", "--angles=45", "90", "-f", "csv"],
    ["train", "--step", "align", "--method", "act", "--halting-bias", "-2"],
    ["--version"],
    ["train", "--help"],
])
def test_parse_problem_accepts_what_the_cli_accepts(args):
    assert docs.parse_problem(args) is None


@pytest.mark.parametrize("line,variables,expected", [
    ("ponder eval --format csv | cut -d, -f1,3", {}, [["eval", "--format", "csv"]]),
    ("for s in 1 2; do ponder train --seed $s > runs/$s.log 2>&1; done", {"s": "1"},
     [["train", "--seed", "1"]]),
    ("OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 -m ponder_cli train --device cpu", {},
     [["train", "--device", "cpu"]]),
    ("ponder extrapolate $f --angles 0 90 -f json > $(dirname $f).json", {"f": "runs/a/best.pt"},
     [["extrapolate", "runs/a/best.pt", "--angles", "0", "90", "-f", "json"]]),
    ("ponder train --method \"$0\" --seed 1", {}, []),  # a variable nobody sets: not checked
    ("ponder eval >&- && python -m ponder_cli sweep --every 30 # a comment", {},
     [["eval"], ["sweep", "--every", "30"]]),
    ("pip install -e '.[test]'", {}, []),
])
def test_invocations_are_read_as_the_shell_reads_them(line, variables, expected):
    assert docs.invocations(line, variables) == expected


@pytest.mark.parametrize("line,expected", [
    ("ponder extrapolate -f json | jq '.buckets |= map({rotation})'", {"ponder", "jq"}),  # | inside quotes
    ("for s in 1 2; do OMP_NUM_THREADS=1 ponder train --seed $s; done", {"ponder"}),
    ("ponder eval -f csv | cut -d, -f1 && ls runs", {"ponder", "cut", "ls"}),
])
def test_programs_are_the_first_words_of_each_command(line, expected):
    assert docs.programs(line) == expected


# Every fast example prints what it shows -----------------------------------------------------

# Each starts `ponder` afresh (torch's start-up, ~1.7 s a command): `python tools/docs_examples.py
# --check` runs them, as .ci/run does under three instruction sets; the suite leaves them out
# unless asked (-m docs_examples).
@pytest.mark.parametrize("example", [pytest.param(e, marks=[pytest.mark.docs_examples,
                                                            *([pytest.mark.mnist] if e.needs_mnist() else [])])
                                     for e in EXAMPLES if not e.slow], ids=lambda e: e.where)
def test_fast_example_prints_what_it_shows(example):
    if example.needs_mnist() and not HAVE_MNIST:
        pytest.skip("real MNIST not found under $PONDER_DATA_DIR")
    missing = sorted(program for command in example.commands for program in docs.programs(command.text)
                     if program != "ponder" and shutil.which(program) is None)
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    outcome = docs.run_example(example, data_dir=DATA_DIR, timeout=300)
    assert not outcome.problems, "\n".join([*outcome.problems, REGENERATE])


def test_fast_examples_stay_cheap():
    """The suite runs every example not marked slow, so each stays cheap: a --limit, --help,
    --version or --print-config, predict on a few files, info or models (no test set read), a
    command that is not ponder's, or a refusal."""
    for example in EXAMPLES:
        if example.slow or example.fails:
            continue
        for command in example.commands:
            words = command.text.split()
            cheap = words[0] != "ponder" or words[1:2] in (["predict"], ["info"], ["models"])
            assert cheap or any(flag in command.text for flag in ("--limit", "--help", "--version", "--print-config")), \
                f"{example.where}: $ {command.text}: a fast example runs on at most --limit images"


def test_check_reports_a_stale_example_and_write_fixes_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        # A page

        ```console
        $ ponder --version
        ponder_cli 0.0.1
        ```

        <!-- example: vary=\\d+ s -->
        ```console
        $ echo "took 12 s"
        took 13 s
        ```

        <!-- example: fails -->
        ```console
        $ ponder --bogus 2>&1
        ```
        """), encoding="utf-8")
    assert docs.main(["--check", str(page)]) == 1
    assert docs.main(["--write", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert f"$ ponder --version\nponder_cli {ponder_cli.__version__}\n```" in text
    assert "$ echo \"took 12 s\"\ntook 13 s\n```" in text  # only the varying part differed: kept
    assert "\nError: No such option: --bogus\n```" in text  # the refusal, through 2>&1
    assert docs.main(["--check", str(page)]) == 0


@pytest.mark.parametrize("shown,printed,same", [
    # a float32 probability printed in full, on an AVX2 and on an AVX-512 CPU: 1.2e-7 apart
    ("7,0.9998444318771362,2", "7,0.9998443126678467,2", True),
    ("7,0.9998444318771362,2", "7,0.9998474318771362,2", False),  # 3e-6 relative: more than float32 rounding
    ("│ 22.5 │   0.9890 │ 5.84  │", "│ 22.5 │   0.9891 │ 5.84  │", False),  # a rounded figure: exact
    ("images: 1000", "images: 1001", False),  # a count: exact
    ("rho = +0.415 over 4000 images", "rho = +0.415 over 4000 image", False),  # the text around: exact
    ("2.5e-07 and 3", "2.5000001e-07 and 3", True),
])
def test_floats_agree_within_the_tolerance_and_nothing_else_does(shown, printed, same):
    assert docs.agrees([shown], [printed], []) is same


def test_write_keeps_a_float_within_the_tolerance_as_written(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```console\n$ echo 0.9998443126678467\n0.9998444318771362\n```\n", encoding="utf-8")
    before = page.read_text(encoding="utf-8")
    assert docs.main(["--check", str(page)]) == 0
    assert docs.main(["--write", str(page)]) == 0 and page.read_text(encoding="utf-8") == before


def test_a_failing_command_is_reported_and_left_as_shown(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```console\n$ ponder --bogus\nwhat the doc said\n```\n", encoding="utf-8")
    before = page.read_text(encoding="utf-8")
    assert docs.main(["--write", str(page)]) == 1
    assert page.read_text(encoding="utf-8") == before
    (example,) = docs.find_examples(page)
    (problem,) = docs.run_example(example).failures
    assert "exited 2" in problem and "No such option: --bogus" in problem


# Links and the architecture page ---------------------------------------------------------------

def test_every_link_between_the_pages_resolves():
    problems = [problem for page in PAGES for problem in docs.broken_links(page)]
    assert not problems, "\n".join(problems)


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nSee [it](other.md#a-code-heading-with-punctuation), [that](#page),\n"
                    "[gone](missing.md), [nowhere](other.md#no-such-heading) and\n[web](https://example.org/x).\n",
                    encoding="utf-8")
    problems = docs.broken_links(page)
    assert len(problems) == 2
    assert "missing.md: no such file" in problems[0] and "other.md#no-such-heading" in problems[1]


def test_the_architecture_pages_step_function_plugs_in(monkeypatch):
    """The step function that docs/architecture.md shows, registered as it says, drives the
    model, early exit included."""
    blocks = [block for block in docs.blocks(REPO / "docs" / "architecture.md") if block.info == "python"]
    code = next("\n".join(block.lines) for block in blocks if "(StepFunction)" in "\n".join(block.lines))
    module = type(sys)("docs_architecture_step")
    exec(compile(code, "docs/architecture.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    (name,) = [n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__]
    from ponder_cli import registry
    monkeypatch.setitem(registry.STEPS, "docs", f"{module.__name__}:{name}")

    model = PonderNet(PonderConfig.of(step="docs", max_steps=4), classes=10, input_shape=(1, 28, 28)).eval()
    x = torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    out = model(x)
    assert out.logits.shape == (4, 6, 10)
    uniforms = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))
    _, steps = model.infer(x, Sample(uniforms))
    assert torch.equal(steps, halting_steps(Sample(uniforms), None, out.lambda_logits)[0])


def test_the_readmes_claims_about_every_commands_options_hold():
    """"Every command takes `--format ...` and `--quiet`; every command that ..., all but `info`
    and `models`, takes `--device`; ...": checked against the real CLI, both ways."""
    import re

    import typer.main

    from ponder_cli.cli import app

    commands = typer.main.get_command(app).commands

    def flags(command) -> set:  # a group of commands (runs, runs rm): what each of them takes
        if hasattr(command, "commands"):
            return set.intersection(*(flags(sub) for sub in command.commands.values()))
        return {flag for param in command.params for flag in param.opts}
    options = {name: flags(command) for name, command in commands.items()}
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    every = re.search(r"Every command takes (.*?);", text)
    assert every, "the README no longer says what every command takes"
    for flag in re.findall(r"`(--[\w-]+)", every.group(1)):
        assert all(flag in flags for flags in options.values()), flag
    exceptions = re.findall(r"all but ((?:`\w+`(?:, | and )?)+), takes `(--[\w-]+)`", text)
    assert {flag for _, flag in exceptions} == {"--device", "--data-dir"}
    for names, flag in exceptions:
        left_out = set(re.findall(r"`(\w+)`", names))
        assert left_out <= set(commands)
        assert {name for name, flags in options.items() if flag not in flags} == left_out, flag


def test_the_command_reference_covers_every_command():
    import typer.main

    from ponder_cli.cli import app

    reference = (REPO / "docs" / "cli-reference.md").read_text(encoding="utf-8")
    missing = [name for name in typer.main.get_command(app).commands if f"$ ponder {name} --help\n" not in reference]
    assert not missing, f"docs/cli-reference.md has no --help of {missing}; {REGENERATE}"
