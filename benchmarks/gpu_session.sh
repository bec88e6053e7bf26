#!/usr/bin/env bash
# Everything a GPU session checks and times on CUDA, in one script:
#
#   bash benchmarks/gpu_session.sh OUT [PHASE ...]     # run the phases (default: all, in order)
#   bash benchmarks/gpu_session.sh --dry-run OUT       # print the commands, run nothing
#   bash benchmarks/gpu_session.sh --cpu-smoke OUT     # every phase, tiny and on the CPU (tests the script)
#
# Phases: check tests mlp align eval resume torchrun speed profile.
#   check     versions, the GPU, the data
#   tests     python -m pytest -m cuda
#   mlp       ponder train --epochs 20 --device cuda, the reference step (target <= 60 s)
#   align     the same with --step align (target <= 3 min)
#   eval      eval, extrapolate, sweep, compare on cuda (the runs of mlp and align if present, and the
#             shipped models); the shipped models' extrapolation on the CPU too (target: within
#             0.3 points of CUDA)
#   resume    one run moving CPU -> CUDA -> CPU -> CUDA, an epoch on each
#   torchrun  torchrun --nproc_per_node=1 --device cuda (nccl), mlp and truncated align, and a resume
#   speed     benchmarks/speed.py --device cuda for the mlp and align steps (align: early exit >= 3x)
#   profile   torch.profiler over one training epoch of each step (tables), and a Chrome trace of
#             20 align batches
#
# Logs, reports and timings go to a work folder ($PONDER_GPU_WORK, default /tmp/ponder-gpu) that
# later calls on the same warm machine reuse; at the end OUT gets summary.txt (one line per step:
# status, seconds, command; then the key figures) and logs.tar.gz (every log, report and profile).
# A failing step does not stop the others. Each step has its own time limit, and the phases given
# stop starting steps $PONDER_GPU_DEADLINE_S seconds (default 570) after the script started, so
# one call fits the device tool's 10 minutes: run the phases over four calls, for instance
#     check tests mlp resume  |  align torchrun  |  eval speed  |  profile
# (about 25 minutes on an H100 once the speed targets hold; before, the limits cut what is slow,
# and the summary says which steps timed out or were skipped: run their phase again).
#
# Data: MNIST's four IDX files under $PONDER_DATA_DIR/MNIST/raw, or under .mnist/MNIST/raw in the
# repository (plain or .gz), carried to the GPU machine: here, once,
#     mkdir -p .mnist/MNIST/raw && for f in /work/shared/datasets/MNIST/raw/*; do
#         gzip -c "$f" > .mnist/MNIST/raw/$(basename "$f").gz; done; echo /.mnist/ >> .git/info/exclude
# and name .mnist in the run's carry. The machine's python3 holds torch, typer, rich and tqdm;
# ponder_cli runs from this checkout (python3 -m ponder_cli).

set -u -o pipefail

DRY=0 SMOKE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1; shift ;;
        --cpu-smoke) SMOKE=1; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
if [ $# -lt 1 ]; then
    echo "usage: $0 [--dry-run] [--cpu-smoke] OUT [PHASE ...]" >&2
    exit 2
fi
OUT=$1; shift
ALL_PHASES=(check tests mlp align eval resume torchrun speed profile)
PHASES=("$@")
[ ${#PHASES[@]} -eq 0 ] && PHASES=("${ALL_PHASES[@]}")
for phase in "${PHASES[@]}"; do
    case " ${ALL_PHASES[*]} " in *" $phase "*) ;; *) echo "unknown phase $phase; choose from ${ALL_PHASES[*]}" >&2; exit 2 ;; esac
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || PY=python
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PONDER="$PY -m ponder_cli"
WORK=${PONDER_GPU_WORK:-/tmp/ponder-gpu}
if [ "$DRY" = 1 ]; then  # a dry run leaves the real work folder alone
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
fi
STARTED=$(date +%s)
DEADLINE=$((STARTED + ${PONDER_GPU_DEADLINE_S:-570}))
mkdir -p "$OUT" "$WORK/logs" "$WORK/reports" "$WORK/runs"
TIMINGS=$WORK/timings.tsv
[ -f "$TIMINGS" ] || printf 'status\tseconds\tstep\tcommand\n' > "$TIMINGS"
STEP_NO=$(($(wc -l < "$TIMINGS") - 1))

# The full-size session on CUDA, or the same plumbing, tiny, on the CPU.
if [ "$SMOKE" = 1 ]; then
    DEV=cpu EPOCHS=1 SIZE=(--train-size 300 --val-size 100 --max-steps 3 --batch-size 50)
    EVAL_SIZE=(--limit 200) SWEEP=(--every 45 --limit 200) SPEED=(--train-batches 2 --synthetic --train-only)
    TRACE_BATCHES=2
else
    DEV=cuda EPOCHS=20 SIZE=() EVAL_SIZE=() SWEEP=(--every 15) SPEED=() TRACE_BATCHES=20
fi

find_data() {
    local dir f
    for dir in "${PONDER_DATA_DIR:-}" "$REPO/.mnist" "$REPO/data" /work/shared/datasets; do
        if [ -n "$dir" ] && [ -f "$dir/MNIST/raw/train-images-idx3-ubyte" ]; then echo "$dir"; return 0; fi
    done
    for dir in "$REPO/.mnist" "$REPO/data"; do
        if [ -f "$dir/MNIST/raw/train-images-idx3-ubyte.gz" ]; then
            mkdir -p "$WORK/mnist/MNIST/raw"
            for f in "$dir"/MNIST/raw/*.gz; do
                gunzip -c "$f" > "$WORK/mnist/MNIST/raw/$(basename "$f" .gz)" || return 1
            done
            echo "$WORK/mnist"; return 0
        fi
    done
    return 1
}
DATA=$(find_data) || DATA=""
export PONDER_DATA_DIR=${DATA:-${PONDER_DATA_DIR:-}}
COMMON=(--data-dir "${DATA:-missing-mnist}" --no-download)

# step NAME LIMIT_S COMMAND...: run with a time limit, log to $WORK/logs, one line in timings.tsv
step() {
    local name=$1 limit=$2; shift 2
    local left=$((DEADLINE - $(date +%s)))
    STEP_NO=$((STEP_NO + 1))
    local log
    log=$WORK/logs/$(printf '%02d' "$STEP_NO")-$name.log
    local shown
    shown=$(printf '%s' "$*" | tr '\n\t' '  ' | tr -s ' ' | cut -c1-300)
    if [ "$left" -lt 15 ]; then
        printf 'SKIPPED\t0\t%s\t%s\n' "$name" "$shown" >> "$TIMINGS"
        echo "[SKIPPED: no time left in this call] $name"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$DRY" = 1 ]; then
        echo "[dry-run, limit ${limit}s] $shown"
        return 0
    fi
    printf '$ %s\n' "$shown" > "$log"
    local t0 t1 rc status
    t0=$(date +%s.%N)
    timeout -k 15 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
        0) status=OK ;;
        124|137) status="TIMEOUT(${limit}s)" ;;
        *) status="FAIL($rc)" ;;
    esac
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\n' "$status" "$secs" "$name" "$shown" >> "$TIMINGS"
    echo "[$status] $name ${secs}s"
    if [ "$status" != OK ]; then tail -n 5 "$log" | sed 's/^/    /'; fi
    return 0
}

phase_check() {
    step versions 60 "$PY" -c "
import sys, torch, typer, rich, tqdm
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'cudnn', torch.backends.cudnn.version())
print('cuda available:', torch.cuda.is_available(), '| devices:', torch.cuda.device_count(),
      '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
import ponder_cli; print('ponder_cli', ponder_cli.__version__, ponder_cli.__file__)"
    step nvidia-smi 30 bash -c "nvidia-smi || echo 'no nvidia-smi'"
    step data 30 bash -c "test -n '$DATA' && ls -l '$DATA/MNIST/raw' || { echo 'MNIST not found: see the header of $0'; exit 1; }"
}

phase_tests() {
    step pytest-cuda 420 "$PY" -m pytest -m cuda -q -rA -p no:cacheprovider tests/test_cuda.py
}

# --patience 0: all 20 epochs, whatever validation does (the targets are for 20)
phase_mlp() {
    step train-mlp 560 $PONDER train --device "$DEV" --epochs "$EPOCHS" --patience 0 "${SIZE[@]}" "${COMMON[@]}" \
        --out "$WORK/runs/mlp" --overwrite --no-progress
}

phase_align() {
    step train-align 560 $PONDER train --step align --device "$DEV" --epochs "$EPOCHS" --patience 0 "${SIZE[@]}" \
        "${COMMON[@]}" --out "$WORK/runs/align" --overwrite --no-progress
}

# the shipped models, and this session's runs where mlp and align got that far
checkpoints() {
    local ck
    for ck in checkpoints/best.pt checkpoints/align/best.pt "$WORK/runs/mlp/best.pt" "$WORK/runs/align/best.pt"; do
        [ -f "$ck" ] && echo "$ck"
    done
}

phase_eval() {
    local ck name
    for ck in $(checkpoints); do
        name=$(echo "$ck" | sed 's#^checkpoints/#shipped-#; s#^'"$WORK"'/runs/#run-#; s#/best.pt$##; s#\.pt$##; s#/#-#g')
        step "eval-$name" 120 bash -c "$PONDER eval '$ck' --device $DEV ${EVAL_SIZE[*]} ${COMMON[*]} -f json > '$WORK/reports/eval-$name.json'"
        step "extrapolate-$name" 120 bash -c "$PONDER extrapolate '$ck' --angles 22.5 45 67.5 90 --device $DEV ${EVAL_SIZE[*]} ${COMMON[*]} -f json > '$WORK/reports/extrapolate-$name-$DEV.json'"
        step "sweep-$name" 180 bash -c "$PONDER sweep '$ck' --halting median --device $DEV ${SWEEP[*]} ${COMMON[*]} -f json > '$WORK/reports/sweep-$name.json'"
    done
    # The shipped models on the CPU, against CUDA (fp16 by default there, and float32)
    for ck in checkpoints/best.pt checkpoints/align/best.pt; do
        name=$(echo "$ck" | sed 's#^checkpoints/#shipped-#; s#/best.pt$##; s#\.pt$##; s#/#-#g')
        step "extrapolate-$name-cpu" 240 bash -c "$PONDER extrapolate '$ck' --angles 22.5 45 67.5 90 --device cpu ${EVAL_SIZE[*]} ${COMMON[*]} -f json > '$WORK/reports/extrapolate-$name-cpu.json'"
        step "extrapolate-$name-$DEV-fp32" 120 bash -c "$PONDER extrapolate '$ck' --angles 22.5 45 67.5 90 --device $DEV --no-amp ${EVAL_SIZE[*]} ${COMMON[*]} -f json > '$WORK/reports/extrapolate-$name-$DEV-fp32.json'"
        step "cpu-vs-$DEV-$name" 30 "$PY" - "$WORK/reports/extrapolate-$name-cpu.json" \
            "$WORK/reports/extrapolate-$name-$DEV.json" "$WORK/reports/extrapolate-$name-$DEV-fp32.json" <<'EOF'
import json, sys
cpu = {b["rotation"]: b["accuracy"] for b in json.load(open(sys.argv[1]))["buckets"]}
worst = 0.0
for path in sys.argv[2:]:
    other = {b["rotation"]: b["accuracy"] for b in json.load(open(path))["buckets"]}
    gaps = {angle: 100 * (other[angle] - cpu[angle]) for angle in cpu}
    worst = max(worst, max(abs(g) for g in gaps.values()))
    print(path.rsplit("/", 1)[-1], " ".join(f"{a:g}: {g:+.2f}" for a, g in gaps.items()), "points")
print(f"largest gap {worst:.2f} points: {'PASS' if worst <= 0.3 else 'FAIL'} (target <= 0.3)")
sys.exit(0 if worst <= 0.3 else 1)
EOF
    done
    local all
    all=$(checkpoints | tr '\n' ' ')
    step compare 240 bash -c "$PONDER compare $all --angles 22.5 45 67.5 90 --device $DEV ${EVAL_SIZE[*]} ${COMMON[*]} > '$WORK/reports/compare.txt'"
}

phase_resume() {
    local run=$WORK/runs/moving last=$WORK/runs/moving/last.pt
    local small=(--train-size 5000 --val-size 1000)
    [ "$SMOKE" = 1 ] && small=("${SIZE[@]}")
    step resume-1-cpu 180 $PONDER train --device cpu --epochs 1 "${small[@]}" "${COMMON[@]}" --out "$run" --overwrite --no-progress
    step "resume-2-$DEV" 180 $PONDER train --resume "$last" --epochs 2 --device "$DEV" "${COMMON[@]}" --no-progress
    step resume-3-cpu 180 $PONDER train --resume "$last" --epochs 3 --device cpu "${COMMON[@]}" --no-progress
    step "resume-4-$DEV" 180 $PONDER train --resume "$last" --epochs 4 --device "$DEV" "${COMMON[@]}" --no-progress
    step resume-check 30 "$PY" -c "
from ponder_cli.checkpoint import load_checkpoint
s = load_checkpoint('$last')
print('epoch', s.epoch, 'history', [h['epoch'] for h in s.history], 'rng', {k: type(v).__name__ for k, v in s.rng.items()},
      'fused', s.optimizer['param_groups'][0].get('fused'), 'scaler', s.scaler)
assert s.epoch == 4 and [h['epoch'] for h in s.history] == [1, 2, 3, 4]"
}

phase_torchrun() {
    local trun=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m ponder_cli train --device "$DEV")
    step torchrun-mlp 300 "${trun[@]}" --epochs 2 "${SIZE[@]}" "${COMMON[@]}" --out "$WORK/runs/ddp-mlp" --overwrite --no-progress
    step torchrun-resume 240 "${trun[@]}" --resume "$WORK/runs/ddp-mlp/last.pt" --epochs 3 "${COMMON[@]}" --no-progress
    step torchrun-align 400 "${trun[@]}" --step align --epochs 1 "${SIZE[@]}" "${COMMON[@]}" --out "$WORK/runs/ddp-align" --overwrite --no-progress
}

phase_speed() {
    step speed-mlp 420 "$PY" benchmarks/speed.py --device "$DEV" "${SPEED[@]}"
    step speed-align 540 "$PY" benchmarks/speed.py --device "$DEV" --step align "${SPEED[@]}"
}

phase_profile() {
    local step_fn
    for step_fn in mlp align; do
        # a whole epoch (tables only: its trace would be too large to open)
        step "profile-$step_fn-epoch" 420 "$PY" benchmarks/speed.py --device "$DEV" --step "$step_fn" --train-only \
            "${SPEED[@]}" --profile "$WORK/profile-$step_fn-epoch"
    done
    step profile-align-trace 240 "$PY" benchmarks/speed.py --device "$DEV" --step align --train-only "${SPEED[@]}" \
        --train-batches "$TRACE_BATCHES" --profile "$WORK/profile-align-trace"
}

echo "phases: ${PHASES[*]}; device $DEV; data ${DATA:-NOT FOUND}; work $WORK; deadline in $((DEADLINE - STARTED)) s"
for phase in "${PHASES[@]}"; do
    echo "== $phase"
    "phase_$phase"
done

# summary.txt: every step so far (this call's and earlier calls' on this machine), then the figures
{
    echo "gpu_session.sh ${PHASES[*]}: $(date -u +%FT%TZ), $(($(date +%s) - STARTED)) s"
    column -t -s $'\t' "$TIMINGS" 2>/dev/null | cut -c1-200 || cut -c1-200 "$TIMINGS"
    echo
    for log in "$WORK"/logs/*.log; do
        [ -f "$log" ] || continue
        figures=$(grep -E "^epoch +[0-9]+/|best checkpoint|train images/s|seconds per epoch|20 epochs, estimated|speed-up|identical results|kernel launches per batch|host syncs per batch|nonzero per batch|largest gap|GradScaler|passed|failed|skipped|synchronising calls|Error|Traceback|TIMEOUT" "$log" | tail -n 8)
        if [ -n "$figures" ]; then
            echo "-- $(basename "$log")"
            echo "$figures" | cut -c1-200
        fi
    done
} > "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs reports timings.tsv $(cd "$WORK" && ls -d profile-* 2>/dev/null) 2>/dev/null
cat "$OUT/summary.txt"
