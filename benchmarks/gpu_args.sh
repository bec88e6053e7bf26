# Sourced by gpu_check.sh and gpu_parity.sh: their one argument form, `[--cpu-smoke] OUT`, and the
# checkout they run from. Sets SMOKE (1 for --cpu-smoke), OUT (made, and absolute, since the
# script then works from the checkout), REPO and PY (the machine's python3), and puts this
# checkout first on PYTHONPATH.
SMOKE=0
if [ "${1:-}" = "--cpu-smoke" ]; then SMOKE=1; shift; fi
if [ $# -ne 1 ]; then
    echo "usage: $0 [--cpu-smoke] OUT" >&2
    exit 2
fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || PY=python
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
