#!/usr/bin/env bash
# tierzero train against PyTorch in one run (issues 12 and 13):
#  1. training: from the same initial weights (written by transformers: GPT2LMHeadModel with a
#     seeded init, save_pretrained to safetensors) and the same llm.c token file (the KJV text of
#     Debian's bible-kjv, byte-level), K steps of fp32 AdamW with gradient clipping in PyTorch
#     (GPT2LMHeadModel on the CPU, torch.optim.AdamW, clip_grad_norm_) and in `tierzero train`
#     (stage 0, no offload). Both read the hyperparameters from the one DeepSpeed config file
#     this script writes, and the batches in llm.c's order. Checks: every step's loss within 1e-4
#     relative; the final weights within the stated tolerance (max abs and rel diff printed); the
#     weights tierzero saved (--save-weights) load in transformers and give tierzero's loss on an
#     unseen batch within 1e-5 relative (and PyTorch's trained model's within 1e-4).
#     Each round runs both, alternating which goes first; tokens/s of each (median step time over
#     steps 2..K of each run, medians over rounds) on GPT-2-small's shape (12 layers, 12 heads,
#     embd 768; vocab 256, seq 256, batch 4) with 2 threads.
#  2. checkpoint export: a short run with --save-dir, `tierzero ckpt export` to fp32 and bf16,
#     each loaded by GPT2LMHeadModel.from_pretrained (the export's config.json beside it); HF's
#     logits equal tierzero's forward of the same file within 1e-5 relative, the fp32 export is
#     bit-identical to --save-weights of the same run, the bf16 export is the fp32 one rounded.
# torch (CPU) + transformers + safetensors live in a throw-away venv under build/ (never in CI;
# bench/peers_venv.sh creates it when missing).
#
# usage: bench/train_vs_pytorch.sh [--build build/peers] [--venv build/peers-venv] [--threads 2]
#          [--steps 20] [--rounds 3] [--model gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256]
#          [--text FILE] [--phases train,export] [--first tierzero|pytorch] [--keep-work] [--out FILE]
# --first: which side runs first in round 1 (then they alternate). One round of GPT-2-small's shape
# takes about 10 minutes on an idle 2-core machine, 20+ on a loaded one.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/peers"
venv="$root/build/peers-venv"
threads=2
steps=20
rounds=3
model="gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256"
text=""
phases="train,export"
first=tierzero
keep_work=0
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --text) text="$2"; shift 2 ;;
    --phases) phases="$2"; shift 2 ;;
    --first) first="$2"; shift 2 ;;
    --keep-work) keep_work=1; shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "train_vs_pytorch: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$first" == tierzero || "$first" == pytorch ]] || { echo "train_vs_pytorch: --first must be tierzero or pytorch" >&2; exit 2; }
if [[ "${CI:-}" == "true" ]]; then
  echo "train_vs_pytorch: peers are never run in CI" >&2
  exit 0
fi
[[ "$model" == gpt2:* ]] || { echo "train_vs_pytorch: --model must be a gpt2:layers=..,heads=..,embd=..,vocab=256,seq=.. shape" >&2; exit 2; }
[[ "$model" == *vocab=256* ]] || { echo "train_vs_pytorch: --model needs vocab=256 (the corpus is byte-level)" >&2; exit 2; }
tierzero="$build/src/cli/tierzero"
[[ -x "$tierzero" ]] || { echo "train_vs_pytorch: $tierzero not built (cmake --build $build --target tierzero)" >&2; exit 1; }
out="${out:-$build/train_vs_pytorch.$(date -u +%Y%m%dT%H%M%SZ).jsonl}"

# shellcheck source=bench/peers_venv.sh
source "$here/peers_venv.sh"
peers_venv_need "$venv" train_vs_pytorch "torch, transformers, safetensors, numpy" \
  torch transformers safetensors numpy || exit 1
py="$(peers_python "$venv")"
# Both sides get the same cores: torch.set_num_threads in the peer, --cpu-threads and the
# optimizer's threads in tierzero, and the BLAS/OpenMP pools of either through these.
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$build"
work="$(mktemp -d "$build/train_vs_pytorch.XXXXXX")"
if [[ "$keep_work" == 1 ]]; then echo "train_vs_pytorch: work folder $work (kept)" >&2; else trap 'rm -rf "$work"' EXIT; fi
: > "$out"

# --- the corpus: KJV as byte-level llm.c tokens -------------------------------------------------
if [[ -z "$text" ]]; then
  command -v bible > /dev/null 2>&1 ||
    { echo "train_vs_pytorch: the bible program is missing (Debian package bible-kjv; scripts/setup.sh installs it), or give --text FILE" >&2; exit 1; }
  text="$work/kjv.txt"
  bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$text"
fi
"$tierzero" data tokenize --text "$text" --out "$work/tokens.bin" > /dev/null

# --- the peer: one Python program, subcommands init / train / eval / compare / export ----------
cat > "$work/peer.py" <<'PY'
"""PyTorch/transformers side of train_vs_pytorch.sh: writes the initial weights, trains as the
DeepSpeed config says, and compares results with tierzero's files."""
import json, statistics, sys, time
import numpy as np, torch
from safetensors.torch import load_file as load_torch
from transformers import GPT2Config, GPT2LMHeadModel

def load_file(path):
    # Every tensor as float32 numpy (bf16 widens exactly; numpy has no bf16).
    return {k: v.float().numpy() for k, v in load_torch(path).items()}

def shape_of(name):
    kv = dict(p.split("=") for p in name.split(":", 1)[1].split(","))
    return {k: int(v) for k, v in kv.items()}

def hf_config(s):
    # No dropout anywhere: tierzero's GPT-2 has none, and the comparison must be deterministic.
    return GPT2Config(n_layer=s["layers"], n_head=s["heads"], n_embd=s["embd"], vocab_size=s["vocab"],
                      n_positions=s["seq"], bos_token_id=s["vocab"] - 1, eos_token_id=s["vocab"] - 1,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

def load_tokens(path):
    # llm.c's format, read independently of tierzero: 256 int32 header, then uint16 tokens.
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[0] == 20240520 and header[1] == 1, f"{path}: not an llm.c token file v1"
    toks = np.fromfile(path, dtype="<u2", offset=256 * 4, count=int(header[2]))
    assert toks.size == header[2], f"{path}: fewer tokens than the header says"
    return toks.astype(np.int64)

def batch(toks, b, B, T):
    # llm.c's order on one rank: micro-batch b holds sequences b*B .. b*B+B-1 of the corpus cut
    # into T-token sequences (targets shifted by one), starting over when a full batch no longer fits.
    rounds = ((toks.size - 1) // T) // B
    first = (b % rounds) * B
    x = np.stack([toks[(first + r) * T:(first + r) * T + T] for r in range(B)])
    y = np.stack([toks[(first + r) * T + 1:(first + r) * T + T + 1] for r in range(B)])
    return torch.from_numpy(x), torch.from_numpy(y)

def mean_ce(model, x, y):
    logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), logits

def strip(name):
    return name[len("transformer."):] if name.startswith("transformer.") else name

def cmd_init(work, model, seed):
    torch.manual_seed(int(seed))
    m = GPT2LMHeadModel(hf_config(shape_of(model)))
    m.save_pretrained(f"{work}/init", safe_serialization=True)

def cmd_train(work, model, config, tokens, steps, threads, tag):
    torch.set_num_threads(int(threads))
    s, cfg = shape_of(model), json.load(open(config))
    o = cfg["optimizer"]["params"]
    B, T, steps = cfg["train_micro_batch_size_per_gpu"], s["seq"], int(steps)
    assert cfg.get("gradient_accumulation_steps", 1) == 1 and cfg["optimizer"]["type"] == "AdamW"
    m = GPT2LMHeadModel.from_pretrained(f"{work}/init", dtype=torch.float32).train()
    # tierzero's AdamW decays every parameter (biases, LayerNorm and embeddings too): one group.
    opt = torch.optim.AdamW(m.parameters(), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                            weight_decay=o["weight_decay"])
    toks = load_tokens(tokens)
    rows = []
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = batch(toks, step, B, T)
        opt.zero_grad(set_to_none=True)
        loss, _ = mean_ce(m, x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), cfg["gradient_clipping"])
        opt.step()
        rows.append({"step": step + 1, "loss": loss.item(), "grad_norm": norm.item(),
                     "step_s": time.perf_counter() - t0})
    with open(f"{work}/pt_{tag}.jsonl", "w") as f:
        for r in rows: f.write(json.dumps(r) + "\n")
    m.save_pretrained(f"{work}/pt_{tag}", safe_serialization=True)
    times = [r["step_s"] for r in rows[1:]] or [rows[0]["step_s"]]
    print(json.dumps({"bench": "train_vs_pytorch", "case": "pytorch_train", "tag": tag,
                      "torch": torch.__version__, "attn_implementation": m.config._attn_implementation,
                      "threads": int(threads), "steps": steps,
                      "final_loss": rows[-1]["loss"], "step_s_median": statistics.median(times),
                      "tokens_per_s": B * T / statistics.median(times)}))

def cmd_ids(work, model, config, tokens, b, out):
    s, cfg = shape_of(model), json.load(open(config))
    x, y = batch(load_tokens(tokens), int(b), cfg["train_micro_batch_size_per_gpu"], s["seq"])
    json.dump({"tokens": x.tolist(), "targets": y.tolist()}, open(out, "w"))

def hf_eval(model_dir, ids):
    m = GPT2LMHeadModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    x, y = torch.tensor(ids["tokens"]), torch.tensor(ids["targets"])
    with torch.no_grad():
        loss, logits = mean_ce(m, x, y)
    return loss.item(), logits.double().numpy()

def rel(a, b):
    return abs(a - b) / abs(b)

def emit(f, r):
    r["pass"] = bool(r["pass"])
    print(json.dumps(r)); f.write(json.dumps(r) + "\n")
    return r["pass"]

def cmd_compare(work, out, tag, tz_metrics, tz_eval, ids_file, weights_tol):
    weights_tol = float(weights_tol)
    """Losses per step, final weights, and tierzero's saved weights in transformers."""
    ok = True
    pt = [json.loads(l) for l in open(f"{work}/pt_{tag}.jsonl")]
    tz = [json.loads(l) for l in open(tz_metrics)]
    with open(out, "a") as f:
        diffs = [rel(t["loss"], p["loss"]) for t, p in zip(tz, pt)]
        worst = int(np.argmax(diffs))
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "loss_per_step", "tag": tag, "steps": len(pt),
                       "steps_tierzero": len(tz), "max_rel_diff": max(diffs), "at_step": worst + 1,
                       "tierzero_losses": [t["loss"] for t in tz], "pytorch_losses": [p["loss"] for p in pt],
                       "grad_norm_max_rel_diff": max(rel(t["grad_norm"], p["grad_norm"]) for t, p in zip(tz, pt)),
                       "bound": 1e-4, "pass": len(tz) == len(pt) and max(diffs) <= 1e-4})
        init = {strip(k): v for k, v in load_file(f"{work}/init/model.safetensors").items()}
        a = {strip(k): v for k, v in load_file(f"{work}/tz_{tag}/model.safetensors").items()}
        b = {strip(k): v for k, v in load_file(f"{work}/pt_{tag}/model.safetensors").items()}
        a.pop("lm_head.weight", None); b.pop("lm_head.weight", None); init.pop("lm_head.weight", None)
        per = []
        for k in sorted(b):
            d = np.abs(a[k].astype(np.float64) - b[k])
            moved = np.abs(b[k].astype(np.float64) - init[k]).max()
            per.append((float(d.max()), float(d.max() / np.abs(b[k]).max()), float(d.max() / max(moved, 1e-30)), k))
        abs_worst, rel_worst, upd_worst = max(per), max(per, key=lambda p: p[1]), max(per, key=lambda p: p[2])
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "final_weights", "tag": tag,
                       "tensors": len(b), "same_names": sorted(a) == sorted(b),
                       "max_abs_diff": abs_worst[0], "max_abs_diff_tensor": abs_worst[3],
                       "max_rel_diff_over_tensor_max": rel_worst[1], "max_rel_diff_tensor": rel_worst[3],
                       "max_abs_diff_over_update": upd_worst[2], "max_abs_diff_over_update_tensor": upd_worst[3],
                       "bound_abs": weights_tol, "pass": sorted(a) == sorted(b) and abs_worst[0] <= weights_tol})
        ids = json.load(open(ids_file))
        hf_tz, _ = hf_eval(f"{work}/tz_{tag}", ids)
        hf_pt, _ = hf_eval(f"{work}/pt_{tag}", ids)
        tz_loss = json.load(open(tz_eval))["loss"]
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "tierzero_weights_in_hf", "tag": tag,
                       "hf_loss_of_tierzero_weights": hf_tz, "tierzero_loss": tz_loss,
                       "rel_diff": rel(tz_loss, hf_tz), "hf_loss_of_pytorch_weights": hf_pt,
                       "rel_diff_vs_pytorch_trained": rel(hf_tz, hf_pt), "bound": 1e-5, "bound_vs_pytorch": 1e-4,
                       "pass": rel(tz_loss, hf_tz) <= 1e-5 and rel(hf_tz, hf_pt) <= 1e-4})
    sys.exit(0 if ok else 1)

def cmd_export(work, out, ids_file):
    """The exported checkpoint (fp32 and bf16) in transformers against tierzero's forward."""
    ok = True
    ids = json.load(open(ids_file))
    saved = load_file(f"{work}/exp_saved/model.safetensors")
    with open(out, "a") as f:
        for dt in ["fp32", "bf16"]:
            d = f"{work}/exp_{dt}"
            cfg = json.load(open(f"{d}/config.json"))
            hf_loss, hf_logits = hf_eval(d, ids)
            tz = json.load(open(f"{d}/tz.json"))
            tz_logits = np.fromfile(f"{d}/tz_logits.bin", dtype=np.float32).reshape(hf_logits.shape)
            logits_rel = float(np.abs(tz_logits - hf_logits).max() / np.abs(hf_logits).max())
            # The export against the run's own --save-weights: fp32 bit for bit, bf16 the rounding.
            exp = load_file(f"{d}/model.safetensors")
            names_ok = sorted(map(strip, exp)) == sorted(map(strip, saved))
            e = {strip(k): v for k, v in exp.items()}
            s = {strip(k): v for k, v in saved.items()}
            if dt == "fp32":
                weights_ok = names_ok and all(np.array_equal(e[k], s[k]) for k in s)
                weights = {"bit_identical_to_save_weights": weights_ok}
            else:
                # bf16 = the top 16 bits of fp32 rounded to nearest even; compare as fp32 values.
                worst = max(float((np.abs(e[k] - s[k]) / np.maximum(np.abs(s[k]), 1e-30)).max())
                            for k in s) if names_ok else 1.0
                weights_ok = names_ok and worst <= 2.0 ** -8
                weights = {"max_rel_diff_to_fp32": worst, "bound_rel": 2.0 ** -8}
            passed = weights_ok and logits_rel <= 1e-5 and rel(tz["loss"], hf_loss) <= 1e-5
            ok &= emit(f, {"bench": "train_vs_pytorch", "case": "ckpt_export_in_hf", "dtype": dt,
                           "config_torch_dtype": cfg.get("torch_dtype", cfg.get("dtype")),
                           "hf_loss": hf_loss, "tierzero_loss": tz["loss"], "loss_rel_diff": rel(tz["loss"], hf_loss),
                           "logits_max_abs_diff_over_max_abs": logits_rel, "bound": 1e-5, **weights,
                           "pass": passed})
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"init": cmd_init, "train": cmd_train, "ids": cmd_ids, "compare": cmd_compare,
     "export": cmd_export}[cmd](*args)
PY

# The one config both sides train with: fp32 (no bf16/fp16 section), stage 0, no offload, AdamW
# with decoupled decay on every parameter, global-norm clipping, constant lr, one micro-batch.
config="$work/fp32_adamw_clip.json"
cat > "$config" <<JSON
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": {"stage": 0},
  "tierzero": {"optimizer_threads": $threads}
}
JSON
echo "# train_vs_pytorch model=$model steps=$steps rounds=$rounds threads=$threads $(date -u)" >&2
echo "# load: $(uptime)" >&2
"$tierzero" info 2>/dev/null | grep -E '^(cpu\.|build\.|version)' | head -8 >&2 || true
status=0

# --- 1: training, loss per step, final weights, saved weights in transformers, tokens/s ---------
# Final weights: fp32 runs that differ only in reduction order (BLAS blocking, summation trees)
# drift apart through Adam's normalised updates; 1e-4 absolute is under 2% of the largest
# parameter change over 20 steps at lr 6e-4 (up to 1.2e-2) and far above rounding of a single step.
weights_tol=1e-4
if [[ ",$phases," == *,train,* ]]; then
  "$py" "$work/peer.py" init "$work" "$model" 1234
  "$py" "$work/peer.py" ids "$work" "$model" "$config" "$work/tokens.bin" "$steps" "$work/eval_ids.json"
  run_tz() {
    mkdir -p "$work/tz_$1"
    "$tierzero" train --config "$config" --model "$model" --data "$work/tokens.bin" \
      --init "$work/init/model.safetensors" --steps "$steps" --cpu-threads "$threads" \
      --metrics "$work/tz_$1.jsonl" --save-weights "$work/tz_$1/model.safetensors" --json \
      > "$work/tz_$1.json" 2> "$work/tz_$1.log" ||
      { echo "train_vs_pytorch: tierzero train failed (round $1):" >&2; tail -5 "$work/tz_$1.log" >&2; return 1; }
    "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); print(json.dumps({"bench": "train_vs_pytorch", "case": "tierzero_train", "tag": sys.argv[2], "steps": s["steps"], "final_loss": s["final_loss"], "step_s_median": s["step_s_median"], "tokens_per_s": s["tokens_per_s"]}))' \
      "$work/tz_$1.json" "$1" | tee -a "$out"
  }
  run_pt() { "$py" "$work/peer.py" train "$work" "$model" "$config" "$work/tokens.bin" "$steps" "$threads" "$1" | tee -a "$out"; }
  tz_first_parity=1
  [[ "$first" == tierzero ]] || tz_first_parity=0
  for ((r = 1; r <= rounds; ++r)); do
    # tierzero goes first in odd rounds when --first tierzero, in even rounds otherwise.
    if (((r % 2) == tz_first_parity)); then run_tz "$r"; run_pt "$r"; else run_pt "$r"; run_tz "$r"; fi
    "$tierzero" bench model --model "$model" --weights "$work/tz_$r/model.safetensors" \
      --ids "$work/eval_ids.json" --threads "$threads" --json > "$work/tz_eval_$r.json"
    "$py" "$work/peer.py" compare "$work" "$out" "$r" "$work/tz_$r.jsonl" "$work/tz_eval_$r.json" \
      "$work/eval_ids.json" "$weights_tol" || status=1
    [[ "$keep_work" == 1 ]] || rm -rf "$work/tz_$r" "$work/pt_$r"
    echo "round $r/$rounds done ($(uptime | sed 's/.*load/load/'))" >&2
  done
  "$py" - "$out" "$model" "$threads" <<'PY' | tee -a "$out"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
tz = [r["step_s_median"] for r in rows if r.get("case") == "tierzero_train"]
pt = [r["step_s_median"] for r in rows if r.get("case") == "pytorch_train"]
t, p = statistics.median(tz), statistics.median(pt)
tokens = 4 * int(dict(kv.split("=") for kv in sys.argv[2].split(":", 1)[1].split(","))["seq"])
print(json.dumps({"bench": "train_vs_pytorch", "case": "train_summary", "model": sys.argv[2], "batch": 4,
                  "threads": int(sys.argv[3]), "tierzero_step_s": t, "pytorch_step_s": p,
                  "tierzero_tokens_per_s": tokens / t, "pytorch_tokens_per_s": tokens / p,
                  "speed_vs_pytorch": p / t, "rounds_tierzero_step_s": tz, "rounds_pytorch_step_s": pt}))
PY
fi

# --- 2: checkpoint export (fp32, bf16) in transformers against tierzero's forward ----------------
if [[ ",$phases," == *,export,* ]]; then
  small="gpt2:layers=2,heads=4,embd=128,vocab=256,seq=64"
  mkdir -p "$work/exp_saved" "$work/exp_fp32" "$work/exp_bf16"
  "$tierzero" train --config "$config" --model "$small" --data "$work/tokens.bin" --steps 3 --seed 3 \
    --cpu-threads "$threads" --save-dir "$work/ckpt" --save-weights "$work/exp_saved/model.safetensors" \
    > "$work/exp_train.log" 2>&1 ||
    { echo "train_vs_pytorch: the export run failed:" >&2; tail -5 "$work/exp_train.log" >&2; exit 1; }
  "$py" "$work/peer.py" ids "$work" "$small" "$config" "$work/tokens.bin" 3 "$work/exp_ids.json"
  for dt in fp32 bf16; do
    "$tierzero" ckpt export "$work/ckpt" --out "$work/exp_$dt/model.safetensors" --dtype "$dt" > /dev/null
    "$tierzero" bench model --model "$small" --weights "$work/exp_$dt/model.safetensors" \
      --ids "$work/exp_ids.json" --threads "$threads" --logits-out "$work/exp_$dt/tz_logits.bin" \
      --json > "$work/exp_$dt/tz.json"
  done
  "$py" "$work/peer.py" export "$work" "$out" "$work/exp_ids.json" || status=1
fi
echo "train_vs_pytorch: results in $out" >&2
exit "$status"
