#!/usr/bin/env bash
# LoRA against PEFT (issue 28), for correctness (no timing): transformers writes a tiny random
# LlamaForCausalLM folder and PEFT creates an adapter on q_proj, v_proj and down_proj
# (LoraConfig r=4, lora_alpha=8, bias none, no dropout) saved with save_pretrained; then
#   1. `tierzero train --model DIR --adapter A0` and PEFT (PeftModel.from_pretrained(...,
#      is_trainable=True), torch.optim.AdamW over the trainable parameters, clip_grad_norm_) take K
#      steps of fp32 AdamW with clipping on the same seeded token file in llm.c's batch order:
#      every step's loss within 1e-4 relative;
#   2. the adapter tierzero saved (--save-weights DIR: a PEFT folder) loads with
#      PeftModel.from_pretrained(base, DIR) and gives the loss tierzero gives on an unseen batch
#      (through its --merge-into folder, which transformers loads too) within 1e-5;
#   3. stage 3 with the base (and the optimizer) on NVMe gives stage 0's adapter bits
#      (params_xxh3 covers trainable units only), and from step 2 on writes to NVMe only adapter
#      state: bytes written per step (the step report's nvme_write_bytes) against the base's size.
#      (This tiny base fits the host tier's minimum (two units plus staging), so after loading it
#      is served from memory and reads are 0 too; the 8B scale run in docs/lora.md measures the
#      streaming case.)
# torch (CPU) + transformers + peft + safetensors in the throw-away venv of bench/peers_venv.sh
# (never CI).
#
# usage: bench/lora_vs_peft.sh [--build build/release] [--venv build/peers-venv] [--steps 20]
#          [--nvme-path DIR] [--keep-work] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/release"
venv="$root/build/peers-venv"
steps=20
nvme=""
keep_work=0
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --nvme-path) nvme="$2"; shift 2 ;;
    --keep-work) keep_work=1; shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "lora_vs_peft: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start lora_vs_peft
bench_default_out lora_vs_peft

peers_venv_need "$venv" lora_vs_peft "torch, transformers, peft, safetensors, numpy" \
  torch transformers peft safetensors numpy || exit 1
py="$(peers_python "$venv")"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # peer.py imports bench/hf_peer_common.py
bench_work_folder lora_vs_peft "$keep_work"
nvme="${nvme:-$work/nvme}"
mkdir -p "$nvme"
: > "$out"

B=4
T=32
bench_write_adamw_configs "$work" "$B"

cat > "$work/peer.py" <<'PY'
"""PEFT's side of lora_vs_peft.sh: writes the base and the adapter, trains, evaluates."""
import json
import torch
import transformers, peft
# cmd_ids and cmd_eval are commands of this script too (run_command finds them in globals()).
from hf_peer_common import ce, cmd_eval, cmd_ids, load, run_command, train, write_tokens

def cmd_init(base, adapter, tokens, seed):
    torch.manual_seed(int(seed))
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, attention_dropout=0.0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(base, safe_serialization=True)
    lc = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                         lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    m = peft.get_peft_model(load(base), lc)
    # B starts at zero (PEFT's init); a few random B make the first step's A gradients non-zero,
    # so the comparison covers both factors from step 1.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    m.save_pretrained(adapter, safe_serialization=True)
    write_tokens(tokens, 40000, seed)
    print(json.dumps(sorted(k for k in __import__("safetensors.torch").torch.load_file(
        adapter + "/adapter_model.safetensors"))[:2]))

def cmd_train(base, adapter, config, tokens, steps, B, T, out):
    def model_and_params():
        m = peft.PeftModel.from_pretrained(load(base), adapter, is_trainable=True).train()
        return m, [p for p in m.parameters() if p.requires_grad]
    train(model_and_params, config, tokens, steps, B, T, out)

def cmd_eval_adapter(base, adapter, ids_file):
    ids = json.load(open(ids_file))
    m = peft.PeftModel.from_pretrained(load(base), adapter).eval()
    with torch.no_grad():
        print(ce(m, torch.tensor(ids["tokens"]), torch.tensor(ids["targets"])).item())

if __name__ == "__main__":
    run_command(globals())
PY

rel() { "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(abs(a - b) / abs(b))" "$1" "$2"; }
fail=0
emit() {  # emit JSON PASS
  echo "$1" | tee -a "$out"
  [[ "$2" == 1 ]] || fail=1
}
passed() { [[ "$1" == 1 ]] && echo true || echo false; }

"$py" "$work/peer.py" init "$work/base" "$work/adapter0" "$work/tokens.bin" 20261203 > "$work/names.json"
# 1. training, per-step losses.
"$tierzero" train --config "$work/stage0.json" --model "$work/base" --adapter "$work/adapter0" \
  --data "$work/tokens.bin" --steps "$steps" --seq "$T" --cpu-threads 2 --metrics "$work/tz.jsonl" \
  --save-weights "$work/tz_adapter" --merge-into "$work/tz_merged" --json > "$work/tz_summary.json"
"$py" "$work/peer.py" train "$work/base" "$work/adapter0" "$work/stage0.json" "$work/tokens.bin" \
  "$steps" "$B" "$T" "$work/pt.jsonl"
verdict="$("$py" "$here/hf_peer_common.py" loss_verdict lora_vs_peft peft "$work/tz.jsonl" \
             "$work/pt.jsonl")"
emit "$verdict" "$(grep -q '"pass": true' <<< "$verdict" && echo 1 || echo 0)"

# 2. tierzero's adapter in PEFT, and its merged folder in transformers, on an unseen batch.
"$py" "$work/peer.py" ids "$work/tokens.bin" 997 "$B" "$T" "$work/ids.json"
tz_loss="$("$tierzero" bench model --model "$work/tz_merged" --batch "$B" --seq "$T" --ids "$work/ids.json" --json |
           "$py" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')"
peft_loss="$("$py" "$work/peer.py" eval_adapter "$work/base" "$work/tz_adapter" "$work/ids.json")"
hf_loss="$("$py" "$work/peer.py" eval "$work/tz_merged" "$work/ids.json")"
r="$(rel "$tz_loss" "$peft_loss")"
r2="$(rel "$hf_loss" "$peft_loss")"
ok="$("$py" -c "print(1 if float('$r') <= 1e-5 and float('$r2') <= 1e-5 else 0)")"
emit "{\"bench\": \"lora_vs_peft\", \"case\": \"saved_adapter_in_peft\", \"tierzero_loss\": $tz_loss, \"peft_loss\": $peft_loss, \"merged_in_transformers_loss\": $hf_loss, \"rel_diff\": $r, \"merged_rel_diff\": $r2, \"bound\": 1e-5, \"pass\": $(passed "$ok")}" "$ok"

# 3. stage 3 with the base and the optimizer on NVMe against stage 0; NVMe writes per step.
h0="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["params_xxh3"])' "$work/tz_summary.json")"
"$tierzero" train --config "$work/stage3.json" --model "$work/base" --adapter "$work/adapter0" \
  --data "$work/tokens.bin" --steps "$steps" --seq "$T" --cpu-threads 2 --nvme-path "$nvme" \
  --metrics "$work/tz3.jsonl" --json > "$work/tz3_summary.json"
verdict="$("$py" - "$work/tz3_summary.json" "$work/tz3.jsonl" "$h0" "$work/tz_adapter/adapter_model.safetensors" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
base_params = s["params"]
adapter_bytes = os.path.getsize(sys.argv[4])  # fp32 adapters: 4 bytes per adapter parameter
writes = [r.get("nvme_write_bytes", 0) for r in rows]
reads = [r.get("nvme_read_bytes", 0) for r in rows]
# From step 2 on only adapter state may be written: its 16-bit (or fp32) parameters, fp32 master,
# m and v are at most 16 bytes per adapter parameter, i.e. 4x the fp32 adapter file.
bound = 4 * adapter_bytes
later = writes[1:]
ok = s["params_xxh3"] == sys.argv[3] and all(w <= bound for w in later)
print(json.dumps({"bench": "lora_vs_peft", "case": "stage3_nvme", "stage0_xxh3": sys.argv[3],
                  "stage3_xxh3": s["params_xxh3"], "params": base_params,
                  "base_fp32_bytes": 4 * base_params, "adapter_fp32_bytes": adapter_bytes,
                  "nvme_write_bytes_per_step": writes, "nvme_read_bytes_per_step": reads,
                  "write_bound_from_step_2": bound,
                  "max_write_from_step_2_over_base": max(later) / (4 * base_params) if later else 0,
                  "pass": ok}))
PY
)"
emit "$verdict" "$(grep -q '"pass": true' <<< "$verdict" && echo 1 || echo 0)"
echo "lora_vs_peft: results in $out" >&2
exit "$fail"
