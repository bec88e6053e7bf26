#!/usr/bin/env bash
# Everything the CUDA path is checked and timed by, on a GPU machine, in one command of at most 8
# minutes, ending in one table of targets.
#
#   bash benchmarks/gpu_check.sh OUT              # on the GPU machine
#   bash benchmarks/gpu_check.sh --cpu-smoke OUT  # the same plumbing, tiny, on the CPU (tests this script)
#
# Steps, each under its own time limit (the whole within $PONDER_GPU_BUDGET_S, default 470 s):
#   versions  python, torch, CUDA, the GPU
#   tests     python -m pytest -m cuda tests: every CUDA test of the suite (tests/test_cuda.py and
#             tests/test_capture.py's GPU cases): k replayed batches train as k eager batches
#             (their per-batch losses), a learning-rate cut reaches the replays, a run resumed onto
#             the GPU replays from the loaded state, no sync in a captured epoch but its one read,
#             two replays draw fresh dropout masks, rotations and coins, parity's curriculum and the
#             GradScaler's scale move under replay, a failed capture falls back and trains on, the
#             capture on the last visible GPU without a torch warning, float32 unless fp16 is asked,
#             the shipped models on CUDA within 0.1 points of the CPU (fp32, fp16)
#   capture   benchmarks/capture_speed.py: ms per batch and peak GPU memory, eager against
#             replayed, fp32 / fp16 / bf16
#   mlp       ponder train --epochs 20 --device cuda, the whole process (target <= 30 s), with
#             nvidia-smi sampling how busy the GPU is while it trains (target >= 50%)
#   align     ponder train --step align --epochs 20 --device cuda, for as long as fits (target <= 120 s)
#   parity    benchmarks/parity_speed.py --only speed, 64 elements, batch 128 and 2048
#             (targets >= 500 iterations/s, >= 250,000 vectors/s)
#   torchrun  ponder train under torchrun --nproc_per_node 1, 2 epochs: the NCCL backend on the
#             GPU (gloo on the CPU), DDP's eager batches (target: both epochs, the run's report)
#   precision benchmarks/precision_table.py: fp32, bf16 autocast and fp16 with a GradScaler under
#             capture, 2 epochs each of mlp, align and parity 64: seconds an epoch, back-offs,
#             accuracy (the figures behind float32 as the CUDA default)
#
# OUT gets summary.txt (the table, then each step's key lines) and logs.tar.gz (every log).
#
# Data: MNIST's four IDX files under $PONDER_DATA_DIR/MNIST/raw, or under .mnist/MNIST/raw in the
# repository (plain or .gz: a copy of the MNIST folder, compressed, travels light), e.g.
#     mkdir -p .mnist/MNIST/raw && for f in "$PONDER_DATA_DIR"/MNIST/raw/*; do
#         gzip -c "$f" > .mnist/MNIST/raw/$(basename "$f").gz; done; echo /.mnist/ >> .git/info/exclude
# with the repository copied to the GPU machine, .mnist included, and there
#     bash benchmarks/gpu_check.sh OUT
# The machine's python3 needs torch, typer, rich and tqdm; ponder_cli runs from this checkout.

set -u -o pipefail

. "$(dirname "$0")/gpu_args.sh"  # [--cpu-smoke] OUT: SMOKE, OUT, REPO, PY
PONDER="$PY -m ponder_cli"
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/logs" "$WORK/runs"
STARTED=$(date +%s)
DEADLINE=$((STARTED + ${PONDER_GPU_BUDGET_S:-470}))

if [ "$SMOKE" = 1 ]; then
    DEV=cpu SIZE=(--train-size 300 --val-size 100 --max-steps 3 --batch-size 50) EPOCHS=1 ITER=3
    PYTEST=(--co -q)  # collect only: the cuda tests skip without a GPU anyway
    CAPTURE=(--batches 2 --cases mlp --dtypes fp32)
    PRECISION=(--cases mlp --dtypes fp32 bf16 --epochs 1 --train-size 300 --val-size 100 --max-steps 3
               --batch-size 50)
else
    DEV=cuda SIZE=() EPOCHS=20 ITER=500 PYTEST=(-q -rA) CAPTURE=(--batches 50) PRECISION=()
fi

find_data() {
    local dir f
    for dir in "${PONDER_DATA_DIR:-}" "$REPO/.mnist"; do
        if [ -n "$dir" ] && [ -f "$dir/MNIST/raw/train-images-idx3-ubyte" ]; then echo "$dir"; return 0; fi
    done
    if [ -f "$REPO/.mnist/MNIST/raw/train-images-idx3-ubyte.gz" ]; then
        mkdir -p "$WORK/mnist/MNIST/raw"
        for f in "$REPO"/.mnist/MNIST/raw/*.gz; do gunzip -c "$f" > "$WORK/mnist/MNIST/raw/$(basename "$f" .gz)"; done
        echo "$WORK/mnist"; return 0
    fi
    return 1
}
DATA=$(find_data) || DATA=""
export PONDER_DATA_DIR=${DATA:-missing-mnist}
COMMON=(--data-dir "$PONDER_DATA_DIR" --no-download --no-progress)

# run NAME LIMIT_S COMMAND...: the command under a limit (cut to what the budget has left), its
# output in logs/NAME.log; sets SECONDS_TAKEN and STATUS
run() {
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE - $(date +%s)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then
        STATUS=SKIPPED SECONDS_TAKEN=0
        echo "[SKIPPED: the budget is spent] $name"
        return
    fi
    local t0 t1
    t0=$(date +%s.%N)
    timeout -k 10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
    local rc=$?
    t1=$(date +%s.%N)
    SECONDS_TAKEN=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    case $rc in 0) STATUS=OK ;; 124|137) STATUS="TIMEOUT(${limit}s)" ;; *) STATUS="FAIL($rc)" ;; esac
    echo "[$STATUS] $name ${SECONDS_TAKEN}s"
    [ "$STATUS" = OK ] || tail -n 6 "$WORK/logs/$name.log" | sed 's/^/    /'
}

ROWS=()
row() { ROWS+=("$(printf '%-44s %-26s %s' "$1" "$2" "$3")"); }
met() { awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN { if (v == "") print "NOT met (not measured)"; else if (op == "<=") print (v <= t ? "met" : "NOT met"); else print (v >= t ? "met" : "NOT met") }'; }

echo "device $DEV; data ${DATA:-NOT FOUND}; work $WORK; budget $((DEADLINE - STARTED)) s"
run versions 60 "$PY" -c "
import sys, torch
print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda)
print('GPU:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')"
cat "$WORK/logs/versions.log"
GPU_NAME=$(grep '^GPU:' "$WORK/logs/versions.log" | cut -c6-)

run tests 170 "$PY" -m pytest -m cuda -p no:cacheprovider "${PYTEST[@]}" tests
TESTS=$(grep -E "[0-9]+ (passed|failed|skipped|selected)|tests collected" "$WORK/logs/tests.log" | tail -n 1)
GAP=$(grep -o "gaps in points \[.*\]" "$WORK/logs/tests.log" | tr -d '[],' | awk '{for (i = 4; i <= NF; i++) if ($i > m) m = $i} END { if (NR) print m }')
row "pytest -m cuda" "${TESTS:-$STATUS}" "$( [ "$STATUS" = OK ] && echo met || echo "NOT met")"
row "shipped models, CUDA vs CPU (points)" "${GAP:-?} largest gap" "$(met "$GAP" "<=" 0.1)"

run capture 90 "$PY" benchmarks/capture_speed.py --device "$DEV" "${CAPTURE[@]}"
# the default mlp batch's peak GPU memory, eager and replayed (capture keeps its graph's pool)
PEAK=$(awk '$1 == "mlp" && $3 == "fp32" && NF >= 9 { print $(NF - 1) " / " $NF }' "$WORK/logs/capture.log")
row "peak GPU memory, mlp fp32 (MiB)" "${PEAK:-not measured} eager / replayed" "$( [ -n "$PEAK" ] && echo reported || echo "NOT met (not measured)")"

# the mlp run, with the GPU's utilisation sampled every half second while it trains
UTIL=$WORK/logs/utilisation.csv
if command -v nvidia-smi >/dev/null && [ "$DEV" = cuda ]; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > "$UTIL" 2>/dev/null &
    SAMPLER=$!
fi
run train-mlp 100 $PONDER train --device "$DEV" --epochs "$EPOCHS" --patience 0 "${SIZE[@]}" "${COMMON[@]}" \
    --out "$WORK/runs/mlp" -f json
MLP_S=$SECONDS_TAKEN MLP_STATUS=$STATUS
[ -n "${SAMPLER:-}" ] && kill "$SAMPLER" 2>/dev/null
# busy share over the samples from the first to the last non-idle one (start-up and exit left out)
BUSY=$(awk '{v[NR] = $1} END { for (i = 1; i <= NR; i++) if (v[i] > 0) { if (!a) a = i; b = i }
            if (a) { for (i = a; i <= b; i++) s += v[i]; printf "%.0f", s / (b - a + 1) } }' "$UTIL" 2>/dev/null)
MLP_ACC=$(grep -o '"val_accuracy": [0-9.]*' "$WORK/logs/train-mlp.log" | head -n 1 | awk '{printf "val acc %.4f", $2}')
row "train mlp, 20 epochs, whole process (s)" "$MLP_S $MLP_STATUS ${MLP_ACC}" "$(met "$MLP_S" "<=" 30)"
row "GPU busy while mlp trains (%)" "${BUSY:--}" "$(met "$BUSY" ">=" 50)"

run train-align 125 $PONDER train --step align --device "$DEV" --epochs "$EPOCHS" --patience 0 "${SIZE[@]}" \
    "${COMMON[@]}" --out "$WORK/runs/align"
ALIGN_EPOCHS=$(grep -cE "^epoch +[0-9]+/" "$WORK/logs/train-align.log")
row "train align, 20 epochs (s)" "$SECONDS_TAKEN $STATUS, $ALIGN_EPOCHS epochs" \
    "$( [ "$STATUS" = OK ] && met "$SECONDS_TAKEN" "<=" 120 || echo "NOT met")"

for batch in 128 2048; do
    run "parity64-$batch" 60 "$PY" benchmarks/parity_speed.py --only speed --elems 64 --batch-size "$batch" \
        --iterations "$ITER" --device "$DEV" --threads 4
    ITS=$(grep -o '"iterations_per_second": [0-9.]*' "$WORK/logs/parity64-$batch.log" | awk '{print $2}')
    if [ "$batch" = 128 ]; then
        row "parity 64, batch 128 (iterations/s)" "${ITS:-$STATUS}" "$(met "$ITS" ">=" 500)"
    else
        VPS=$(awk -v i="$ITS" 'BEGIN { if (i != "") printf "%.0f", i * 2048 }')
        row "parity 64, batch 2048 (vectors/s)" "${VPS:-$STATUS}" "$(met "$VPS" ">=" 250000)"
    fi
done

# DDP on the GPU, one process: NCCL's own line says which version ran (gloo on the CPU)
run torchrun 90 env NCCL_DEBUG=VERSION "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 \
    -m ponder_cli train --device "$DEV" --epochs 2 --patience 0 "${SIZE[@]}" "${COMMON[@]}" \
    --out "$WORK/runs/torchrun" -f json
DDP_EPOCHS=$(grep -cE "^epoch +[0-9]+/2" "$WORK/logs/torchrun.log")
NCCL=$(grep -o "NCCL version [0-9.]*" "$WORK/logs/torchrun.log" | head -n 1)
DDP_ACC=$(grep -o '"val_accuracy": [0-9.]*' "$WORK/logs/torchrun.log" | head -n 1 | awk '{printf "val acc %.4f", $2}')
row "torchrun, 1 process, 2 epochs" "$STATUS $DDP_EPOCHS epochs ${NCCL:-no NCCL} ${DDP_ACC}" \
    "$( [ "$STATUS" = OK ] && [ "$DDP_EPOCHS" = 2 ] && grep -q "1 processes, global batch" "$WORK/logs/torchrun.log" \
        && echo met || echo "NOT met")"

run precision 170 "$PY" benchmarks/precision_table.py --device "$DEV" --data-dir "$PONDER_DATA_DIR" "${PRECISION[@]}"
ROWS_DONE=$(grep -cE "^(mlp|align|parity64) .* (captured|eager)" "$WORK/logs/precision.log")
row "precision table (rows trained)" "$ROWS_DONE $STATUS" "$( [ "$STATUS" = OK ] && echo reported || echo "NOT met")"

{
    echo "gpu_check.sh on ${GPU_NAME:-?}, $(grep '^python' "$WORK/logs/versions.log"), $(date -u +%FT%TZ), $(($(date +%s) - STARTED)) s"
    printf '%-44s %-26s %s\n' "target" "measured" "verdict"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "-- capture_speed.py (ms per batch; peak GPU memory, MiB, eager and replayed)"
    cat "$WORK/logs/capture.log" 2>/dev/null
    echo
    echo "-- precision_table.py (trained under capture: seconds, GradScaler back-offs, accuracy)"
    cat "$WORK/logs/precision.log" 2>/dev/null
    for log in "$WORK"/logs/*.log; do
        echo "-- $(basename "$log")"
        grep -E "^epoch +[0-9]+/|best |passed|failed|Error|Traceback|CUDA graphs|about .* an epoch|iterations/s" "$log" \
            | tail -n 6 | cut -c1-200
    done
} > "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs
cat "$OUT/summary.txt"
