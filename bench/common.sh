# shellcheck shell=bash
# The start every peer script of bench/ shares (adam_vs_peers.sh, llama_vs_hf.sh, lora_vs_peft.sh,
# model_vs_hf.sh, tokenizer_vs_hf.sh, train_vs_pytorch.sh): source it once the options are parsed.
# It sources peers_venv.sh too (the peers' throw-away virtual environment). The functions read the
# caller's `build` (the build folder) and set the caller's variables named below.
#
#   bench_peer_start WHO
#     Exits 0 with one line under CI (the peers never run there). Otherwise sets `tierzero` to
#     $build/src/cli/tierzero, or exits 1 with the command that builds it when it is not there.
#     WHO (the script's name) starts every message.
#   bench_default_out WHO
#     Sets `out`, when it is empty, to $build/WHO.<UTC date and time>.jsonl.
#   bench_work_folder WHO KEEP
#     Sets `work` to a fresh folder $build/WHO.XXXXXX (creating $build), removed at exit unless
#     KEEP is 1, when its path is printed instead (the EXIT trap is this function's: a caller
#     with more to clean sets its own afterwards).
#   bench_write_adamw_configs DIR B
#     Writes DIR/stage0.json and DIR/stage3.json, the DeepSpeed configs the HF peers train with:
#     micro-batch B, fp32 AdamW (lr 0.003, betas 0.9/0.95, eps 1e-8, weight decay 0.1), clipping
#     at 1.0; ZeRO stage 0, and stage 3 with parameters and optimizer states on NVMe.

# shellcheck disable=SC2154  # build is the caller's
# shellcheck source=bench/peers_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/peers_venv.sh"

bench_peer_start() {
  local who="$1"
  if [[ "${CI:-}" == "true" ]]; then
    echo "$who: peers are never run in CI" >&2
    exit 0
  fi
  tierzero="$build/src/cli/tierzero"
  [[ -x "$tierzero" ]] ||
    { echo "$who: $tierzero not built (cmake --build $build --target tierzero)" >&2; exit 1; }
}

bench_default_out() {
  out="${out:-$build/$1.$(date -u +%Y%m%dT%H%M%SZ).jsonl}"
}

bench_work_folder() {
  local who="$1" keep="$2"
  mkdir -p "$build"
  work="$(mktemp -d "$build/$who.XXXXXX")"
  if [[ "$keep" == 1 ]]; then echo "$who: work folder $work (kept)" >&2; else trap 'rm -rf "$work"' EXIT; fi
}

bench_write_adamw_configs() {
  local dir="$1" b="$2"
  local head="\"train_micro_batch_size_per_gpu\": $b, \"gradient_accumulation_steps\": 1, \"gradient_clipping\": 1.0,
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003, \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},"
  cat > "$dir/stage0.json" <<EOF
{$head
 "zero_optimization": {"stage": 0}, "steps_per_print": 1000}
EOF
  cat > "$dir/stage3.json" <<EOF
{$head
 "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "nvme"}},
 "steps_per_print": 1000}
EOF
}
