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
if [[ "${CI:-}" == "true" ]]; then
  echo "adam_vs_peers: peers are never run in CI" >&2
  exit 0
fi
venv="${venv:-$build/../peers-venv}"
out="${out:-$build/adam_vs_peers.$(date -u +%Y%m%dT%H%M%SZ).jsonl}"
tierzero="$build/src/cli/tierzero"
[[ -x "$tierzero" ]] || { echo "adam_vs_peers: $tierzero not built (ninja -C $build tierzero)" >&2; exit 1; }

# --- the peers' environment -------------------------------------------------------------------
if [[ ! -x "$venv/bin/python" ]]; then
  echo "adam_vs_peers: creating $venv (torch + deepspeed from PyPI; several GB)" >&2
  python3 -m venv "$venv"
  if ! { "$venv/bin/pip" install -q torch numpy ninja &&
         DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation deepspeed; } \
       > "$venv.install.log" 2>&1; then
    echo "adam_vs_peers: installing the peers failed, see $venv.install.log:" >&2
    tail -5 "$venv.install.log" >&2
  fi
fi
py="$venv/bin/python"
export DS_BUILD_OPS=0            # DeepSpeed JIT-builds CPUAdam on first use
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
export THP_MEM_ALLOC_ENABLE=1    # torch: huge pages for large tensors, as tierzero's bench uses

peers=()
check="$("$py" "$here/adam_peers.py" check 2>"$out.check.log" || true)"
echo "peers: ${check:-<check failed, see $out.check.log>}" >&2
have() { [[ "$check" == *"\"$1\": {\"ok\": true"* ]]; }
if have torch; then peers+=(torch_foreach torch_forloop); else echo "peer torch: NOT AVAILABLE" >&2; fi
if have torch_fused; then peers+=(torch_fused); else echo "peer torch fused AdamW: NOT AVAILABLE" >&2; fi
if have deepspeed; then peers+=(ds_step ds_full); else echo "peer DeepSpeedCPUAdam: NOT AVAILABLE" >&2; fi

# --- alternate tierzero and the peers, round after round ---------------------------------------
echo "# adam_vs_peers params=$params threads=$threads rounds=$rounds repeat=$repeat $(date -u)" >&2
echo "# load: $(uptime)" >&2
: > "$out"
for ((r = 1; r <= rounds; ++r)); do
  "$tierzero" bench adam --params "$params" --threads "$threads" --repeat "$repeat" --json >> "$out"
  for peer in "${peers[@]}"; do
    if [[ "$peer" == ds_full ]]; then
      "$tierzero" bench adam --params "$params" --threads "$threads" --repeat "$repeat" \
        --grad-dtype bf16 --param-copy bf16 --json >> "$out"
    fi
    if ! "$py" "$here/adam_peers.py" run --peer "$peer" --params "$params" --threads "$threads" \
         --repeat "$repeat" >> "$out" 2>> "$out.peers.log"; then
      echo "peer $peer failed in round $r: $(tail -1 "$out.peers.log")" >&2
    fi
  done
  echo "round $r/$rounds done ($(uptime | sed 's/.*load/load/'))" >&2
done
"$py" "$here/adam_peers.py" summarize "$out"
echo "results: $out" >&2
