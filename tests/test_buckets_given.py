"""What the user's buckets and names become: a bucket given twice is evaluated once, band buckets
in ascending order labelled by their edges, a run folder name too long refused before anything
is written, and the captions saying only what the table shows (no Spearman line where the
difficulty never varied, no "± sd" over one seed, the sparkline's legend)."""

import json

import pytest

from ponder_cli.config import PonderConfig
from ponder_cli.reports import comparison_report, group_by_configuration
from ponder_cli.tasks import get_task


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_bucket_given_twice_is_evaluated_once_and_said_once(checkpoint, tiny_mnist, ponder):
    args = ("extrapolate", checkpoint, "--limit", "60", "--data-dir", tiny_mnist, "-f", "json")
    twice = ponder(*args, "--angles", "45", "30", "45.0", "30")
    once = _json(ponder(*args, "--angles", "45", "30"))
    data = _json(twice)
    assert [b["rotation"] for b in data["buckets"]] == [45.0, 30.0]  # the first place each was given
    assert data["buckets"] == once["buckets"] and data["spearman"] == once["spearman"]
    assert twice.stderr.count("given again") == 1
    assert "--angles: 45.0 30 given again: each bucket is evaluated once" in twice.stderr


def test_band_buckets_run_ascending_each_labelled_by_its_edges(checkpoint, tiny_mnist, ponder):
    args = ("extrapolate", checkpoint, "--limit", "60", "--data-dir", tiny_mnist, "--protocol", "band")
    descending = _json(ponder(*args, "--angles", "90", "45", "-f", "json"))
    ascending = _json(ponder(*args, "--angles", "45", "90", "-f", "json"))
    assert [(b["rotation"], b["band"]) for b in descending["buckets"]] == [(45.0, [0.0, 45.0]), (90.0, [45.0, 90.0])]
    assert descending["buckets"] == ascending["buckets"]  # the same bands, the same draws
    table = ponder(*args, "--angles", "90", "45", "--detail")
    assert table.exit_code == 0, table.output
    rows = [line for line in table.stdout.splitlines() if line.startswith("│")]
    assert rows[0].split("│")[1].strip() == "0–45" and rows[1].split("│")[1].strip() == "45–90"
    assert "|angle|" in table.stdout and "45–90° halted" in " ".join(table.stdout.split())
    for bucket, row in zip(ascending["buckets"], rows):
        assert f"{bucket['accuracy']:.4f}" in row
    # uniform buckets keep the order given, and carry no band
    uniform = _json(ponder("extrapolate", checkpoint, "--limit", "60", "--data-dir", tiny_mnist, "--angles", "90",
                           "45", "-f", "json"))
    assert [b["rotation"] for b in uniform["buckets"]] == [90.0, 45.0]
    assert all("band" not in b for b in uniform["buckets"])


def test_band_edges_reach_calibrate_and_compare(checkpoint, tiny_mnist, ponder):
    args = (checkpoint, "--limit", "40", "--data-dir", tiny_mnist, "--protocol", "band", "--angles", "60", "30",
            "-f", "json")
    calibrated = _json(ponder("calibrate", *args))
    assert calibrated["sets"] == [{"rotation": 30.0, "protocol": "band", "band": [0.0, 30.0]},
                                  {"rotation": 60.0, "protocol": "band", "band": [30.0, 60.0]}]
    compared = _json(ponder("compare", *args))
    assert [b["band"] for b in compared["buckets"]] == [[0.0, 30.0], [30.0, 60.0]]


def test_an_out_name_too_long_is_one_line_naming_the_fix(tiny_mnist, tmp_path, ponder, error, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "r" * 300
    # the name cut short in the line, its length and the file system's limit
    line = error(ponder("train", "--epochs", "1", "--data-dir", tiny_mnist, "--out", name), 1, f"--out {'r' * 59}…",
                 "300", "255")
    assert name not in line
    error(ponder("train", "--epochs", "1", "--data-dir", tiny_mnist, "--out", f"a/{name}/b"), 1, "--out", "300", "255")
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_eval_at_0_degrees_has_no_spearman_line_and_a_sparkline_legend(checkpoint, tiny_mnist, ponder):
    args = (checkpoint, "--limit", "60", "--data-dir", tiny_mnist)
    at_zero = ponder("eval", *args)
    assert at_zero.exit_code == 0, at_zero.output
    text = " ".join(at_zero.stdout.split())
    assert "Spearman" not in text
    assert "halting steps: images halting at each step: █ the most, ▁ a few, blank none" in text
    assert _json(ponder("eval", *args, "-f", "json"))["spearman"]["rho"] is None  # the JSON keeps its key
    rotated = ponder("eval", *args, "--angles", "0", "45")
    rho = _json(ponder("eval", *args, "--angles", "0", "45", "-f", "json"))["spearman"]["rho"]
    assert f"Spearman ρ(|angle|, steps) = {rho:+.3f} over 120 images" in " ".join(rotated.stdout.split())
    detail = ponder("eval", *args, "--detail")  # no sparkline column: no legend
    assert detail.exit_code == 0 and "█ the most" not in detail.stdout


def _compare(seeds: list[int]):
    models = [(f"s{seed}.pt", PonderConfig.of(seed=seed)) for seed in seeds] + [("act.pt", PonderConfig.of(method="act"))]
    groups = group_by_configuration(models)
    results = [[[{"accuracy": 0.9 - 0.01 * m, "mean_steps": 4.0 + m, "accuracy_at_step": [0.89] * 20, "rotation": 45.0,
                  "halting": "act" if g.cfg.method.name == "act" else "sample", "images": 100, "histogram": [1] * 20}]
                for m in range(len(g.members))] for g in groups]
    return comparison_report(groups, results, [45.0], protocol="uniform", halting="sample", seed=1,
                             view=get_task(groups[0].cfg).view())


def test_compare_speaks_of_sd_only_where_there_are_seeds():
    one = _compare([1])
    assert one.caption.startswith("accuracy and steps: one checkpoint per method\n")
    assert "±" not in one.caption and all("±" not in b["accuracy_text"] for b in one.buckets)
    assert [b["accuracy_text"] for b in one.buckets] == ["0.9000", "0.9000"]
    two = _compare([1, 2])
    assert two.caption.startswith("accuracy and steps: mean ± sd over seeds (a method of one seed: its figure, no sd)")
    assert two.buckets[0]["accuracy_text"] == f"0.8950 ±{0.01 * 0.5 ** 0.5:.4f}"
