import csv
import io
import json

import pytest
import torch
from typer.testing import CliRunner

from ponder_cli.cli import app, expand_greedy_options

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_clean_error(result, *fragments):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in error_lines[0]


@pytest.mark.parametrize("command", [[], ["train"], ["eval"], ["extrapolate"]])
def test_help(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Usage:" in result.stdout


def test_greedy_angles_expansion():
    assert expand_greedy_options(["--angles", "22.5", "45", "-f", "json"], ("--angles",)) == \
        ["--angles", "22.5", "--angles", "45", "-f", "json"]
    assert expand_greedy_options(["--angles", "10", "--angles", "20"], ("--angles",)) == \
        ["--angles", "10", "--angles", "20"]
    assert expand_greedy_options(["ck.pt", "--angles", "-5", "7"], ("--angles",)) == \
        ["ck.pt", "--angles", "-5", "--angles", "7"]


@pytest.fixture(scope="module")
def trained(tiny_mnist, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    result = invoke("train", "--epochs", 1, "--val-size", 100, "--max-steps", 5, "--batch-size", 64,
                    "--data-dir", tiny_mnist, "--out", out, "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    return out, result


def test_train_writes_checkpoints_and_reports(trained):
    out, result = trained
    assert (out / "best.pt").exists() and (out / "last.pt").exists()
    assert f"best checkpoint: {out / 'best.pt'}" in result.stdout
    assert "epoch  1/1" in result.stderr and "val acc" in result.stderr
    ckpt = torch.load(out / "best.pt", weights_only=True)
    assert ckpt["config"]["max_steps"] == 5 and ckpt["epoch"] == 1


def test_eval_json(trained, tiny_mnist):
    out, _ = trained
    result = invoke("eval", out / "best.pt", "--data-dir", tiny_mnist, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["images"] == 200 and 0 <= data["accuracy"] <= 1
    assert 1 <= data["mean_steps"] <= 5 and data["loss"] > 0


def test_extrapolate_greedy_angles_json(trained, tiny_mnist):
    out, _ = trained
    result = invoke("extrapolate", out / "best.pt", "--angles", 10, 20, "--format", "json",
                    "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rows = data["buckets"]
    assert data["protocol"] == "uniform" and data["halting"] == "sample"
    assert data["spearman"]["images"] == 400
    assert [r["rotation"] for r in rows] == [10.0, 20.0]
    for r in rows:
        assert r["images"] == 200 and 0 <= r["accuracy"] <= 1 and 1 <= r["mean_steps"] <= 5
    # Same checkpoint and seed: the same numbers, flag repeated or not.
    again = invoke("extrapolate", out / "best.pt", "--angles", 10, "--angles", 20, "--format", "json",
                   "--data-dir", tiny_mnist)
    assert json.loads(again.stdout) == data


def test_extrapolate_csv_and_table(trained, tiny_mnist):
    out, _ = trained
    result = invoke("extrapolate", out / "best.pt", "--angles", 45, "-f", "csv", "--data-dir", tiny_mnist)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1 and float(rows[0]["rotation"]) == 45.0 and int(rows[0]["images"]) == 200
    table = invoke("extrapolate", out / "best.pt", "--angles", 45, 90, "--data-dir", tiny_mnist)
    assert table.exit_code == 0 and "mean steps" in table.stdout and "90" in table.stdout


def test_default_checkpoint_is_checkpoints_best(trained, tiny_mnist, tmp_path, monkeypatch):
    out, _ = trained
    monkeypatch.chdir(tmp_path)
    assert_clean_error(invoke("eval", "--data-dir", tiny_mnist), "checkpoints/best.pt")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "best.pt").write_bytes((out / "best.pt").read_bytes())
    result = invoke("eval", "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["images"] == 200


def test_missing_checkpoint_is_a_clean_error(tmp_path, tiny_mnist):
    result = invoke("eval", tmp_path / "nope.pt", "--data-dir", tiny_mnist)
    assert_clean_error(result, "nope.pt", "does not exist")
    assert result.exit_code == 1


def test_non_numeric_angle_is_a_clean_error(trained, tiny_mnist):
    out, _ = trained
    assert_clean_error(invoke("extrapolate", out / "best.pt", "--angles", 10, "abc", "--data-dir", tiny_mnist),
                       "'abc'", "not a number")


def test_empty_angles_is_a_clean_error(trained):
    out, _ = trained
    assert_clean_error(invoke("extrapolate", out / "best.pt", "--angles", "--format", "json"), "--angles")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clean_error(tiny_mnist, tmp_path):
    result = invoke("train", "--device", "cuda", "--data-dir", tiny_mnist, "--out", tmp_path)
    assert_clean_error(result, "CUDA is not available")
    assert not any(tmp_path.iterdir())


def test_bad_config_is_a_clean_error(tiny_mnist, tmp_path):
    assert_clean_error(invoke("train", "--lambda-p", 1.5, "--data-dir", tiny_mnist, "--out", tmp_path), "lambda-p")
