"""Parity as a task of the real CLI: `ponder train --task parity`, its checkpoints, eval --counts,
extrapolate, sweep and compare on count buckets, the JSON/CSV contract, resume continuing the
generator's stream, and bad input refused in one line with nothing written."""

import csv
import io
import json

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.reports import META_KEYS
from ponder_cli.tasks import get_task
from ponder_cli.tasks.parity import curriculum_top
from ponder_cli.tasks.parity import ParityBatches, parity_batch, split_range

# 8 elements, 3 steps, 4 batches of 32 per epoch: a run takes about a second
PARITY = ["--task", "parity", "--elems", "8", "--max-steps", "3", "--hidden", "16", "--batch-size", "32",
          "--batches-per-epoch", "4", "--no-progress"]


@pytest.fixture(scope="module")
def parity_run(ponder, tmp_path_factory):
    """A two-epoch parity run (pondernet, gru) trained on counts 1-6 of 8."""
    out = tmp_path_factory.mktemp("parity") / "run"
    result = ponder("train", *PARITY, "--epochs", "2", "--train-counts", "1-6", "--seed", "3", "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_the_checkpoint_names_its_task_and_training_range(parity_run):
    cfg = load_checkpoint(parity_run / "best.pt").config
    assert (cfg.task.name, cfg.task.elems, cfg.task.train_counts, cfg.step.name) == ("parity", 8, "1-6", "gru")
    # what the task and the step imply: the recipe that learns (docs/parity-results.md)
    assert (cfg.step.hidden, cfg.method.lambda_p, cfg.training.lr, cfg.training.grad_clip) == (16, 0.1, 1e-3, 1.0)
    assert (cfg.step.gru_layer_norm, cfg.step.gru_orthogonal, cfg.step.gru_update_bias) == (True, True, 1.0)
    saved = json.loads((parity_run / "config.json").read_text())
    assert saved["config"]["task"] == "parity" and saved["sources"]["step"] == "implied by --task parity"
    assert saved["sources"]["lambda_p"] == "implied by --task parity"
    assert "train_rotation" in saved["not_applicable"] and "elems" not in saved["not_applicable"]


def test_eval_counts_json_contract_and_the_same_numbers_twice(parity_run, ponder):
    args = ("eval", parity_run, "--counts", "1-2", "3-8", "--limit", "16", "-f", "json", "-q")
    first, second = ponder(*args), ponder(*args)
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout  # fixed vectors and coins: a checkpoint's figures never change
    report = json.loads(first.stdout)
    assert list(report)[:1 + len(META_KEYS)] == ["format_version", *META_KEYS]
    assert (report["command"], report["task"], report["protocol"]) == ("eval", "parity", None)
    assert (report["elems"], report["train_counts"]) == (8, "1-6")
    assert [(b["counts"], b["lo"], b["hi"]) for b in report["buckets"]] == [("1-2", 1, 2), ("3-8", 3, 8)]
    assert [b["images"] for b in report["buckets"]] == [2 * 16, 6 * 16]  # --limit: rows per count
    assert report["spearman"]["between"] == "non-zero count and ponder steps"
    assert report["spearman"]["images"] == 8 * 16
    for bucket in report["buckets"]:
        assert sum(bucket["histogram"]) == bucket["images"] and len(bucket["histogram"]) == 3
        assert "rotation" not in bucket and bucket["loss"] > 0


def test_eval_csv_and_table_name_counts(parity_run, ponder, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the table must fit an 80-column terminal
    result = ponder("eval", parity_run, "--counts", "2", "--limit", "8", "-f", "csv", "-q")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["task"], r["counts"], r["lo"], r["hi"], r["images"]) for r in rows] == [("parity", "2", "2", "2", "8")]
    table = ponder("eval", parity_run, "--counts", "1-4", "--limit", "8", "-q", "--format", "table").stdout
    assert "counts" in table and "±deg" not in table and "Spearman ρ(count, steps)" in table
    assert "8 elements, trained on counts 1-6" in table
    assert max(len(line) for line in table.splitlines()) <= 80


@pytest.mark.parametrize("command, caption", [
    ("eval", "32–96 vectors per bucket · steps ✓ / ✗"), ("compare", "32–96 test vectors per bucket")])
def test_captions_count_buckets_of_different_sizes_as_a_range(parity_run, ponder, command, caption):
    # --limit 16: 16 vectors per count, so counts 1-2 hold 32 and counts 3-8 hold 96
    table = ponder(command, parity_run, "--counts", "1-2", "3-8", "--limit", "16", "-q").stdout
    assert caption in table
    even = ponder(command, parity_run, "--counts", "1-2", "3-4", "--limit", "16", "-q").stdout
    assert caption.replace("32–96", "32") in even


def test_default_buckets_are_the_training_range_and_the_counts_beyond_it(parity_run, ponder):
    def buckets(*args):
        result = ponder(*args, parity_run, "--limit", "4", "-f", "json", "-q")
        assert result.exit_code == 0, result.output
        return [b["counts"] for b in json.loads(result.stdout)["buckets"]]

    assert buckets("eval") == ["1", "2-3", "4", "5-6"]  # 1-6 in four
    assert buckets("extrapolate") == ["7", "8"]  # beyond training: 7-8
    assert split_range(1, 64) == [(1, 16), (17, 32), (33, 48), (49, 64)]
    assert split_range(49, 96) == [(49, 60), (61, 72), (73, 84), (85, 96)]


def test_sweep_runs_over_each_count(parity_run, ponder):
    result = ponder("sweep", parity_run, "--from", "2", "--to", "8", "--every", "3", "--limit", "8", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [b["lo"] for b in report["buckets"]] == [2, 5, 8]
    assert set(report["fit"]) == {"steps_per_count", "steps_at_0", "r2"}
    assert report["buckets"][1]["counts"] == "5" and report["buckets"][1]["images"] == 8


def test_plots_draw_count_buckets(parity_run, ponder, tmp_path):
    pytest.importorskip("matplotlib")
    for command, extra in (("sweep", ["--to", "3"]), ("eval", [])):
        figure = tmp_path / f"{command}.png"
        result = ponder(command, parity_run, *extra, "--limit", "4", "--plot", figure, "-q")
        assert result.exit_code == 0, result.output
        assert figure.stat().st_size > 0


def test_compare_on_count_buckets_and_not_across_tasks(parity_run, checkpoint, ponder, error):
    result = ponder("compare", parity_run, "--counts", "1-8", "--limit", "4", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["task"] == "parity" and [b["counts"] for b in report["buckets"]] == ["1-8"]
    error(ponder("compare", parity_run, checkpoint, "--limit", "4", "-q"), 2, "parity", "mnist")


def test_training_batches_come_from_the_seeded_generator():
    cfg = PonderConfig.of(task="parity", elems=8, train_counts="2-5", batch_size=16, seed=7)
    source = get_task(cfg).training_source(None, "cpu")
    generator = torch.Generator().manual_seed(7)
    for index in range(3):
        source.stage(index)
        x, labels = source.batch()
        expected = parity_batch(16, 8, 2, 5, generator)
        assert torch.equal(x, expected.x) and torch.equal(labels, expected.labels)
    counts = (x != 0).sum(dim=1)
    assert counts.min() >= 2 and counts.max() <= 5


def test_the_generator_state_round_trips():
    cfg = PonderConfig.of(task="parity", elems=8, batch_size=4)
    first = ParityBatches(cfg, "cpu")
    first.stage(0)
    first.batch()
    state = first.state()
    first.stage(1)
    following = first.batch()
    second = ParityBatches(cfg, "cpu")
    second.load_state(state)
    second.stage(1)
    assert torch.equal(second.batch()[0], following[0])


def test_the_curriculum_raises_the_top_count_linearly_then_holds_it():
    # 1-16, over 8 batches from 4: tops 4 + 12 * drawn // 8
    assert [curriculum_top(drawn, 1, 16, 8, 4) for drawn in range(10)] == [4, 5, 7, 8, 10, 11, 13, 14, 16, 16]
    assert curriculum_top(0, 1, 16, 0, 4) == 16  # off
    assert curriculum_top(0, 6, 16, 8, 2) == 6  # never below the range's bottom


def test_curriculum_batches_stay_under_the_top_and_resume_where_they_were(tmp_path):
    cfg = PonderConfig.of(task="parity", elems=16, batch_size=64, curriculum=4, curriculum_start=2)
    source = ParityBatches(cfg, "cpu")
    tops = []
    for index in range(6):
        source.stage(index)
        x, _ = source.batch()
        tops.append(int((x != 0).sum(dim=1).max()))
        if index == 2:
            state = source.state()
    assert tops[0] <= 2 and tops[1] <= 5 and tops[2] <= 9 and tops[3] <= 12 and max(tops[4:]) > 12
    resumed = ParityBatches(cfg, "cpu")
    resumed.load_state(state)
    assert resumed.drawn == 3  # the curriculum goes on where it was
    straight = ParityBatches(cfg, "cpu")
    for index in range(4):
        straight.stage(index)
        expected = straight.batch()[0]
    resumed.stage(3)
    assert torch.equal(resumed.batch()[0], expected)


def test_the_curriculum_is_a_config_setting_of_parity_alone(tmp_path, ponder, error):
    path = tmp_path / "c.toml"
    path.write_text('[task]\ntask = "parity"\nelems = 8\ncurriculum = 100\ncurriculum_start = 3\n')
    printed = ponder("train", "--config", path, "--print-config")
    assert "curriculum = 100" in printed.stdout and "curriculum_start = 3" in printed.stdout
    path.write_text("[task]\ncurriculum = 100\n")
    # the file's key, not a flag
    error(ponder("train", "--config", path, "--print-config"), 2, f"--config {path}: curriculum", "--task parity",
          "mnist")
    path.write_text('[task]\ntask = "parity"\nelems = 8\ncurriculum = 10\ncurriculum_start = 9\n')
    error(ponder("train", "--config", path, "--print-config"), 2, "curriculum-start", "(8)", "9")


def test_resume_continues_the_training_stream(ponder, tmp_path):
    common = [*PARITY, "--seed", "5", "--patience", "0"]
    assert ponder("train", *common, "--epochs", "2", "--out", tmp_path / "straight").exit_code == 0
    assert ponder("train", *common, "--epochs", "1", "--out", tmp_path / "resumed").exit_code == 0
    result = ponder("train", "--resume", tmp_path / "resumed" / "last.pt", "--epochs", "2", "--no-progress")
    assert result.exit_code == 0, result.output

    def history(folder):
        return [{k: v for k, v in h.items() if k != "seconds"} for h in load_checkpoint(folder / "last.pt").history]

    assert history(tmp_path / "straight") == history(tmp_path / "resumed")
    assert "task" in load_checkpoint(tmp_path / "resumed" / "last.pt").rng


@pytest.mark.parametrize("method", ["act", "plain"])
def test_act_and_plain_train_on_parity(method, ponder, tmp_path):
    args = [a for a in PARITY if a not in ("--max-steps", "3")] if method == "plain" else PARITY  # plain: one step
    result = ponder("train", *args, "--method", method, "--epochs", "1", "--out", tmp_path / method, "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["task"], report["method"], report["config"]["max_steps"]) == ("parity", method,
                                                                                 1 if method == "plain" else 3)


@pytest.mark.parametrize("args, named", [  # the setting, the value given, the range or the task it fits
    (["--elems", "0"], ["elems", "0", "256"]),
    (["--elems", "100000"], ["elems", "100000", "256"]),
    (["--train-counts", "0-4"], ["train-counts", "0-4", "8"]),
    (["--train-counts", "5-3"], ["train-counts", "5-3", "8"]),
    (["--train-counts", "1-9"], ["train-counts", "1-9", "8"]),
    (["--train-counts", "a-b"], ["train-counts", "'a-b'", "LO-HI"]),
    (["--step", "mlp"], ["--step mlp", "--task parity"]),
    (["--train-rotation", "10"], ["--train-rotation", "--task mnist", "parity"]),
    (["--batches-per-epoch", "0"], ["batches-per-epoch", "0"]),
])
def test_bad_parity_options_are_one_line_and_write_nothing(args, named, ponder, error, tmp_path):
    error(ponder("train", *PARITY, "--epochs", "1", *args, "--out", tmp_path / "run"), 2, *named)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, named", [
    (["--step", "gru"], ["--step gru", "--task mnist"]),
    (["--elems", "16"], ["--elems", "--task parity", "mnist"]),
    (["--train-counts", "1-4"], ["--train-counts", "--task parity", "mnist"]),
    (["--gru-orthogonal"], ["--gru-orthogonal", "--step gru", "mlp"]),
])
def test_parity_options_on_mnist_are_refused(args, named, ponder, error, tmp_path):
    error(ponder("train", "--epochs", "1", *args, "--out", tmp_path / "run"), 2, *named)
    assert not (tmp_path / "run").exists()


def test_counts_on_mnist_and_angles_on_parity_are_one_line(parity_run, checkpoint, ponder, error):
    # the option refused, the model's task and the option it takes instead: exit 2, as train's
    error(ponder("eval", checkpoint, "--counts", "1-16"), 2, "--counts", "mnist", "--angles")
    error(ponder("extrapolate", parity_run, "--angles", "45"), 2, "--angles", "parity", "--counts")
    for bad in ("0-4", "5-3", "1-9"):
        error(ponder("eval", parity_run, "--counts", bad), 2, bad, "8")
    error(ponder("sweep", parity_run, "--every", "0.5"), 2, "0.5")
    error(ponder("sweep", parity_run, "--to", "9"), 2, "--to", "8")


@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare", "calibrate"])
def test_protocol_on_parity_is_refused_not_ignored(parity_run, ponder, error, command):
    error(ponder(command, parity_run, "--protocol", "fixed"), 2, "--protocol", "mnist", "parity", "--counts")


def test_mnist_protocol_defaults_to_uniform(checkpoint, tiny_mnist, ponder):
    result = ponder("eval", checkpoint, "--limit", "50", "-f", "json", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["protocol"] == "uniform"


def test_a_checkpoint_with_a_misfit_step_is_refused(vector_config):
    from ponder_cli import PonderError

    with pytest.raises(PonderError, match="--step gru does not fit --task mnist"):
        PonderConfig.from_dict({"step": "gru"})


def test_a_vector_model_probes_with_a_vector(tmp_path):
    from ponder_cli.checkpoint import new_model

    cfg = PonderConfig.of(task="parity", elems=8, hidden=8, max_steps=3, truncation=0.01)
    probe = get_task(cfg).example_input(2, "cpu")
    assert new_model(cfg).left_out_by_one_step(probe) == ["step.cell.weight_hh"]  # h_0 = 0 meets no W_hh at step 1


def test_calibrate_uses_vectors_of_its_own_over_the_training_range(parity_run, ponder):
    def report(*args):
        result = ponder("calibrate", parity_run, "-f", "json", *args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)
    default = report()
    # CALIBRATION_PER_COUNT (256) calibration vectors for each count of the training range 1-6
    assert default["sets"] == [{"counts": "1-6", "lo": 1, "hi": 6}] and default["images"] == 6 * 256
    assert default["data"] == "calibration" and default["bound"] == "wilson one-sided 95%"
    assert default["protocol"] is None and default["task"] == "parity"
    beyond = report("--counts", "7-8", "--limit", "10")
    assert beyond["sets"] == [{"counts": "7-8", "lo": 7, "hi": 8}] and beyond["images"] == 2 * 10


def test_the_limit_help_says_the_parity_sets_sizes(ponder):
    """The command line reads no torch, so its help spells the sizes out: they must be the task's."""
    from ponder_cli.tasks.parity import CALIBRATION_PER_COUNT, TEST_PER_COUNT

    for command, size in (("eval", TEST_PER_COUNT), ("extrapolate", TEST_PER_COUNT), ("calibrate", CALIBRATION_PER_COUNT)):
        assert f"(0: {size})" in " ".join(ponder(command, "--help").stdout.split()), command


def test_above_32_elements_parity_defaults_to_the_recipe_that_learnt_at_64(ponder):
    """The documented 16- and 32-element runs keep their defaults; above 32 elements batches of
    2048, the learning rate held and no early stop, derived through the one settings rule (a
    value given, by option or file, wins), and shown by --print-config and --help."""
    def training(**given):
        cfg = PonderConfig.of(task="parity", **given)
        return cfg.training.batch_size, cfg.training.lr_patience, cfg.training.patience

    assert training(elems=16) == training(elems=32) == (128, 2, 5)
    assert training(elems=33) == training(elems=64) == training(elems=96) == training() == (2048, 1000, 0)
    assert training(elems=64, batch_size=512, patience=3) == (512, 1000, 3)
    cfg = PonderConfig.of(task="parity", elems=96, train_counts="1-48", lr_patience=4)
    assert cfg.sources({"task", "elems", "train_counts", "lr_patience"})["batch_size"] == "derived by --task parity"
    printed = ponder("train", "--task", "parity", "--elems", "64", "--print-config").stdout
    for line in ("batch_size = 2048", "patience = 0", "lr_patience = 1000"):
        assert f"{line}  " in printed and printed.split(f"{line}  ")[1].split("\n")[0].endswith(
            "# derived by --task parity"), printed
    assert "batch_size = 128" in ponder("train", "--task", "parity", "--elems", "32", "--print-config").stdout
    help_text = " ".join(ponder("train", "--help").stdout.split())
    assert "[default: 128; parity --elems > 32: 2048]" in help_text
    assert "(0: off). [default: 5; parity --elems > 32: 0]" in help_text


def test_a_time_limit_stops_after_a_whole_epoch_says_so_and_resume_goes_on(ponder, tmp_path, monkeypatch):
    """A clock that moves 1 s at every read (three reads an epoch): a 10 s limit fits four
    epochs of ten. The run saves, says why it stopped and how to go on, and its JSON says why;
    resumed with a new limit it goes on from epoch 5."""
    from ponder_cli import train as training

    reads = iter(range(10_000))
    monkeypatch.setattr(training, "CLOCK", lambda: float(next(reads)))
    out = tmp_path / "run"
    result = ponder("train", *PARITY, "--epochs", "10", "--time-limit", "10s", "--out", out, "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["epochs"], report["stop_reason"], report["stopped_early"]) == (4, "time limit", False)
    assert load_checkpoint(out / "last.pt").epoch == 4
    listed = json.loads(ponder("runs", out, "-f", "json").stdout)["buckets"]  # its own status, not "interrupted"
    assert [(run["status"], run["epoch"]) for run in listed] == [("time limit", 4)]
    assert f"stopped at its time limit after epoch 4 of 10; resume with: ponder train --resume {out / 'last.pt'}" \
        in ponder("info", out, "-f", "json").stdout
    assert (f"stopped at its time limit (10s) after epoch 4: the next epoch would take about 1.0 s, the time "
            f"is up; epoch 4 is saved in {out / 'last.pt'}; resume with: ponder train --resume {out / 'last.pt'} "
            f"--time-limit 10s") in result.stderr.splitlines()
    again = ponder("train", "--resume", out, "--time-limit", "1h", "-f", "json", "--no-progress")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (report["epochs"], report["stop_reason"]) == (10, "finished")
    assert [bucket["epoch"] for bucket in report["buckets"]] == list(range(1, 11))
    assert "time limit" not in again.stderr
    assert json.loads(ponder("runs", out, "-f", "json").stdout)["buckets"][0]["status"] == "finished"


@pytest.mark.parametrize("value", ["9", "9x", "0s", "1h1h", "-5m"])
def test_a_time_limit_that_is_not_a_duration_is_one_line(value, ponder, error, tmp_path):
    error(ponder("train", *PARITY, "--time-limit", value, "--out", tmp_path / "run"), 2, "--time-limit", repr(value))
    assert not (tmp_path / "run").exists()


def test_a_run_at_chance_says_so_in_one_line_and_its_report_says_why(ponder, tmp_path):
    """A learning rate too small to learn, cut after every epoch without improvement (to 9e-9,
    under a thousandth of 1e-5, by epoch 3): one line on stderr, and not a normal finish."""
    config = tmp_path / "cut.toml"
    config.write_text("[training]\nlr = 1e-5\nlr_patience = 0\nlr_factor = 0.03\npatience = 0\n")
    result = ponder("train", *PARITY, "--epochs", "3", "--config", config, "--out", tmp_path / "run", "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["stop_reason"], report["epochs"], report["stopped_early"]) == ("at chance", 3, False)
    said = [line for line in result.stderr.splitlines() if "at chance" in line]
    assert len(said) == 1 and said[0].startswith("the run sits at chance: its best validation accuracy is ")
    assert "its learning rate was cut from 1e-05 to 9e-09; it did not learn" in said[0]
def test_eval_loss_is_taken_under_the_halting_asked_for(ponder):
    """parity16 stopped at step 1 is at chance and says so in its loss (it once showed the
    training objective, 0.0112, whatever the halting); the JSON and caption name the rule."""
    def run(rule, fmt="json"):
        result = ponder("eval", "parity16", "--halting", rule, "--counts", "13-16", "--limit", "32", "-f", fmt, "-q")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout) if fmt == "json" else " ".join(result.stdout.split())
    first, last = run("fixed:1"), run("fixed:20")
    one, twenty = first["buckets"][0], last["buckets"][0]
    assert (one["loss_halting"], twenty["loss_halting"]) == ("fixed:1", "fixed:20")
    assert one["images"] == 128 and 0.35 < one["accuracy"] < 0.65 and one["loss"] > 1.0  # confidently at chance
    assert twenty["accuracy"] > 0.9 and twenty["loss"] < 0.3
    # the training objective does not depend on the halting: the same figures under both
    assert (one["objective"], one["reconstruction"]) == (twenty["objective"], twenty["reconstruction"])
    assert one["objective"] < 0.05
    assert f"{one['loss']:.4f}" in run("fixed:1", "table")
    assert "loss: cross-entropy of the prediction under halting fixed:1" in run("fixed:1", "table")
