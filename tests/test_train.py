import dataclasses
import math
import re
import resource
import sys

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli import train as training
from ponder_cli.checkpoint import new_model
from ponder_cli.train import batch_step, train, train_one_epoch
from ponder_cli.model import Method, halting_steps
from ponder_cli.tasks import get_task

CFG = PonderConfig.of(epochs=2, max_steps=4, batch_size=64, val_size=100, hidden=16, hidden_cnn=16, hidden_lin=16)


def _data(tiny_mnist, cfg=CFG):
    return train_val_split(load_mnist(tiny_mnist, train=True, download=False),
                           val_size=cfg.task.val_size, train_size=cfg.task.train_size, seed=cfg.training.seed)


def test_training_learns_the_synthetic_digits(tiny_mnist, tmp_path):
    train_set, val_set = _data(tiny_mnist)
    cfg = CFG.replace(epochs=4, lr=3e-3, train_rotation=0.0)
    result = train(cfg, train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    assert result.last_epoch == 4 and len(result.history) == 4
    assert result.best_accuracy > 0.5  # chance is 0.1
    assert result.history[-1].train_loss < result.history[0].train_loss
    assert all(1 <= h.val_steps <= 4 for h in result.history)


def test_bf16_autocast_on_cpu_trains_with_finite_float32_loss(tiny_mnist, tmp_path):
    train_set, val_set = _data(tiny_mnist)
    result = train(CFG.replace(epochs=1), train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path,
                   amp=True, progress=False)
    stats = result.history[0]
    assert math.isfinite(stats.train_loss) and math.isfinite(stats.train_regularisation)
    assert 0 <= stats.val_accuracy <= 1


@pytest.mark.parametrize("cnn_dropout_mask", ["shared", "per-step"])
def test_resume_equals_training_straight_through(cnn_dropout_mask, tiny_mnist, tmp_path):
    train_set, val_set = _data(tiny_mnist)
    cpu = torch.device("cpu")
    cfg = CFG.replace(cnn_dropout_mask=cnn_dropout_mask)
    straight = train(cfg, train_set, val_set, device=cpu, out_dir=tmp_path / "a", progress=False)
    train(cfg.replace(epochs=1), train_set, val_set, device=cpu, out_dir=tmp_path / "b", progress=False)
    resumed = train(cfg, train_set, val_set, device=cpu, out_dir=tmp_path / "b", progress=False,
                    resume=load_checkpoint(tmp_path / "b" / "last.pt"))
    assert [h.epoch for h in resumed.history] == [1, 2]
    assert resumed.history[-1].val_accuracy == straight.history[-1].val_accuracy
    assert resumed.history[-1].train_loss == straight.history[-1].train_loss
    a = load_checkpoint(tmp_path / "a" / "last.pt").model
    b = load_checkpoint(tmp_path / "b" / "last.pt").model
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_early_stopping_and_best_checkpoint(tiny_mnist, tmp_path):
    train_set, val_set = _data(tiny_mnist)
    cfg = CFG.replace(epochs=6, patience=1, lr=1e-9)  # nothing improves after epoch 1
    result = train(cfg, train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    assert result.stopped_early and result.last_epoch < 6
    assert load_checkpoint(tmp_path / "best.pt").epoch == result.best_epoch
    assert load_checkpoint(tmp_path / "last.pt").epoch == result.last_epoch


def test_measuring_the_training_batches_draws_none_of_the_trainings_randomness(tiny_mnist, monkeypatch):
    """The per-batch accuracy and steps are expectations under the halting distribution, with no
    coin drawn: an epoch measured and one not (its metrics stubbed out) train the same weights and
    leave the same random state after them."""
    data = load_mnist(tiny_mnist, train=True, download=False).subset(slice(0, 300))  # three batches
    cfg = CFG.replace(batch_size=100)  # dropout and the ±22.5° training rotation draw at every batch

    def epoch():
        torch.manual_seed(0)
        model = new_model(cfg)
        stats = train_one_epoch(batch_step(model, cfg, data), progress=False)
        return model.state_dict(), torch.get_rng_state(), stats

    weights, after, stats = epoch()
    assert 0 < stats["accuracy"] < 1 and 1 < stats["steps"] < cfg.method.max_steps
    monkeypatch.setattr(Method, "batch_metrics", lambda *args: (torch.zeros(()), torch.zeros(())))
    unmeasured_weights, unmeasured_after, unmeasured = epoch()
    assert unmeasured["accuracy"] == 0 and unmeasured["loss"] == stats["loss"]
    assert all(torch.equal(weights[k], unmeasured_weights[k]) for k in weights)
    assert torch.equal(after, unmeasured_after)


@pytest.mark.parametrize("batches, startup, per_batch, expected", [
    # the clock starts once batch 0 (3 s of start-up) is done; after 5 s ten batches of 0.5 s are
    # timed: 50 s an epoch of 100, 1000 s (17 min) for 20 epochs
    (100, 3.0, 0.5, "about 50 s an epoch, 17 min for 20 epochs"),
    # or once 20 batches are timed (0.2 s): 0.01 s a batch, 100 s (2 min) an epoch of 10,000, 33 min for 20
    (10_000, 3.0, 0.01, "about 2 min an epoch, 33 min for 20 epochs"),
    # 0.01 s a batch of 100: 1 s an epoch, 20 s in all: too short a run to need an estimate
    (100, 3.0, 0.01, None),
])
def test_the_run_s_duration_is_estimated_once_from_its_first_batches(batches, startup, per_batch, expected):
    lines, now = [], [0.0]
    timer = training.EpochTimer(20, lines.append, clock=lambda: now[0])
    waits = []
    timer.synchronize = lambda: waits.append(now[0])  # on CUDA, a wait for the device
    for epoch in range(2):
        for index in range(min(batches, 100)):
            now[0] = 100 * epoch + (startup + per_batch * (index - 1) if index else 0.0)
            timer(index, batches)
    assert lines == ([expected] if expected else [])
    assert len(waits) == 2  # where the clock starts and where it is read: never a wait per batch


def test_durations_read_as_a_person_says_them():
    from ponder_cli import BadValue, durations

    assert [durations.rough(s) for s in (0.2, 45, 89.6, 200, 5399, 5400, 50_000)] == [
        "1 s", "45 s", "90 s", "3 min", "90 min", "1.5 h", "14 h"]
    assert [durations.rough(s, tenths=True) for s in (0.04, 4.25, 9.96, 45)] == ["0.0 s", "4.2 s", "10.0 s", "45 s"]
    assert [durations.ago(s) for s in (59, 300, 3 * 3600 + 59, 86400, 9 * 86400 + 5)] == [
        "just now", "5 min ago", "3 h ago", "1 day ago", "9 days ago"]
    # the exact form is what --time-limit reads back, to the second
    exact = {s: durations.exact(s) for s in (0, 0.4, 59.6, 90, 540, 3600, 5401, 7200, 90061)}
    assert list(exact.values()) == ["0s", "0s", "1m", "1m30s", "9m", "1h", "1h30m1s", "2h", "25h1m1s"]
    assert all(durations.parse(text) == round(s) for s, text in exact.items() if round(s) > 0)
    assert [durations.parse(text) for text in ("90s", "1.5h", "1h 30m", ".5m")] == [90, 5400, 5400, 30]
    for text in ("", "0s", "90", "1m1m", "1x", "-5m"):
        with pytest.raises(BadValue, match="^--budget "):
            durations.parse(text, "--budget")
    assert training.duration_estimate(59.0, 1) is None  # under a minute in all
    assert training.duration_estimate(90.0, 1) == "about 2 min for 1 epoch"


def test_train_states_its_estimate_among_the_chatter(ponder, tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.setattr(training, "ESTIMATE_FROM_SECONDS", 0.0)  # a tiny run gets one too
    args = ["train", "--epochs", "1", "--max-steps", "2", "--val-size", "100", "--train-size", "200",
            "--batch-size", "8", "--no-progress", "--data-dir", tiny_mnist]  # 25 batches: 20 timed
    result = ponder(*args, "--out", tmp_path / "a")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("training pondernet"))
    assert re.fullmatch(r"about \d+ s for 1 epoch", lines[start + 1]) and lines[start + 2].startswith("epoch  1/1")
    assert ponder(*args, "--out", tmp_path / "b", "-q").stderr == ""


def test_the_step_counts_the_optimizer_steps_it_takes_and_resumes_from_adams_count(tiny_mnist, tmp_path):
    """What a warm-up reads (--beta-warmup): the steps taken, as Adam counts them, on resume too."""
    train_set, val_set = _data(tiny_mnist)
    cfg = CFG.replace(epochs=1, beta_warmup=50)
    step = batch_step(new_model(cfg), cfg, train_set)
    batches = train_one_epoch(step, progress=False)["batches"]
    assert float(step.taken) == batches  # Adam's own count
    resumed = batch_step(new_model(cfg), cfg, train_set, optimizer=step.optimizer)
    assert float(resumed.taken) == batches


def test_random_depth_training_stops_each_input_at_its_drawn_depth(tiny_mnist, tmp_path):
    train_set, val_set = _data(tiny_mnist)
    cfg = CFG.replace(max_steps=6, depth_min=2)
    torch.manual_seed(0)
    rule = batch_step(new_model(cfg), cfg, train_set).method.truncation(400, torch.device("cpu"))
    computed, _ = halting_steps(rule, None, torch.full((6, 400), -10.0))  # halting never near: the depth decides
    assert computed.min() == 2 and computed.max() == 6
    assert sorted(set(computed.tolist())) == [2, 3, 4, 5, 6]  # every depth drawn, uniformly
    assert abs(computed.float().mean() - 4.0) < 0.25
    result = train(cfg, train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    # the expected steps under the halting distribution stay within each input's depth (mean 4)
    assert 1 <= result.history[0].train_steps <= 4.25 and math.isfinite(result.history[0].train_loss)
def test_patience_running_out_at_the_last_epoch_is_a_finished_run(tiny_mnist, tmp_path, quick, ponder):
    """A learning rate too small to change anything: only epoch 1 improves. With --patience 1,
    two planned epochs end as planned (finished, not stopped early); three stop after the second."""
    import json

    for epochs, stopped, status in ((2, False, "finished"), (3, True, "stopped early after epoch 2")):
        out = tmp_path / f"e{epochs}"
        result = ponder("train", *quick, "--epochs", epochs, "--patience", 1, "--lr", 1e-9, "--data-dir", tiny_mnist,
                        "--out", out, "-f", "json")
        assert result.exit_code == 0, result.output
        trained = json.loads(result.stdout)
        assert (trained["epochs"], trained["stopped_early"]) == (2, stopped)
        info = json.loads(ponder("info", out, "-f", "json").stdout)
        assert info["stopped_early"] is stopped and info["status"].startswith(status)
        runs = json.loads(ponder("runs", out, "-f", "json").stdout)["buckets"]
        assert runs[0]["status"] == status.removesuffix(" after epoch 2")


def test_the_estimate_takes_the_steady_batches_not_the_slow_ones_after_start_up():
    """On the CPU the first batches after start-up are still slow; the estimate is the median
    batch's: three batches of 1 s among seventeen of 0.1 s give 0.1 s a batch (their mean, 0.235
    s, made the estimate more than twice too long)."""
    lines, now = [], [0.0]
    timer = training.EpochTimer(20, lines.append, clock=lambda: now[0])
    times = [1.0] * 3 + [0.1] * 17
    for index in range(22):
        now[0] = 3.0 + sum(times[:max(index - 1, 0)]) if index else 0.0
        timer(index, 1000)
    assert lines == ["about 2 min an epoch, 33 min for 20 epochs"]  # 100 s an epoch of 1,000


def test_a_few_slow_batches_after_start_up_make_no_estimate():
    """An epoch of six batches of 8 s after start-up (a slow first epoch, under DDP say) where the
    next epochs take 1 s a batch: the five-second rule alone estimated 48 s an epoch from one
    batch; an estimate waits for ESTIMATE_MIN_BATCHES, and such an epoch's line comes soon."""
    lines, now = [], [0.0]
    timer = training.EpochTimer(31, lines.append, clock=lambda: now[0])
    for seconds in (8.0, 1.0, 1.0):
        for index in range(6):
            now[0] += seconds
            timer(index, 6)
    assert lines == []


PARITY = PonderConfig.of(task="parity", elems=4, hidden=8, max_steps=2, batch_size=16, batches_per_epoch=2, epochs=8)


def _ticking(seconds: list):
    """A clock and an on_epoch that advances it by each epoch's seconds in turn: epochs that take
    exactly that long, with no sleeping."""
    now = [0.0]

    def on_epoch(record):
        now[0] += seconds[record.epoch - 1]
    return (lambda: now[0]), on_epoch


def test_a_time_limit_ends_the_run_after_the_last_epoch_that_fits_and_resume_goes_on(tmp_path):
    """Epoch 1 takes 30 s (one-time costs), the rest 10 s; 75 s fit five epochs. Judged by the
    first epoch's 30 s the run would stop after three; judged by the slowest of the steady ones
    it starts the fifth at 60 s, ends it at 70 s, and does not start a sixth it cannot finish."""
    cpu = torch.device("cpu")
    clock, on_epoch = _ticking([30.0] + [10.0] * 7)
    result = train(PARITY, None, get_task(PARITY).load_training(None, False)[1], device=cpu, out_dir=tmp_path,
                   progress=False, time_limit=75.0, clock=clock, on_epoch=on_epoch)
    assert (result.last_epoch, result.stop_reason, result.stopped_early) == (5, training.TIME_LIMIT, False)
    assert result.stop_note == ("stopped at its time limit (1m15s) after epoch 5: the next epoch would take "
                                "about 10 s, 5.0 s are left")
    state = load_checkpoint(tmp_path / "last.pt")
    assert state.epoch == 5 and not state.stopped_early
    clock, on_epoch = _ticking([0.0] * 5 + [40.0, 40.0, 40.0])  # resumed with a new limit: epoch 6 fits, 7 not
    resumed = train(PARITY, None, get_task(PARITY).load_training(None, False)[1], device=cpu, out_dir=tmp_path,
                    progress=False, time_limit=70.0, clock=clock, on_epoch=on_epoch, resume=state)
    assert (resumed.last_epoch, resumed.stop_reason) == (6, training.TIME_LIMIT)
    assert [h.epoch for h in resumed.history] == [1, 2, 3, 4, 5, 6]


def test_a_run_at_chance_with_its_learning_rate_at_the_floor_says_so(tmp_path):
    """A learning rate too small to move anything, cut after every epoch without improvement:
    after epoch 3 it is 1e-5 x 0.03^2, below a thousandth of its start, and validation never
    left chance (two classes: 0.5, within 3 standard errors of 256 vectors). The run does not
    report a normal finish; one that learnt, at the same learning rate cuts, does."""
    cfg = PARITY.replace(epochs=3, lr=1e-5, lr_patience=0, lr_factor=0.03, patience=0)
    val = get_task(cfg).load_training(None, False)[1]
    result = train(cfg, None, val, device=torch.device("cpu"), out_dir=tmp_path / "a", progress=False)
    assert result.stop_reason == training.AT_CHANCE and abs(result.best_accuracy - 0.5) < 0.094
    assert result.stop_note.startswith(f"the run sits at chance: its best validation accuracy is "
                                       f"{result.best_accuracy:.4f} (chance 0.5) and its learning rate was cut "
                                       f"from 1e-05 to 9e-09")
    learnt = dataclasses.replace(result, best_accuracy=0.7)
    assert training.at_chance(learnt, cfg, 2, 9e-9) is None
    assert training.at_chance(result, cfg, 2, 1e-7) is None  # a learning rate not yet at the floor


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_cpu_training_batches_reuse_the_memory_the_last_batch_freed():
    # batches of 128 parity vectors: 1.3 MB readouts (20 steps of 128 units) and the like, which glibc's
    # defaults hand back to the system at every free, to fault in again, page by page
    cfg = PonderConfig.of(task="parity", elems=64, batch_size=128, seed=1)
    torch.manual_seed(1)
    step = batch_step(new_model(cfg), cfg, get_task(cfg).training_source(None, torch.device("cpu")))
    step.warm_up()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for index in range(20):
        step.source.stage(index)
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    assert faults < 40, f"{faults:.0f} page faults a batch"
