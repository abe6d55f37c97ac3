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
expect steps_zero "--steps" --config "$work/stage0.json" --model "$model" --steps 0 --data "$work/good.txt"
expect eval_without_val "--eval-every needs --val-data" "${base[@]}" --data "$work/good.txt" --eval-every 2
expect nvme_flag_no_offload "offloads nothing to nvme" "${base[@]}" --data "$work/good.txt" --nvme-path "$work"
expect batch_contradicts_ranks "contradicts" --config "$work/contradict.json" --model "$model" --steps 1 --ranks 2 --data "$work/good.txt"
expect nvme_not_writable "not writable" --config "$work/nvme.json" --model "$model" --steps 1 --data "$work/good.txt" --nvme-path "$work/notadir"
expect nvme_too_small "needs about" --config "$work/nvme.json" --model "gpt2:layers=200,heads=16,embd=8192,vocab=256,seq=32" --steps 1 --data "$work/good.txt" --nvme-path "$work"
expect device_budget_too_small "device" --config "$work/tiny_budget.json" --model "$model" --steps 1 --data "$work/good.txt"
expect bad_config "stage" --config "$(dirname "$0")/../../configs/bad/stage4.json" --model "$model" --steps 1 --data "$work/good.txt"
exit $fail
