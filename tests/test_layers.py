"""The package's layers are enforced, not described: .importlinter's contracts hold (a handful
of layers; what the command line reads first imports no torch), and `ponder --help` starts
without torch."""

import subprocess
import sys
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]


def test_the_layers_contract_holds():
    assert lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True) == 0


def test_the_command_line_starts_without_torch():
    probe = "import sys, ponder_cli.cli; print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_architecture_page_shows_the_layers_the_contract_enforces():
    contract = (ROOT / ".importlinter").read_text(encoding="utf-8").split("layers =\n", 1)[1].split("\n\n")[0]
    layers = [line.strip() for line in contract.splitlines() if line.strip()]
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "```\n" + "\n".join(layers) + "\n```" in page
