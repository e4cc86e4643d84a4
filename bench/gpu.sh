#!/usr/bin/env bash
# relpos_jax on an accelerator, as the machine is found (its python3 and jax, no network):
#
#   bash bench/gpu.sh            # every table, under 8 minutes: results in ${OUT:-docs/benchmarks}
#   bash bench/gpu.sh --quick    # everything compiles and runs, under 3 minutes: ${OUT:-/tmp/relpos_gpu_quick}
#   bash bench/gpu.sh --kernels  # the kernel tests, then the kernels over T = 1k … 32k and memory
#                                # 0 … 4,096 against tiled and cuDNN, under 8 minutes: gpu_kernels.*
#
# 1. If .whl/ holds wheels (bash bench/gpu_wheels.sh fills it where pip reaches the index), installs
#    them with pip --no-index into /tmp/site; relpos_jax runs from this checkout (PYTHONPATH;
#    bench/device_env.sh).
# 2. One process a table, each under `timeout` and within the run's time budget, so that a table
#    that fails or hangs costs only itself: `python -m bench.gpu --table training|depth|profile|
#    attention` merges its rows into gpu.json as it goes (see bench/gpu.py), the kernel tests on
#    the device before the attention table (not in --quick). JAX's persistent compilation cache
#    (/tmp/jax_cache) lets a later table load what an earlier one compiled.
# 3. Renders gpu.md from gpu.json (python -m bench.gpu_render), and records in
#    relpos_jax/attention/kernel/faster.json where the kernels beat dense and tiled (what
#    model.attention_impl=auto takes on this kind of GPU); the log of the run is gpu.log.
# GPU_BENCH_COMMIT=<commit> names the commit where the copy has no git history (a device's copy);
# GPU_BENCH_BUDGET=<seconds> and GPU_BENCH_CAPS="table:seconds ..." size the run to a lease.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
QUICK="" MODE=full NAME=gpu TABLES="training depth profile attention"
if [ "${1:-}" = "--quick" ]; then QUICK="--quick" MODE=quick; fi
if [ "${1:-}" = "--kernels" ]; then MODE=kernels NAME=gpu_kernels TABLES="kernels"; fi
if [ "$MODE" = quick ]; then
  DIR=${OUT:-/tmp/relpos_gpu_quick}; BUDGET=${GPU_BENCH_BUDGET:-170}
  CAPS="training:90 depth:60 profile:45 attention:60"
elif [ "$MODE" = kernels ]; then
  DIR=${OUT:-docs/benchmarks}; BUDGET=${GPU_BENCH_BUDGET:-470}
  CAPS="kernel_tests:170 kernels:300"
else
  DIR=${OUT:-docs/benchmarks}; BUDGET=${GPU_BENCH_BUDGET:-470}
  CAPS="training:200 depth:40 profile:30 kernel_tests:100 attention:100"
fi
CAPS=${GPU_BENCH_CAPS:-$CAPS}  # e.g. "training:200 depth:80 ..." where one lease must hold every table
mkdir -p "$DIR"
JSON=$DIR/$NAME.json LOG=$DIR/$NAME.log
rm -f "$JSON" "$LOG" /tmp/gpu_bench_*.log
start=$SECONDS
say() { echo "[gpu.sh $((SECONDS - start)) s] $*" | tee -a "$LOG"; }

# shellcheck source=bench/device_env.sh
source bench/device_env.sh
device_env "$LOG"  # .whl/'s wheels, PYTHONPATH, the compilation cache (bench/device_env.sh)
export GPU_BENCH_COMMAND="bash bench/gpu.sh${1:+ $1}"
say "$($PY -c 'import jax; d = jax.devices()[0]; print(f"{d.device_kind} ({jax.default_backend()}), jax {jax.__version__}")' 2>&1 | tail -n1); budget ${BUDGET} s"

limit_for() {  # the table's cap, or what is left of the budget if less
  local cap left
  cap=$(echo "$CAPS" | tr ' ' '\n' | grep "^$1:" | cut -d: -f2)
  left=$((BUDGET - (SECONDS - start)))
  echo $((cap < left ? cap : left))
}

run_table() {  # run_table NAME COMMAND...: under its time limit; what went wrong goes into gpu.json
  local name=$1 limit rc t0=$SECONDS
  shift
  limit=$(limit_for "$name")
  if [ "$limit" -lt 20 ]; then
    say "$name: skipped, ${limit} s left of the ${BUDGET} s budget"
    $PY -m bench.gpu --record "$name" --outcome "skipped: the run's time budget was spent" --json "$JSON"
    return
  fi
  say "$name: starting (limit ${limit} s)"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "/tmp/gpu_bench_$name.log" | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    last=$(grep -v '^\s*$' "/tmp/gpu_bench_$name.log" | tail -n1 | cut -c1-200)
    $PY -m bench.gpu --record "$name" --json "$JSON" \
      --outcome "stopped at gpu.sh's limit of ${limit} s; its last output: ${last:-none}"
  elif [ "$rc" != 0 ]; then
    last=$(grep -E "Error|error" "/tmp/gpu_bench_$name.log" | tail -n1 | cut -c1-300)
    $PY -m bench.gpu --record "$name" --outcome "failed (exit $rc): ${last:-see gpu.log}" --json "$JSON"
  fi
  say "$name: done in $((SECONDS - t0)) s (exit $rc)"
}

run_kernel_tests() {
  # XLA_FLAGS set (even empty): tests/conftest.py's XLA:CPU settings stay off the device.
  # the compiled kernels (not the interpreted variants, which a CPU test run covers); with
  # pytest-timeout, the session ends itself 20 s inside the limit and still prints why each failed
  local ends=()
  if $PY -c "import pytest_timeout" 2>/dev/null; then
    ends=(--session-timeout "$(($(limit_for kernel_tests) - 20))")
  fi
  run_table kernel_tests env XLA_FLAGS="${XLA_FLAGS-}" $PY -m pytest -v --tb=line -rfE \
    -p no:cacheprovider "${ends[@]}" \
    -k "not interpreted" tests/attention/kernel/kernel_vs_reference_test.py \
    tests/attention/kernel/kernel_vs_tiled_test.py
  summary=$(grep -s -E "[0-9]+ (passed|failed|errors?)" /tmp/gpu_bench_kernel_tests.log | tail -n1 | cut -c1-300)
  if [ -n "$summary" ]; then
    $PY -m bench.gpu --record kernel_tests --outcome "$summary" --json "$JSON"
  fi
}

# the kernels' correctness first where they are the subject; before the attention table otherwise
# (which the time budget may cut short: its first cells are the targets')
[ "$MODE" = kernels ] && run_kernel_tests
for table in $TABLES; do
  [ "$MODE" = full ] && [ "$table" = attention ] && run_kernel_tests
  run_table "$table" $PY -m bench.gpu --table "$table" --json "$JSON" $QUICK
done
$PY -m bench.gpu_render --json "$JSON" --out "$DIR/$NAME.md" \
  --faster relpos_jax/attention/kernel/faster.json 2>&1 | tee -a "$LOG"
[ "$DIR" = docs/benchmarks ] || cp relpos_jax/attention/kernel/faster.json "$DIR/faster.json"
say "finished; $DIR/$NAME.md, $DIR/$NAME.json, $DIR/$NAME.log"
