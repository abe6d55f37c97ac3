#!/usr/bin/env bash
# Builds the store's, the CPU module's and the NVMe module's unit tests under a sanitizer (the
# asan or tsan preset of CMakePresets.json: CUDA off, Debug) and runs them with the preset's
# runtime options and suppressions; the store's seeded tests (property, concurrency) run once per
# seed. Prints one line per run and a summary; exits non-zero when any run failed.
#   scripts/sanitize.sh asan|tsan [seeds]     seeds: how many TZ_STORE_SEED values (default 3)
#   TZ_BUILD_DIR   build folder (default build/<preset>)
#   TZ_JOBS        parallel build jobs (default: number of cores)
#   TZ_SAN_TESTS   test programs to build and run (default: all listed below)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

preset=${1:-}
seeds=${2:-3}
case "$preset" in
  asan)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/lsan.supp}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    ;;
  tsan)
    # A report makes the program exit with 66 at the end (TSan's default exitcode).
    export TSAN_OPTIONS=${TSAN_OPTIONS:-suppressions=$root/tsan.supp:second_deadlock_stack=1}
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [seeds]" >&2
    exit 2
    ;;
esac

build_dir=${TZ_BUILD_DIR:-build/$preset}
jobs=${TZ_JOBS:-$(nproc)}
seeded=(store_property_test store_concurrency_test)
tests=(${TZ_SAN_TESTS:-store_test store_policy_test store_defects_test store_host_alloc_wait_test
       store_early_write_back_test store_window_test store_property_test store_concurrency_test
       tz_cpu_unit_tests
       tz_nvme_unit_tests})

if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  extra=()
  if command -v ninja >/dev/null 2>&1; then extra+=(-G Ninja); fi
  if command -v ccache >/dev/null 2>&1; then extra+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake --preset "$preset" -B "$build_dir" "${extra[@]}"
fi
cmake --build "$build_dir" --parallel "$jobs" --target "${tests[@]}"

failed=0
runs=0
run() {  # run <label> <program> [env...]
  local label=$1 prog=$2
  shift 2
  local log="$build_dir/sanitize-$label.log"
  local start=$SECONDS rc=0
  env "$@" "$prog" >"$log" 2>&1 || rc=$?
  runs=$((runs + 1))
  if [ "$rc" -eq 0 ]; then
    echo "ok    $label ($((SECONDS - start)) s)"
  else
    failed=$((failed + 1))
    echo "FAIL  $label (exit $rc, $((SECONDS - start)) s): $log"
    local pat="ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer|runtime error"
    grep -m 5 -E "$pat|FAILED|hang" "$log" || true
  fi
}

for t in "${tests[@]}"; do
  prog=$(find "$build_dir/tests" -type f -name "$t" -perm -u+x | head -n 1)
  if [ -z "$prog" ]; then
    echo "FAIL  $t: not built in $build_dir" >&2
    failed=$((failed + 1))
    continue
  fi
  if [[ " ${seeded[*]} " == *" $t "* ]]; then
    for ((s = 1; s <= seeds; ++s)); do run "$t.seed$s" "$prog" TZ_STORE_SEED=$s; done
  else
    run "$t" "$prog"
  fi
done
echo "$preset: $((runs - failed)) of $runs runs passed"
[ "$failed" -eq 0 ]
