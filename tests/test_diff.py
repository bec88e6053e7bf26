"""`ponder diff RUN RUN`: two run folders' settings and results, only what differs."""

import csv
import io
import json


def _diff(ponder, *args) -> dict:
    result = ponder("diff", *args, "-f", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_two_seeds_differ_in_the_seed_and_whatever_their_results_do(runs, ponder):
    listed = {row["name"]: row for row in json.loads(ponder("runs", runs, "-f", "json").stdout)["buckets"]}
    data = _diff(ponder, runs / "pn1", runs / "pn2")
    assert data["format_version"] == 1 and data["command"] == "diff" and data["runs"] == [str(runs / "pn1"),
                                                                                            str(runs / "pn2")]
    settings = [(b["key"], b["first"], b["second"]) for b in data["buckets"] if b["kind"] == "setting"]
    assert settings == [("seed", 1, 2)]
    expected = [(key, listed["pn1"][key], listed["pn2"][key])
                for key in ("status", "epoch", "best_epoch", "best_val_accuracy", "best_val_steps")
                if listed["pn1"][key] != listed["pn2"][key]]
    assert [(b["key"], b["first"], b["second"]) for b in data["buckets"] if b["kind"] == "result"] == expected
    assert expected and data["differences"] == 1 + len(expected)  # two seeds train apart
    table = ponder("diff", runs / "pn1", runs / "pn2")
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert f"1 setting and {len(expected)} result" in text
    best = next(b for b in data["buckets"] if b["key"] == "best_val_accuracy")
    assert f"best val accuracy │ {best['first']:.4f} │ {best['second']:.4f}" in text
    rows = list(csv.DictReader(io.StringIO(ponder("diff", runs / "pn1", runs / "pn2", "-f", "csv").stdout)))
    assert [(r["key"], r["first"], r["second"]) for r in rows][0] == ("seed", "1", "2")


def test_methods_differ_in_the_settings_that_apply_to_either(runs, ponder):
    data = _diff(ponder, runs / "pn1", runs / "act")
    settings = {b["key"]: (b["first"], b["second"]) for b in data["buckets"] if b["kind"] == "setting"}
    assert settings["method"] == ("pondernet", "act") and settings["seed"] == (1, 1234)
    assert "max_steps" not in settings  # 5 in both
    table = ponder("diff", runs / "pn1", runs / "act").stdout
    assert "halting-bias" in table or "halting_bias" not in settings


def test_the_same_run_says_so_and_a_folder_that_is_no_run_is_one_line(runs, ponder, tmp_path, one_error_line):
    same = ponder("diff", runs / "pn1", runs / "pn1")
    assert same.exit_code == 0 and same.stdout == f"{runs / 'pn1'} and {runs / 'pn1'}: the same settings and results\n"
    assert _diff(ponder, runs / "pn1", runs / "pn1")["buckets"] == []
    line = one_error_line(ponder("diff", runs / "pn1", tmp_path))
    assert line == f"Error: {tmp_path} is not a run folder: ponder diff takes two run folders (`ponder runs` lists them)"
    line = one_error_line(ponder("diff", tmp_path / "nope", runs / "pn1"))
    assert line.startswith(f"Error: {tmp_path / 'nope'} does not exist")
