"""A narrow terminal (COLUMNS=40): tables wrap at spaces only, never inside a name or a figure,
and no line ends in a sign cut off from its figure; a table whose unbreakable pieces are wider
than the terminal is printed wider, whole, for the terminal to wrap."""

import json
import re
import shutil

import pytest

from ponder_cli.render import wrap_text


def test_wrap_text_binds_signs_to_their_figures_and_separators_to_their_words():
    assert wrap_text("5.91 ± 3.53", 7) == "5.91\n± 3.53"
    assert wrap_text("5.76 / 13.50", 8) == "5.76\n/ 13.50"
    assert wrap_text("pondernet · step mlp · trained", 12) == "pondernet ·\nstep mlp ·\ntrained"
    path = "runs/pondernet-mlp-seed1234-2/best.pt"
    assert wrap_text(f"on the test set ({path})", 10) == f"on the\ntest set\n({path})"  # whole, wider than 10
    assert wrap_text("a b\nc d", 3) == "a b\nc d"


def _lines(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def _cells(lines: list[str]) -> list[str]:
    """Every table cell's lines, and every other line, stripped of borders and padding."""
    return [cell.strip() for line in lines for cell in re.split(r"[│┃]", line) if cell.strip()]


@pytest.fixture
def narrow(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")


def test_an_evaluation_at_40_columns_keeps_every_figure_and_the_path_whole(narrow, checkpoint, tiny_mnist, ponder):
    args = ("extrapolate", checkpoint, "--limit", "60", "--angles", "45", "90", "--data-dir", tiny_mnist)
    lines = _lines(ponder(*args))
    data = json.loads(ponder(*args, "-f", "json").stdout)
    text = "\n".join(lines)
    assert f"({checkpoint})" in lines  # the title's path on a line of its own, whole
    cells = _cells(lines)
    for bucket in data["buckets"]:
        low, high = bucket["accuracy_wilson"]
        assert f"±{(high - low) / 2:.4f}" in cells and f"{bucket['accuracy']:.4f}" in cells
        assert f"{bucket['mean_steps']:.2f}" in cells and f"± {bucket['std_steps']:.2f}" in cells
        assert f"{bucket['steps_correct']:.2f}" in cells and f"/ {bucket['steps_wrong']:.2f}" in cells
    assert not any(cell.endswith(("±", "/")) for cell in cells), text
    assert not any(line.lstrip().startswith("·") for line in lines), text  # a list wraps after its separator


def test_runs_and_compare_at_40_columns_never_split_a_name(narrow, runs, tiny_mnist, ponder, tmp_path):
    name = "a-run-folder-named-at-length-seed-1"  # 35 characters: wider than its column could be
    shutil.copytree(runs / "pn1", tmp_path / name)
    listed = _lines(ponder("runs", tmp_path))
    assert name in _cells(listed), "\n".join(listed)
    assert max(len(line) for line in listed) > 40  # wider than the terminal rather than a name broken
    compared = _lines(ponder("compare", runs / "pn1", runs / "act", "--limit", "40", "--angles", "45",
                             "--data-dir", tiny_mnist))
    cells = _cells(compared)
    assert "pondernet" in cells and "act" in cells
    assert not any(cell.endswith(("±", "/")) for cell in cells)
    assert "accuracy and steps: one checkpoint per method" in " ".join(" ".join(compared).split())
