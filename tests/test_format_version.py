"""The JSON contract's version: `format_version` (1) first in every JSON document a command writes,
and `ponder train -f jsonl`, one JSON object per epoch as it ends, then the report's."""

import csv
import json

import pytest

from ponder_cli.registry import FORMAT_VERSION

TINY = ("--val-size", "100", "--batch-size", "64", "--train-size", "256", "--no-progress")


def _document(result) -> dict:
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert next(iter(data)) == "format_version" and data["format_version"] == FORMAT_VERSION == 1
    return data


@pytest.mark.parametrize("args", [("eval", "--limit", "20"), ("extrapolate", "--angles", "45", "--limit", "20"),
                                  ("sweep", "--to", "10", "--every", "10", "--limit", "20"),
                                  ("compare", "--angles", "45", "--limit", "20"), ("calibrate", "--limit", "40"),
                                  ("info",), ("models",), ("runs",)])
def test_every_command_json_leads_with_its_format_version(args, checkpoint, tiny_mnist, ponder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = () if args[0] in ("models", "runs") else (checkpoint,)
    data = ("--data-dir", tiny_mnist) if args[0] not in ("info", "models", "runs") else ()
    assert _document(ponder(*args, *where, *data, "-f", "json"))["command"] == args[0]


def test_predict_json_leads_with_its_format_version(checkpoint, tmp_path, ponder):
    import numpy
    numpy.save(tmp_path / "digits.npy", numpy.zeros((2, 28, 28), dtype=numpy.float32))
    assert _document(ponder("predict", checkpoint, tmp_path / "digits.npy", "-f", "json"))["inputs"] == 2


def test_print_config_json_has_it_and_reads_back(tmp_path, ponder):
    printed = _document(ponder("train", "--lambda-p", "0.3", "--print-config", "-f", "json"))
    assert printed["method"]["lambda_p"] == 0.3 and printed["sources"]["lambda_p"] == "given"
    (tmp_path / "settings.json").write_text(json.dumps(printed))
    again = _document(ponder("train", "--config", tmp_path / "settings.json", "--print-config", "-f", "json"))
    assert {k: v for k, v in again.items() if k != "sources"} == {k: v for k, v in printed.items() if k != "sources"}
    assert again["sources"]["lambda_p"] == f"file {tmp_path / 'settings.json'}"


def test_train_jsonl_streams_each_epoch_as_it_ends_then_the_report(tiny_mnist, tmp_path, ponder, monkeypatch):
    import ponder_cli.cli.train as train_cli

    out, seen = tmp_path / "run", []
    written = train_cli.json_line

    def watching(record, file=None):
        # an epoch's line is written when that epoch ends: metrics.csv holds it and no later one
        with open(out / "metrics.csv", newline="") as f:
            seen.append((record["record"], record.get("epoch"), [int(r["epoch"]) for r in csv.DictReader(f)]))
        written(record, file)
    monkeypatch.setattr(train_cli, "json_line", watching)
    result = ponder("train", "--epochs", "3", "--max-steps", "3", *TINY, "--data-dir", tiny_mnist, "--out", out,
                    "-f", "jsonl")
    assert result.exit_code == 0, result.output
    assert seen == [("epoch", 1, [1]), ("epoch", 2, [1, 2]), ("epoch", 3, [1, 2, 3])]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["format_version"], line["record"]) for line in lines] == [(1, "epoch")] * 3 + [(1, "report")]
    epochs, report = lines[:3], lines[3]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and all(e["command"] == "train" for e in epochs)
    # each epoch's line is the report's entry for that epoch, with the stream's marks
    assert [{k: v for k, v in e.items() if k not in ("format_version", "record", "command")} for e in epochs] == \
        report["buckets"]
    assert report["command"] == "train" and report["epochs"] == 3 and report["out_dir"] == str(out)
    assert result.stdout.count("\n") == 4  # nothing else on stdout
    assert "epoch  1/3" in result.stderr and "epoch  3/3" in result.stderr  # progress stays on stderr
    for name in ("config.json", "environment.json"):
        assert json.loads((out / name).read_text())["format_version"] == 1


def test_print_config_jsonl_is_one_line(ponder):
    result = ponder("train", "--print-config", "-f", "jsonl")
    assert result.exit_code == 0 and result.stdout.count("\n") == 1
    assert json.loads(result.stdout)["format_version"] == 1
