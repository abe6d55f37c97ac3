#!/usr/bin/env bash
# tierzero's CPU AdamW against its peers in one run, alternating: PyTorch's torch.optim.AdamW on
# CPU (foreach, fused where the installed version has it, for-loop) and DeepSpeed's
# DeepSpeedCPUAdam, both the plain fp32 step and DeepSpeed's full offloaded update (step plus
# the separate 16-bit copy-back) against our fused bf16-gradient + bf16-copy pass.
#
# The peers are installed from PyPI into a throw-away virtual environment under the build folder
# (never in CI). A peer that cannot be installed or built is reported with the reason.
#
# usage: bench/adam_vs_peers.sh [--params 256M] [--threads N] [--rounds 3] [--repeat 5]
#                               [--build build/h4] [--venv build/peers-venv] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
params=256M
threads=$(nproc)
rounds=3
repeat=5
build="$root/build/h4"
venv=""
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --params) params="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "adam_vs_peers: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start adam_vs_peers
venv="${venv:-$build/../peers-venv}"
bench_default_out adam_vs_peers

# --- the peers' environment -------------------------------------------------------------------
# A missing peer is reported by adam_peers.py's check below, not fatal: run with what installs.
peers_venv_need "$venv" adam_vs_peers "torch, numpy" torch numpy ninja || true
DS_BUILD_OPS=0 peers_venv_need "$venv" adam_vs_peers "deepspeed" --no-build-isolation deepspeed || true
py="$venv/bin/python"
export DS_BUILD_OPS=0            # DeepSpeed JIT-builds CPUAdam on first use
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
export THP_MEM_ALLOC_ENABLE=1    # torch: huge pages for large tensors, as tierzero's bench uses

# Each peer runs right next to the tierzero mode it is compared with (a pair); the shared host's
# memory bandwidth drifts over minutes, so only neighbours are compared.
check="$("$py" "$here/adam_peers.py" check 2>"$out.check.log" || true)"
echo "peers: ${check:-<check failed, see $out.check.log>}" >&2
have() { [[ "$check" == *"\"$1\": {\"ok\": true"* ]]; }
pairs=()
if have torch; then
  if have torch_fused; then pairs+=("tz_fp32 torch_fused"); else
    echo "peer torch fused AdamW: NOT AVAILABLE ($(echo "$check" | sed 's/.*torch_fused//' | cut -c1-200))" >&2
  fi
  pairs+=("tz_fp32 torch_foreach" "tz_fp32 torch_forloop")
else
  echo "peer torch: NOT AVAILABLE ($check; see $out.check.log)" >&2
fi
if have deepspeed; then pairs+=("tz_fp32 ds_step" "tz_fused ds_full"); else
  echo "peer DeepSpeedCPUAdam: NOT AVAILABLE ($(echo "$check" | sed 's/.*deepspeed//' | cut -c1-300))" >&2
fi
have torch_fused && pairs+=("tz_fused torch_fused_full")

run_one() {
  case "$1" in
    tz_fp32) "$tierzero" bench adam --params "$params" --threads "$threads" --repeat "$repeat" --json ;;
    tz_fused) "$tierzero" bench adam --params "$params" --threads "$threads" --repeat "$repeat" \
                --grad-dtype bf16 --param-copy bf16 --json ;;
    *) "$py" "$here/adam_peers.py" run --peer "$1" --params "$params" --threads "$threads" \
         --repeat "$repeat" 2>> "$out.peers.log" ;;
  esac
}

# --- rounds of pairs; odd rounds run tierzero first in each pair, even rounds the peer ---------
echo "# adam_vs_peers params=$params threads=$threads rounds=$rounds repeat=$repeat $(date -u)" >&2
echo "# pairs: ${pairs[*]}" >&2
echo "# load: $(uptime)" >&2
: > "$out"
for ((r = 1; r <= rounds; ++r)); do
  for pair in "${pairs[@]}"; do
    read -r mine peer <<< "$pair"
    echo "{\"bench\": \"pair\", \"round\": $r, \"tierzero\": \"$mine\", \"peer\": \"$peer\"}" >> "$out"
    seq=("$mine" "$peer")
    ((r % 2 == 0)) && seq=("$peer" "$mine")
    for runner in "${seq[@]}"; do
      if ! run_one "$runner" >> "$out"; then
        echo "runner $runner failed in round $r (see $out.peers.log)" >&2
      fi
    done
  done
  echo "round $r/$rounds done ($(uptime | sed 's/.*load/load/'))" >&2
done
"$py" "$here/adam_peers.py" summarize "$out"
echo "results: $out" >&2
