#!/usr/bin/env bash
# The Llama family against transformers (issue 25), for correctness (no timing): transformers writes
# three tiny random folders (save_pretrained):
#   llama  LlamaForCausalLM, GQA (4 heads over 2), untied head, llama3 rope scaling
#   qwen2  Qwen2ForCausalLM, q/k/v biases, tied head
#   qwen3  Qwen3ForCausalLM, q/k norms, head_dim 24 != 64 / 4, tied head
# and for each:
#   1. `tierzero train --model DIR` and PyTorch (the same model class, torch.optim.AdamW,
#      clip_grad_norm_) take K steps of fp32 AdamW with clipping from the folder's weights on the
#      same seeded token file in llm.c's batch order: every step's loss within 1e-4 relative;
#   2. the folder tierzero saved (--save-weights DIR) loads with AutoModelForCausalLM and gives
#      tierzero's loss of an unseen batch (`tierzero bench model --model DIR --ids`) within 1e-5;
#   3. greedy decoding of 24 tokens by `tierzero sample --model DIR` (KV cache) equals
#      transformers' greedy loop on the same folder;
#   4. stage 3 with parameters and optimizer states on NVMe gives stage 0's params_xxh3.
# --phases speed (not in the default): forward+backward tokens/s of the Llama shape of issue 25
# (12 layers, hidden 768, 12 heads, 4 KV heads, ffn 2048, vocab 32000, seq 256, batch 4, fp32,
# 2 threads), `tierzero bench model` and PyTorch's LlamaForCausalLM alternated for --rounds
# rounds, and `tierzero sample` tokens/s with and without the KV cache (run on a quiet machine).
# torch (CPU) + transformers + safetensors in the throw-away venv of bench/peers_venv.sh (never CI).
#
# usage: bench/llama_vs_hf.sh [--build build/release] [--venv build/peers-venv] [--steps 20]
#          [--families llama,qwen2,qwen3] [--nvme-path DIR] [--phases correctness,speed]
#          [--rounds 3] [--keep-work] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/release"
venv="$root/build/peers-venv"
steps=20
families="llama,qwen2,qwen3"
nvme=""
keep_work=0
out=""
phases="correctness"
rounds=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --families) families="$2"; shift 2 ;;
    --nvme-path) nvme="$2"; shift 2 ;;
    --phases) phases="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --keep-work) keep_work=1; shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "llama_vs_hf: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start llama_vs_hf
bench_default_out llama_vs_hf

peers_venv_need "$venv" llama_vs_hf "torch, transformers, safetensors, numpy" \
  torch transformers safetensors numpy || exit 1
py="$(peers_python "$venv")"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # peer.py imports bench/hf_peer_common.py
bench_work_folder llama_vs_hf "$keep_work"
nvme="${nvme:-$work/nvme}"
mkdir -p "$nvme"
: > "$out"

B=4
T=32
bench_write_adamw_configs "$work" "$B"

cat > "$work/peer.py" <<'PY'
"""transformers' side of llama_vs_hf.sh: writes the folders and tokens, trains, evaluates, decodes."""
import json
import torch
import transformers
# cmd_ids and cmd_eval are commands of this script too (run_command finds them in globals()).
from hf_peer_common import ce, cmd_eval, cmd_ids, load, run_command, train, write_tokens

def config_of(family):
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  bos_token_id=1, eos_token_id=2, attention_dropout=0.0)
    if family == "llama":
        return transformers.LlamaConfig(**common, rms_norm_eps=1e-5, rope_theta=10000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            tie_word_embeddings=False)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                        use_sliding_window=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=24, rms_norm_eps=1e-6,
                                        tie_word_embeddings=True, use_sliding_window=False)
    raise SystemExit(f"unknown family {family}")

def cmd_init(family, folder, tokens, seed):
    torch.manual_seed(int(seed))
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "qwen3": transformers.Qwen3ForCausalLM}[family]
    cls(config_of(family)).save_pretrained(folder, safe_serialization=True)
    write_tokens(tokens, 40000, seed)

def cmd_train(folder, config, tokens, steps, B, T, out):
    def model_and_params():
        m = load(folder).train()
        return m, list(m.parameters())
    train(model_and_params, config, tokens, steps, B, T, out)

def cmd_speed(repeat):
    # Forward+backward of the issue's Llama shape, fp32, 2 threads: median seconds over `repeat`
    # after one warm-up.
    import time, statistics
    torch.set_num_threads(2)
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
        num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
        max_position_embeddings=256, tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).train()
    x = torch.randint(0, 32000, (4, 256)); y = torch.randint(0, 32000, (4, 256))
    times = []
    for r in range(int(repeat) + 1):
        t0 = time.perf_counter()
        m.zero_grad(set_to_none=True)
        ce(m, x, y).backward()
        if r > 0: times.append(time.perf_counter() - t0)
    print(json.dumps({"torch": torch.__version__, "attn_implementation": m.config._attn_implementation,
                      "fwd_bwd_s_median": statistics.median(times),
                      "tokens_per_s": 4 * 256 / statistics.median(times)}))

def cmd_greedy(folder, prompt, n):
    m = load(folder).eval()
    x = torch.tensor([[int(t) for t in prompt.split()]])
    out = []
    with torch.no_grad():
        for _ in range(int(n)):
            nxt = int(m(x).logits[0, -1].argmax())
            out.append(nxt); x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    print(json.dumps(out))

if __name__ == "__main__":
    run_command(globals())
PY

rel() { "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(abs(a - b) / abs(b))" "$1" "$2"; }
fail=0
emit() {  # emit JSON PASS
  echo "$1" | tee -a "$out"
  [[ "$2" == 1 ]] || fail=1
}
IFS=, read -r -a fams <<< "$families"
[[ ",$phases," == *,correctness,* ]] || fams=()
for fam in "${fams[@]}"; do
  d="$work/$fam"
  mkdir -p "$d"
  "$py" "$work/peer.py" init "$fam" "$d/init" "$d/tokens.bin" 20261203
  # 1. training, per-step losses.
  "$tierzero" train --config "$work/stage0.json" --model "$d/init" --data "$d/tokens.bin" \
    --steps "$steps" --seq "$T" --cpu-threads 2 --metrics "$d/tz.jsonl" --save-weights "$d/tz" \
    --json > "$d/tz_summary.json"
  "$py" "$work/peer.py" train "$d/init" "$work/stage0.json" "$d/tokens.bin" "$steps" "$B" "$T" "$d/pt.jsonl"
  verdict="$("$py" "$here/hf_peer_common.py" loss_verdict llama_vs_hf pytorch "$d/tz.jsonl" \
               "$d/pt.jsonl" "$fam")"
  emit "$verdict" "$(grep -q '"pass": true' <<< "$verdict" && echo 1 || echo 0)"
  # 2. the saved folder in transformers, on a batch neither trained on.
  "$py" "$work/peer.py" ids "$d/tokens.bin" 997 "$B" "$T" "$d/ids.json"
  tz_loss="$("$tierzero" bench model --model "$d/tz" --batch "$B" --seq "$T" --ids "$d/ids.json" --json |
             "$py" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')"
  hf_loss="$("$py" "$work/peer.py" eval "$d/tz" "$d/ids.json")"
  r="$(rel "$tz_loss" "$hf_loss")"
  ok="$("$py" -c "print(1 if float('$r') <= 1e-5 else 0)")"
  emit "{\"bench\": \"llama_vs_hf\", \"family\": \"$fam\", \"case\": \"saved_folder_in_transformers\", \"tierzero_loss\": $tz_loss, \"hf_loss\": $hf_loss, \"rel_diff\": $r, \"bound\": 1e-5, \"pass\": $([[ $ok == 1 ]] && echo true || echo false)}" "$ok"
  # 3. greedy decoding, 24 tokens.
  # The tiny models have 256 ids, so `sample` reads the prompt as bytes: transformers starts from
  # the ids tierzero reports it used (prompt_ids), not from the prompt's text.
  prompt="5 17 42 99 3 250 7 64"
  tz_json="$("$tierzero" sample --model "$d/tz" --prompt "$prompt" --tokens 24 --temperature 0 --json)"
  tz_ids="$(echo "$tz_json" | "$py" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["ids"]))')"
  prompt_ids="$(echo "$tz_json" |
                "$py" -c 'import json, sys; print(" ".join(map(str, json.load(sys.stdin)["prompt_ids"])))')"
  hf_ids="$("$py" "$work/peer.py" greedy "$d/tz" "$prompt_ids" 24)"
  ok="$([[ "$tz_ids" == "$hf_ids" ]] && echo 1 || echo 0)"
  emit "{\"bench\": \"llama_vs_hf\", \"family\": \"$fam\", \"case\": \"greedy_24\", \"tierzero\": $tz_ids, \"transformers\": $hf_ids, \"pass\": $([[ $ok == 1 ]] && echo true || echo false)}" "$ok"
  # 4. stage 3 with both offloads on NVMe against stage 0.
  h0="$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["params_xxh3"])' "$d/tz_summary.json")"
  h3="$("$tierzero" train --config "$work/stage3.json" --model "$d/init" --data "$d/tokens.bin" \
          --steps "$steps" --seq "$T" --cpu-threads 2 --nvme-path "$nvme" --json |
        "$py" -c 'import json, sys; print(json.load(sys.stdin)["params_xxh3"])')"
  ok="$([[ "$h0" == "$h3" ]] && echo 1 || echo 0)"
  emit "{\"bench\": \"llama_vs_hf\", \"family\": \"$fam\", \"case\": \"stage3_nvme_params_xxh3\", \"stage0\": \"$h0\", \"stage3\": \"$h3\", \"pass\": $([[ $ok == 1 ]] && echo true || echo false)}" "$ok"
done
if [[ ",$phases," == *,speed,* ]]; then
  shape="llama:layers=12,heads=12,kv_heads=4,embd=768,ffn=2048,vocab=32000,seq=256"
  for r in $(seq 1 "$rounds"); do
    # Alternate which side runs first.
    for side in $( ((r % 2)) && echo "tierzero pytorch" || echo "pytorch tierzero"); do
      if [[ "$side" == tierzero ]]; then
        j="$("$tierzero" bench model --model "$shape" --batch 4 --seq 256 --threads 2 --repeat 5 --checkpointing 0 --json)"
      else
        j="$("$py" "$work/peer.py" speed 5)"
      fi
      echo "{\"bench\": \"llama_vs_hf\", \"case\": \"fwd_bwd_speed\", \"round\": $r, \"side\": \"$side\", \"result\": $j}" | tee -a "$out"
    done
  done
  "$py" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"fwd_bwd_speed"' in l]
tz = statistics.median(r["result"]["tokens_per_s"] for r in rows if r["side"] == "tierzero")
pt = statistics.median(r["result"]["tokens_per_s"] for r in rows if r["side"] == "pytorch")
line = {"bench": "llama_vs_hf", "case": "fwd_bwd_speed_summary", "tierzero_tokens_per_s": tz,
        "pytorch_tokens_per_s": pt, "ratio": tz / pt, "bound": 1.0}
print(json.dumps(line)); open(sys.argv[1], "a").write(json.dumps(line) + "\n")
PY
  # Sampling with and without the KV cache (same ids), on a random folder of the same shape.
  "$tierzero" bench model --model "$shape" --batch 1 --seq 8 --repeat 1 --threads 2 --save-weights "$work/speed_model" > /dev/null
  for flag in "" --no-kv-cache; do
    j="$("$tierzero" sample --model "$work/speed_model" --prompt "1 2 3 4 5 6 7 8" --tokens 128 --temperature 0 --json $flag)"
    echo "{\"bench\": \"llama_vs_hf\", \"case\": \"sample_speed\", \"flag\": \"$flag\", \"result\": $j}" | tee -a "$out"
  done
fi
echo "llama_vs_hf: results in $out" >&2
exit "$fail"
