"""Evaluation: accuracy and ponder steps under sampled halting, with seeded rotations."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .config import PonderConfig
from .data import ImageSet, prepare_batch
from .losses import geometric_log_prior, ponder_loss
from .model import PonderNet, logits_at, sample_halting_steps
from .rotation import uniform_angles
from .runtime import autocast


@dataclass(frozen=True)
class EvalResult:
    images: int
    accuracy: float
    mean_steps: float
    std_steps: float
    loss: float | None = None
    reconstruction: float | None = None
    regularisation: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def evaluation_draws(count: int, max_steps: int, max_angle: float, seed: int, device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """All random numbers of one evaluation, drawn up front from one seeded CPU generator.

    The same seed gives the same rotations and coin flips on any device and for any batch size
    or early-exit setting. Returns angles (N,) or None, and halting uniforms (steps, N).
    """
    generator = torch.Generator().manual_seed(seed)
    angles = uniform_angles(count, max_angle, generator=generator) if max_angle > 0 else None
    uniforms = torch.rand(max_steps, count, generator=generator)
    return (None if angles is None else angles.to(device)), uniforms.to(device)


@torch.inference_mode()
def evaluate(model: PonderNet, data: ImageSet, cfg: PonderConfig, *, max_angle: float = 0.0,
             seed: int = 0, batch_size: int = 1000, early_exit: bool = True,
             with_loss: bool = False, amp: bool = False) -> EvalResult:
    """Halting sampled from Bernoulli(lambda_n) per step; the prediction is y at the halting step.

    early_exit computes each step only for images that have not halted; with_loss needs every
    step of every image and therefore runs the full forward pass (same predictions and steps).
    """
    was_training = model.training
    model.eval()
    device = data.images.device
    count = len(data)
    angles, uniforms = evaluation_draws(count, model.max_steps, max_angle, seed, device)
    log_prior = geometric_log_prior(cfg.lambda_p, cfg.max_steps, device)
    # correct, steps, steps^2, then batch-size-weighted loss, reconstruction, regularisation
    totals = torch.zeros(6, dtype=torch.float64, device=device)
    for start in range(0, count, batch_size):
        end = min(start + batch_size, count)
        x = prepare_batch(data.images[start:end], None if angles is None else angles[start:end])
        targets = data.labels[start:end]
        with autocast(device, amp):
            if early_exit and not with_loss:
                logits, steps = model.infer(x, uniforms[:, start:end])
            else:
                out = model(x)
                steps = sample_halting_steps(out.lambda_logits, uniforms[:, start:end])
                logits = logits_at(out.logits, steps)
        correct = (logits.argmax(dim=1) == targets).sum()
        steps = steps.double()
        totals[:3] += torch.stack([correct.double(), steps.sum(), steps.square().sum()])
        if with_loss:
            parts = ponder_loss(out, targets, log_prior, cfg.beta)
            totals[3:] += torch.stack(list(parts)).double() * (end - start)
    model.train(was_training)
    values = (totals / max(count, 1)).tolist()  # the one host read of the evaluation
    mean_steps = values[1]
    std_steps = math.sqrt(max(values[2] - mean_steps ** 2, 0.0))
    return EvalResult(
        images=count, accuracy=values[0], mean_steps=mean_steps, std_steps=std_steps,
        **({"loss": values[3], "reconstruction": values[4], "regularisation": values[5]} if with_loss else {}),
    )
