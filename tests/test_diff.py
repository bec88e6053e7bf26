"""`ponder diff RUN RUN...`: runs' settings (those each reads) and results, a column each, only
what differs."""

import csv
import io
import json
import os


def _diff(ponder, *args) -> dict:
    result = ponder("diff", *args, "-f", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _settings(data) -> dict:
    return {b["key"]: (b["values"], b["reads"]) for b in data["buckets"] if b["kind"] == "setting"}


def test_two_seeds_differ_in_the_seed_and_whatever_their_results_do(runs, ponder):
    listed = {row["name"]: row for row in json.loads(ponder("runs", runs, "-f", "json").stdout)["buckets"]}
    data = _diff(ponder, runs / "pn1", runs / "pn2")
    assert data["format_version"] == 1 and data["command"] == "diff" and data["runs"] == [str(runs / "pn1"),
                                                                                            str(runs / "pn2")]
    assert data["checkpoints"] == [str(runs / name / "last.pt") for name in ("pn1", "pn2")]
    assert _settings(data) == {"seed": ([1, 2], [True, True])}
    expected = [(key, [listed["pn1"][key], listed["pn2"][key]])
                for key in ("status", "epoch", "best_epoch", "best_val_accuracy", "best_val_steps")
                if listed["pn1"][key] != listed["pn2"][key]]
    assert [(b["key"], b["values"]) for b in data["buckets"] if b["kind"] == "result"] == expected
    assert expected and data["differences"] == 1 + len(expected)  # two seeds train apart
    table = ponder("diff", runs / "pn1", runs / "pn2")
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert f"1 setting and {len(expected)} result" in text and "┃ pn1 ┃ pn2 ┃" in text
    best = next(b for b in data["buckets"] if b["key"] == "best_val_accuracy")
    assert f"best val accuracy │ {best['values'][0]:.4f} │ {best['values'][1]:.4f}" in text
    rows = list(csv.DictReader(io.StringIO(ponder("diff", runs / "pn1", runs / "pn2", "-f", "csv").stdout)))
    assert [(r["key"], r["kind"], r["pn1"], r["pn2"]) for r in rows][0] == ("seed", "setting", "1", "2")


def test_each_method_shows_what_it_reads_and_a_dash_for_what_it_does_not(runs, ponder):
    """PonderNet reads lambda-p, ACT tau: both runs store both (equal defaults), each shows its own
    and '-' for the other's, as `ponder runs` shows a setting a run does not read."""
    configs = [json.loads((runs / name / "config.json").read_text())["config"] for name in ("pn1", "act")]
    assert configs[0]["lambda_p"] == configs[1]["lambda_p"] and configs[0]["tau"] == configs[1]["tau"]
    data = _diff(ponder, runs / "pn1", runs / "act")
    settings = _settings(data)
    assert settings["method"] == (["pondernet", "act"], [True, True]) and settings["seed"] == ([1, 1234], [True] * 2)
    assert settings["lambda_p"] == ([configs[0]["lambda_p"], None], [True, False])
    assert settings["beta"] == ([configs[0]["beta"], None], [True, False])
    assert settings["tau"] == ([None, configs[1]["tau"]], [False, True])
    assert "max_steps" not in settings and "train_rotation" not in settings  # the same, read by both
    text = " ".join(ponder("diff", runs / "pn1", runs / "act").stdout.split())
    assert f"lambda-p │ {configs[0]['lambda_p']:g} │ - │" in text
    assert f"tau │ - │ {configs[1]['tau']:g} │" in text
    assert "-: a setting the run does not read" in text
    rows = {r["key"]: r for r in csv.DictReader(io.StringIO(ponder("diff", runs / "pn1", runs / "act", "-f",
                                                                   "csv").stdout))}
    assert (rows["tau"]["pn1"], rows["tau"]["act"]) == ("", f"{configs[1]['tau']}")


def test_an_answer_trained_head_shows_a_dash_for_the_priors_settings(runs, ponder, tmp_path):
    """Under --halting-target final there is no KL term: lambda-p, prior, beta and beta-warmup are
    not read, and show as a setting of another method does."""
    import dataclasses

    import torch

    from ponder_cli.checkpoint import load_checkpoint

    state = load_checkpoint(runs / "pn1" / "last.pt")
    final = state.config.replace(halting_target="final", truncation=0.0)
    torch.save(dataclasses.replace(state, config=final).to_dict(), tmp_path / "final.pt")
    settings = _settings(_diff(ponder, runs / "pn1", tmp_path / "final.pt"))
    assert settings["halting_target"] == (["prior", "final"], [True, True])
    for key in ("lambda_p", "prior", "beta", "beta_warmup"):
        assert settings[key] == ([state.config.value(key), None], [True, False]), key


def test_a_parity_run_shows_no_mnist_setting_and_shipped_names_are_runs(runs, ponder):
    """reference (MNIST) against parity16 (shipped, by name): val-size is MNIST's alone, elems
    parity's; both read max-steps (20), which does not differ."""
    data = _diff(ponder, "reference", "parity16")
    settings = _settings(data)
    assert settings["task"] == (["mnist", "parity"], [True, True])
    assert settings["val_size"] == ([5000, None], [True, False]) and settings["train_rotation"][1] == [True, False]
    assert settings["elems"] == ([None, 16], [False, True]) and settings["train_counts"] == ([None, "1-16"],
                                                                                            [False, True])
    assert "max_steps" not in settings
    # a shipped model, a run folder and a checkpoint file, a column each
    data = _diff(ponder, "parity16", runs / "pn1", runs / "act" / "best.pt")
    assert data["runs"] == ["parity16", str(runs / "pn1"), str(runs / "act" / "best.pt")]
    assert _settings(data)["method"] == (["pondernet", "pondernet", "act"], [True] * 3)
    header = ponder("diff", "parity16", runs / "pn1", runs / "act" / "best.pt", "-f", "csv").stdout.splitlines()[0]
    assert header.endswith(",key,kind,parity16,pn1,best.pt")


def test_latest_is_a_run_too(runs, ponder):
    before = os.getcwd()
    try:
        os.chdir(runs.parent)
        os.symlink(runs, "runs")  # runs/ here: latest is its newest run
        data = _diff(ponder, "latest", runs / "pn1")
    finally:
        os.remove("runs")
        os.chdir(before)
    assert data["runs"] == ["latest", str(runs / "pn1")] and data["checkpoints"][0].startswith("runs/")


def test_the_same_run_twice_is_refused_naming_it(runs, ponder, tmp_path, error):
    # both names given, and the one file they both resolve to
    line = error(ponder("diff", runs / "pn1", runs / "pn2", runs / "pn1" / "last.pt"), 2, f"{runs / 'pn1'} and",
                 runs / "pn1" / "last.pt")
    assert str(runs / "pn2") not in line
    error(ponder("diff", "parity16", "parity16"), 2, "parity16 and parity16", "checkpoints/parity/interpolation16.pt")
    error(ponder("diff", runs / "pn1"), 2, "`ponder runs`")  # a usage mistake, as a missing argument is
    error(ponder("diff", runs / "pn1", tmp_path), 1, tmp_path, "last.pt", "best.pt")
    error(ponder("diff", tmp_path / "nope", runs / "pn1"), 1, tmp_path / "nope")


def test_runs_that_differ_in_nothing_say_so(runs, ponder, tmp_path):
    import shutil

    shutil.copytree(runs / "pn1", tmp_path / "copy")
    result = ponder("diff", runs / "pn1", tmp_path / "copy")
    assert result.exit_code == 0 and result.stdout == f"{runs / 'pn1'} and {tmp_path / 'copy'}: the same settings " \
                                                      "and results\n"
    assert _diff(ponder, runs / "pn1", tmp_path / "copy")["buckets"] == []


def test_labels_head_the_columns_and_differ_first(runs, ponder, tmp_path):
    """A run's --name heads its column; tags, note and the checkpoint its weights started from
    (--init-from) differ as labels, before the settings; a run without one shows '-'."""
    import shutil

    labelled = {"a": ({"name": "base", "tags": ["t1"], "note": None}, None),
                "b": ({"name": "tuned", "tags": [], "note": "lr up"}, "runs/pn2/best.pt")}  # short: the table fits
    for folder, (labels, init_from) in labelled.items():
        shutil.copytree(runs / "pn1", tmp_path / folder)
        saved = json.loads((tmp_path / folder / "config.json").read_text())
        (tmp_path / folder / "config.json").write_text(json.dumps({**saved, "labels": labels, "init_from": init_from}))
    data = _diff(ponder, tmp_path / "a", tmp_path / "b")
    assert [(b["key"], b["kind"], b["values"]) for b in data["buckets"]] == [
        ("tags", "label", [["t1"], []]), ("note", "label", [None, "lr up"]),
        ("init_from", "label", [None, "runs/pn2/best.pt"])]  # the same weights and settings
    text = " ".join(ponder("diff", tmp_path / "a", tmp_path / "b").stdout.split())
    assert "┃ base ┃ tuned ┃" in text and "tags │ t1 │ - │" in text and "note │ - │ lr up │" in text
    assert "initialised from │ - │ runs/pn2/best.pt │" in text
    assert "3 labels, 0 settings and 0 results" in text
    rows = list(csv.DictReader(io.StringIO(ponder("diff", tmp_path / "a", tmp_path / "b", "-f", "csv").stdout)))
    assert [(r["key"], r["base"], r["tuned"]) for r in rows][:2] == [("tags", "t1", ""), ("note", "", "lr up")]
