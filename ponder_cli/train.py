"""The hand-written training loop: Adam, optional AMP, clipping, plateau LR, early stopping."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from . import PonderError, brief, distributed
from .checkpoint import BEST, LAST, TrainingState, save_checkpoint
from .config import PonderConfig
from .data import ImageSet, prepare_batch
from .evaluate import evaluate
from .methods import Method, build_model, get_method
from .rotation import uniform_angles
from .runtime import autocast


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    train_loss: float
    train_reconstruction: float
    train_regularisation: float
    train_accuracy: float
    train_steps: float
    val_accuracy: float
    val_steps: float
    lr: float
    seconds: float
    improved: bool
    skipped_batches: int = 0  # batches skipped for a non-finite loss or gradient


@dataclass
class TrainResult:
    out_dir: Path
    best_accuracy: float
    best_epoch: int
    last_epoch: int
    stopped_early: bool
    history: list[EpochStats] = field(default_factory=list)

    @property
    def best_path(self) -> Path:
        return self.out_dir / BEST


def train_one_epoch(model: torch.nn.Module, method: Method, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler, data: ImageSet, cfg: PonderConfig, *, amp: bool,
                    desc: str = "train", progress: bool = True) -> dict:
    """One pass over the shuffled training set; metrics stay on the device until the end.

    Under torchrun `model` is DDP-wrapped and each rank trains on its slice of every global batch
    of cfg.batch_size images; the metrics returned cover the whole epoch, all ranks together.
    """
    model.train()
    device = data.images.device
    count = len(data)
    order = torch.randperm(count, device=device)  # (N,) from the shared RNG stream: the same on every rank
    order = order[:distributed.even_length(count)]  # under torchrun the last batch must split evenly
    # Under torchrun rotations, dropout, truncation and coin flips come from this rank's own RNG
    # stream until the shared stream is put back at the end of the epoch.
    shared_rng = distributed.fork_rank_rng(device)
    # loss, reconstruction, regularisation (each times batch size), correct, halting steps,
    # images in batches that were used, batches skipped for a non-finite loss or gradient
    totals = torch.zeros(7, dtype=torch.float64, device=device)
    params = list(model.parameters())
    batches = range(0, order.shape[0], cfg.batch_size)
    for start in tqdm(batches, desc=desc, unit="batch", leave=False, file=sys.stderr,
                      disable=not progress, dynamic_ncols=True):
        index = distributed.shard(order[start:start + cfg.batch_size])  # (B,) this rank's contiguous slice
        batch = index.shape[0]
        angles = uniform_angles(batch, cfg.train_rotation, device=device) if cfg.train_rotation > 0 else None
        x = prepare_batch(data.images[index], angles)  # (B, 1, 28, 28)
        targets = data.labels[index]
        with autocast(device, amp):
            # Truncation lets a rank run fewer steps than another: no collective happens in
            # here (see distributed.wrap); DDP synchronises in backward, once per batch.
            out = model(x, stop=method.truncation(batch, device))
        loss = method.loss(out.logits, out.lambda_logits, targets)  # float32 outside autocast
        optimizer.zero_grad(set_to_none=True)
        # scale -> backward -> unscale_ -> clip -> step -> update (GradScaler is a no-op unless fp16)
        scaler.scale(loss.total).backward()
        scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        finite = torch.isfinite(loss.total) & torch.isfinite(grad_norm)
        # Under DDP the gradients (so grad_norm) are already averaged and equal on every rank, but
        # the loss is this rank's own. Ranks that disagreed would step on some replicas and not on
        # others, and the replicas would silently drift apart for good: skip only jointly.
        finite = distributed.all_ranks(finite)
        if scaler.is_enabled():
            scaler.step(optimizer)  # GradScaler itself skips steps whose gradients are not finite
        elif finite.item():
            # Skip a non-finite batch rather than poison the weights. Free on the CPU; on CUDA
            # without AMP it is the loop's one sync, the same one GradScaler makes with AMP.
            optimizer.step()
        scaler.update()
        with torch.no_grad():
            uniforms = torch.rand(cfg.max_steps, batch, device=device)  # (steps, B)
            scores, steps = method.predict(out.logits, out.lambda_logits, uniforms, "sample")
            correct = (scores.argmax(dim=1) == targets).sum()
            values = torch.stack([loss.total * batch, loss.reconstruction * batch, loss.regularisation * batch,
                                  correct, steps.sum()]).double()
            totals[:5] += torch.where(finite, values, torch.zeros_like(values))
            totals[5] += finite.double() * batch
            totals[6] += (~finite).double()
    distributed.join_shared_rng(shared_rng, device)
    # Sum the images, losses and correct counts of every rank: the epoch line covers the whole
    # epoch. The skip count (6) is not summed: the skips were joint, every rank counted them all.
    totals[:6] = distributed.sum_over_ranks(totals[:6])
    values = totals.tolist()  # the one host read of the epoch
    used = max(values[5], 1.0)
    stats = {key: value / used for key, value in
             zip(("loss", "reconstruction", "regularisation", "accuracy", "steps"), values[:5])}
    stats["skipped_batches"] = int(values[6])
    stats["batches"] = len(batches)
    return stats


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        if distributed.active():
            # Every rank continues the shared stream, which rank 0 drew on cuda:0, on its own GPU.
            torch.cuda.set_rng_state(state["cuda"][0], device)
        else:
            torch.cuda.set_rng_state_all(state["cuda"])


def train(cfg: PonderConfig, train_set: ImageSet, val_set: ImageSet, *, device: torch.device,
          out_dir: Path, amp: bool = False, resume: TrainingState | None = None,
          on_epoch: Callable[[EpochStats], None] | None = None, progress: bool = True) -> TrainResult:
    """Train, validating once per epoch; write last.pt every epoch and best.pt on improvement.

    resume is a loaded checkpoint whose config equals cfg up to the number of epochs and the
    patience (see runs.plan_training); training continues at the epoch after the one it holds.

    Data-parallel once distributed.setup() has started the process group (torchrun): every rank
    calls train() with the same arguments and the whole data; rank 0 alone validates and writes
    the checkpoints, and every rank returns the same TrainResult once they are written.
    """
    out_dir = Path(out_dir)
    torch.manual_seed(cfg.seed)
    method = get_method(cfg)
    model = build_model(cfg).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="max", factor=cfg.lr_factor, patience=cfg.lr_patience)
    scaler = torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")

    result = TrainResult(out_dir=out_dir, best_accuracy=-1.0, best_epoch=0, last_epoch=0, stopped_early=False)
    epochs_without_improvement = 0
    if resume is not None:
        resume.require_resumable(out_dir)
        try:
            model.load_state_dict(resume.model)
            optimizer.load_state_dict(resume.optimizer)
            scheduler.load_state_dict(resume.scheduler)
            if resume.scaler:
                # A run saved without a live scaler (on the CPU, or with AMP off) has an empty
                # state, which an enabled scaler refuses: resumed with fp16 on CUDA it starts a
                # fresh scaler instead.
                scaler.load_state_dict(resume.scaler)
            _set_rng_state(resume.rng, device)
            result.history = [EpochStats(**h) for h in resume.history]
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            raise PonderError(f"cannot resume: the checkpoint's training state does not fit ({brief(exc)})") from None
        result.best_accuracy = resume.best_accuracy
        result.best_epoch = resume.best_epoch
        result.last_epoch = resume.epoch
        epochs_without_improvement = resume.epochs_without_improvement
        if cfg.patience and epochs_without_improvement >= cfg.patience:
            raise PonderError(f"this run already stopped early after epoch {resume.epoch} "
                              f"(no better validation accuracy for {cfg.patience} epochs); "
                              "raise --patience to go on")

    # Under torchrun DDP averages the gradients across ranks in backward; `model` stays the plain
    # module for validation and checkpoints (no "module." prefix). DDP must be told when a
    # parameter may get no gradient on a rank: with one step, h_0 = 0 never meets the mlp step's
    # from_state (and align's turn never acts); with truncation, a rank whose images all stop at
    # step 1 leaves those unused too, while another rank uses them.
    parallel_model = distributed.wrap(model, device, find_unused_parameters=cfg.max_steps == 1 or cfg.truncation > 0)

    for epoch in range(result.last_epoch + 1, cfg.epochs + 1):
        started = time.perf_counter()
        stats = train_one_epoch(parallel_model, method, optimizer, scaler, train_set, cfg, amp=amp,
                                desc=f"epoch {epoch}/{cfg.epochs}", progress=progress)
        if stats["skipped_batches"] == stats["batches"]:
            raise PonderError(f"epoch {epoch}: every batch had a non-finite loss or gradient; training "
                              f"stopped, {out_dir / LAST} still holds the last good epoch (try a lower --lr)")
        # Validation runs once, on rank 0, giving a single process's numbers (it draws from its
        # own seeded generator, not the shared stream); broadcasting them makes every rank step
        # the scheduler and early stopping alike. (The weights and the summed training loss are
        # the same on every rank, so `improved` agrees too.)
        if distributed.is_main():
            val = evaluate(model, val_set, cfg, max_angle=cfg.train_rotation, seed=cfg.seed, amp=amp)
        val_accuracy, val_steps = distributed.broadcast_from_main(
            [val.accuracy, val.mean_steps] if distributed.is_main() else [0.0, 0.0], device)
        lr = optimizer.param_groups[0]["lr"]
        scheduler.step(val_accuracy)
        # A model with non-finite weights or training loss never becomes "best".
        weights_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        improved = weights_finite and math.isfinite(stats["loss"]) and val_accuracy > result.best_accuracy
        if improved:
            result.best_accuracy, result.best_epoch = val_accuracy, epoch
            epochs_without_improvement = 0
        else:
            epochs_without_improvement += 1
        record = EpochStats(
            epoch=epoch, train_loss=stats["loss"], train_reconstruction=stats["reconstruction"],
            train_regularisation=stats["regularisation"], train_accuracy=stats["accuracy"],
            train_steps=stats["steps"], val_accuracy=val_accuracy, val_steps=val_steps, lr=lr,
            seconds=time.perf_counter() - started, improved=improved,
            skipped_batches=stats["skipped_batches"])
        result.history.append(record)
        result.last_epoch = epoch
        state = TrainingState(
            config=cfg, model=model.state_dict(), epoch=epoch, optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(), scaler=scaler.state_dict(), best_accuracy=result.best_accuracy,
            best_epoch=result.best_epoch, epochs_without_improvement=epochs_without_improvement,
            history=[asdict(h) for h in result.history], rng=_rng_state(device))
        if distributed.is_main():  # every rank holds this same state; one writes it
            save_checkpoint(state, out_dir / LAST)
            if improved:
                save_checkpoint(state, out_dir / BEST)
        if on_epoch is not None:
            on_epoch(record)
        if cfg.patience and epochs_without_improvement >= cfg.patience:
            result.stopped_early = True
            break
    distributed.barrier()  # under torchrun every rank returns once rank 0 has written the checkpoints
    return result
