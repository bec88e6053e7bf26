"""Does `ponder predict` on PNG files agree with `ponder eval` on the same images?

Writes the first N MNIST test digits as PNG files with Pillow (the independent tool), upright and
rotated by Pillow by exactly the angles `ponder eval --protocol fixed --angles DEG` draws for
them (+-DEG, the sign eval draws for each image: tasks.mnist.evaluation_draws picks the signs,
Pillow does the rotating; `predict --rotate` is shown too), runs `ponder predict` on the files and `ponder eval --limit N` on the
same images, and prints both accuracies under the median rule (deterministic: the two should
agree image for image) and the sample rule (each command draws its own coins). Then: the same
digits black on white (inverted) and three times larger (84x84, framed as MNIST's digits), and
the align model's accumulated turn on digits rotated by +DEG and by -DEG: on how many the turn
at which the halting step read the digit has the sign opposite to the rotation.

    python benchmarks/predict_agreement.py                       # align, 500 digits, 60 degrees
    python benchmarks/predict_agreement.py --checkpoint reference --count 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from PIL import Image

from ponder_cli.data import default_data_dir, load_mnist
from ponder_cli.tasks.mnist import evaluation_draws


def ponder(*args) -> dict:
    done = subprocess.run([sys.executable, "-m", "ponder_cli", *map(str, args), "-f", "json", "-q"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"ponder {' '.join(map(str, args))} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def write_pngs(folder: Path, images, labels, angles=None, *, invert=False, scale=1) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (image, label) in enumerate(zip(images, labels)):
        picture = Image.fromarray(image.numpy())
        if angles is not None:  # Pillow: counter-clockwise, about the centre, nearest neighbour, black fill
            picture = picture.rotate(float(angles[i]), resample=Image.NEAREST)
        if invert:
            picture = Image.eval(picture, lambda v: 255 - v)
        if scale != 1:
            picture = picture.resize((28 * scale, 28 * scale), Image.BICUBIC)
        path = folder / f"{i:05d}_{int(label)}.png"
        picture.save(path)
        paths.append(path)
    return paths


def accuracy(report: dict) -> float:
    labels = [int(Path(b["input"]).stem.split("_")[1]) for b in report["buckets"]]
    return sum(b["prediction"] == y for b, y in zip(report["buckets"], labels)) / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="align")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--angle", type=float, default=60.0)
    parser.add_argument("--turns", type=int, default=200, help="digits per sign for the turn count (align)")
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    data_dir = args.data_dir or default_data_dir()
    test = load_mnist(data_dir, train=False, download=False)
    images, labels = test.images[:args.count], test.labels[:args.count]
    seed = ponder("info", args.checkpoint)["seed"]  # eval's default seed: the checkpoint's training seed
    os.environ.setdefault("PONDER_DATA_DIR", str(data_dir))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # eval's draws for the fixed protocol: each image's angle from (seed, bucket, its index)
        angles, _ = evaluation_draws(args.count, 1, args.angle, seed, "cpu", protocol="fixed")
        sets = {"upright": write_pngs(tmp / "upright", images, labels),
                f"±{args.angle:g}°": write_pngs(tmp / "rotated", images, labels, angles)}
        print(f"{args.checkpoint}: the first {args.count} MNIST test digits as PNG files (Pillow)\n")
        print(f"{'images':<10} {'halting':<8} {'predict':>8} {'eval':>8}")
        for name, paths in sets.items():
            for rule in ("median", "sample"):
                predicted = ponder("predict", args.checkpoint, *paths, "--halting", rule)
                evaluated = ponder("eval", args.checkpoint, "--limit", args.count, "--halting", rule,
                                   "--protocol", "fixed", "--angles", 0 if name == "upright" else args.angle)
                print(f"{name:<10} {rule:<8} {accuracy(predicted):>8.4f} {evaluated['buckets'][0]['accuracy']:>8.4f}")
        for rule in ("median", "sample"):
            both = [ponder("predict", args.checkpoint, *sets["upright"], "--halting", rule, "--rotate", sign * args.angle)
                    for sign in (1, -1)]
            print(f"{'--rotate':<10} {rule:<8} {sum(map(accuracy, both)) / 2:>8.4f}    (predict --rotate +{args.angle:g} "
                  f"and -{args.angle:g} on the upright files, mean)")
        upright = ponder("predict", args.checkpoint, *sets["upright"], "--halting", "median")
        inverted = ponder("predict", args.checkpoint, *write_pngs(tmp / "inverted", images, labels, invert=True),
                          "--halting", "median")
        large = ponder("predict", args.checkpoint, *write_pngs(tmp / "large", images, labels, invert=True, scale=3),
                       "--halting", "median")
        agree = sum(a["prediction"] == b["prediction"] for a, b in zip(upright["buckets"], inverted["buckets"]))
        print(f"\nblack on white, 28x28: accuracy {accuracy(inverted):.4f}; the same prediction as white on black "
              f"for {agree} of {args.count}")
        print(f"black on white, 84x84 (framed): accuracy {accuracy(large):.4f}")
        if upright["step"] != "align":
            return
        print(f"\nthe accumulated turn the halting step read the digit at (median rule; 0 when it halts at step 1), "
              f"digits rotated by exactly ±{args.angle:g}°:")
        first = images[:args.turns], labels[:args.turns]
        for sign in (1, -1):
            rotation = sign * args.angle
            paths = write_pngs(tmp / f"turn{sign}", *first, torch.full((args.turns,), rotation))
            report = ponder("predict", args.checkpoint, *paths, "--halting", "median", "--steps")
            # turn_deg is the turn accumulated after a step: the halting step read at its predecessor's
            turns = [b["steps"][b["halting_step"] - 2]["turn_deg"] if b["halting_step"] > 1 else 0.0
                     for b in report["buckets"]]
            opposite = [t * rotation < 0 for t in turns]
            median = sorted(turns)[len(turns) // 2]
            others = sorted(int(y) for y, right in zip(first[1], opposite) if not right)
            print(f"  {rotation:+g}°: the turn's sign is opposite to the rotation on {sum(opposite)} of {len(turns)}; "
                  f"median turn {median:+.1f}°, accuracy {accuracy(report):.4f}\n"
                  f"        the others' labels: {' '.join(map(str, others))}")


if __name__ == "__main__":
    main()
