"""Evaluation: accuracy and ponder steps per rotation bucket, seeded, under three halting rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from .config import PonderConfig
from .data import ImageSet, prepare_batch
from .losses import geometric_log_prior
from .methods import needs_all_steps, predict_early_exit, predict_from_all_steps, training_loss
from .model import PonderNet, halting_log_probs
from .rotation import protocol_angles
from .runtime import autocast

HALTING_RULES = ("sample", "median", "expected")


@dataclass(frozen=True)
class EvalSamples:
    """Per-image values, kept for statistics across buckets (CPU tensors)."""
    abs_angles: torch.Tensor  # (N,) |rotation| in degrees
    steps: torch.Tensor  # (N,) float64 ponder steps (fractional for the expected rule)
    correct: torch.Tensor  # (N,) bool


@dataclass(frozen=True)
class EvalResult:
    images: int
    accuracy: float
    mean_steps: float
    std_steps: float
    steps_correct: float | None  # mean steps on correctly classified images (None: there are none)
    steps_wrong: float | None
    histogram: tuple  # images halting at step 1..max_steps (expected halting mass for "expected")
    accuracy_at_step: tuple | None = None  # accuracy if every image stopped at step k (detail)
    loss: float | None = None
    reconstruction: float | None = None
    regularisation: float | None = None
    samples: EvalSamples | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v, tuple) else v)
                for f in fields(self) if f.name != "samples" for v in [getattr(self, f.name)]}


def evaluation_draws(count: int, max_steps: int, angle: float, seed: int, device, *,
                     protocol: str = "uniform", lower: float = 0.0) -> tuple[torch.Tensor | None, torch.Tensor]:
    """All random numbers of one evaluation, drawn up front from one seeded CPU generator.

    The same seed gives the same rotations and coin flips on any device and for any batch size,
    halting rule or early-exit setting. Returns angles (N,), or None when no image is rotated,
    and halting uniforms (steps, N).
    """
    generator = torch.Generator().manual_seed(seed)
    angles = protocol_angles(count, angle, protocol, lower=lower, generator=generator)
    uniforms = torch.rand(max_steps, count, generator=generator)
    rotated = bool(angles.abs().max() > 0) if count else False
    return (angles.to(device) if rotated else None), uniforms.to(device)


@torch.inference_mode()
def evaluate(model: PonderNet, data: ImageSet, cfg: PonderConfig, *, max_angle: float = 0.0,
             seed: int = 0, batch_size: int = 1000, protocol: str = "uniform", lower: float = 0.0,
             halting: str = "sample", early_exit: bool = True, with_loss: bool = False,
             detail: bool = False, amp: bool = False) -> EvalResult:
    """Evaluate one rotation bucket.

    halting: "sample" draws Bernoulli(lambda_n) at each step (the paper); "median" halts where
    the cumulative halting probability reaches 1/2; "expected" runs every step and predicts with
    the p-weighted average of the step outputs, counting sum_n n p_n steps.
    early_exit computes each step only for images still running; the loss, the per-step accuracy
    of `detail` and the expected rule need every step of every image, so they run the full
    forward pass (with identical predictions and steps).
    """
    if halting not in HALTING_RULES:
        raise ValueError(f"unknown halting rule {halting!r}")
    was_training = model.training
    model.eval()
    device = data.images.device
    count, max_steps = len(data), model.max_steps
    angles, uniforms = evaluation_draws(count, max_steps, max_angle, seed, device, protocol=protocol, lower=lower)
    full_forward = with_loss or detail or needs_all_steps(cfg, halting) or not early_exit
    expected = halting == "expected" and cfg.method != "act"
    log_prior = geometric_log_prior(cfg.lambda_p, cfg.max_steps, device)
    # correct, steps, steps^2, steps of correct images, then batch-size-weighted loss parts
    totals = torch.zeros(7, dtype=torch.float64, device=device)
    histogram = torch.zeros(max_steps, dtype=torch.float64, device=device)
    correct_at_step = torch.zeros(max_steps, dtype=torch.float64, device=device)
    all_steps, all_correct = [], []
    for start in range(0, count, batch_size):
        end = min(start + batch_size, count)
        x = prepare_batch(data.images[start:end], None if angles is None else angles[start:end])
        targets = data.labels[start:end]
        with autocast(device, amp):
            if not full_forward:
                logits, steps = predict_early_exit(cfg, model, x, uniforms[:, start:end], halting)
            else:
                out = model(x)
        if full_forward:
            logits, steps = predict_from_all_steps(cfg, out, uniforms[:, start:end], halting)
            if expected:  # steps are sum_n n p_n: the histogram collects the halting mass p_n
                histogram += halting_log_probs(out.lambda_logits).exp().double().sum(dim=1)
            if detail:
                correct_at_step += (out.logits.argmax(dim=-1) == targets).sum(dim=1).double()
            if with_loss:
                parts = training_loss(cfg, out, targets, log_prior)
                totals[4:] += torch.stack(list(parts)).double() * (end - start)
        if not expected:
            # index_add_ rather than bincount, which needs its output size from the host on CUDA
            histogram.index_add_(0, steps - 1, torch.ones_like(steps, dtype=torch.float64))
        correct = logits.argmax(dim=1) == targets
        steps = steps.double()
        totals[:4] += torch.stack([correct.sum().double(), steps.sum(), steps.square().sum(), (steps * correct).sum()])
        all_steps.append(steps)
        all_correct.append(correct)
    model.train(was_training)

    values = totals.tolist()  # the host reads of the evaluation, once at the end
    n = max(count, 1)
    n_correct, steps_sum = values[0], values[1]
    mean_steps = steps_sum / n
    abs_angles = angles.abs().cpu() if angles is not None else torch.zeros(count)
    samples = EvalSamples(abs_angles, torch.cat(all_steps).cpu() if all_steps else torch.zeros(0),
                          torch.cat(all_correct).cpu() if all_correct else torch.zeros(0, dtype=torch.bool))
    hist = histogram.tolist()
    return EvalResult(
        images=count, accuracy=n_correct / n, mean_steps=mean_steps,
        std_steps=math.sqrt(max(values[2] / n - mean_steps ** 2, 0.0)),
        steps_correct=values[3] / n_correct if n_correct else None,
        steps_wrong=(steps_sum - values[3]) / (count - n_correct) if count - n_correct else None,
        histogram=tuple(hist) if expected else tuple(int(round(h)) for h in hist),
        accuracy_at_step=tuple(c / n for c in correct_at_step.tolist()) if detail else None,
        **({"loss": values[4] / n, "reconstruction": values[5] / n, "regularisation": values[6] / n}
           if with_loss else {}),
        samples=samples,
    )


def evaluate_buckets(model: PonderNet, data: ImageSet, cfg: PonderConfig, angles: list[float], *,
                     protocol: str = "uniform", **options) -> tuple[list[EvalResult], float | None]:
    """One evaluation per rotation bucket, and Spearman's rho between every evaluated image's
    |rotation| and its ponder steps. The band protocol's inner edge is the next smaller angle."""
    results = []
    for angle in angles:
        lower = max((a for a in angles if a < angle), default=0.0)
        results.append(evaluate(model, data, cfg, max_angle=angle, lower=lower, protocol=protocol, **options))
    rho = spearman(torch.cat([r.samples.abs_angles for r in results]), torch.cat([r.samples.steps for r in results]))
    return results, rho


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    sorted_values, order = torch.sort(values.double())
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(sorted_values)
    ranks[order] = average[inverse]
    return ranks


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman's rank correlation; None when either variable is constant."""
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return float((rx * ry).sum()) / denominator if denominator > 0 else None
