#!/usr/bin/env bash
# One row of the README's align-step experiments: train on a subset, then evaluate.
#
#   benchmarks/align_experiment.sh NAME EPOCHS TRAIN_SIZE [ponder train options...]
#   python benchmarks/align_table.py runs/exp-A runs/exp-K ...     # the Markdown table
#
# Trains `--step align` into runs/exp-NAME and writes there fixed.json (exactly 0/22.5/45/67.5/90
# degrees, median halting, per-step accuracy, first 2,000 test images) and uniform.json (within
# +-22.5/45/67.5/90 degrees, sampled halting). Needs PONDER_DATA_DIR (or MNIST in the cache).
set -euo pipefail
name=$1; epochs=$2; size=$3; shift 3
out=runs/exp-$name
mkdir -p runs
python -m ponder_cli train --step align --epochs "$epochs" --train-size "$size" --out "$out" --overwrite \
    --no-progress "$@" 2> "$out.log" >/dev/null || { tail -3 "$out.log"; exit 1; }
mv "$out.log" "$out/train.log"
python -m ponder_cli extrapolate "$out/best.pt" --angles 0 22.5 45 67.5 90 --protocol fixed --halting median \
    --detail --limit 2000 -f json -q > "$out/fixed.json"
python -m ponder_cli extrapolate "$out/best.pt" --angles 22.5 45 67.5 90 --limit 2000 -f json -q > "$out/uniform.json"
echo "$out: $*"
