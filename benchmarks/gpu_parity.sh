#!/usr/bin/env bash
# The paper's parity runs carried forward one GPU window at a time: one command of at most 9
# minutes that leaves the campaign's checkpoint and log one window further on.
#
#   bash benchmarks/gpu_parity.sh OUT              # on the GPU machine, after gpu_check.sh or alone
#   bash benchmarks/gpu_parity.sh --cpu-smoke OUT  # the same plumbing, tiny, on the CPU (a test runs it)
#
# What a window does (benchmarks/parity_campaign.py says it in full):
#   - takes the first stage of the campaign not done: 64 elements scattered (PonderNet, the
#     slowest, begun on an H200), then the prefix and one-hot stages a CPU also runs, then 96
#     elements trained on counts 1-48 (PonderNet, then ACT); parity_campaign.py lists them;
#   - resumes that stage's checkpoint, benchmarks/parity_campaign/STAGE.pt (the 64-element one
#     begins at epoch 90 of a run on an H200), or starts the stage, and trains with --time-limit
#     for what the budget leaves after the evaluation;
#   - evaluates the new last.pt per count range (1-16 ... 49-64; 1-24 ... 73-96), with Wilson 95%
#     intervals, mean steps and Spearman rho(count, steps), 1,000 test vectors per count;
#   - replaces STAGE.pt with it (one tracked file, under 2 MB) and appends one row to
#     benchmarks/parity_campaign/log.md (date, GPU, torch, epochs, vectors, minutes, accuracy
#     per range);
#   - a stage is done once every range it trains on reaches 0.99.
# Commit the two changed files afterwards: the next window starts where this one ended.
#
# OUT gets summary.txt (the window's lines and the log's new row), window.json and logs.tar.gz
# (the run folder: config.json, metrics.csv, environment.json). $PONDER_PARITY_BUDGET_S (default
# 520) is the whole window's budget, start-up included; 60 s of it are kept for the evaluation.
# The machine's python3 needs torch, typer, rich and tqdm; ponder_cli runs from this checkout.

set -u -o pipefail

. "$(dirname "$0")/gpu_args.sh"  # [--cpu-smoke] OUT: SMOKE, OUT, REPO, PY
STARTED=$(date +%s)
BUDGET=${PONDER_PARITY_BUDGET_S:-520}

if [ "$SMOKE" = 1 ]; then
    # the tracked checkpoint copied into OUT and evaluated, then stand-in stages of 8 and 12
    # elements trained for seconds: the tracked files are never touched
    timeout -k 10 110 "$PY" benchmarks/parity_campaign.py --out "$OUT" --cpu-smoke 2>&1 | tee "$OUT/summary.txt"
    STATUS=$?
else
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| GPU:',
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" | tee "$OUT/summary.txt"
    # what is left of the budget for the window's process, less a margin for writing back
    LEFT=$((BUDGET - ($(date +%s) - STARTED) - 15))
    timeout -k 10 $((LEFT + 60)) "$PY" benchmarks/parity_campaign.py --out "$OUT" --budget-s "$LEFT" \
        --device cuda 2>&1 | tee -a "$OUT/summary.txt"
    STATUS=$?
    tar -czf "$OUT/logs.tar.gz" --exclude='*.pt' -C "$OUT" work 2>/dev/null && rm -rf "$OUT/work"
fi
echo "gpu_parity.sh: exit $STATUS after $(($(date +%s) - STARTED)) s" | tee -a "$OUT/summary.txt"
exit "$STATUS"
