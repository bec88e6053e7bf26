"""Data-parallel training: two gloo ranks on the CPU against one process, and the CLI under torchrun."""

import contextlib
import csv
import io
import json
import os
import signal
import socket
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import ponder_cli
from ponder_cli import PonderError, distributed
from ponder_cli.tasks import mnist as mnist_task  # uniform_angles: the MNIST task's training draws
from ponder_cli.api import Interrupted
from ponder_cli.checkpoint import load_checkpoint, load_model
from ponder_cli.cli import app
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli.model import FixedBudget, PonderNet
from ponder_cli.train import train

import processes

REPO = Path(ponder_cli.__file__).resolve().parent.parent
TINY = ["--val-size", "100", "--train-size", "256", "--max-steps", "3", "--batch-size", "64", "--no-progress"]
# Truncation under DDP: the align step (a CNN per step), 8 images per rank and batch. A halting
# bias just above logit(0.99) puts the first step's remaining halting mass on both sides of
# --truncation 0.01, so in some batches one rank stops after one step while the other goes on;
# with the halting head reading the state alone (not align's default, which shows it the turn)
# the turn's weights then get no gradient on that rank.
ALIGN = ["--step", "align", "--truncation", "0.01", "--max-steps", "3", "--halting-input", "state", "--turn-gate", "0",
         "--halting-bias", "4.66", "--epochs", "1", "--val-size", "100", "--train-size", "256", "--batch-size", "16",
         "--no-progress"]
# The same with align's own halting input and turn gate: halting sees the turn from step 1 on, so
# every forward reaches every parameter and DDP need not search for unused ones.
ALIGN_DEFAULTS = [option for option in ALIGN if option not in ("--halting-input", "state", "--turn-gate", "0")]
SMALL = dict(max_steps=3, val_size=100, hidden=16, hidden_cnn=16, hidden_lin=16, epochs=1)
# Without dropout and rotation the ranks' own RNG streams touch nothing, so 2 ranks x 64 images
# must step exactly like 1 process x 128 images.
NO_NOISE = PonderConfig.of(**SMALL, batch_size=128, train_size=192, cnn_dropout=0.0, mlp_dropout=0.0,
                           train_rotation=0.0)
# Everything random on: 201 images, three whole global batches of 64 an epoch (9 left out).
NOISY = PonderConfig.of(**{**SMALL, "epochs": 2}, batch_size=64, train_size=201)
TORCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _data(data_dir, cfg):
    return train_val_split(load_mnist(data_dir, train=True, download=False), val_size=cfg.task.val_size,
                           train_size=cfg.task.train_size, seed=cfg.training.seed)


def _cli(args: list, out: Path, name: str, rank: int) -> None:
    """`ponder ARGS` in this process (which starts and ends its own process group); its exit code,
    stdout and stderr go to out/<name><rank>.json."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            app(args, prog_name="ponder")
        except SystemExit as exc:
            code = exc.code
    (out / f"{name}{rank}.json").write_text(json.dumps({"code": code, "stdout": stdout.getvalue(),
                                                        "stderr": stderr.getvalue()}))


def _rank_main(rank: int, world: int, ports: tuple, data_dir: Path, out: Path) -> None:
    """One rank of a 2-process gloo run, in torchrun's environment: two `ponder train` runs, then
    library-level runs that record what they saw. Each uses a fresh port: a fresh process group."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(ports[0]))
    torch.set_num_threads(1)
    _cli(["train", "--epochs", "2", *TINY, "--data-dir", str(data_dir), "--out", str(out / "cli")], out, "cli", rank)

    # The default run folder, whose first choice the fixture took: rank 0 claims the next one
    # and every rank must train with that. Record each rank's folder and steps per batch.
    os.environ["MASTER_PORT"] = str(ports[1])
    os.chdir(out / "work")
    seen = {"out_dir": [], "computed": []}
    import ponder_cli.api.training as training_command  # where `ponder train` calls train()

    real_train, real_truncated = training_command.train, PonderNet._forward_truncated

    def recording_train(*args, **kwargs):
        seen["out_dir"].append(str(kwargs["out_dir"]))
        return real_train(*args, **kwargs)

    def recording_truncated(self, x, stop):
        result = real_truncated(self, x, stop)
        if self.training and not isinstance(stop, FixedBudget):  # not left_out_by_one_step's probe
            seen["computed"].append(int(result.computed.max()))
        return result

    real_wrap = distributed.wrap

    def recording_wrap(*args, **kwargs):
        seen.setdefault("find_unused_parameters", []).append(kwargs["find_unused_parameters"])
        return real_wrap(*args, **kwargs)

    training_command.train, PonderNet._forward_truncated = recording_train, recording_truncated
    distributed.wrap = recording_wrap
    try:
        _cli(["train", *ALIGN, "--data-dir", str(data_dir)], out, "align", rank)
        (out / f"align_seen{rank}.json").write_text(json.dumps(seen))
        seen = {"out_dir": [], "computed": []}
        os.environ["MASTER_PORT"] = str(ports[3])
        _cli(["train", *ALIGN_DEFAULTS, "--data-dir", str(data_dir), "--out", str(out / "align_defaults")], out,
             "align_defaults", rank)
        (out / f"align_defaults_seen{rank}.json").write_text(json.dumps(seen))
    finally:
        training_command.train, PonderNet._forward_truncated = real_train, real_truncated
        distributed.wrap = real_wrap

    os.environ["MASTER_PORT"] = str(ports[2])
    cpu = torch.device("cpu")
    distributed.setup(cpu, distributed.launch())
    seen = {"global": [], "mine": [], "angles": []}
    shard, uniform_angles = distributed.shard, mnist_task.uniform_angles  # the MNIST task's training draws

    def recording_shard(index):
        seen["global"].append(index.clone())
        seen["mine"].append(shard(index).clone())
        return seen["mine"][-1]

    def recording_angles(*args, **kwargs):
        seen["angles"].append(uniform_angles(*args, **kwargs).clone())
        return seen["angles"][-1]

    distributed.shard, mnist_task.uniform_angles = recording_shard, recording_angles
    try:
        step = train(NO_NOISE, *_data(data_dir, NO_NOISE), device=cpu, out_dir=out / "step", progress=False)
        for values in seen.values():
            values.clear()
        straight = train(NOISY, *_data(data_dir, NOISY), device=cpu, out_dir=out / "straight", progress=False)
        recorded = len(seen["global"])
        train(NOISY.replace(epochs=1), *_data(data_dir, NOISY), device=cpu, out_dir=out / "resumed", progress=False)
        resumed = train(NOISY, *_data(data_dir, NOISY), device=cpu, out_dir=out / "resumed", progress=False,
                        resume=load_checkpoint(out / "resumed" / "last.pt"))

        def history(result):
            return [{k: v for k, v in asdict(h).items() if k != "seconds"} for h in result.history]

        torch.save({"step": history(step), "straight": history(straight), "resumed": history(resumed),
                    "global": seen["global"][:recorded], "mine": seen["mine"][:recorded],
                    "angles": seen["angles"][:recorded], "global_resumed": seen["global"][recorded:]},
                   out / f"rank{rank}.pt")
        # --time-limit: rank 0's clock runs 10 s a read, rank 1's a millisecond: alone, rank 0
        # would stop after epoch 2 of 3 and rank 1 train all three; rank 0's decision holds on both
        now = [0.0]

        def clock():
            now[0] += 10.0 if rank == 0 else 0.001
            return now[0]
        limited = train(NOISY.replace(epochs=3), *_data(data_dir, NOISY), device=cpu, out_dir=out / "limited",
                        progress=False, time_limit=65.0, clock=clock)
        (out / f"limited{rank}.json").write_text(json.dumps([limited.last_epoch, limited.stop_reason]))
    finally:
        distributed.teardown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tiny_mnist, tmp_path_factory):
    """Runs both ranks once, each a process forked from this one (no second import of torch)."""
    out = tmp_path_factory.mktemp("ddp")
    (out / "work" / "runs" / "pondernet-align-seed1234").mkdir(parents=True)  # taken: the run gets -2
    ports = (_free_port(), _free_port(), _free_port(), _free_port())
    ranks = [processes.fork(_rank_main, rank, 2, ports, tiny_mnist, out) for rank in (0, 1)]
    try:
        for rank in ranks:
            rank.wait(timeout=180)  # else "the 2-rank run hung"
        for rank in ranks:
            assert rank.returncode == 0, rank.communicate()[1]
    finally:
        for rank in ranks:
            rank.__exit__()
    return out


def _params(path: Path) -> dict:
    return load_checkpoint(path).model


def _ranks(two_ranks: Path, name: str) -> list:
    return [json.loads((two_ranks / f"{name}{r}.json").read_text()) for r in (0, 1)]


def test_ponder_train_on_two_ranks_finishes_and_rank_zero_alone_reports(two_ranks):
    ranks = _ranks(two_ranks, "cli")
    assert [r["code"] for r in ranks] == [0, 0], ranks
    out = two_ranks / "cli"
    # nothing from rank 1, no lock left
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "config.json", "config.toml", "environment.json", "last.pt", "metrics.csv"]
    model, cfg, state = load_model(out / "best.pt", "cpu")
    assert cfg.training.batch_size == 64 and state.epoch in (1, 2) and state.history[0]["epoch"] == 1
    assert f"writing checkpoints to {out}/" in ranks[0]["stderr"]
    assert "2 processes, global batch 64" in ranks[0]["stderr"]
    assert ranks[0]["stderr"].count("epoch  1/2") == 1 and ranks[0]["stderr"].count("epoch  2/2") == 1
    assert ranks[0]["stdout"].count(f"best checkpoint: {out / 'best.pt'}") == 1
    assert ranks[1]["stdout"] == "" and ranks[1]["stderr"] == ""
    with open(out / "metrics.csv", newline="") as f:  # rank 0 alone writes a row per epoch
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1", "2"]
    assert json.loads((out / "config.json").read_text())["processes"] == 2


def test_truncated_align_training_under_ddp_finishes_in_the_folder_rank_zero_claimed(two_ranks):
    ranks = _ranks(two_ranks, "align")
    assert [r["code"] for r in ranks] == [0, 0], ranks
    seen = [json.loads((two_ranks / f"align_seen{r}.json").read_text()) for r in (0, 1)]
    # rank 0 found runs/pondernet-align-seed1234 taken and claimed -2; rank 1 trained with it too
    folder = str(Path("runs") / "pondernet-align-seed1234-2")
    assert seen[0]["out_dir"] == seen[1]["out_dir"] == [folder]
    runs = two_ranks / "work" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["pondernet-align-seed1234", "pondernet-align-seed1234-2"]
    assert sorted(p.name for p in (runs / "pondernet-align-seed1234-2").iterdir()) == ["best.pt", "config.json",
                                                                                       "config.toml",
                                                                                       "environment.json", "last.pt",
                                                                                       "metrics.csv"]
    model, cfg, state = load_model(runs / "pondernet-align-seed1234-2" / "best.pt", "cpu")
    assert cfg.step.name == "align" and cfg.method.truncation == 0.01 and state.epoch == 1
    assert ranks[0]["stdout"].count("best checkpoint:") == 1 and ranks[1]["stdout"] == ranks[1]["stderr"] == ""
    # the same 16 optimizer steps on both ranks, but not always the same number of ponder steps:
    # in some batches one rank stopped after the first step while the other went on
    assert len(seen[0]["computed"]) == len(seen[1]["computed"]) == 16
    assert seen[0]["computed"] != seen[1]["computed"], seen
    assert {1, 2} <= set(seen[0]["computed"] + seen[1]["computed"])
    # halting reads the state alone: a rank that stops after step 1 leaves the turn unused
    assert seen[0]["find_unused_parameters"] == seen[1]["find_unused_parameters"] == [True]


def test_align_with_its_own_halting_input_trains_under_ddp_with_the_unused_parameter_search(two_ranks):
    ranks = _ranks(two_ranks, "align_defaults")
    assert [r["code"] for r in ranks] == [0, 0], ranks
    seen = [json.loads((two_ranks / f"align_defaults_seen{r}.json").read_text()) for r in (0, 1)]
    # halting reads the turn detached: a rank that stops after step 1 leaves the turn unused
    assert seen[0]["find_unused_parameters"] == seen[1]["find_unused_parameters"] == [True]
    # ranks still stop after different numbers of steps in some batches: every parameter got a
    # gradient on each of them all the same (else DDP would have failed the next batch)
    assert seen[0]["computed"] != seen[1]["computed"] and {1, 2} <= set(seen[0]["computed"] + seen[1]["computed"])
    _, cfg, state = load_model(two_ranks / "align_defaults" / "best.pt", "cpu")
    assert cfg.method.halting_input == "state+turn" and cfg.step.turn_gate == 0.2 and state.epoch == 1


def test_two_ranks_step_like_one_process_on_the_same_global_batch(two_ranks, tiny_mnist, tmp_path):
    single = train(NO_NOISE, *_data(tiny_mnist, NO_NOISE), device=torch.device("cpu"), out_dir=tmp_path,
                   progress=False)
    parallel, alone = _params(two_ranks / "step" / "last.pt"), _params(tmp_path / "last.pt")
    assert parallel.keys() == alone.keys()  # no "module." prefix
    for name in alone:  # one optimizer step (one whole batch of 128 of the 192), on the same images
        assert torch.allclose(parallel[name], alone[name], rtol=1e-5, atol=1e-6), name
    ranks = [torch.load(two_ranks / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    # the epoch loss is summed over both ranks' images: the whole epoch's, as one process measures it
    assert ranks[0]["step"][0]["train_loss"] == pytest.approx(single.history[0].train_loss, rel=1e-5)
    assert ranks[0]["step"][0]["val_accuracy"] == single.history[0].val_accuracy


def test_rank_zero_alone_writes_loadable_checkpoints(two_ranks):
    for run in ("cli", "step", "straight", "resumed"):
        beside = ["config.json", "config.toml", "environment.json", "metrics.csv"] if run == "cli" else []  # `ponder train`'s, not train()'s
        assert sorted(p.name for p in (two_ranks / run).iterdir()) == sorted(["best.pt", "last.pt", *beside])
        model, cfg, state = load_model(two_ranks / run / "best.pt", "cpu")
        assert cfg.method.max_steps == 3 and state.epoch >= 1


def test_ranks_share_the_permutation_and_decisions_but_not_the_augmentation(two_ranks):
    ranks = [torch.load(two_ranks / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    # 192 of the 201 images per epoch: three whole batches of 64, each split 32/32
    assert [len(g) for g in ranks[0]["global"]] == [64, 64, 64] * 2
    for a, b in zip(ranks[0]["global"], ranks[1]["global"]):
        assert torch.equal(a, b)  # the same global batch on both ranks, every epoch
    for g, mine0, mine1 in zip(ranks[0]["global"], ranks[0]["mine"], ranks[1]["mine"]):
        assert torch.equal(torch.cat([mine0, mine1]), g)  # contiguous halves, rank 0 first
    epoch1, epoch2 = torch.cat(ranks[0]["global"][:3]), torch.cat(ranks[0]["global"][3:])
    assert len(set(epoch1.tolist())) == 192 and not torch.equal(epoch1, epoch2)  # reshuffled each epoch
    # one epoch, then resume for the second: the same batches as straight through, on both ranks
    for rank in ranks:
        assert len(rank["global_resumed"]) == 6
        assert all(torch.equal(a, b) for a, b in zip(rank["global"], rank["global_resumed"]))
    # each rank rotates its own images with its own random angles
    assert [len(a) for a in ranks[0]["angles"]] == [32] * 6
    assert not any(torch.equal(a, b) for a, b in zip(ranks[0]["angles"], ranks[1]["angles"]))
    # validation, the LR schedule and early stopping are rank 0's on every rank
    assert ranks[0]["straight"] == ranks[1]["straight"] and ranks[0]["resumed"] == ranks[1]["resumed"]


def test_resume_under_ddp_equals_training_straight_through(two_ranks):
    straight, resumed = _params(two_ranks / "straight" / "last.pt"), _params(two_ranks / "resumed" / "last.pt")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_single_process_never_starts_a_process_group(ponder, tiny_mnist, tmp_path, monkeypatch):
    for name in TORCH_ENV:
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append((a, k)))
    result = ponder("train", "--epochs", "1", *TINY, "--data-dir", tiny_mnist, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert calls == [] and not torch.distributed.is_initialized()
    assert "processes" not in result.stderr


MESSAGE = "--batch-size 64 is the global batch and must be divisible by the 3 processes torchrun started"


@pytest.mark.parametrize("rank, local_rank, shown", [(0, 0, "Error: "), (1, 1, None), (2, 0, "Error (rank 2): ")])
def test_a_batch_size_the_world_size_does_not_divide_is_refused(rank, local_rank, shown, ponder, one_error_line,
                                                                 tiny_mnist, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: pytest.fail("group started"))
    result = ponder("train", *TINY, "--data-dir", tiny_mnist, "--out", tmp_path / "o")
    # every rank refuses; each node's first process says why (the others share its arguments and data)
    if shown is None:
        assert result.exit_code == 1 and "Traceback" not in result.output and result.stderr == ""
    else:
        assert one_error_line(result).startswith(f"{shown}{MESSAGE}") and result.exit_code == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rank, local_rank, error, shown", [
    (0, 0, Interrupted("epoch 1 is saved"), "Interrupted: epoch 1 is saved"),
    (1, 0, Interrupted("epoch 1 is saved"), None),  # about the whole run: rank 0's to say
    (1, 1, PonderError("no data"), None),
    (3, 1, distributed.RankError("no GPU"), "Error (rank 3): no GPU"),  # this process's own problem
])
def test_which_process_prints_an_error_under_torchrun(rank, local_rank, error, shown, monkeypatch):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.error_line(f"{error.headline}: {error}", error) == shown


def _launch(args: list) -> None:
    from torch.distributed.run import main
    main(["--standalone", "--nproc_per_node=2", "-m", "ponder_cli", "train", *args])


def _torchrun(*args: str, **fork) -> processes.Process:
    """`torchrun --standalone --nproc_per_node=2 -m ponder_cli train ARGS`: torchrun's own launcher
    in a forked process, its two workers fresh interpreters as torchrun starts them."""
    env = {k: v for k, v in os.environ.items() if k not in TORCH_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    return processes.fork(_launch, [str(arg) for arg in args], env=env, **fork)


def _rank_of_children(pid: int) -> dict:
    """{rank: pid} of the processes whose parent is pid, read from Linux's /proc."""
    ranks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, StopIteration):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                environ = (stat.parent / "environ").read_bytes().split(b"\0")
                rank = next(int(v[5:]) for v in environ if v.startswith(b"RANK="))
                ranks[rank] = int(stat.parent.name)
    return ranks


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the ranks' processes in Linux's /proc")
def test_sigterm_to_one_rank_stops_every_rank_with_a_resume_hint(tiny_mnist, tmp_path):
    out = tmp_path / "run"
    proc = _torchrun("--epochs", "500", "--patience", "0", *TINY, "--data-dir", str(tiny_mnist),
                     "--out", str(out), new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (out / "last.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        workers = _rank_of_children(proc.pid)
        assert sorted(workers) == [0, 1]
        os.kill(workers[1], signal.SIGTERM)  # rank 0 must notice and stop too
        _, stderr = proc.communicate(timeout=60)  # no hang
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # rank 1 stops quietly (exit 143); rank 0 either gets torchrun's SIGTERM (Terminated) or first
    # finds its peer gone (Error): one line either way, with the hint
    ours = [line for line in stderr.splitlines() if line.startswith(("Terminated", "Interrupted", "Error"))]
    assert len(ours) == 1, stderr
    assert f"resume with: torchrun ... -m ponder_cli train --resume {out / 'last.pt'}" in ours[0]
    assert "ponder_cli/" not in stderr and "race condition" not in stderr  # no traceback through our code
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".tmp")) == ["best.pt", "config.json",
                                                                                     "config.toml",
                                                                                     "environment.json", "last.pt",
                                                                                     "metrics.csv"]
    load_model(out / "last.pt", "cpu")


def test_under_torchrun_every_rank_stops_at_its_time_limit_after_the_same_epoch(two_ranks):
    assert [json.loads((two_ranks / f"limited{r}.json").read_text()) for r in (0, 1)] == [[2, "time limit"]] * 2
    assert load_checkpoint(two_ranks / "limited" / "last.pt").epoch == 2
