#!/usr/bin/env bash
# A sweep on an accelerator machine (its own python3 and jax, no network), on the corpus the
# committed results were measured on, its training runs side by side on the one device:
#
#   bash experiments/device.sh --prepare                   # here, where pip reaches the index
#   bash experiments/device.sh [-P N] experiments.<sweep> ARGS...  # there, .whl and .data carried
#
# --prepare fills .whl/ (bench/gpu_wheels.sh) and .data/: this Python's pystdlib (the results'
# corpus: Python 3.11's standard library) as built here, and the file .data/PYTHON naming it.
#
# There, bench/device_env.sh readies the machine (wheels, PYTHONPATH, compilation cache, .data/ as
# the datasets' folder), then:
# 1. the sweep's runs (its --dry-run lines, each a train.py and an eval.py) run N at a time
#    (default 4, XLA_PYTHON_CLIENT_PREALLOCATE=false so that they share the device's memory), those
#    that start from another run's checkpoint (train.init_from) after all the others; a run whose
#    eval.json is there is not run again;
# 2. the sweep itself with ARGS: it reuses those runs, runs any left, scores and writes its tables.
# Every command gets --set data.python=<.data/PYTHON>, so that a machine with another Python reads
# the same corpus (relpos_jax/data/corpora.py). Run again, it goes on where it stopped. The log:
# ${OUT:-/tmp}/device.log, each run's output in ${OUT:-/tmp}/device_runs.log.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  bash bench/gpu_wheels.sh
  ${PYTHON:-.venv/bin/python} - <<'PREPARE'
import pathlib
import shutil

from relpos_jax.data import builders, corpora

built = pathlib.Path(builders.build("pystdlib").data_dir).parent  # built here on first use
target = pathlib.Path(".data") / built.parent.name / built.name
if target.resolve() != built.resolve():  # not where RELPOS_DATA_DIR=.data already built it
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(built, target)
(pathlib.Path(".data") / "PYTHON").write_text(corpora.running_python() + "\n")
print(f"{target}: pystdlib of Python {corpora.running_python()}")
PREPARE
  echo "carry .whl and .data ($(du -sh .whl .data | cut -f1 | tr '\n' ' '))"
  exit 0
fi

PY=${PYTHON:-python3}
PARALLEL=4
if [ "${1:-}" = "-P" ]; then PARALLEL=$2; shift 2; fi
if [ $# -lt 1 ]; then
  echo "usage: bash experiments/device.sh --prepare | [-P N] experiments.<sweep> ARGS..." >&2
  exit 2
fi
SWEEP=$1
shift
DIR=${OUT:-/tmp}
mkdir -p "$DIR"
LOG=$DIR/device.log RUNS_LOG=$DIR/device_runs.log
start=$SECONDS
say() { echo "[device.sh $((SECONDS - start)) s] $*" | tee -a "$LOG"; }

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
device_env "$LOG"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
interpreter=$(command -v "$PY")
[[ $interpreter = /* ]] || interpreter=$PWD/$interpreter
shims=$(mktemp -d)  # a new folder: nothing there to write through
printf '#!/bin/sh\nexec "%s" "$@"\n' "$interpreter" >"$shims/python"  # a venv's by its own path
chmod +x "$shims/python"
export PATH=$shims:$PATH  # the --dry-run lines call `python`
trap 'rm -rf "$shims"' EXIT
PIN=()
if [ -f .data/PYTHON ]; then PIN=(--set "data.python=$(tr -d '[:space:]' <.data/PYTHON)"); fi
say "$($PY -c 'import jax; d = jax.devices()[0]; print(f"{d.device_kind} ({jax.default_backend()}), jax {jax.__version__}")' 2>&1 | tail -n1); ${PIN[*]:-pystdlib of this Python}"

run_all() {  # run_all LINES: each a run's command line, PARALLEL at a time
  local line workdir count=0 total
  total=$(grep -c . <<<"$1")
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    count=$((count + 1))
    workdir=$(grep -o -- "--workdir [^ ]*" <<<"$line" | head -n1 | cut -d' ' -f2)
    if [ -f "$workdir/eval.json" ]; then
      continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
    say "run $count/$total: $workdir"
    (bash -c "$line" >>"$RUNS_LOG" 2>&1 || say "failed (exit $?): $workdir; see $RUNS_LOG") &
  done <<<"$1"
  wait
}

lines=$($PY -m "$SWEEP" "$@" "${PIN[@]}" --dry-run) || { say "$SWEEP --dry-run failed"; exit 1; }
run_all "$(grep -v -- "train.init_from" <<<"$lines")"
run_all "$(grep -- "train.init_from" <<<"$lines")"
say "$SWEEP: tabulating"
$PY -m "$SWEEP" "$@" "${PIN[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
say "finished (exit $rc)"
exit "$rc"
