"""What the align step's turn does while it waits: a two-step cycle about each digit's upright.

    OMP_NUM_THREADS=1 python tools/figures/align_cycle.py                # the shipped `align`, 2,000 digits
    OMP_NUM_THREADS=1 python tools/figures/align_cycle.py --checkpoint runs/NAME --limit 500

The first `--limit` MNIST test digits, each rotated by exactly each angle (the sign given, as
`ponder predict --rotate` does), run through all the model's steps. Three tables:

1. The cycle, per angle. "alternating": the share of digits whose turn increment Δ_n changes
   sign at every step from 5 to the last; |Δ| late and "drift" |Δ_N + Δ_{N-1}| (the net turn of
   the last two steps: what the halting gate reads as work), medians; "gate at N": the mean
   factor 1 − min(1, w_N / turn_gate) by which the gate scales λ at the last step, with
   w_N = drift / (2 align_turn). Of the last two steps, U is the one whose view (the image as
   the step read it, turned by θ_{n-1}) was nearer upright and T the other: the median residual rotation of each view, and of the cycle's centre; accuracy and
   mean λ_n at U and at T; the share of digits whose prediction differs between the last two
   steps; and of the digits halting at step 4 or later (median rule; the sample rule with
   seeded coins), the share halting at a step of U's parity.
2. The turn as a map of the view: upright digits read through every residual rotation r in
   ±45° (1° apart) after the state of a given step; the turn g(r) the step would make. Where g
   crosses zero from + to − (the digit's own upright for the model) the next view's residual is
   r + g(r), a fixed point that is stable only if g'(r) > −2 there. Median slope and the share
   of digits with g' < −2 (an unstable fixed point: a two-step cycle about it).
3. Damping the turn at evaluation: every increment from step 3 on multiplied by a gain
   (1: the model as trained; 0.5, 0.25: the cycle dies out): accuracy at the last step, the
   median rule's accuracy and mean steps. The gain-1 pass is checked against the model's own
   forward.
4. Settling, per angle. Over the last three steps each digit's turn is fixed (|θ_n − θ_{n−1}|
   under 3°), a 2-cycle (|θ_n − θ_{n−2}| under 3°), a 3-cycle (|θ_n − θ_{n−3}|) or other: their
   shares, and the mean gate factor at the last step and median-rule steps of the first two kinds
   together and of the rest. A digit has settled from step n when the net turn of two steps
   |θ_m − θ_{m−2}| stays under 3° from m = n on: the share settled by the last step, the mean
   settling step, the median rule's halting step minus it, accuracy (of the settled digits) at
   the settling step, the halting step and the last step; the share of all digits wrong at the
   halting step and right at the last, and of those the share that halted once settled.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli.checkpoint import load_model  # noqa: E402
from ponder_cli.tasks.mnist import default_data_dir, load_mnist, prepare_batch  # noqa: E402
from ponder_cli.folders import shipped_path  # noqa: E402
from ponder_cli.model import Quantile, Sample, halting_steps  # noqa: E402
from ponder_cli.steps.align import rotate_bilinear  # noqa: E402

SETTLED = 3.0  # degrees: a turn that moves less than this from a step two (or k) steps back has settled
ANGLES = (0.0, 22.5, -22.5, 45.0, -45.0, 60.0, -60.0, 90.0, -90.0)


@torch.no_grad()
def damped_pass(model, x, gain: float = 1.0, from_step: int = 3):
    """AlignStep.forward and PonderNet.heads, step by step, with every turn increment from step
    `from_step` (1-based) on multiplied by `gain`. Returns class logits (steps, B, C), halting
    logits (steps, B) and the turn after each step θ_n in degrees (steps, B)."""
    step = model.step
    (image, _masks), (h, angle, previous) = step.start(x, model.max_steps)  # eval: no dropout masks
    logits, lambdas, turns = [], [], []
    for n in range(model.max_steps):
        seen = image if n == 0 else rotate_bilinear(image, angle)
        features = step.encoder.features(seen)
        h = step.cell(step.encoder.head(features), h)
        delta = step.max_turn * torch.tanh((step.turn(h) + step.view_turn(features)).squeeze(-1))
        if n + 1 >= from_step:
            delta = gain * delta
        work = ((delta + previous).abs() / (2 * step.max_turn)).unsqueeze(-1)
        angle, previous = angle + delta, delta
        y, z = model.heads(h, work)
        logits.append(y), lambdas.append(z), turns.append(torch.rad2deg(angle))
    return torch.stack(logits), torch.stack(lambdas), torch.stack(turns)


def cycle_row(model, images, labels, angle: float, seed: int) -> list[str]:
    x = prepare_batch(images, torch.full((len(images),), angle))
    logits, lambda_logits, turns = damped_pass(model, x)
    reference = model(x)  # the model's own forward: the pass above must be it
    assert torch.allclose(logits, reference.logits, atol=1e-4) and torch.allclose(
        lambda_logits, reference.lambda_logits, atol=1e-4), "damped_pass no longer mirrors AlignStep.forward"
    steps, count = turns.shape
    delta = torch.diff(turns, dim=0, prepend=torch.zeros(1, count))
    residual = turns + angle  # after each step: 0 is upright
    view = torch.cat([torch.full((1, count), angle), residual[:-1]])  # what step n read
    last, before = steps - 1, steps - 2
    u_last = view[last].abs() < view[before].abs()  # U: of the last two steps, the one whose view was nearer upright
    at_u = lambda t: torch.where(u_last, t[last], t[before])  # noqa: E731
    at_t = lambda t: torch.where(u_last, t[before], t[last])  # noqa: E731
    predictions = logits.argmax(-1)
    lam = torch.sigmoid(lambda_logits.float())
    u_step = torch.where(u_last, steps, steps - 1)  # 1-based
    coins = torch.rand(steps, count, generator=torch.Generator().manual_seed(seed))
    shares = []
    for halting in (halting_steps(Quantile(0.5), None, lambda_logits)[0],
                    halting_steps(Sample(coins), None, lambda_logits)[0]):
        late = halting >= 4
        shares.append(((halting - u_step) % 2 == 0)[late].float().mean())
    alternating = (delta[5:] * delta[4:-1] < 0).all(0)
    drift = (delta[last] + delta[before]).abs()
    gate = 1 - (drift / (2 * math.degrees(model.step.max_turn)) / model.step.turn_gate).clamp_max(1) \
        if model.step.turn_gate > 0 else torch.ones_like(drift)
    return [f"{angle:+g}", f"{alternating.float().mean():.1%}", f"{delta[-2:].abs().median():.1f}",
            f"{drift.median():.2f}", f"{gate.mean():.3f}",
            f"{at_u(view).abs().median():.1f} / {at_t(view).abs().median():.1f}",
            f"{((residual[last] + residual[before]) / 2).abs().median():.1f}",
            f"{(at_u(predictions) == labels).float().mean():.4f} / {(at_t(predictions) == labels).float().mean():.4f}",
            f"{at_u(lam).mean():.3f} / {at_t(lam).mean():.3f}",
            f"{(predictions[last] != predictions[before]).float().mean():.1%}",
            f"{shares[0]:.1%} / {shares[1]:.1%}"]


@torch.no_grad()
def turn_map(model, images, after_step: int) -> list[str]:
    step = model.step
    x = prepare_batch(images)
    context, state = step.start(x, model.max_steps)  # eval: no dropout masks
    image = context[0]
    for n in range(after_step):
        state, _, _ = step(context, state, n)
    rs = torch.arange(-45.0, 45.5, 1.0)
    turns = []
    for r in rs:
        features = step.encoder.features(rotate_bilinear(image, torch.full((len(images),), float(torch.deg2rad(r)))))
        h = step.cell(step.encoder.head(features), state[0])
        turns.append(torch.rad2deg(step.max_turn * torch.tanh((step.turn(h) + step.view_turn(features)).squeeze(-1))))
    g = torch.stack(turns)  # (R, B): the turn from a view at residual r
    slopes, roots = [], []
    for column in g.T:
        down = ((column[:-1] > 0) & (column[1:] <= 0)).nonzero().squeeze(1)
        if len(down):
            j = down[rs[down].abs().argmin()]  # the crossing nearest upright
            slopes.append(float(column[j + 1] - column[j]))  # degrees of turn per degree of view, 1° apart
            roots.append(float(rs[j] + column[j] / (column[j] - column[j + 1])))
    slopes, roots = torch.tensor(slopes), torch.tensor(roots)
    near = g[rs.abs() <= 10].abs().mean()
    return [str(after_step + 1), f"{len(slopes)} / {len(images)}", f"{roots.abs().median():.1f}",
            f"{slopes.median():.1f} ({slopes.quantile(0.25):.1f} to {slopes.quantile(0.75):.1f})",
            f"{(slopes < -2).float().mean():.1%}", f"{near:.1f}"]


def damping_row(model, images, labels, angle: float) -> list[str]:
    x = prepare_batch(images, torch.full((len(images),), angle))
    cells = [f"{angle:+g}"]
    for gain in (1.0, 0.5, 0.25):
        logits, lambda_logits, turns = damped_pass(model, x, gain)
        halting = halting_steps(Quantile(0.5), None, lambda_logits)[0]
        chosen = logits.gather(0, (halting - 1)[None, :, None].expand(1, -1, logits.shape[-1]))[0]
        cells.append(f"{(logits[-1].argmax(-1) == labels).float().mean():.4f} · "
                     f"{(chosen.argmax(-1) == labels).float().mean():.4f} · {halting.float().mean():.2f} · "
                     f"{(turns[-1] - turns[-2]).abs().median():.1f}°")
    return cells


def settling_row(model, images, labels, angle: float) -> list[str]:
    x = prepare_batch(images, torch.full((len(images),), angle))
    logits, lambda_logits, turns = damped_pass(model, x)
    steps, count = turns.shape
    lag = lambda k: (turns[-3:] - turns[-3 - k:steps - k]).abs().amax(0)  # noqa: E731  over the last 3 steps
    fixed = lag(1) < SETTLED
    two = ~fixed & (lag(2) < SETTLED)
    three = ~fixed & ~two & (lag(3) < SETTLED)
    other = ~(fixed | two | three)
    drift = (turns[-1] - turns[-3]).abs()
    gate = 1 - (drift / (2 * math.degrees(model.step.max_turn)) / model.step.turn_gate).clamp_max(1) \
        if model.step.turn_gate > 0 else torch.ones_like(drift)
    # settled from step n: the net turn of two steps below SETTLED at n and every step after
    two_step = torch.cat([torch.full((2, count), math.inf), (turns[2:] - turns[:-2]).abs()]) < SETTLED
    settled_from = torch.full((count,), steps + 1)
    for n in range(steps - 1, 1, -1):
        settled_from = torch.where(two_step[n:].all(0), torch.tensor(n + 1), settled_from)
    settled = settled_from <= steps
    halting = halting_steps(Quantile(0.5), None, lambda_logits)[0]
    correct = logits.argmax(-1) == labels  # (steps, B)
    at = lambda n: correct.gather(0, (n - 1)[None])[0]  # noqa: E731
    late_gain = ~at(halting) & correct[-1]
    return [f"{angle:+g}", " / ".join(f"{m.float().mean():.1%}" for m in (fixed, two, three, other)),
            " / ".join(f"{gate[m].mean():.2f}" if m.any() else "-" for m in (fixed | two, three | other)),
            " / ".join(f"{halting[m].float().mean():.2f}" if m.any() else "-" for m in (fixed | two, three | other)),
            f"{settled.float().mean():.1%}", f"{settled_from[settled].float().mean():.2f}",
            f"{(halting - settled_from)[settled].float().mean():+.2f}",
            f"{at(settled_from.clamp_max(steps))[settled].float().mean():.4f} / {at(halting)[settled].float().mean():.4f}"
            f" / {correct[-1][settled].float().mean():.4f}",
            f"{late_gain.float().mean():.1%}",
            f"{(late_gain & (halting >= settled_from)).float().sum() / late_gain.float().sum().clamp_min(1):.0%}"]


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(c) for c in column) for column in zip(header, *rows)]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


@torch.no_grad()  # as a decorator: the caller's grad mode is left as it was (a test runs this in-process)
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="an align model (default: the shipped align)")
    parser.add_argument("--limit", type=int, default=2000, help="the first N test digits")
    parser.add_argument("--seed", type=int, default=1234, help="the sample rule's coins")
    parser.add_argument("--data-dir", type=Path, default=None, help="the MNIST folder (default: PONDER_DATA_DIR)")
    args = parser.parse_args(argv)
    model, cfg, _ = load_model(args.checkpoint or shipped_path("align"), "cpu")
    if cfg.step.name != "align":
        parser.error(f"{args.checkpoint} is a {cfg.step.name} model: this reads the align step's turn")
    test = load_mnist(args.data_dir or default_data_dir(), train=False)
    images, labels = test.images[:args.limit], test.labels[:args.limit]
    print(f"{args.checkpoint or 'align'}: the first {len(images)} test digits, rotated by exactly each angle")
    table("1. The turn's cycle (last two steps; U: the one whose view was nearer upright, T: the other)",
          ["deg", "alternating", "|Δ| late", "drift", "gate at N", "view |r| U / T", "|centre|", "accuracy U / T", "λ U / T",
           "prediction flips", "halts at U's parity, median / sample"],
          [cycle_row(model, images, labels, angle, args.seed) for angle in ANGLES])
    table("2. The turn as a map of the view (upright digits; g: turn in degrees from a view at residual r)",
          ["step", "digits with g = 0 in ±45°", "|r| at g = 0", "g' there (IQR)", "g' < -2", "|g| within ±10°"],
          [turn_map(model, images[:500], after) for after in (0, model.max_steps - 1)])
    table("3. Turn increments damped from step 3 on: acc last step · acc median rule · mean steps · |θ_N − θ_{N−1}|",
          ["deg", "gain 1 (as trained)", "gain 0.5", "gain 0.25"],
          [damping_row(model, images, labels, angle) for angle in (0.0, 45.0, -45.0, 60.0, -60.0, 90.0, -90.0)])
    table("4. Settling and the halting step (median rule): late behaviour fixed / 2-cycle / 3-cycle / other;"
          " gate at N and steps, fixed or 2-cycle / the rest", ["deg", "late behaviour", "gate at N", "steps",
          "settled", "settling step", "halting − settling", "acc settling / halting / last", "wrong→right after halting",
          "of them halted settled"],
          [settling_row(model, images, labels, angle) for angle in ANGLES])

if __name__ == "__main__":
    main()
