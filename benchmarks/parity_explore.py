"""Experiment harness for the parity task (issue 16): train one model, log its learning curve.

Standalone until `ponder train --task parity` exists. Trains PonderNet, ACT or plain on parity
vectors drawn on the fly from a seeded generator (Adam, gradient clipping, the method's own
loss), validates every --eval-every iterations on fixed per-bucket sets (accuracy under sampled
and median halting, mean steps +- sd, Spearman rho(non-zero count, steps)), and at the end
reports the same on the fixed test sets with the steps per count. Every evaluation is one JSON
line in --log; a one-line summary goes to stdout.

Runs on one thread by default: the machine is shared.

    python benchmarks/parity_explore.py --elems 16 --step gru --lr 1e-3 --iterations 20000 \\
        --eval-counts 1-8 9-16 --log /work/parity-runs/x.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ponder_cli.config import PonderConfig
from ponder_cli.evaluate import spearman
from ponder_cli.methods import get_method, init_halting_bias
from ponder_cli.model import PonderNet
from ponder_cli.steps.gru import GRUStep
from ponder_cli.tasks import parity


@dataclass(frozen=True)
class ParityConfig(PonderConfig):
    """PonderConfig plus the parity task's own fields (until the config grows a task)."""
    elems: int = 64
    train_lo: int = 1
    train_hi: int = 64


def build(cfg: ParityConfig, gru_recipe: dict) -> PonderNet:
    model = PonderNet(cfg, classes=parity.CLASSES)
    if cfg.step == "gru" and gru_recipe:
        model.step = GRUStep(cfg, **gru_recipe)
    init_halting_bias(model, cfg)
    return model


@torch.no_grad()
def evaluate_sets(model, method, cfg, sets, ranges, seed: int, rules=("sample", "median")) -> dict:
    """Per bucket: accuracy and steps under each halting rule; rho over all rows together."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)  # the same coins at every evaluation
    result = {"buckets": []}
    all_counts, all_steps, all_correct = [], {rule: [] for rule in rules}, {rule: [] for rule in rules}
    for (lo, hi), data in zip(ranges, sets):
        out = model(data.x)
        uniforms = torch.rand(cfg.max_steps, data.x.shape[0], generator=generator)
        bucket = {"counts": f"{lo}-{hi}"}
        for rule in rules:
            scores, steps = method.predict(out.logits, out.lambda_logits, uniforms, rule)
            steps, correct = steps.float(), (scores.argmax(1) == data.labels).float()
            bucket[rule] = {"accuracy": float(correct.mean()),
                            "steps": float(steps.mean()), "steps_sd": float(steps.std()) if len(steps) > 1 else 0.0}
            all_steps[rule].append(steps)
            all_correct[rule].append(correct)
        result["buckets"].append(bucket)
        all_counts.append(data.counts)
    counts = torch.cat(all_counts)
    for rule in rules:
        steps, correct = torch.cat(all_steps[rule]), torch.cat(all_correct[rule])
        result[f"rho_{rule}"] = spearman(counts.float(), steps)
        result[f"steps_per_count_{rule}"] = {
            int(c): round(float(steps[counts == c].mean()), 3) for c in torch.unique(counts)}
        result[f"accuracy_per_count_{rule}"] = {
            int(c): round(float(correct[counts == c].mean()), 4) for c in torch.unique(counts)}
    model.train()
    return result


def summary(record: dict) -> str:
    parts = []
    for b in record["buckets"]:
        s = b["sample"]
        parts.append(f"{b['counts']}:{s['accuracy']:.3f}/{s['steps']:.1f}")
    rho = record.get("rho_sample")
    return " ".join(parts) + (f" rho={rho:.2f}" if rho is not None else " rho=-")


def train_counts_at(iteration: int, args) -> tuple[int, int]:
    """Count curriculum: the top of the training count range grows linearly over the first
    --curriculum iterations, from --curriculum-start to the full range."""
    lo, hi = args.train_counts
    if args.curriculum <= 0 or iteration >= args.curriculum:
        return lo, hi
    start = max(lo, args.curriculum_start)
    return lo, min(hi, start + (hi - start) * iteration // args.curriculum)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="pondernet", choices=("pondernet", "act", "plain"))
    p.add_argument("--step", default="gru", choices=("rnn", "gru"))
    p.add_argument("--elems", type=int, default=64)
    p.add_argument("--train-counts", default=None, help="LO-HI non-zero counts in training (default 1-elems)")
    p.add_argument("--eval-counts", nargs="+", default=None, help="buckets LO-HI (default quarters of 1-elems)")
    p.add_argument("--eval-per-count", type=int, default=64, help="validation rows per non-zero count")
    p.add_argument("--test-per-count", type=int, default=256, help="test rows per non-zero count (final)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--lambda-p", type=float, default=0.1)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--act-epsilon", type=float, default=0.01)
    p.add_argument("--halting-bias", type=float, default=None)
    p.add_argument("--truncation", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gru-layer-norm", action="store_true")
    p.add_argument("--gru-orthogonal", action="store_true")
    p.add_argument("--gru-update-bias", type=float, default=0.0)
    p.add_argument("--curriculum", type=int, default=0, help="iterations over which the top count grows")
    p.add_argument("--curriculum-start", type=int, default=2)
    p.add_argument("--iterations", type=int, default=20000)
    p.add_argument("--minutes", type=float, default=0.0, help="stop after this much training time (0: no limit)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--stop-at", type=float, default=0.0,
                   help="stop once every validation bucket's sampled accuracy reaches this (0: never)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log", type=Path, required=True, help="JSON lines: one per evaluation, then the final test")
    p.add_argument("--save", type=Path, default=None, help="write the final weights and config here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.train_counts = parity.parse_count_range(args.train_counts or f"1-{args.elems}", args.elems)
    if args.eval_counts is None:
        quarter = max(1, args.elems // 4)
        args.eval_counts = [f"{lo}-{min(lo + quarter - 1, args.elems)}" for lo in range(1, args.elems + 1, quarter)]
    ranges = [parity.parse_count_range(r, args.elems) for r in args.eval_counts]

    fields = dict(method=args.method, step=args.step, hidden=args.hidden, lambda_p=args.lambda_p, beta=args.beta,
                  tau=args.tau, act_epsilon=args.act_epsilon, halting_bias=args.halting_bias,
                  truncation=args.truncation, lr=args.lr, batch_size=args.batch_size, grad_clip=args.grad_clip,
                  seed=args.seed, elems=args.elems, train_lo=args.train_counts[0], train_hi=args.train_counts[1])
    if args.max_steps is not None:
        fields["max_steps"] = args.max_steps
    elif args.method == "plain":
        fields["max_steps"] = 1
    cfg = ParityConfig(**fields)
    gru_recipe = {k: v for k, v in (("layer_norm", args.gru_layer_norm), ("orthogonal", args.gru_orthogonal),
                                    ("update_bias", args.gru_update_bias)) if v}

    torch.manual_seed(cfg.seed)  # weights only; data come from their own generators
    method = get_method(cfg)
    model = build(cfg, gru_recipe)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data_generator = torch.Generator().manual_seed(cfg.seed)
    val_sets = parity.bucket_sets(cfg.elems, ranges, args.eval_per_count, parity.VALIDATION_SEED)

    args.log.parent.mkdir(parents=True, exist_ok=True)
    log = args.log.open("w")
    header = {"kind": "config", "config": dataclasses.asdict(cfg), "gru_recipe": gru_recipe,
              "argv": sys.argv[1:] if argv is None else argv, "threads": args.threads,
              "curriculum": args.curriculum, "curriculum_start": args.curriculum_start}
    log.write(json.dumps(header) + "\n")
    log.flush()

    model.train()
    params = list(model.parameters())
    train_seconds, iteration = 0.0, 0
    window = torch.zeros(4, dtype=torch.float64)  # loss, correct, steps, rows since the last evaluation
    stopped = "iterations"
    while iteration < args.iterations:
        started = time.perf_counter()
        lo, hi = train_counts_at(iteration, args)
        batch = parity.parity_batch(cfg.batch_size, cfg.elems, lo, hi, data_generator)
        out = model(batch.x, stop=method.truncation(cfg.batch_size, batch.x.device))
        loss = method.loss(out.logits, out.lambda_logits, batch.labels)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        if torch.isfinite(loss.total):
            optimizer.step()
        with torch.no_grad():
            uniforms = torch.rand(cfg.max_steps, cfg.batch_size)
            scores, steps = method.predict(out.logits, out.lambda_logits, uniforms, "sample")
            window += torch.tensor([float(loss.total) * cfg.batch_size,
                                    float((scores.argmax(1) == batch.labels).sum()), float(steps.sum()),
                                    cfg.batch_size], dtype=torch.float64)
        train_seconds += time.perf_counter() - started
        iteration += 1
        out_of_time = args.minutes > 0 and train_seconds >= args.minutes * 60
        if iteration % args.eval_every == 0 or iteration == args.iterations or out_of_time:
            record = evaluate_sets(model, method, cfg, val_sets, ranges, seed=parity.VALIDATION_SEED)
            rows = max(float(window[3]), 1.0)
            record.update(kind="val", iteration=iteration, train_seconds=round(train_seconds, 1),
                          it_per_s=round(iteration / train_seconds, 1), train_counts=f"{lo}-{hi}",
                          train_loss=float(window[0]) / rows, train_accuracy=float(window[1]) / rows,
                          train_steps=float(window[2]) / rows)
            window.zero_()
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"it {iteration} {train_seconds:.0f}s {record['it_per_s']}it/s loss {record['train_loss']:.3f} "
                  f"train {record['train_accuracy']:.3f} | {summary(record)}", flush=True)
            if args.stop_at > 0 and all(b["sample"]["accuracy"] >= args.stop_at for b in record["buckets"]):
                stopped = "stop-at"
                break
            if out_of_time:
                stopped = "minutes"
                break

    test_sets = parity.bucket_sets(cfg.elems, ranges, args.test_per_count, parity.TEST_SEED)
    record = evaluate_sets(model, method, cfg, test_sets, ranges, seed=parity.TEST_SEED)
    record.update(kind="test", iteration=iteration, train_seconds=round(train_seconds, 1),
                  it_per_s=round(iteration / max(train_seconds, 1e-9), 1), stopped=stopped,
                  test_per_count=args.test_per_count)
    log.write(json.dumps(record) + "\n")
    log.close()
    print(f"TEST it {iteration} {train_seconds:.0f}s | {summary(record)}", flush=True)
    if args.save is not None:
        torch.save({"config": dataclasses.asdict(cfg), "gru_recipe": gru_recipe, "model": model.state_dict()},
                   args.save)


if __name__ == "__main__":
    main()
