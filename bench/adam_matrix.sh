#!/usr/bin/env bash
# Every gradient dtype x 16-bit copy x state dtype of `tierzero bench adam`, each as a fraction of
# its same-run streaming ceiling, alternating the binaries given (e.g. a baseline and a new build)
# per combination so both see the same machine state. One row per binary and combination.
#
# usage: bench/adam_matrix.sh [--params 64M] [--threads 2] [--repeat 5] [--simd auto] BIN [BIN...]
# Environment: GRADS, COPIES, STATES (space-separated lists to narrow the sweep).
set -euo pipefail
params=64M
threads=2
repeat=5
simd=auto
bins=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --simd) simd="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[[ ${#bins[@]} -gt 0 ]] || { echo "adam_matrix: give at least one tierzero binary" >&2; exit 2; }
echo "# adam_matrix: $(date -u), $(nproc) cpus, params $params, threads $threads, repeat $repeat, simd $simd" >&2
printf "%-8s %-6s %-6s %-6s %-6s %8s %8s %8s\n" binary simd grad copy states gbps ceiling fraction
for states in ${STATES:-fp32 bf16}; do
  for grad in ${GRADS:-fp32 bf16 fp16}; do
    for copy in ${COPIES:-none bf16 fp16}; do
      for i in "${!bins[@]}"; do
        line=$("${bins[$i]}" --log-level warn bench adam --params "$params" --threads "$threads" \
                 --repeat "$repeat" --simd "$simd" --grad-dtype "$grad" --param-copy "$copy" \
                 --state-dtype "$states" --json)
        python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print("%-8s %-6s %-6s %-6s %-6s %8.2f %8.2f %8.3f" % (sys.argv[2], j["simd"], j["grad_dtype"],
      j["param_copy"], j["state_dtype"], j["gbps"], j["ceiling_gbps"], j["fraction_of_ceiling"]))
' "$line" "bin$i"
      done
    done
  done
done
