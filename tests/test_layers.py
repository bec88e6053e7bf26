"""The package's layers are enforced, not described: .importlinter's contract holds, and no
import is hidden inside a function to dodge it."""

import ast
import subprocess
import sys
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ponder_cli"

# Imports that run inside a function on purpose, each for start-up time or an optional extra:
# (importing module, imported module) -> why
DEFERRED = {
    ("cli.app", "api"): "the commands' work loads torch; `ponder --help` and a mistyped option must not",
    ("cli.train", "api"): "the same: the work, and torch, only once the command runs",
    ("cli.evaluation", "api"): "the same",
    ("cli.inspection", "api"): "the same",
    ("cli.inspection", "plot"): "matplotlib only when --plot is given",
    ("cli.inspection", "catalogue"): "`ponder models` reads checkpoints, so loads torch",
    ("cli.app", "plot"): "matplotlib only when --plot is given",
    ("cli.app", "render"): "rich's tables only once a report is rendered",
    ("cli.app", "distributed"): "torchrun plumbing only at the error boundary, under torchrun",
    ("cli_options", "config"): "every piece (so torch) loads only when --help asks for implied values",
    ("api.training", "tensorboard_log"): "the tensorboard extra is optional",
    ("api.run_folder", "tensorboard_log"): "the tensorboard extra is optional",
}


def test_the_layers_contract_holds():
    assert lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True) == 0


def deferred_imports(path: Path) -> list[tuple[str, int]]:
    """(imported module relative to the package, line) for every package import inside a function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.relative_to(PACKAGE).with_suffix("").parts[:-1]
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                if node.module:
                    found.append((".".join([*base, *node.module.split(".")]), node.lineno))
                else:  # from .. import distributed: each name is a module (or the package's own name)
                    found += [(".".join([*base, alias.name]), node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ponder_cli"):
                found.append((node.module.removeprefix("ponder_cli."), node.lineno))
    return found


def test_no_import_hides_inside_a_function_but_the_listed_ones():
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for module, line in deferred_imports(path):
            if (importer, module) not in DEFERRED:
                hidden.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert hidden == []


def test_the_deferred_imports_keep_torch_out_of_the_command_line_start_up():
    probe = "import sys, ponder_cli.cli; print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_architecture_page_shows_the_layers_the_contract_enforces():
    contract = (ROOT / ".importlinter").read_text(encoding="utf-8").split("layers =\n", 1)[1]
    layers = [line.strip() for line in contract.splitlines() if line.strip()]
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "```\n" + "\n".join(layers) + "\n```" in page
