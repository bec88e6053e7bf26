"""Every script that makes a doc's figures (tools/figures/, listed in its README.md) runs end to
end at a tiny size, so that none rots between the times its figures are remade."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.tasks.mnist import split_seed

FIGURES = Path(__file__).resolve().parent.parent / "tools" / "figures"


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"figures_{name}", FIGURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_names_every_script_and_every_script_names_its_doc():
    readme = (FIGURES / "README.md").read_text()
    docs = Path(__file__).resolve().parent.parent / "docs"
    for path in sorted(FIGURES.glob("*.py")):
        assert f"`{path.name}`" in readme, path.name
        # the doc it feeds names it, with the command that remakes its figures
        assert any(f"tools/figures/{path.name}" in doc.read_text() for doc in docs.glob("*.md")), path.name


def test_halting_study_tabulates_draws_with_their_standard_error(runs, tiny_mnist, capsys):
    script("halting_study").main([f"pn={runs / 'pn1'}", "--angles", "45", "90", "--limit", "40", "--draws", "2",
                                  "--data-dir", str(tiny_mnist)])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| pn |")]
    assert len(rows) == 3 and "± the standard error over draws: pn: 1 checkpoint(s) ± SE over draws" in out
    assert "best fixed ≤ steps | adapting − best fixed" in out and "seeds 1234–1235" in out
    cells = rows[0].split(" | ")
    assert " ±" in cells[2] and cells[1] == "45"  # accuracy: a mean over two draws, with its SE


def test_halting_study_averages_seeds_with_their_interval(runs, tiny_mnist, capsys, tmp_path):
    script("halting_study").main([f"two={runs / 'pn1'},{runs / 'pn2'}", "--angles", "90", "--limit", "40",
                                  "--data-dir", str(tiny_mnist), "--json", str(tmp_path / "raw.json")])
    out = capsys.readouterr().out
    assert "two: 2 checkpoint(s)." in out and "Evaluation seed 1234," in out
    raw = json.loads((tmp_path / "raw.json").read_text())["two"]
    assert len(raw) == 2 and all(len(draws) == 1 for draws in raw.values())
    figures = next(iter(raw.values()))[0]
    assert figures["adapting"][0] == pytest.approx(figures["accuracy"][0] - figures["budget"][0])


def test_exit_rules_runs_every_rule_on_a_checkpoint(runs, tiny_mnist, capsys):
    script("exit_rules").main([str(runs / "pn1"), "--angles", "0", "90", "--rules", "median", "patience:1",
                               "--limit", "40", "--data-dir", str(tiny_mnist), "-f", "json"])
    report = json.loads(capsys.readouterr().out)
    assert [(b["rotation"], b["halting"]) for b in report["buckets"]] == [
        (0, "median"), (0, "patience:1"), (90, "median"), (90, "patience:1")]
    assert all(b["images"] == 40 and 1 <= b["mean_steps"] <= 5 for b in report["buckets"])


def test_results_table_prints_a_table_per_rule(runs, tiny_mnist, capsys):
    script("results_table").main([str(runs / "pn1"), "--angles", "45", "--protocols", "uniform", "fixed",
                                  "--halting", "median", "--limit", "40", "--data-dir", str(tiny_mnist)])
    lines = capsys.readouterr().out.splitlines()
    assert "halting `median`:" in lines and sum(line.startswith(("| uniform |", "| fixed |")) for line in lines) == 2


def test_align_targets_reads_reports_that_ponder_writes(runs, tiny_mnist, ponder, tmp_path, capsys):
    result = ponder("extrapolate", runs / "pn1", "--angles", "0", "22.5", "45", "67.5", "90", "--protocol", "fixed",
                    "--halting", "median", "--detail", "--limit", "40", "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    (tmp_path / "fixed.json").write_text(result.stdout)
    script("align_targets").main([str(tmp_path / "fixed.json")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| model | acc ±45°") and lines[2].startswith("| pn1, median |")


def test_align_cycle_runs_on_the_shipped_align_model(tiny_mnist, capsys):
    script("align_cycle").main(["--limit", "6", "--data-dir", str(tiny_mnist)])
    assert torch.is_grad_enabled()  # the process's grad mode is left as it was
    out = capsys.readouterr().out
    assert "the first 6 test digits" in out
    assert all(f"{n}. " in out for n in (1, 2, 3, 4))  # its four tables


def test_answer_halting_chooses_a_threshold_on_the_digits_a_refit_body_never_trained_on(runs, tiny_mnist, ponder,
                                                                                      tmp_path, capsys):
    # a refit of pn1 (seed 1) with its own seed: its validation digits are pn1's held-out ones
    result = ponder("train", "--init-from", runs / "pn1", "--refit-halting", "--halting-target", "final",
                    "--halting-input", "state+answer", "--truncation", "0", "--seed", "7", "--train-size", "128",
                    "--epochs", "1", "--data-dir", tiny_mnist, "--out", tmp_path / "refit")
    assert result.exit_code == 0, result.output
    answer_halting = script("answer_halting")
    refit = load_checkpoint(tmp_path / "refit" / "last.pt").config
    assert split_seed(answer_halting.validation_task(refit, tmp_path / "refit" / "last.pt").cfg) == 1
    answer_halting.main([f"refit={tmp_path / 'refit' / 'last.pt'}", "--limit", "40", "--repeats", "2",
                         "--resamples", "2", "--tolerance", "0.5", "--data-dir", str(tiny_mnist),
                         "--json", str(tmp_path / "raw.json")])
    out = capsys.readouterr().out
    run = json.loads((tmp_path / "raw.json").read_text())["refit"][0]
    assert run["rule"].startswith("threshold:") and len(run["resampled"]) == 2
    assert len(run["figures"]["accuracy"]) == 4 and len(run["figures"]["gap90_draws"]) == 2  # four buckets, two draws
    assert run["figures"]["adapting"][3] == pytest.approx(run["figures"]["accuracy"][3] - run["figures"]["budget"][3])
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ")]
    assert "### refit" in out and rows == ["| ±deg", "| 22.5", "| 45", "| 67.5", "| 90"]


def test_risk_study_tests_each_calibrated_rule_as_extrapolate_does(runs, tiny_mnist, capsys, tmp_path):
    from ponder_cli.api import EvalOptions, evaluate_checkpoint
    risk_study = script("risk_study")
    risk_study.main([f"pn={runs / 'pn1'}", "--control", f"own={runs / 'pn1'}", "--draws", "2", "--draws-upright", "1",
                     "--max-loss", "0.5", "--risk", "0.5", "--limit", "40", "--data-dir", str(tiny_mnist),
                     "--json", str(tmp_path / "raw.json")])
    out = capsys.readouterr().out
    raw = json.loads((tmp_path / "raw.json").read_text())
    at90, upright = raw["heads"]["pn"]["90"][0], raw["heads"]["pn"]["22.5"][0]
    assert [draw["seed"] for draw in at90] == [1, 2] and [draw["seed"] for draw in upright] == [1]
    draw = at90[1]
    rule = draw["calibration"]["rule"]
    assert rule is not None and draw["calibration"]["bound"] <= 0.5
    assert draw["calibration"]["gap"] <= draw["calibration"]["loss"]  # the loss bounds the accuracy lost
    # the test figures are `extrapolate --halting RULE --seed 2 --detail`'s
    report = evaluate_checkpoint("extrapolate", str(runs / "pn1"), {"--angles": risk_study.TEST_ANGLES},
                                 EvalOptions(halting=rule, seed=2, detail=True, limit=40, data_dir=tiny_mnist))
    assert draw["test"]["accuracy"] == [bucket["accuracy"] for bucket in report.buckets]
    assert draw["test"]["null"] == [bucket["adapting_minus_shuffled"] for bucket in report.buckets]
    assert all(gap <= premature + 1e-12 for gap, premature in zip(draw["test"]["gap"], draw["test"]["premature"]))
    assert len(raw["controls"]["own"]) == 2 and raw["controls"]["own"][0]["halting"] == "sample"
    assert "### pn, calibrated at ±90° (2 draws)" in out and "### pn, calibrated at ±22.5° (1 draws)" in out
    assert "| ±90° | " in out and "- pn: gap kept in" in out and "| own (sample) | 90 |" in out
    # the tables again from the JSON, computing nothing
    risk_study.main([f"pn={runs / 'pn1'}", "--control", f"own={runs / 'pn1'}", "--tables", str(tmp_path / "raw.json")])
    assert capsys.readouterr().out == out


def test_risk_study_counts_a_refused_calibration_and_tests_nothing_for_it(runs, tiny_mnist, capsys, tmp_path):
    script("risk_study").main([f"pn={runs / 'pn1'}", "--draws", "1", "--max-loss", "0.0001", "--risk", "0.01",
                               "--limit", "40", "--data-dir", str(tiny_mnist), "--json", str(tmp_path / "raw.json")])
    out = capsys.readouterr().out
    draw = json.loads((tmp_path / "raw.json").read_text())["heads"]["pn"]["90"][0][0]
    assert draw["calibration"]["rule"] is None and "--max-loss" in draw["calibration"]["refused"] and "test" not in draw
    assert "(0 draws, 1 refused: no candidate reached the bound)" in out
