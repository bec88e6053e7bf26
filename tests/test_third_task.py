"""A task is one module and one registry line: a third one, defined here and registered by one
line, trains, evaluates on its own buckets, predicts and reports through the public commands,
with no package module naming it."""

import json
import sys

import numpy as np
import pytest
import torch

from ponder_cli import registry
from ponder_cli.checkpoint import load_model
from ponder_cli.evaluate import EvalBucket, evaluate_bucket
from ponder_cli.model import Quantile, halting_steps
from ponder_cli.reports import TaskView, Terms
from ponder_cli.tasks import Task, TrainingSource, UserInputs, load_inputs, uniforms

WIDTH, TRAINED = 6, 3  # vectors of 6 small integers; training uses the first 1-3 of them


def sums(length: int, rows: int, seed: int):
    """`rows` vectors whose first `length` entries are integers 0-3 (the rest 0), labels: the sum mod 2."""
    x = torch.randint(0, 4, (rows, WIDTH), generator=torch.Generator().manual_seed(seed)).float()
    x[:, length:] = 0
    return x, (x.sum(1) % 2).long()


class SumsTask(Task):
    name, classes, inputs, input_kind, input_shape = "sums", 2, "vectors of 6 integers 0-3", "vectors", (WIDTH,)
    implied, reads, bucket_metavar = {"step": "rnn"}, ("batches_per_epoch",), "LENGTH..."
    calibration_split = "calibration"

    def load_training(self, data_dir, download):
        return None, sums(TRAINED, 64, seed=1)

    def to_device(self, data, device):
        return data

    def training_source(self, data, device):
        task = self

        class Batches(TrainingSource):
            def start_epoch(self):
                return task.cfg.task.batches_per_epoch

            def stage(self, index):
                self.index = index

            def batch(self):
                return sums(1 + self.index % TRAINED, task.cfg.training.batch_size, seed=100 + self.index)

        return Batches()

    def validate(self, model, data, amp):
        return evaluate_bucket(model, self.bucket(None, TRAINED, [], model.max_steps, self.cfg.training.seed, None),
                               self.cfg,
                               amp=amp)

    def describe(self, train_data, val_data):
        return "on vectors of sums"

    def read_inputs(self, paths, options):
        rows = [load_inputs(path, (WIDTH,), self.inputs) for path in paths]
        return UserInputs([f"{p}[{i}]" for p, r in zip(paths, rows) for i in range(len(r))],
                          torch.from_numpy(np.concatenate(rows)).float())

    def example_input(self, batch, device):
        return torch.zeros((batch, WIDTH), device=device)

    def view(self):
        terms = Terms("length", "length", "d", "length", "length and ponder steps", "vectors", "sums test vectors",
                      lambda b: f"length {b['length']}", "length", "length", 1.0, "entry", "steps_per_entry", "length")
        return TaskView("sums", terms, {"width": WIDTH}, f"sums of up to {TRAINED} entries", protocol=None)

    def default_buckets(self, command):
        return list(range(TRAINED + 1, WIDTH + 1)) if command == "extrapolate" else list(range(1, TRAINED + 1))

    def parse_specs(self, texts, option):
        return [int(text) for text in texts]

    def test_data(self, options, device):
        return options.limit or 32

    calibration_data = test_data

    def bucket(self, test, spec, specs, max_steps, seed, protocol, draw=0):
        x, labels = sums(spec, test or 32, seed=1000 * spec + draw)
        return EvalBucket(labels=labels, inputs=lambda start, end: x[start:end],
                          uniforms=uniforms(seed, "coins", (spec,), torch.arange(len(x)), max_steps, torch.float32).T,
                          difficulty=torch.full((len(x),), float(spec), dtype=torch.float64))

    def bucket_fields(self, spec, protocol, specs):
        return {"length": spec}

    def sweep_specs(self, start, stop, every):
        return list(range(int(start or 1), int(stop or WIDTH) + 1, int(every or 1)))


@pytest.fixture
def sums_task(monkeypatch):
    """The one registry line, pointing at this module."""
    monkeypatch.setitem(sys.modules, "third_task_module", sys.modules[__name__])
    monkeypatch.setitem(registry.TASKS, "sums", "third_task_module:SumsTask")


def test_a_task_defined_here_trains_evaluates_predicts_and_reports(sums_task, ponder, error, tmp_path):
    run = tmp_path / "run"
    trained = ponder("train", "--task", "sums", "--step", "gru", "--epochs", "1", "--batches-per-epoch", "3",
                     "--batch-size", "16", "--hidden", "8", "--max-steps", "3", "--out", run, "-q", "-f", "json")
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["task"] == "sums"

    evaluated = json.loads(ponder("eval", run, "--limit", "8", "-f", "json", "-q").stdout)
    assert (evaluated["task"], evaluated["width"], evaluated["protocol"]) == ("sums", 6, None)
    assert [b["length"] for b in evaluated["buckets"]] == [1, 2, 3]  # the task's default for eval
    assert [b["images"] for b in evaluated["buckets"]] == [8, 8, 8]
    assert evaluated["spearman"]["between"] == "length and ponder steps"

    beyond = json.loads(ponder("extrapolate", run, "--buckets", "4", "6", "-f", "json", "-q").stdout)
    assert [(b["length"], b["images"]) for b in beyond["buckets"]] == [(4, 32), (6, 32)]
    assert len(json.loads(ponder("extrapolate", run, "-f", "json", "-q").stdout)["buckets"]) == 3  # 4, 5, 6
    compared = json.loads(ponder("compare", run, "--buckets", "5", "-f", "json", "-q").stdout)
    assert [(b["length"], b["images"]) for b in compared["buckets"]] == [(5, 32)]
    error(ponder("extrapolate", run, "--counts", "1-4"), 2, "--counts", "parity", "sums", "--buckets")

    rows = tmp_path / "rows.npy"
    np.save(rows, np.array([[1, 2, 0, 0, 0, 0], [3, 3, 1, 0, 0, 0]], dtype=np.float32))
    predicted = json.loads(ponder("predict", run, rows, "--halting", "median", "-f", "json", "-q").stdout)
    assert [b["input"] for b in predicted["buckets"]] == [f"{rows}[0]", f"{rows}[1]"]
    model, _, _ = load_model(run / "best.pt", "cpu")  # the model read the rows as the task gave them
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 0, 0, 0, 0], [3, 3, 1, 0, 0, 0]], dtype=torch.float32))
    halts = halting_steps(Quantile(0.5), None, out.lambda_logits)[0]  # (2,): the median rule, 1-based
    for i, bucket in enumerate(predicted["buckets"]):
        probs = torch.softmax(out.logits[halts[i] - 1, i], dim=-1)
        assert bucket["halting_step"] == int(halts[i])
        assert (bucket["prediction"], bucket["probability"]) == (int(probs.argmax()), pytest.approx(float(probs.max())))

    info = json.loads(ponder("info", run, "-f", "json", "-q").stdout)
    assert (info["config"]["task"], info["config"]["step"], info["epochs_trained"]) == ("sums", "gru", 1)
    assert info["config"]["batches_per_epoch"] == 3  # a field this task reads, so shown


def test_its_buckets_refuse_another_tasks_spelling_and_its_name_the_default_run_folder(sums_task, ponder,
                                                                                        error, tmp_path):
    from ponder_cli.config import PonderConfig
    from ponder_cli.runs import run_dir_name

    assert run_dir_name(PonderConfig.of(task="sums")) == "sums-pondernet-rnn-seed1234"
    error(ponder("train", "--task", "sums", "--step", "mlp", "--out", tmp_path / "x"), 2, "--step mlp", "--task sums",
          "rnn, gru")


def test_an_installed_package_registers_a_task_by_entry_point(monkeypatch, ponder, error, tmp_path):
    """Not built in: --task looks the name up among the entry points `ponder_cli.tasks`, only then."""
    from importlib import metadata

    point = metadata.EntryPoint("sums", "third_task_module:SumsTask", registry.ENTRY_POINTS["task"])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == registry.ENTRY_POINTS["task"] else [])
    monkeypatch.setitem(sys.modules, "third_task_module", sys.modules[__name__])
    line = error(ponder("train", "--task", "nothing"), 2, "--task", "'nothing'", "'mnist', 'parity'")
    assert "sums" not in line
    try:
        printed = ponder("train", "--task", "sums", "--print-config", "-f", "json")
        assert registry.TASKS["sums"] == "third_task_module:SumsTask"  # found, and kept for what follows
    finally:
        registry.TASKS.pop("sums", None)
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout)["step"]["step"] == "rnn"  # what the task implies


def test_an_installed_package_registers_a_step_by_entry_point(sums_task, monkeypatch, ponder, error,
                                                              tmp_path):
    """Steps (and methods) are found the same way: here the tanh RNN again, under a name of its own."""
    from importlib import metadata

    point = metadata.EntryPoint("tanh", "ponder_cli.steps.vectors:RNNStep", registry.ENTRY_POINTS["step"])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == registry.ENTRY_POINTS["step"] else [])
    line = error(ponder("train", "--step", "nothing"), 2, "--step", "'nothing'", "'mlp', 'align', 'rnn', 'gru'")
    assert "tanh" not in line
    run = tmp_path / "run"
    try:
        trained = ponder("train", "--task", "sums", "--step", "tanh", "--epochs", "1", "--batches-per-epoch", "2",
                         "--batch-size", "8", "--hidden", "4", "--max-steps", "2", "--out", run, "-q", "-f", "json")
        assert trained.exit_code == 0, trained.output
        info = json.loads(ponder("info", run, "-f", "json", "-q").stdout)
        model, _, _ = load_model(run / "best.pt", "cpu")  # rebuilt from its config: the step read the task's width
    finally:
        registry.STEPS.pop("tanh", None)  # found, it joined STEPS: leave the table as it was
    assert (info["config"]["task"], info["config"]["step"]) == ("sums", "tanh")
    assert type(model.step).__name__ == "RNNStep" and model.step.from_input.weight.shape == (4, WIDTH)
