#!/usr/bin/env bash
# gpu-check.sh: the verdict of one call on the borrowed GPU machine (one H200, 16 cores, nvcc 13,
# PyTorch's venv with the nvidia-* wheels; no package registry). Nothing is built there: the
# programs and the libraries the machine lacks travel as the payload that scripts/gpu-payload.sh
# makes here, and CUDA's own libraries (cudart, cuBLAS, NCCL) are found on the machine.
#
# WHAT TO SEND AND RUN (device tool), after `scripts/gpu-payload.sh` here has printed its size:
#     run(command="scripts/gpu-check.sh", carry=["build/gpu-payload"], timeout_s=540)
# The tree travels with it (the configs under configs/train/ are read from it). One command,
# under 9 minutes: DEADLINE_S=500 for the checks, whose caps add up to 500 s (payload 30, gpu
# tests 15, ops tests 150, bench copy 15, bench ops 15, train cpu 30, train gpu 20, speed 25,
# llama cpu 80, llama gpu 120). The first H200 run (2026-12-04) took 2, 70+ (its cap: 19 of 25
# tests, 5-12 s each at GPT-2's vocabulary), 8, 1, 14, 10, 10, 45+ (init about 30 s), 70+ s.
#
# What it checks, each a row of the summary; the exit status is 0 only when every row passed:
#   payload        the three programs start with the machine's libraries (libstdc++ from the
#                  payload's fallback only if the machine's is too old); `tierzero info` runs
#   gpu tests      tz_gpu_cuda_tests: CudaDevice conformance, the kernels bit for bit, NcclComm
#   ops tests      tz_ops_cuda_tests: every ops/ CUDA kernel and cuBLAS against the CPU backend
#                  (a missing program, a failed, or a SKIPPED test fails the row: no passing by
#                  skipping)
#   bench copy     host<->device bandwidth on cuda (the result must name a cuda device)
#   bench ops      every kernel on cuda, bf16; each must pass its own check against the CPU
#   train cpu/gpu  gpt2-124m, 3 steps, fp32, stage 3, parameters and optimizer states on NVMe,
#                  once on the CPU (TZ_DEVICE=host) and once on the GPU (TZ_DEVICE=cuda: no
#                  silent fallback to HostDevice, a failure to open the GPU fails); each step's
#                  loss on the GPU within 1e-3 (relative) of the CPU's
#   train speed    gpt2-124m, bf16, seq 1024, NVMe offload, on cuda: tokens/s and model TFLOPS
#                  ((6 N + 12 L T d) FLOP per token), reported, not judged
#   llama cpu/gpu  llama-3.2-1b (1.24 B parameters, vocab 128,256), 2 steps, fp32, seq 64: on the
#                  GPU at stage 3 with parameters and optimizer states on NVMe; the same steps on
#                  the CPU at stage 0 in host memory (the engine's losses do not depend on stage or
#                  offload, so the CPU run needs no disk time); each loss within 1e-3 relative;
#                  the GPU run's tokens/s and model TFLOPS
# Results: $OUT/summary.txt (the table), $OUT/summary.json, $OUT/logs.tar.gz (every log, gtest
# JSON, metrics); $OUT unset: build/gpu-check/. At most 8 files come back from $OUT: keep it so.
#
# Environment: PAYLOAD (the carried folder, default build/gpu-payload: payload.tar.gz is unpacked
# under /tmp), TZ_GPU_NVME (swap folder, default
# /var/tmp/tierzero-gpu-check: a disk with O_DIRECT, not tmpfs), DEADLINE_S (500).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CARRIED=$(readlink -f "${PAYLOAD:-build/gpu-payload}")  # payload.tar.gz, MANIFEST.txt
PAYLOAD=$(mktemp -d /tmp/tz-gpu-payload.XXXXXX)             # unpacked: bin/, lib/
RESULTS=${OUT:-$ROOT/build/gpu-check}
WORK=$(mktemp -d /tmp/tz-gpu-check.XXXXXX)
NVME=${TZ_GPU_NVME:-/var/tmp/tierzero-gpu-check}
DEADLINE_S=${DEADLINE_S:-500}
mkdir -p "$RESULTS" "$NVME"
t0=$(date +%s)
STEPS=$WORK/steps.tsv
: >"$STEPS"

elapsed() { echo $(( $(date +%s) - t0 )); }
say() { echo "=== [$(elapsed)s] $*"; }
# Seconds a step may take: its cap, or what is left before the deadline (at least 5).
budget() {
  local left=$(( DEADLINE_S - $(elapsed) ))
  if [ "$left" -lt "$1" ]; then echo $(( left > 5 ? left : 5 )); else echo "$1"; fi
}
# record NAME pass|fail SECONDS NOTE: one row of the summary.
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS"; echo "--- $1: $2 ($3 s) $4"; }

# --- The machine and the payload --------------------------------------------------------------
say "machine"
date -u
nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader \
  >"$WORK/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >>"$WORK/nvidia-smi.txt"
cat "$WORK/nvidia-smi.txt"
(ldd --version | head -1; uname -a; nproc; python3 --version) >"$WORK/machine.txt" 2>&1
TZ=$PAYLOAD/bin/tierzero

# CUDA's libraries from the machine: each soname of machine-libs.txt from the dynamic linker's
# cache, else from the CUDA toolkit, else from the nvidia-* wheels of python3's venv.
cuda_lib_path() {
  local dirs=() soname found d
  local candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
  local wheels
  wheels=$(python3 -c 'import nvidia, os; print("\n".join(os.path.realpath(p) for p in nvidia.__path__))' 2>/dev/null)
  while read -r soname; do
    [ -z "$soname" ] && continue
    [ "$soname" = libcuda.so.1 ] && continue  # the driver: the loader's business
    if ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$soname "; then continue; fi
    found=""
    for d in "${candidates[@]}"; do
      [ -e "$d/$soname" ] && { found=$d; break; }
    done
    if [ -z "$found" ] && [ -n "$wheels" ]; then
      found=$(find $wheels -name "$soname" -print -quit 2>/dev/null)
      [ -n "$found" ] && found=$(dirname "$found")
    fi
    if [ -z "$found" ]; then
      echo "MISSING:$soname"
    else
      dirs+=("$found")
    fi
  done <"$PAYLOAD/machine-libs.txt"
  local IFS=:
  echo "${dirs[*]}"
}

payload_ok=0
s=$(date +%s)
tar -C "$PAYLOAD" -xzf "$CARRIED/payload.tar.gz" 2>"$WORK/unpack.err" || cat "$WORK/unpack.err"
if [ ! -x "$TZ" ] || [ ! -f "$PAYLOAD/machine-libs.txt" ]; then
  record payload fail 0 "no payload in $CARRIED: run scripts/gpu-payload.sh here and carry build/gpu-payload"
else
  head -6 "$CARRIED/MANIFEST.txt"
  cuda_dirs=$(cuda_lib_path)
  if [[ $cuda_dirs == *MISSING:* ]]; then
    record payload fail 0 "CUDA libraries not found on this machine: $(echo "$cuda_dirs" | grep -o 'MISSING:[^ ]*' | tr '\n' ' ')"
  else
    export LD_LIBRARY_PATH="$PAYLOAD/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HWLOC_PLUGINS_PATH=$PAYLOAD/lib/hwloc  # empty: no optional hwloc plugins, as verified here
    if ! "$TZ" --version >"$WORK/version.txt" 2>&1; then
      # The machine's libstdc++ (or libgcc_s) is older than the programs need: the payload's.
      export LD_LIBRARY_PATH="$PAYLOAD/lib:$PAYLOAD/lib/fallback:${LD_LIBRARY_PATH#"$PAYLOAD/lib:"}"
      echo "using the payload's libstdc++ ($(tr '\n' ' ' <"$WORK/version.txt"))"
    fi
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee "$WORK/ld-library-path.txt"
    if "$TZ" --version >"$WORK/version.txt" 2>&1 &&
       timeout 30 "$TZ" info --path "$NVME" >"$WORK/info.txt" 2>&1; then
      payload_ok=1
      record payload pass $(( $(date +%s) - s )) "$(head -1 "$WORK/version.txt")"
      grep -i -E "gpu|cuda|nccl|o_direct" "$WORK/info.txt" | head -12
    else
      record payload fail $(( $(date +%s) - s )) "tierzero does not start: $(tail -2 "$WORK/version.txt" "$WORK/info.txt" 2>/dev/null | tr '\n' ' ')"
    fi
  fi
fi

# --- The CUDA test programs: run, nothing failed, nothing skipped -----------------------------
# gtest_row NAME PROGRAM CAP
gtest_row() {
  local name=$1 prog=$2 cap=$3 s rc=0 verdict note
  s=$(date +%s)
  if [ ! -x "$PAYLOAD/bin/$prog" ]; then
    record "$name" fail 0 "$prog is not in the payload (not built)"; return
  fi
  say "$name: $prog"
  timeout "$(budget "$cap")" "$PAYLOAD/bin/$prog" --gtest_output="json:$WORK/$prog.json" \
    >"$WORK/$prog.log" 2>&1 || rc=$?
  note=$(python3 - "$WORK/$prog.json" "$rc" <<'PY'
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
try:
    d = json.load(open(path))
except Exception as e:
    print(f"fail\texit {rc}, no gtest report ({'timed out' if rc in (124, 137) else e})"); sys.exit()
ran, failed, skipped = 0, [], []
for suite in d.get("testsuites", []):
    for t in suite.get("testsuite", []):
        name = f"{suite['name']}.{t['name']}"
        if t.get("status") == "NOTRUN":
            continue
        ran += 1
        if t.get("failures"):
            failed.append(name)
        elif t.get("result") == "SKIPPED":
            skipped.append(name)
ok = rc == 0 and ran > 0 and not failed and not skipped
note = f"{ran} tests, {len(failed)} failed, {len(skipped)} skipped"
if failed: note += "; failed: " + " ".join(failed[:6])
if skipped: note += "; skipped (a failure here): " + " ".join(skipped[:6])
if rc != 0 and not failed: note += f"; exit {rc}"
print(("pass" if ok else "fail") + "\t" + note)
PY
)
  verdict=${note%%$'\t'*}
  record "$name" "$verdict" $(( $(date +%s) - s )) "${note#*$'\t'}"
  [ "$verdict" = pass ] || grep -E "^\[  (FAILED|SKIPPED) |Failure|error" "$WORK/$prog.log" | head -20
}

if [ "$payload_ok" = 1 ]; then
  gtest_row "gpu tests" tz_gpu_cuda_tests 15
  gtest_row "ops tests" tz_ops_cuda_tests 150

  # --- Benchmarks on the GPU ----------------------------------------------------------------
  say "bench copy (cuda, 1G)"
  s=$(date +%s); rc=0
  timeout "$(budget 15)" "$TZ" bench copy --device cuda --size 1G --repeats 5 --json \
    >"$WORK/bench-copy.jsonl" 2>"$WORK/bench-copy.err" || rc=$?
  note=$(python3 - "$WORK/bench-copy.jsonl" "$rc" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rc = int(sys.argv[2])
ok = rc == 0 and rows and all("cuda:" in r["device"] for r in rows)
best = {f"{r['direction']}/{r['host_memory']}": r["median_gbps"] for r in rows}
print(("pass" if ok else "fail") + "\t" + (f"exit {rc}; " if rc else "") +
      (rows[0]["device"] + ": " if rows else "no results") +
      ", ".join(f"{k} {v:.1f} GB/s" for k, v in best.items()))
PY
)
  record "bench copy" "${note%%$'\t'*}" $(( $(date +%s) - s )) "${note#*$'\t'}"

  say "bench ops (cuda, bf16)"
  s=$(date +%s); rc=0
  timeout "$(budget 15)" "$TZ" bench ops --device cuda --dtype bf16 --repeat 5 --json \
    >"$WORK/bench-ops.jsonl" 2>"$WORK/bench-ops.err" || rc=$?
  note=$(python3 - "$WORK/bench-ops.jsonl" "$rc" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rc = int(sys.argv[2])
bad = [f"{r['op']}/{r.get('pass')}" for r in rows if r.get("pass") is False]
cuda = rows and all(str(r["backend"]).startswith("cuda") for r in rows)
ok = rc == 0 and rows and cuda and not bad
gemm = [r for r in rows if "fraction_of_peak" in r]
peak = max((r.get("peak_gflops", 0) for r in gemm), default=0)
print(("pass" if ok else "fail") + "\t" + (f"exit {rc}; " if rc else "") +
      f"{len(rows)} kernels on {rows[0]['backend'] if rows else '?'}" +
      (f"; failed checks: {' '.join(bad)}" if bad else "") +
      (f"; same-run GEMM {peak / 1e3:.0f} TFLOP/s" if peak else ""))
PY
)
  record "bench ops" "${note%%$'\t'*}" $(( $(date +%s) - s )) "${note#*$'\t'}"

  # --- Training: the same steps on the CPU and on the GPU, both offloads on NVMe --------------
  # train_run NAME DEVICE CAP CONFIG SEQ STEPS [MODEL]: sets TRAIN_RC and TRAIN_SECS.
  train_run() {
    local name=$1 device=$2 cap=$3 config=$4 seq=$5 steps=$6 model=${7:-gpt2-124m} rc=0 s
    local nvme_args=()
    s=$(date +%s)
    say "train $name: $model on $device, $config, seq $seq, $steps steps, NVMe at $NVME"
    rm -rf "${NVME:?}/$name"; mkdir -p "$NVME/$name"
    grep -q '"nvme"' "configs/train/$config" && nvme_args=(--nvme-path "$NVME/$name")
    TZ_DEVICE=$device timeout "$(budget "$cap")" "$TZ" train --config "configs/train/$config" \
      --model "$model" --seq "$seq" --steps "$steps" --seed 1234 "${nvme_args[@]}" \
      --metrics "$WORK/train-$name.jsonl" --json >"$WORK/train-$name.json" 2>"$WORK/train-$name.err" ||
      rc=$?
    rm -rf "${NVME:?}/$name"
    [ "$rc" -eq 0 ] || tail -5 "$WORK/train-$name.err"
    TRAIN_RC=$rc
    TRAIN_SECS=$(( $(date +%s) - s ))
  }
  # compare_losses CPU_NAME GPU_NAME STEPS: "pass|fail<TAB>details" for the two runs' losses.
  compare_losses() {
    python3 - "$WORK" "$1" "$2" "$3" <<'PY'
import json, sys, pathlib
w, cpu_name, gpu_name, steps = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
def losses(name):
    p = w / f"train-{name}.jsonl"
    return [json.loads(l)["loss"] for l in p.read_text().splitlines() if l.startswith("{")] if p.exists() else []
def rc(name):
    p = w / f"train-{name}.rc"
    return int(p.read_text()) if p.exists() else -1
cpu, gpu = losses(cpu_name), losses(gpu_name)
rc_cpu, rc_gpu = rc(cpu_name), rc(gpu_name)
if rc_cpu or rc_gpu or len(cpu) != steps or len(gpu) != steps:
    err = (w / f"train-{gpu_name}.err").read_text().strip().splitlines()[-1:] if rc_gpu else []
    print(f"fail\texit cpu {rc_cpu} gpu {rc_gpu}, steps cpu {len(cpu)} gpu {len(gpu)} {' '.join(err)}")
    sys.exit()
rel = [abs(g - c) / abs(c) for c, g in zip(cpu, gpu)]
ok = max(rel) <= 1e-3
print(("pass" if ok else "fail") + "\tlosses cpu " + " ".join(f"{x:.5f}" for x in cpu) +
      " | gpu " + " ".join(f"{x:.5f}" for x in gpu) + f" | max rel diff {max(rel):.1e} (limit 1e-3)")
PY
  }
  train_run cpu host 30 gpu_check_nvme_fp32.json 256 3
  echo "$TRAIN_RC" > "$WORK/train-cpu.rc"; secs_cpu=$TRAIN_SECS
  train_run gpu cuda 20 gpu_check_nvme_fp32.json 256 3
  echo "$TRAIN_RC" > "$WORK/train-gpu.rc"; secs_gpu=$TRAIN_SECS
  note=$(compare_losses cpu gpu 3)
  record "train cpu vs gpu" "${note%%$'\t'*}" $(( secs_cpu + secs_gpu )) "${note#*$'\t'}"

  train_run speed cuda 25 gpu_check_nvme_bf16.json 1024 6
  rc_speed=$TRAIN_RC secs_speed=$TRAIN_SECS
  note=$(python3 - "$WORK/train-speed.json" "$rc_speed" <<'PY'
import json, sys
rc = int(sys.argv[2])
try:
    j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
except Exception:
    print(f"fail\texit {rc}, no summary"); sys.exit()
L, d, T = 12, 768, 1024  # gpt2-124m
flop_per_token = 6 * j["params"] + 12 * L * T * d
tflops = j["tokens_per_s"] * flop_per_token / 1e12
ok = rc == 0 and j["steps"] == 6
print(("pass" if ok else "fail") + f"\t{j['tokens_per_s']:.0f} tokens/s, {tflops:.1f} model TFLOP/s, "
      f"median step {j['step_s_median']:.3f} s (bound {j['bound_s']:.3f} s), final loss {j['final_loss']:.4f}")
PY
)
  record "train speed" "${note%%$'\t'*}" "$secs_speed" "${note#*$'\t'}"

  # --- llama-3.2-1b: the GPU at stage 3 with both offloads on NVMe against the CPU at stage 0 ---
  train_run llama-cpu host 80 gpu_check_stage0_fp32.json 64 2 llama-3.2-1b
  echo "$TRAIN_RC" > "$WORK/train-llama-cpu.rc"; secs_lcpu=$TRAIN_SECS
  train_run llama-gpu cuda 120 gpu_check_nvme_fp32.json 64 2 llama-3.2-1b
  echo "$TRAIN_RC" > "$WORK/train-llama-gpu.rc"; secs_lgpu=$TRAIN_SECS
  note=$(compare_losses llama-cpu llama-gpu 2)
  speed=$(python3 - "$WORK/train-llama-gpu.json" <<'PY'
import json, sys
try:
    j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
except Exception:
    sys.exit()
L, d, T = 16, 2048, 64  # llama-3.2-1b, seq 64
tflops = j["tokens_per_s"] * (6 * j["params"] + 12 * L * T * d) / 1e12
print(f" | gpu {j['tokens_per_s']:.0f} tokens/s, {tflops:.2f} model TFLOP/s, median step "
      f"{j['step_s_median']:.2f} s (bound {j['bound_s']:.2f} s)")
PY
)
  record "llama-3.2-1b cpu vs gpu" "${note%%$'\t'*}" $(( secs_lcpu + secs_lgpu )) "${note#*$'\t'}$speed"
fi

# --- Summary ----------------------------------------------------------------------------------
say "summary"
cp "$CARRIED/MANIFEST.txt" "$WORK/" 2>/dev/null
python3 - "$STEPS" "$RESULTS" "$(elapsed)" "$DEADLINE_S" <<'PY'
import json, sys
steps_path, results, secs, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [l.rstrip("\n").split("\t") for l in open(steps_path) if l.strip()]
expected = ["payload", "gpu tests", "ops tests", "bench copy", "bench ops", "train cpu vs gpu",
            "train speed", "llama-3.2-1b cpu vs gpu"]
have = {r[0] for r in rows}
for name in expected:  # a check that never ran is a failure, never a silent gap
    if name not in have:
        rows.append([name, "fail", "0", "not run (an earlier check failed)"])
ok = all(r[1] == "pass" for r in rows)
w = max(len(r[0]) for r in rows)
lines = [f"{'check':{w}}  {'result':7}  {'s':>4}  details"]
lines += [f"{r[0]:{w}}  {r[1].upper():7}  {r[2]:>4}  {r[3]}" for r in rows]
lines.append(f"verdict: {'PASS' if ok else 'FAIL'} ({secs} s of {deadline} s)")
text = "\n".join(lines)
print(text)
open(f"{results}/summary.txt", "w").write(text + "\n")
json.dump({"pass": ok, "seconds": secs,
           "checks": [{"check": r[0], "result": r[1], "seconds": int(r[2]), "details": r[3]} for r in rows]},
          open(f"{results}/summary.json", "w"), indent=1)
PY
verdict=$?
tar -C "$WORK" -czf "$RESULTS/logs.tar.gz" . 2>/dev/null
rm -rf "$WORK" "$PAYLOAD"
echo "results in $RESULTS (summary.txt, summary.json, logs.tar.gz)"
grep -q "^verdict: PASS" "$RESULTS/summary.txt" && [ "$verdict" -eq 0 ]
