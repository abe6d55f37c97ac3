#!/usr/bin/env bash
# tierzero's GPT-2 against Hugging Face transformers in one run:
#  1. weights written by transformers (GPT2LMHeadModel.save_pretrained) for a small shape load in
#     tierzero, and tierzero's loss and logits equal HF's within 1e-5 relative;
#  2. weights written by tierzero (HF init from a seed) load with from_pretrained and HF's loss and
#     logits equal tierzero's within the same bound;
#  3. one forward+backward of GPT-2-small's shape (vocab 256, seq 256, batch 4, fp32, 2 threads)
#     timed in both, alternating, medians.
# torch (CPU) + transformers + safetensors go into a throw-away venv under build/ (never in CI).
#
# usage: bench/model_vs_hf.sh [--build build/model] [--venv build/peers-venv] [--threads 2]
#                             [--rounds 3] [--repeat 5] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/model"
venv="$root/build/peers-venv"
threads=2
rounds=3
repeat=5
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "model_vs_hf: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start model_vs_hf
bench_default_out model_vs_hf

peers_venv_need "$venv" model_vs_hf "torch, transformers, safetensors, numpy" \
  torch transformers safetensors numpy || exit 1
py="$venv/bin/python"
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
bench_work_folder model_vs_hf 0

# --- 1 and 2: weights both ways, loss and logits -------------------------------------------------
small="gpt2:layers=2,heads=4,embd=64,vocab=96,seq=32"
"$py" - "$work" <<'PY'
import json, sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
work = sys.argv[1]
torch.manual_seed(7)
cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=96, n_positions=32, bos_token_id=95, eos_token_id=95,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
m = GPT2LMHeadModel(cfg).eval()
# Larger than HF's init so the logits spread and every weight matters.
with torch.no_grad():
    for p in m.parameters():
        p.add_(torch.randn_like(p) * 0.1)
m.save_pretrained(f"{work}/hf", safe_serialization=True)
g = torch.Generator().manual_seed(11)
tokens = torch.randint(0, 96, (3, 29), generator=g)
targets = torch.randint(0, 96, (3, 29), generator=g)
json.dump({"tokens": tokens.tolist(), "targets": targets.tolist()}, open(f"{work}/ids.json", "w"))
PY
"$tierzero" bench model --model "$small" --weights "$work/hf/model.safetensors" --ids "$work/ids.json" \
  --logits-out "$work/tz_hf.bin" --json > "$work/tz_hf.json"
mkdir -p "$work/tz"
"$tierzero" bench model --model "$small" --seed 5 --save-weights "$work/tz/model.safetensors" \
  --ids "$work/ids.json" --logits-out "$work/tz_own.bin" --json > "$work/tz_own.json"
"$py" - "$work" "$out" <<'PY'
import json, sys, numpy as np, torch
from transformers import GPT2LMHeadModel
work, out = sys.argv[1], sys.argv[2]
ids = json.load(open(f"{work}/ids.json"))
tokens, targets = torch.tensor(ids["tokens"]), torch.tensor(ids["targets"])
ok = True
with open(out, "a") as f:
    for case, model_dir, tz_json, tz_bin in [("hf_weights_in_tierzero", "hf", "tz_hf.json", "tz_hf.bin"),
                                              ("tierzero_weights_in_hf", "tz", "tz_own.json", "tz_own.bin")]:
        m = GPT2LMHeadModel.from_pretrained(f"{work}/{model_dir}").eval()
        with torch.no_grad():
            logits = m(tokens).logits.double()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
        tz = json.load(open(f"{work}/{tz_json}"))
        tz_logits = np.fromfile(f"{work}/{tz_bin}", dtype=np.float32).reshape(logits.shape)
        ref = logits.numpy()
        logits_rel = float(np.abs(tz_logits - ref).max() / np.abs(ref).max())
        loss_rel = abs(tz["loss"] - loss) / abs(loss)
        passed = logits_rel <= 1e-5 and loss_rel <= 1e-5
        ok = ok and passed
        r = {"bench": "model_vs_hf", "case": case, "hf_loss": loss, "tierzero_loss": tz["loss"],
             "loss_rel_diff": loss_rel, "logits_max_abs_diff_over_max_abs": logits_rel,
             "bound": 1e-5, "pass": passed}
        print(json.dumps(r)); f.write(json.dumps(r) + "\n")
sys.exit(0 if ok else 1)
PY

# --- 3: one forward+backward of GPT-2-small's shape (vocab 256, seq 256, batch 4) -------------------
big="gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256"
cat > "$work/time_hf.py" <<'PY'
import json, statistics, sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
threads, repeat = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(1)
cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=256, n_positions=256, bos_token_id=255, eos_token_id=255,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
m = GPT2LMHeadModel(cfg).train()
x = torch.randint(0, 256, (4, 256)); y = torch.randint(0, 256, (4, 256))
times = []
for r in range(repeat + 1):
    m.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits = m(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
    loss.backward()
    t1 = time.perf_counter()
    if r > 0: times.append(t1 - t0)
print(json.dumps({"bench": "model_vs_hf", "case": "pytorch_fwd_bwd", "torch": torch.__version__,
                  "threads": threads, "fwd_bwd_s_median": statistics.median(times),
                  "fwd_bwd_s_min": min(times), "fwd_bwd_s_max": max(times), "repeat": repeat}))
PY
tz_times=(); hf_times=()
for ((r = 0; r < rounds; ++r)); do
  tz=$("$tierzero" bench model --model "$big" --batch 4 --threads "$threads" --repeat "$repeat" --checkpointing 0 --json)
  echo "$tz" | tee -a "$out"
  tz_times+=("$(echo "$tz" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["fwd_bwd_s_median"])')")
  hf=$("$py" "$work/time_hf.py" "$threads" "$repeat")
  echo "$hf" | tee -a "$out"
  hf_times+=("$(echo "$hf" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["fwd_bwd_s_median"])')")
done
# --rounds 0 checks the weights only: no timing summary.
((rounds > 0)) && "$py" - "${tz_times[*]}" "${hf_times[*]}" "$threads" <<'PY' | tee -a "$out"
import json, statistics, sys
tz = [float(x) for x in sys.argv[1].split()]; hf = [float(x) for x in sys.argv[2].split()]
t, h = statistics.median(tz), statistics.median(hf)
print(json.dumps({"bench": "model_vs_hf", "case": "fwd_bwd_summary", "shape": "gpt2-124m layers/embd, vocab 256, seq 256, batch 4, fp32",
                  "threads": int(sys.argv[3]), "tierzero_s": t, "pytorch_s": h, "speed_vs_pytorch": h / t,
                  "rounds_tierzero": tz, "rounds_pytorch": hf}))
PY
echo "model_vs_hf: results in $out" >&2
