#!/usr/bin/env bash
# tierzero train against PyTorch in one run (issues 12, 13 and 29):
#  1. training: from the same initial weights (written by transformers: GPT2LMHeadModel with a
#     seeded init, save_pretrained to safetensors) and the same llm.c token file (the KJV text of
#     Debian's bible-kjv, byte-level), K steps of fp32 AdamW with gradient clipping on three sides:
#       pytorch        GPT2LMHeadModel on the CPU, torch.optim.AdamW, clip_grad_norm_;
#       tierzero       `tierzero train`, ZeRO stage 0, no offload;
#       tierzero-nvme  `tierzero train`, ZeRO stage 3 with offload_param and offload_optimizer both
#                      on nvme (the same fp32 config but for zero_optimization, written beside the
#                      stage-0 one), swap files in a fresh folder under --nvme-dir, removed after
#                      each run. Put --nvme-dir on the disk you mean to measure.
#     All read the hyperparameters from the config files this script writes, and the batches in
#     llm.c's order. Checks: each tierzero side's every step's loss within 1e-4 relative of
#     PyTorch's; its final weights within the stated tolerance (max abs and rel diff printed); the
#     weights it saved (--save-weights) load in transformers and give tierzero's loss on an unseen
#     batch within 1e-5 relative (and PyTorch's trained model's within 1e-4); the NVMe side's
#     per-step losses and grad norms and its final weights (params_xxh3) equal stage 0's bit for
#     bit (the engine in its default overlap mode, `exact`, is bit-identical across stages and
#     placements: docs/zero.md).
#     Each round runs the sides of --sides in a rotated order (round r starts with the side after
#     round r-1's first; --first picks round 1's), recorded in the output. Figures per round and as
#     medians over rounds: tokens/s of each side (median step time over steps 2..K of each run)
#     and each tierzero side's speed against PyTorch; for the NVMe side its step against its bound
#     (`step_s`, `bound_s` of --metrics, medians over steps 2..K; `bound_term` and
#     `bandwidth_bytes_per_s` too where the binary writes them), NVMe bytes read and written per
#     step, and step/bound beside issue 29's target of 1.15. Timing is reported, never asserted:
#     only the checks set the exit status. The machine (`tierzero info`: cpu.model, the GEMM
#     library and kernel target; the --nvme-dir filesystem) and `uptime`'s load average before and
#     after every side are in the output, so every figure carries its machine and load.
#     Default shape GPT-2-small's (12 layers, 12 heads, embd 768; vocab 256, seq 256, batch 4),
#     2 threads.
#  2. checkpoint export: a short run with --save-dir, `tierzero ckpt export` to fp32 and bf16,
#     each loaded by GPT2LMHeadModel.from_pretrained (the export's config.json beside it); HF's
#     logits equal tierzero's forward of the same file within 1e-5 relative, the fp32 export is
#     bit-identical to --save-weights of the same run, the bf16 export is the fp32 one rounded.
# torch (CPU) + transformers + safetensors live in a throw-away venv under build/ (never in CI;
# bench/peers_venv.sh creates it when missing). The tierzero binary is BUILD/src/cli/tierzero.
#
# usage: bench/train_vs_pytorch.sh [--build build/peers] [--venv build/peers-venv] [--threads 2]
#          [--steps 20] [--rounds 3] [--model gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256]
#          [--sides tierzero,tierzero-nvme,pytorch] [--first SIDE] [--nvme-dir DIR]
#          [--text FILE] [--phases train,export] [--keep-work] [--out FILE]
# --sides: which sides run (comma-separated, default all three; e.g. tierzero-nvme,pytorch).
# --first: the side that runs first in round 1 (default the first of --sides).
# --nvme-dir: where the NVMe side's swap folders go (default WORK/nvme, WORK being a fresh folder
#   under --build); each run gets its own folder inside it, deleted after the run.
# One round of the three sides at GPT-2-small's shape takes about 20 s per step on an idle
# 2-core machine (stage 0 ~6 s, stage 3 on NVMe ~6-7 s, PyTorch ~5 s) plus about a minute.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"  # peer.py imports bench/hf_peer_common.py
root="$(cd "$here/.." && pwd)"
build="$root/build/peers"
venv="$root/build/peers-venv"
threads=2
steps=20
rounds=3
model="gpt2:layers=12,heads=12,embd=768,vocab=256,seq=256"
text=""
phases="train,export"
sides="tierzero,tierzero-nvme,pytorch"
first=""
nvme_dir=""
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
    --sides) sides="$2"; shift 2 ;;
    --first) first="$2"; shift 2 ;;
    --nvme-dir) nvme_dir="$2"; shift 2 ;;
    --keep-work) keep_work=1; shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,48p' "$0"; exit 0 ;;
    *) echo "train_vs_pytorch: unknown argument $1" >&2; exit 2 ;;
  esac
done
IFS=, read -ra side_list <<< "$sides"
for ((i = 0; i < ${#side_list[@]}; ++i)); do
  case "${side_list[i]}" in
    tierzero|tierzero-nvme|pytorch) ;;
    *) echo "train_vs_pytorch: --sides: unknown side '${side_list[i]}' (tierzero, tierzero-nvme, pytorch)" >&2; exit 2 ;;
  esac
  for ((j = 0; j < i; ++j)); do
    [[ "${side_list[j]}" != "${side_list[i]}" ]] || { echo "train_vs_pytorch: --sides: ${side_list[i]} twice" >&2; exit 2; }
  done
done
((${#side_list[@]} > 0)) || { echo "train_vs_pytorch: --sides is empty" >&2; exit 2; }
has_side() { [[ ",$sides," == *",$1,"* ]]; }
first="${first:-${side_list[0]}}"
first_index=-1
for ((i = 0; i < ${#side_list[@]}; ++i)); do [[ "${side_list[i]}" != "$first" ]] || first_index=$i; done
((first_index >= 0)) || { echo "train_vs_pytorch: --first $first is not one of --sides ($sides)" >&2; exit 2; }
[[ "$model" == gpt2:* ]] || { echo "train_vs_pytorch: --model must be a gpt2:layers=..,heads=..,embd=..,vocab=256,seq=.. shape" >&2; exit 2; }
[[ "$model" == *vocab=256* ]] || { echo "train_vs_pytorch: --model needs vocab=256 (the corpus is byte-level)" >&2; exit 2; }
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start train_vs_pytorch
bench_default_out train_vs_pytorch

peers_venv_need "$venv" train_vs_pytorch "torch, transformers, safetensors, numpy" \
  torch transformers safetensors numpy || exit 1
py="$(peers_python "$venv")"
# Both sides get the same cores: torch.set_num_threads in the peer, --cpu-threads and the
# optimizer's threads in tierzero, and the BLAS/OpenMP pools of either through these.
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
bench_work_folder train_vs_pytorch "$keep_work"
# The NVMe side's swap folder of the run under way: removed after the run, and here if it fails.
nvme_run=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  [[ -z "$nvme_run" ]] || rm -rf "$nvme_run"
  [[ "$keep_work" == 1 ]] || rm -rf "$work"
}
trap cleanup EXIT
nvme_dir="${nvme_dir:-$work/nvme}"
if has_side tierzero-nvme; then
  if ! mkdir -p "$nvme_dir" || [[ ! -w "$nvme_dir" ]]; then
    echo "train_vs_pytorch: --nvme-dir $nvme_dir is not a writable folder" >&2
    exit 1
  fi
  nvme_dir="$(cd "$nvme_dir" && pwd)"
fi
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
from hf_peer_common import batch  # llm.c's batch order, shared with the other HF peers

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

def cmd_compare(work, out, tag, side, tz_metrics, tz_dir, tz_eval, ids_file, weights_tol):
    """Losses per step, final weights, and the saved weights of one tierzero side (stage 0 or
    stage 3 on NVMe: tz_metrics, tz_dir) in transformers, against PyTorch's run of round tag."""
    weights_tol = float(weights_tol)
    ok = True
    pt = [json.loads(l) for l in open(f"{work}/pt_{tag}.jsonl")]
    tz = [json.loads(l) for l in open(tz_metrics)]
    with open(out, "a") as f:
        diffs = [rel(t["loss"], p["loss"]) for t, p in zip(tz, pt)]
        worst = int(np.argmax(diffs))
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "loss_per_step", "tag": tag, "side": side, "steps": len(pt),
                       "steps_tierzero": len(tz), "max_rel_diff": max(diffs), "at_step": worst + 1,
                       "tierzero_losses": [t["loss"] for t in tz], "pytorch_losses": [p["loss"] for p in pt],
                       "grad_norm_max_rel_diff": max(rel(t["grad_norm"], p["grad_norm"]) for t, p in zip(tz, pt)),
                       "bound": 1e-4, "pass": len(tz) == len(pt) and max(diffs) <= 1e-4})
        init = {strip(k): v for k, v in load_file(f"{work}/init/model.safetensors").items()}
        a = {strip(k): v for k, v in load_file(f"{tz_dir}/model.safetensors").items()}
        b = {strip(k): v for k, v in load_file(f"{work}/pt_{tag}/model.safetensors").items()}
        a.pop("lm_head.weight", None); b.pop("lm_head.weight", None); init.pop("lm_head.weight", None)
        per = []
        for k in sorted(b):
            d = np.abs(a[k].astype(np.float64) - b[k])
            moved = np.abs(b[k].astype(np.float64) - init[k]).max()
            per.append((float(d.max()), float(d.max() / np.abs(b[k]).max()), float(d.max() / max(moved, 1e-30)), k))
        abs_worst, rel_worst, upd_worst = max(per), max(per, key=lambda p: p[1]), max(per, key=lambda p: p[2])
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "final_weights", "tag": tag, "side": side,
                       "tensors": len(b), "same_names": sorted(a) == sorted(b),
                       "max_abs_diff": abs_worst[0], "max_abs_diff_tensor": abs_worst[3],
                       "max_rel_diff_over_tensor_max": rel_worst[1], "max_rel_diff_tensor": rel_worst[3],
                       "max_abs_diff_over_update": upd_worst[2], "max_abs_diff_over_update_tensor": upd_worst[3],
                       "bound_abs": weights_tol, "pass": sorted(a) == sorted(b) and abs_worst[0] <= weights_tol})
        ids = json.load(open(ids_file))
        hf_tz, _ = hf_eval(tz_dir, ids)
        hf_pt, _ = hf_eval(f"{work}/pt_{tag}", ids)
        tz_loss = json.load(open(tz_eval))["loss"]
        ok &= emit(f, {"bench": "train_vs_pytorch", "case": "tierzero_weights_in_hf", "tag": tag, "side": side,
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

# The configs the sides train with: fp32 (no bf16/fp16 section), AdamW with decoupled decay on
# every parameter, global-norm clipping, constant lr, one micro-batch. The stage-0 one (no offload;
# PyTorch reads its hyperparameters from it) and beside it the NVMe side's, which differs only in
# zero_optimization: stage 3, parameters and optimizer states on nvme (the swap folder comes from
# --nvme-path, one per run), the tiers' budgets left at their defaults.
write_config() {
  cat > "$1" <<JSON
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "optimizer": {"type": "AdamW",
                "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "zero_optimization": $2,
  "tierzero": {"optimizer_threads": $threads}
}
JSON
}
config="$work/fp32_adamw_clip.json"
config_nvme="$work/fp32_adamw_clip_stage3_nvme.json"
write_config "$config" '{"stage": 0}'
write_config "$config_nvme" '{"stage": 3, "offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "nvme"}}'

# --- rows that need no torch: each run's figures, the comparisons between runs, the summaries ---
cat > "$work/rows.py" <<'PY'
"""Rows of train_vs_pytorch.sh that need no torch: the machine, each tierzero run's figures from
its --json summary and --metrics lines, a side's row with its round, place in the order and load,
stage 3 on NVMe against stage 0, and the per-round and final summaries (JSON lines on stdout, a
human line on stderr)."""
import json, statistics, sys

BENCH = "train_vs_pytorch"
TARGET = 1.15  # issue 29: the NVMe-offloaded step within 1.15x its bound (reported, not asserted)
TRAIN_CASES = {"tierzero_train": "tierzero", "tierzero_nvme_train": "tierzero-nvme",
               "pytorch_train": "pytorch"}

def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]

def median(v):
    return statistics.median(v) if v else None

# One write per line or message, so that lines stay whole when stdout (through tee) and stderr
# share a file.
def emit(r):
    sys.stdout.write(json.dumps(r) + "\n")
    sys.stdout.flush()

def say(s):
    sys.stderr.write(s + "\n")
    sys.stderr.flush()

def gb(v):
    return "n/a" if v is None else f"{v / 1e9:.3f} GB"

def cmd_machine(info_file, nvme_dir, nvme_device):
    # tierzero info --json: the CPU, the GEMM library and its kernel target; the swap folder's disk.
    j = json.load(open(info_file))
    g, c = j.get("gemm", {}), j.get("cpu", {})
    r = {"bench": BENCH, "case": "machine", "cpu_model": c.get("model"), "logical_cpus": c.get("logical_cpus"),
         "optimizer_simd_target": c.get("optimizer_dispatch_target"), "gemm_library": g.get("library"),
         "gemm_kernel_target": g.get("kernel_target"), "gemm_cpu_target": g.get("cpu_target"),
         "gemm_below_cpu": g.get("below_cpu"), "gemm_summary": g.get("summary"),
         "gemm_warnings": g.get("warnings")}
    if nvme_dir:
        p = (j.get("paths") or [{}])[0]
        r.update({"nvme_dir": nvme_dir, "nvme_dir_device": nvme_device,
                  "nvme_dir_filesystem": p.get("filesystem"), "nvme_dir_free_bytes": p.get("free_bytes"),
                  "nvme_dir_o_direct": p.get("o_direct"), "nvme_dir_engine": p.get("recommended_engine")})
    emit(r)
    say(f"# machine: cpu.model {r['cpu_model']}, {r['logical_cpus']} logical CPUs")
    say(f"# {r['gemm_summary']}")
    if nvme_dir:
        say(f"# nvme dir: {nvme_dir} on {nvme_device} ({r['nvme_dir_filesystem']}, {gb(r['nvme_dir_free_bytes'])} free)")

def cmd_tz(side, tag, summary, metrics):
    """One tierzero run: its --json summary's medians (steps 2..K) and, from --metrics, the waits
    and for the NVMe side the step against its bound and the NVMe bytes per step."""
    s, m = json.load(open(summary)), lines(metrics)
    steady = m[1:] or m  # steps 2..K, as the summary's medians (step 1 records the access trace)
    r = {"bench": BENCH, "case": "tierzero_train" if side == "tierzero" else "tierzero_nvme_train",
         "side": side, "tag": tag, "steps": s["steps"], "final_loss": s["final_loss"],
         "step_s_median": s["step_s_median"], "tokens_per_s": s["tokens_per_s"],
         "bound_s": s["bound_s"], "params_xxh3": s["params_xxh3"],
         "wait_fraction_median": {k: median([x[f"wait_{k}_fraction"] for x in steady])
                                  for k in ("params", "grads", "optimizer")}}
    if side == "tierzero-nvme":
        ratio = s["step_s_median"] / s["bound_s"] if s["bound_s"] > 0 else None
        r.update({"step_over_bound": ratio, "step_over_bound_target": TARGET,
                  "within_target": ratio is not None and ratio <= TARGET,
                  "step_over_bound_per_step": [x["step_s"] / x["bound_s"] for x in steady if x["bound_s"] > 0],
                  "nvme_read_bytes_per_step": median([x["nvme_read_bytes"] for x in steady]),
                  "nvme_write_bytes_per_step": median([x["nvme_write_bytes"] for x in steady]),
                  "nvme_bytes_per_param": s.get("nvme_bytes_per_param"),
                  "peak_bytes": s.get("peak_bytes"), "plan_bytes": s.get("plan_bytes")})
    # What bounds the step and the bandwidths behind it, where this binary reports them: the
    # summary's value, else the last step's; bound_term of every step 2..K.
    for k in ("bound_term", "bandwidth_bytes_per_s"):
        per = [x[k] for x in steady if k in x]
        if k in s:
            r[k] = s[k]
        elif per:
            r[k] = per[-1]
        if k == "bound_term" and per:
            r["bound_term_per_step"] = per
    emit(r)

def cmd_annotate(row_file, side, tag, position, order, load_before, load_after):
    r = lines(row_file)[-1]
    r.update({"side": side, "tag": tag, "round": int(tag), "position": int(position),
              "order": order.split(","), "load_before": load_before, "load_after": load_after})
    emit(r)

def cmd_stages(tag, m0, j0, m3, j3):
    """Stage 3 with both offloads on NVMe against stage 0: the engine is bit-identical across
    stages and placements in its default overlap mode (exact), so every step's loss and grad
    norm and the final weights' hash must be equal, not close."""
    a, b = lines(m0), lines(m3)
    x0, x3 = json.load(open(j0))["params_xxh3"], json.load(open(j3))["params_xxh3"]
    same = lambda k: len(a) == len(b) and all(p[k] == q[k] for p, q in zip(a, b))
    differ = [p["step"] for p, q in zip(a, b) if p["loss"] != q["loss"] or p["grad_norm"] != q["grad_norm"]]
    rel = [abs(p["loss"] - q["loss"]) / abs(p["loss"]) for p, q in zip(a, b)]
    r = {"bench": BENCH, "case": "stage3_nvme_vs_stage0", "tag": tag, "steps": len(a), "steps_nvme": len(b),
         "losses_bit_identical": same("loss"), "grad_norms_bit_identical": same("grad_norm"),
         "loss_max_rel_diff": max(rel) if rel else None, "first_differing_step": differ[0] if differ else None,
         "params_xxh3_stage0": x0, "params_xxh3_stage3_nvme": x3,
         "bound": "bit-identical (docs/zero.md: tierzero.overlap exact, the default)",
         "pass": same("loss") and same("grad_norm") and x0 == x3}
    emit(r)
    sys.exit(0 if r["pass"] else 1)

def train_rows(out):
    return [r for r in lines(out) if r.get("case") in TRAIN_CASES]

def cmd_round(out, tag):
    rows = {TRAIN_CASES[r["case"]]: r for r in train_rows(out) if r.get("tag") == tag}
    order = next(iter(rows.values()))["order"]
    pt = rows.get("pytorch")
    nv = rows.get("tierzero-nvme", {})
    r = {"bench": BENCH, "case": "round_summary", "tag": tag, "order": order,
         "step_s": {k: v["step_s_median"] for k, v in rows.items()},
         "tokens_per_s": {k: v["tokens_per_s"] for k, v in rows.items()},
         "speed_vs_pytorch": {k: pt["step_s_median"] / v["step_s_median"] for k, v in rows.items()
                              if pt and k != "pytorch"},
         "nvme_bound_s": nv.get("bound_s"), "nvme_step_over_bound": nv.get("step_over_bound"),
         "step_over_bound_target": TARGET,
         "nvme_read_bytes_per_step": nv.get("nvme_read_bytes_per_step"),
         "nvme_write_bytes_per_step": nv.get("nvme_write_bytes_per_step"),
         "load": {k: [v["load_before"], v["load_after"]] for k, v in rows.items()}}
    for k in ("bound_term", "bandwidth_bytes_per_s"):
        if k in nv: r["nvme_" + k] = nv[k]
    emit(r)
    parts = []
    for k in (k for k in order if k in rows):
        v = rows[k]
        p = f"{k} {v['tokens_per_s']:.1f} tokens/s ({v['step_s_median']:.3f} s/step"
        if k in r["speed_vs_pytorch"]:
            p += f", {r['speed_vs_pytorch'][k]:.2f}x PyTorch"
        if k == "tierzero-nvme" and v.get("step_over_bound") is not None:
            p += (f"; bound {v['bound_s']:.3f} s, step/bound {v['step_over_bound']:.3f} (target {TARGET})"
                  f"; NVMe {gb(v['nvme_read_bytes_per_step'])} read, {gb(v['nvme_write_bytes_per_step'])} written per step")
            if not v["nvme_read_bytes_per_step"] and not v["nvme_write_bytes_per_step"]:
                p += " (no NVMe traffic after step 1: the default budgets held every byte in memory)"
            for k in ("bound_term", "bandwidth_bytes_per_s"):
                if k in v: p += f"; {k} {json.dumps(v[k])}"
        parts.append(p + f"; load {v['load_before']} -> {v['load_after']})")
    say(f"round {tag}, order {' -> '.join(order)}:\n  " + "\n  ".join(parts))

def cmd_summary(out, model, config, threads):
    rows = train_rows(out)
    machine = next((r for r in lines(out) if r.get("case") == "machine"), {})
    seq = int(dict(kv.split("=") for kv in model.split(":", 1)[1].split(","))["seq"])
    tokens = json.load(open(config))["train_micro_batch_size_per_gpu"] * seq
    per = {side: [r["step_s_median"] for r in rows if r["case"] == case] for case, side in TRAIN_CASES.items()}
    med = {k: median(v) for k, v in per.items()}
    tps = lambda k: tokens / med[k] if med[k] else None
    vs = lambda k, ref: med[ref] / med[k] if med[k] and med[ref] else None
    nv = [r for r in rows if r["case"] == "tierzero_nvme_train"]
    ratios = [r["step_over_bound"] for r in nv if r.get("step_over_bound") is not None]
    loads = [float(r[k].split(",")[0]) for r in rows for k in ("load_before", "load_after")]
    r = {"bench": BENCH, "case": "train_summary", "model": model, "batch": tokens // seq, "threads": int(threads),
         "rounds": max((r["round"] for r in rows), default=0),
         "orders": [x["order"] for x in sorted({r["round"]: r for r in rows}.values(), key=lambda x: x["round"])],
         "tierzero_step_s": med["tierzero"], "tierzero_nvme_step_s": med["tierzero-nvme"], "pytorch_step_s": med["pytorch"],
         "tierzero_tokens_per_s": tps("tierzero"), "tierzero_nvme_tokens_per_s": tps("tierzero-nvme"),
         "pytorch_tokens_per_s": tps("pytorch"),
         "speed_vs_pytorch": vs("tierzero", "pytorch"), "nvme_speed_vs_pytorch": vs("tierzero-nvme", "pytorch"),
         "nvme_speed_vs_stage0": vs("tierzero-nvme", "tierzero"),
         "nvme_bound_s": median([r["bound_s"] for r in nv]), "nvme_step_over_bound": median(ratios),
         "step_over_bound_target": TARGET,
         "nvme_within_target": median(ratios) <= TARGET if ratios else None,
         "nvme_read_bytes_per_step": median([r["nvme_read_bytes_per_step"] for r in nv]),
         "nvme_write_bytes_per_step": median([r["nvme_write_bytes_per_step"] for r in nv]),
         "rounds_tierzero_step_s": per["tierzero"], "rounds_tierzero_nvme_step_s": per["tierzero-nvme"],
         "rounds_pytorch_step_s": per["pytorch"], "rounds_nvme_step_over_bound": ratios,
         "load_1min_min": min(loads, default=None), "load_1min_max": max(loads, default=None),
         "cpu_model": machine.get("cpu_model"), "gemm_library": machine.get("gemm_library"),
         "gemm_kernel_target": machine.get("gemm_kernel_target")}
    for k in ("bound_term", "bandwidth_bytes_per_s"):
        if any(k in x for x in nv): r["rounds_nvme_" + k] = [x.get(k) for x in nv]
    emit(r)
    say(f"summary over {r['rounds']} round(s), medians ({r['cpu_model']}; GEMM {r['gemm_library']}, "
        f"kernels {r['gemm_kernel_target']}; 1-min load {r['load_1min_min']}-{r['load_1min_max']}):")
    for side, key in (("tierzero", "speed_vs_pytorch"), ("tierzero-nvme", "nvme_speed_vs_pytorch"), ("pytorch", None)):
        if med[side] is None: continue
        line = f"  {side}: {tps(side):.1f} tokens/s, {med[side]:.3f} s/step"
        if key and r[key] is not None: line += f", {r[key]:.2f}x PyTorch"
        if side == "tierzero-nvme" and ratios:
            line += (f"; step/bound {r['nvme_step_over_bound']:.3f} (target {TARGET}; rounds "
                     + " / ".join(f"{x:.3f}" for x in ratios) + ")"
                     f"; NVMe {gb(r['nvme_read_bytes_per_step'])} read, {gb(r['nvme_write_bytes_per_step'])} written per step")
        say(line)

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"machine": cmd_machine, "tz": cmd_tz, "annotate": cmd_annotate, "stages": cmd_stages,
     "round": cmd_round, "summary": cmd_summary}[cmd](*args)
PY

echo "# train_vs_pytorch model=$model steps=$steps rounds=$rounds threads=$threads sides=$sides $(date -u)" >&2
echo "# load: $(uptime)" >&2
load_avg() { uptime | sed 's/.*load average: *//'; }
# The machine every figure below was taken on: CPU, GEMM library and kernel target, and the
# disk of --nvme-dir when the NVMe side runs.
info_args=()
nvme_device=""
if has_side tierzero-nvme; then
  info_args=(--path "$nvme_dir")
  nvme_device="$(df -P "$nvme_dir" | awk 'NR == 2 {print $1}')"
fi
"$tierzero" info --json "${info_args[@]}" > "$work/info.json" 2> /dev/null
"$py" "$work/rows.py" machine "$work/info.json" "$(has_side tierzero-nvme && echo "$nvme_dir")" "$nvme_device" |
  tee -a "$out"
status=0

# --- 1: training, loss per step, final weights, saved weights in transformers, tokens/s ---------
# Final weights: fp32 runs that differ only in reduction order (BLAS blocking, summation trees)
# drift apart through Adam's normalised updates; 1e-4 absolute is under 2% of the largest
# parameter change over 20 steps at lr 6e-4 (up to 1.2e-2) and far above rounding of a single step.
weights_tol=1e-4
# Each side's files in the work folder: PREFIX_ROUND.{json,jsonl,log,row} and PREFIX_ROUND/.
side_prefix() { case "$1" in tierzero) echo tz ;; tierzero-nvme) echo tzn ;; pytorch) echo pt ;; esac; }
if [[ ",$phases," == *,train,* ]]; then
  "$py" "$work/peer.py" init "$work" "$model" 1234
  "$py" "$work/peer.py" ids "$work" "$model" "$config" "$work/tokens.bin" "$steps" "$work/eval_ids.json"
  run_tz() {  # SIDE ROUND
    local side="$1" r="$2" p cfg="$config" nvme_args=()
    p="$(side_prefix "$side")"
    if [[ "$side" == tierzero-nvme ]]; then
      nvme_run="$(mktemp -d "$nvme_dir/tz_nvme.XXXXXX")"
      cfg="$config_nvme"
      nvme_args=(--nvme-path "$nvme_run")
    fi
    mkdir -p "$work/${p}_$r"
    "$tierzero" train --config "$cfg" --model "$model" --data "$work/tokens.bin" \
      --init "$work/init/model.safetensors" --steps "$steps" --cpu-threads "$threads" "${nvme_args[@]}" \
      --metrics "$work/${p}_$r.jsonl" --save-weights "$work/${p}_$r/model.safetensors" --json \
      > "$work/${p}_$r.json" 2> "$work/${p}_$r.log" ||
      { echo "train_vs_pytorch: tierzero train ($side) failed (round $r):" >&2; tail -5 "$work/${p}_$r.log" >&2; return 1; }
    if [[ -n "$nvme_run" ]]; then rm -rf "$nvme_run"; nvme_run=""; fi
    "$py" "$work/rows.py" tz "$side" "$r" "$work/${p}_$r.json" "$work/${p}_$r.jsonl" > "$work/${p}_$r.row"
  }
  run_pt() { "$py" "$work/peer.py" train "$work" "$model" "$config" "$work/tokens.bin" "$steps" "$threads" "$1" > "$work/pt_$1.row"; }
  run_side() {  # SIDE ROUND POSITION ORDER: one run with the load before and after it
    local before after
    before="$(load_avg)"
    if [[ "$1" == pytorch ]]; then run_pt "$2"; else run_tz "$1" "$2"; fi
    after="$(load_avg)"
    "$py" "$work/rows.py" annotate "$work/$(side_prefix "$1")_$2.row" "$1" "$2" "$3" "$4" "$before" "$after" |
      tee -a "$out"
  }
  # A tierzero side against PyTorch: its saved weights' loss on the unseen batch, then the checks.
  compare_side() {  # SIDE ROUND
    local p
    p="$(side_prefix "$1")"
    "$tierzero" bench model --model "$model" --weights "$work/${p}_$2/model.safetensors" \
      --ids "$work/eval_ids.json" --threads "$threads" --json > "$work/${p}_eval_$2.json"
    "$py" "$work/peer.py" compare "$work" "$out" "$2" "$1" "$work/${p}_$2.jsonl" "$work/${p}_$2" \
      "$work/${p}_eval_$2.json" "$work/eval_ids.json" "$weights_tol"
  }
  n=${#side_list[@]}
  for ((r = 1; r <= rounds; ++r)); do
    # Rotated order: round 1 starts with --first, each later round with the next side.
    order=()
    for ((i = 0; i < n; ++i)); do order+=("${side_list[(first_index + r - 1 + i) % n]}"); done
    order_csv="$(IFS=,; echo "${order[*]}")"
    echo "round $r/$rounds: order $order_csv" >&2
    for ((i = 0; i < n; ++i)); do run_side "${order[i]}" "$r" "$((i + 1))" "$order_csv"; done
    if has_side pytorch && has_side tierzero; then compare_side tierzero "$r" || status=1; fi
    if has_side pytorch && has_side tierzero-nvme; then compare_side tierzero-nvme "$r" || status=1; fi
    if has_side tierzero && has_side tierzero-nvme; then
      "$py" "$work/rows.py" stages "$r" "$work/tz_$r.jsonl" "$work/tz_$r.json" "$work/tzn_$r.jsonl" \
        "$work/tzn_$r.json" | tee -a "$out" || status=1
    fi
    "$py" "$work/rows.py" round "$out" "$r" | tee -a "$out"
    [[ "$keep_work" == 1 ]] || rm -rf "$work/tz_$r" "$work/tzn_$r" "$work/pt_$r"
    echo "round $r/$rounds done ($(uptime | sed 's/.*load/load/'))" >&2
  done
  "$py" "$work/rows.py" summary "$out" "$model" "$config" "$threads" | tee -a "$out"
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
