"""`ponder runs --where` and `--sort`, and the columns of the settings that differ between the
runs listed (the session's tiny runs: pondernet seeds 1 and 2, act and plain)."""

import csv
import io
import json

import pytest


def _listing(ponder, runs, *args) -> dict:
    result = ponder("runs", runs, *args, "-f", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_where_and_sort_choose_and_order_runs_by_their_figures_and_settings(runs, ponder):
    everything = _listing(ponder, runs)
    by_name = {row["name"]: row for row in everything["buckets"]}
    assert set(by_name) == {"pn1", "pn2", "act", "plain"}
    # across all four, the seed differs, and the halting bias (the method's own: act's is not
    # pondernet's); max_steps, 5 wherever a method reads it, does not (plain's one step is no setting of plain's)
    assert everything["settings"] == ["halting_bias", "seed"]
    assert by_name["pn1"]["halting_bias"] == by_name["pn2"]["halting_bias"] != by_name["act"]["halting_bias"]
    assert "halting_bias" not in by_name["plain"]  # one step: no halting head to bias, shown as "-"
    assert [by_name[name]["seed"] for name in ("pn1", "pn2", "act", "plain")] == [1, 2, 1234, 1234]

    pondernet = _listing(ponder, runs, "--where", "method=pondernet", "--sort", "seed")
    assert [row["name"] for row in pondernet["buckets"]] == ["pn2", "pn1"]  # a figure: the highest first
    assert pondernet["settings"] == ["seed"]  # all the two differ in
    assert (pondernet["where"], pondernet["sort"], pondernet["reverse"]) == (["method=pondernet"], "seed", False)
    reversed_ = _listing(ponder, runs, "--where", "method=pondernet", "--sort", "seed", "--reverse")
    assert [row["name"] for row in reversed_["buckets"]] == ["pn1", "pn2"]

    accuracies = sorted((row["best_val_accuracy"], name) for name, row in by_name.items())
    ranked = _listing(ponder, runs, "--sort", "best_val_acc")  # a header's spelling
    assert [row["best_val_accuracy"] for row in ranked["buckets"]] == sorted((a for a, _ in accuracies), reverse=True)
    low, name = accuracies[1]
    above = _listing(ponder, runs, "--where", f"best_val_accuracy>={low}")
    assert {row["name"] for row in above["buckets"]} == {n for a, n in accuracies if a >= low}
    assert [row["name"] for row in _listing(ponder, runs, "--where", "max_steps<5")["buckets"]] == ["plain"]
    both = _listing(ponder, runs, "--where", "max_steps=5", "--where", "seed!=1")["buckets"]
    assert {row["name"] for row in both} == {"pn2", "act"}
    assert [row["name"] for row in _listing(ponder, runs, "--sort", "method")["buckets"]][:1] == ["act"]  # a to z


def test_the_table_and_csv_show_the_settings_that_differ(runs, ponder):
    table = ponder("runs", runs, "--where", "method=pondernet")
    assert table.exit_code == 0, table.output
    header = next(line for line in table.stdout.splitlines() if "seed" in line)
    assert "seed" in header and "max-steps" not in table.stdout
    assert "where method=pondernet" in " ".join(table.stdout.split())
    rows = list(csv.DictReader(io.StringIO(ponder("runs", runs, "-f", "csv", "--sort", "seed").stdout)))
    assert [(row["name"], row["seed"]) for row in rows] == [("act", "1234"), ("plain", "1234"), ("pn2", "2"),
                                                            ("pn1", "1")]
    none = ponder("runs", runs, "--where", "step!=mlp")
    assert none.exit_code == 0 and len(none.stdout.splitlines()) == 1 and "step!=mlp" in none.stdout


KEYS = ["run", "name", "task", "method", "step", "status", "best_val_accuracy", "lambda_p", "started"]


@pytest.mark.parametrize("args,named", [  # the option and what was given; the keys, or the forms, it takes
    (("--where", "val=1"), ["--where", "'val'", *KEYS]),
    (("--sort", "speed"), ["--sort", "'speed'", *KEYS]),
    (("--where", "step"), ["--where 'step'", "KEY=VALUE, KEY!=VALUE, KEY>V, KEY<V, KEY>=V or KEY<=V"]),
    (("--reverse",), ["--reverse", "--sort KEY"]),
])
def test_a_bad_where_or_sort_is_one_line(args, named, runs, ponder, error):
    error(ponder("runs", runs, *args), 2, *named)  # a usage mistake


@pytest.mark.parametrize("where,named", [  # the condition given, and its key's kind or the keys there are
    ("name>9", ["--where 'name>9'", "text", "= or !="]),
    ("x>>0.5", ["--where", "'x'", *KEYS]),
    ("best_val_accuracy>>0.5", ["--where 'best_val_accuracy>>0.5'", "number", "'>0.5'"]),
    ("started>yesterday", ["--where 'started>yesterday'", "time", "'yesterday'"]),
    ("tag>a", ["--where 'tag>a'", "tag", "= or !="]),
    ("gru_layer_norm=maybe", ["--where 'gru_layer_norm=maybe'", "true or false", "'maybe'"]),
])
def test_a_value_is_read_as_its_keys_kind_or_refused_in_one_line(where, named, runs, ponder, error):
    error(ponder("runs", runs, "--where", where), 2, *named)


def test_names_sort_as_text_and_times_as_times_whatever_they_look_like(runs, tmp_path, ponder):
    """Run folders `2` and `pn1`: a name is text, never a number beside a word; `when` is the
    recorded UTC time, so a run started an hour later sorts after, whatever the local clock said."""
    import shutil

    for name, started in (("2", "2026-10-25T01:30:00+00:00"), ("pn1", "2026-10-25T00:45:00+00:00")):
        shutil.copytree(runs / "pn1", tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())
        (tmp_path / name / "config.json").write_text(json.dumps({**config, "started": started}))
    table = ponder("runs", tmp_path, "--sort", "name")
    assert table.exit_code == 0 and "Traceback" not in table.output, table.output
    assert [row["name"] for row in _listing(ponder, tmp_path, "--sort", "name")["buckets"]] == ["2", "pn1"]
    assert [row["name"] for row in _listing(ponder, tmp_path, "--sort", "name", "--reverse")["buckets"]] == ["pn1", "2"]
    newest = _listing(ponder, tmp_path, "--sort", "when")["buckets"]
    assert [(row["name"], row["when"]) for row in newest] == [("2", "2026-10-25T01:30:00+00:00"),
                                                               ("pn1", "2026-10-25T00:45:00+00:00")]
    # a time given with its zone: 02:00 in UTC+01:00 is 01:00 UTC, between the two
    assert [row["name"] for row in _listing(ponder, tmp_path, "--where", "when>2026-10-25T02:00+01:00")["buckets"]] \
        == ["2"]
    assert [row["name"] for row in _listing(ponder, tmp_path, "--where", "started<2026-10-25T01:00")["buckets"]] \
        == ["pn1"]  # no zone: UTC, as the listing writes it


def test_the_setting_columns_keep_one_order_whatever_the_sort(runs, ponder):
    headers = set()
    for args in ((), ("--sort", "seed"), ("--sort", "seed", "--reverse"), ("--sort", "method"),
                 ("--sort", "method", "--reverse")):
        lines = ponder("runs", runs, "-f", "csv", *args).stdout.splitlines()
        headers.add(lines[0])
        settings = _listing(ponder, runs, *args)["settings"]
        assert settings == ["halting_bias", "seed"]
    assert len(headers) == 1
    header = headers.pop().split(",")  # seed: a column of every report's metadata already
    assert header[-3:] == ["tags", "note", "halting_bias"] and header.count("seed") == 1


def _files(folder) -> dict:
    """Every file below a folder: its bytes, mode and modification time."""
    return {str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mode, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_rm_moves_runs_to_the_trash_restore_brings_them_back_bit_for_bit_and_only_empty_deletes(
        runs, tmp_path, ponder, error, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    for name in ("pn1", "act"):
        shutil.copytree(runs / name, tmp_path / "runs" / name)
    before = _files(tmp_path / "runs" / "pn1")
    removed = ponder("runs", "rm", "runs/pn1", "runs/pn1", "-f", "json")  # named twice: moved once
    assert removed.exit_code == 0, removed.output
    report = json.loads(removed.stdout)
    assert (report["command"], report["action"], [row["run"] for row in report["buckets"]]) == \
        ("runs rm", "removed", ["runs/pn1"])
    entry = tmp_path / report["buckets"][0]["trash"]
    assert entry.parent == tmp_path / "runs" / ".trash" and _files(entry / "run") == before
    assert json.loads((entry / "trashed.json").read_text())["original"] == str(tmp_path / "runs" / "pn1")
    assert [row["name"] for row in _listing(ponder, "runs")["buckets"]] == ["act"]  # the trash is hidden
    assert "restore with: ponder runs rm --restore runs/act" in ponder("runs", "rm", "runs/act").stdout
    bare = ponder("runs", "rm", "--restore")  # the trashed runs are in no listing: the error names them
    error(bare, 2, "runs/act, runs/pn1")

    restored = ponder("runs", "rm", "--restore", "runs/pn1")
    assert restored.exit_code == 0, restored.output
    assert _files(tmp_path / "runs" / "pn1") == before and not entry.exists()
    error(ponder("runs", "rm", "--restore", "runs/pn1"), 1, "runs/pn1", "runs/.trash/")
    deleted = json.loads(ponder("runs", "rm", "--empty", "--yes", "-f", "json").stdout)
    assert [row["run"] for row in deleted["buckets"]] == ["runs/act"] and not (tmp_path / "runs" / ".trash").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["pn1"]
    nothing = ponder("runs", "rm", "--empty")
    assert nothing.exit_code == 0 and len(nothing.stdout.splitlines()) == 1  # one line: nothing to delete
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["pn1"]
    error(ponder("runs", "rm", "--restore"), 2, "runs/", "./")


def test_rm_refuses_a_run_being_trained_and_what_is_no_run_moving_nothing(runs, tmp_path, ponder, error):
    import os
    import shutil

    for name in ("pn1", "act"):
        shutil.copytree(runs / name, tmp_path / name)
    (tmp_path / "act" / ".ponder.lock").write_text(f"{os.getppid()}\n")  # a live process holds it
    error(ponder("runs", "rm", tmp_path / "pn1", tmp_path / "act"), 1, tmp_path / "act", f"PID {os.getppid()}")
    (tmp_path / "notes").mkdir()
    error(ponder("runs", "rm", tmp_path / "pn1", tmp_path / "notes"), 1, tmp_path / "notes", "`ponder runs`")
    error(ponder("runs", "rm", tmp_path), 1, tmp_path, "act", "pn1")  # a folder of runs: its runs named
    error(ponder("runs", "rm"), 2)
    assert (tmp_path / "pn1" / "last.pt").is_file() and not (tmp_path / ".trash").exists()


def test_a_run_whose_best_pt_fails_its_checksum_is_listed_as_damaged(runs, tmp_path, ponder):
    import shutil
    import struct
    import zipfile

    shutil.copytree(runs / "pn1", tmp_path / "pn1")
    best = tmp_path / "pn1" / "best.pt"
    whole = best.read_bytes()
    with zipfile.ZipFile(best) as archive:  # a byte of its record changed: only the CRC tells
        member = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    name_length, extra_length = struct.unpack("<HH", whole[member.header_offset + 26:member.header_offset + 30])
    damaged = bytearray(whole)
    damaged[member.header_offset + 30 + name_length + extra_length + 8] ^= 0xFF
    best.write_bytes(bytes(damaged))
    row = _listing(ponder, tmp_path)["buckets"][0]
    assert (row["status"], row["epoch"], row["checkpoint"]) == ("damaged", 2, str(tmp_path / "pn1" / "last.pt"))
    assert "damaged at 2/2" in ponder("runs", tmp_path).stdout
    assert [r["name"] for r in _listing(ponder, tmp_path, "--where", "status=damaged")["buckets"]] == ["pn1"]


def test_runs_without_tags_sort_last_by_tag_either_way(runs, tmp_path, ponder):
    """--sort tag: text from a to z, a run without tags last (as any key a run has no value for)."""
    import shutil

    for name, tags in (("a", []), ("b", ["zeta"]), ("c", ["alpha"])):
        shutil.copytree(runs / "pn1", tmp_path / name)
        saved = json.loads((tmp_path / name / "config.json").read_text())
        (tmp_path / name / "config.json").write_text(json.dumps({**saved, "labels": {"name": name, "tags": tags}}))
    assert [row["name"] for row in _listing(ponder, tmp_path, "--sort", "tag")["buckets"]] == ["c", "b", "a"]
    assert [row["name"] for row in _listing(ponder, tmp_path, "--sort", "tags", "--reverse")["buckets"]] == \
        ["b", "c", "a"]
