#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, configures and builds tierzero with CUDA, runs the
# tests labelled `gpu` (CudaDevice conformance, kernels vs CPU references, NcclComm), then
# `tierzero bench copy` and `tierzero bench comm` on the GPU, and prints a short summary table
# last. Meant to finish in one call of under 8 minutes: only the needed targets are built, with
# every core. Results (JSON lines and logs) go to $OUT if set, else build/gpu-check/results.
#
#   scripts/gpu-check.sh            # BUILD_DIR=build/gpu-check, CUDA_ARCHS="80;90"
#   CUDA_ARCHS=native scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build/gpu-check}
RESULTS=${OUT:-$BUILD_DIR/results}
CUDA_ARCHS=${CUDA_ARCHS:-80;90}
COPY_SIZE=${COPY_SIZE:-1G}
JOBS=$(nproc)
mkdir -p "$RESULTS"
t0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-450}  # everything, summary included, stays under 8 minutes
step() { echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
# Seconds a step may take: its own cap, or what is left before the deadline (at least 5).
budget() { local left=$(( DEADLINE_S - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
status_build=fail status_tests=fail status_copy=skip status_comm=skip

step "machine"
date -u
nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader \
  2>&1 | tee "$RESULTS/nvidia-smi.txt" || echo "nvidia-smi not available"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" --version | tail -1 || { echo "no nvcc: cannot build the CUDA backend"; exit 1; }
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
NGPU=${NGPU:-0}

step "configure (CUDA archs $CUDA_ARCHS)"
GEN=(-G Ninja)
command -v ninja >/dev/null || GEN=(-G "Unix Makefiles")
# One CUDA runtime (the shared one) for every target, as CUDA::cudart is.
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS" \
  -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared > "$RESULTS/configure.log" 2>&1 \
  || { tail -30 "$RESULTS/configure.log"; exit 1; }
grep "tierzero: TZ_CUDA" "$RESULTS/configure.log"

step "build (-j$JOBS): gpu tests, then tierzero"
if timeout "$(budget 300)" cmake --build "$BUILD_DIR" -j"$JOBS" --target tz_gpu_cuda_tests tz_ops_cuda_tests \
     > "$RESULTS/build-tests.log" 2>&1; then
  status_build=ok
else
  tail -40 "$RESULTS/build-tests.log"
fi
have_cli=no
if timeout "$(budget 150)" cmake --build "$BUILD_DIR" -j"$JOBS" --target tierzero > "$RESULTS/build-cli.log" 2>&1; then
  have_cli=yes
else
  echo "tierzero did not build (benchmarks skipped):"; tail -20 "$RESULTS/build-cli.log"
fi

if [ "$status_build" = ok ]; then
  step "tests labelled gpu"
  if timeout "$(budget 120)" ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure \
       > "$RESULTS/ctest-gpu.log" 2>&1; then
    status_tests=ok
  fi
  tail -15 "$RESULTS/ctest-gpu.log"
  grep -h "SKIPPED\|skipped:" "$RESULTS/ctest-gpu.log" | head -5
  # The gpu binary itself, for the per-test skip/pass lines.
  timeout "$(budget 60)" "$BUILD_DIR/tests/gpu/tz_gpu_cuda_tests" \
    > "$RESULTS/gpu-tests-detail.log" 2>&1 || true
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$RESULTS/gpu-tests-detail.log" | head -20
  if [ "$NGPU" -gt 1 ] && command -v mpirun >/dev/null; then
    step "NcclComm across $NGPU GPUs (mpirun)"
    if timeout "$(budget 90)" mpirun --allow-run-as-root -np "$NGPU" \
         "$BUILD_DIR/tests/gpu/tz_gpu_cuda_tests" --gtest_filter='NcclComm.*' \
         > "$RESULTS/nccl-multi.log" 2>&1; then
      echo "NcclComm with $NGPU ranks: ok"
    else
      status_tests=fail; tail -20 "$RESULTS/nccl-multi.log"
    fi
  fi
fi

TZ=$BUILD_DIR/src/cli/tierzero
if [ "$have_cli" = yes ]; then
  step "bench copy (cuda, $COPY_SIZE)"
  if timeout "$(budget 60)" "$TZ" bench copy --device cuda --size "$COPY_SIZE" --repeats 5 --json \
       > "$RESULTS/bench-copy.jsonl" 2> "$RESULTS/bench-copy.err"; then
    status_copy=ok
  else
    status_copy=fail; cat "$RESULTS/bench-copy.err"
  fi
  step "bench comm (nccl, $NGPU GPU(s))"
  comm_cmd=("$TZ" bench comm --device cuda --backend nccl --min-bytes 1M --max-bytes 1G --factor 8
            --iters 20 --repeats 3 --json)
  if [ "$NGPU" -gt 1 ] && command -v mpirun >/dev/null; then
    comm_cmd=(mpirun --allow-run-as-root -np "$NGPU" "${comm_cmd[@]}")
  fi
  if timeout "$(budget 90)" "${comm_cmd[@]}" > "$RESULTS/bench-comm.jsonl" 2> "$RESULTS/bench-comm.err"; then
    status_comm=ok
  else
    status_comm=fail; tail -20 "$RESULTS/bench-comm.err"
  fi
  # The kernels (their CUDA-vs-CPU tests ran with -L gpu above) and the model on the GPU: bench ops
  # in bf16, gpt2-124m for 20 steps without offload, gpt2-1.5b with both offloads on NVMe.
  step "bench ops (cuda, bf16)"
  timeout "$(budget 90)" "$TZ" bench ops --device cuda --dtype bf16 --repeat 5 --json \
    > "$RESULTS/bench-ops.jsonl" 2> "$RESULTS/bench-ops.err" || tail -20 "$RESULTS/bench-ops.err"
  step "train gpt2-124m, 20 steps, no offload"
  timeout "$(budget 120)" "$TZ" train --config configs/train/gpu_bf16.json --model gpt2-124m \
    --steps 20 --seq 1024 --json > "$RESULTS/train-124m.json" 2> "$RESULTS/train-124m.err" \
    || tail -20 "$RESULTS/train-124m.err"
  step "train gpt2-1.5b, 5 steps, parameters and optimizer on NVMe"
  timeout "$(budget 180)" "$TZ" train --config configs/good/ds_zero3_nvme_offload.json --model gpt2-1.5b \
    --steps 5 --seq 1024 --nvme-path "${TZ_GPU_NVME:-/tmp}" --json \
    > "$RESULTS/train-1.5b.json" 2> "$RESULTS/train-1.5b.err" || tail -20 "$RESULTS/train-1.5b.err"
fi

step "summary"
python3 - "$RESULTS" "$status_build" "$status_tests" "$status_copy" "$status_comm" <<'PY' || cat "$RESULTS"/*.jsonl
import json, pathlib, sys
res = pathlib.Path(sys.argv[1])
print(f"build {sys.argv[2]} | gpu tests {sys.argv[3]} | bench copy {sys.argv[4]} | bench comm {sys.argv[5]}")
def rows(name):
    p = res / name
    if not p.exists():
        return []
    return [json.loads(l) for l in p.read_text().splitlines() if l.startswith("{")]
copy = rows("bench-copy.jsonl")
if copy:
    print(f"\nbench copy on {copy[0]['device']}, {copy[0]['bytes'] / 2**20:.0f} MiB")
    print(f"{'dir':6} {'memory':9} {'GB/s':>8} {'min':>8} {'max':>8}")
    for r in copy:
        print(f"{r['direction']:6} {r['host_memory']:9} {r['median_gbps']:8.2f} {r['min_gbps']:8.2f} {r['max_gbps']:8.2f}")
comm = rows("bench-comm.jsonl")
if comm:
    print(f"\nbench comm: {comm[0]['backend']}, {comm[0]['ranks']} rank(s), {comm[0]['device']}")
    print(f"{'op':15} {'bytes':>12} {'time_us':>10} {'algbw':>8} {'busbw':>8}")
    for r in comm:
        print(f"{r['op']:15} {r['bytes']:12d} {r['time_us_median']:10.1f} {r['algbw_gbps']:8.2f} {r['busbw_gbps']:8.2f}")
PY
echo "results in $RESULTS ($(( $(date +%s) - t0 ))s)"
[ "$status_build" = ok ] && [ "$status_tests" = ok ]
