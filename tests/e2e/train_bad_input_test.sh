#!/usr/bin/env bash
# Every bad data file and bad flag of `tierzero train` stops before the first step with exactly
# one line on stderr naming the problem, and a non-zero exit.
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/good.txt"
config "$work/stage0.json" 0 none none
config "$work/nvme.json" 3 nvme nvme
config "$work/contradict.json" 0 none none ', "train_batch_size": 12'
config "$work/tiny_budget.json" 0 none none ', "tierzero": {"device_budget": "64K"}'
# Token files written byte by byte: header (magic, version, count) then uint16 tokens.
tokfile() {  # FILE MAGIC VERSION COUNT TOKEN...
  python3 - "$@" <<'PY'
import struct, sys
path, magic, version, count, *toks = sys.argv[1:]
hdr = struct.pack("<3i", int(magic), int(version), int(count)) + b"\0" * (1024 - 12)
open(path, "wb").write(hdr + b"".join(struct.pack("<H", int(t)) for t in toks))
PY
}
tokfile "$work/magic.bin" 20240521 1 3 1 2 3
tokfile "$work/version.bin" 20240520 3 3 1 2 3
tokfile "$work/size.bin" 20240520 1 5 1 2 3
tokfile "$work/vocab.bin" 20240520 1 3 1 300 3
printf 'hi' > "$work/short.txt"
: > "$work/empty.txt"
: > "$work/notadir"

# expect NAME SUBSTRING ARGS...: rc != 0, one stderr line, containing SUBSTRING.
expect() {
  local name=$1 want=$2; shift 2
  local err rc lines
  err=$("$tz" train "$@" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"; then
    ok "$name: $err"
  else
    bad "$name: rc=$rc lines=$lines (want '$want'): $err"
  fi
}
base=(--config "$work/stage0.json" --model "$model" --steps 1)
expect unknown_model "gpt2-9b" --config "$work/stage0.json" --model gpt2-9b --data "$work/good.txt"
expect seq_too_long "longer than" "${base[@]}" --seq 64 --data "$work/good.txt"
expect wrong_magic "wrong magic 20240521" "${base[@]}" --data "$work/magic.bin"
expect wrong_version "version 3" "${base[@]}" --data "$work/version.bin"
expect size_vs_header "header says 5 tokens" "${base[@]}" --data "$work/size.bin"
expect token_ge_vocab "token 300 at position 1" "${base[@]}" --data "$work/vocab.bin"
expect val_token_ge_vocab "vocab.bin" "${base[@]}" --data "$work/good.txt" --val-data "$work/vocab.bin"
expect too_few_tokens "fewer than one micro-batch" "${base[@]}" --data "$work/short.txt"
expect empty_file "empty data file" "${base[@]}" --data "$work/empty.txt"
expect missing_file "missing.txt" "${base[@]}" --data "$work/missing.txt"
expect lora_and_adapter "--lora and --adapter both give the adapters; give one" "${base[@]}" --data "$work/good.txt" --lora r=4 --adapter "$work"
expect steps_zero "--steps" --config "$work/stage0.json" --model "$model" --steps 0 --data "$work/good.txt"
expect eval_without_val "--eval-every needs --val-data" "${base[@]}" --data "$work/good.txt" --eval-every 2
expect nvme_flag_no_offload "offloads nothing to nvme" "${base[@]}" --data "$work/good.txt" --nvme-path "$work"
expect batch_contradicts_ranks "contradicts" --config "$work/contradict.json" --model "$model" --steps 1 --ranks 2 --data "$work/good.txt"
expect nvme_not_a_folder "is a file, not a folder" --config "$work/nvme.json" --model "$model" --steps 1 --data "$work/good.txt" --nvme-path "$work/notadir"
expect nvme_too_small "short by" --config "$work/nvme.json" --model "gpt2:layers=200,heads=16,embd=8192,vocab=256,seq=32" --steps 1 --data "$work/good.txt" --nvme-path "$work"
expect device_budget_too_small "device" --config "$work/tiny_budget.json" --model "$model" --steps 1 --data "$work/good.txt"
expect bad_config "stage" --config "$(dirname "$0")/../../configs/bad/stage4.json" --model "$model" --steps 1 --data "$work/good.txt"
# Outputs are checked before the first step, not after the work.
expect save_weights_unwritable "--save-weights" "${base[@]}" --data "$work/good.txt" --save-weights "$work/notadir/w.safetensors"
expect trace_is_input "is also an input" "${base[@]}" --data "$work/good.txt" --trace-out "$work/good.txt"
expect save_dir_unwritable "--save-dir" "${base[@]}" --data "$work/good.txt" --save-dir "$work/notadir/ck"
[ "$(head -c 4 "$work/good.txt")" = "The " ] && ok "the input named as output is unchanged" || bad "good.txt changed"
expect too_many_ranks "--ranks 200: at most" "${base[@]}" --data "$work/good.txt" --ranks 200
printf '{"zero_optimizaton": {"stage": 3}}' > "$work/misspelled.json"
expect misspelled_section "did you mean zero_optimization?" --config "$work/misspelled.json" --model "$model" --steps 1 --data "$work/good.txt"
printf '{"optimizer": {"params": {"lr": 1e400}}}' > "$work/overflow.json"
expect number_overflow "optimizer.params.lr" --config "$work/overflow.json" --model "$model" --steps 1 --data "$work/good.txt"
# Resuming at or past --steps says so instead of "0 steps, final loss 0".
"$tz" train "${base[@]}" --data "$work/good.txt" --save-dir "$work/ck" > /dev/null 2>&1 || bad "1-step save failed"
expect resume_past_steps "at or past --steps 1" "${base[@]}" --data "$work/good.txt" --resume "$work/ck"
# Unknown keys are ignored but said, by train as by config check.
printf '{"trian_batch_size": 4}' > "$work/unknown.json"
err=$("$tz" train --config "$work/unknown.json" --model "$model" --steps 1 --data "$work/good.txt" 2>&1 >/dev/null)
printf '%s\n' "$err" | grep -qF "tierzero train: warning: $work/unknown.json: trian_batch_size: unknown key, ignored (did you mean train_batch_size?)" \
  && ok "unknown key warned by train" || bad "train did not warn about trian_batch_size: $err"
exit $fail
