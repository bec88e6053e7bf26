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
# what the scripts import, checked first: one line and exit 1 where it is missing, not a traceback
MISSING=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('torch', 'typer', 'rich', 'tqdm')
if u.find_spec(m) is None))" 2>/dev/null) || { echo "Error: $PY does not run; set PYTHON to a python3 with torch" >&2
    exit 1; }
if [ -n "$MISSING" ]; then
    echo "Error: $PY ($(command -v "$PY")) lacks $MISSING, which $(basename "$0") needs; install them there" \
        "(pip install torch typer rich tqdm) or set PYTHON to a python3 that has them" >&2
    exit 1
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
