#!/usr/bin/env bash
# Zero and negative counts are refused alike (docs/cli.md), and `estimate --nvme-path` with a
# config that offloads nothing to nvme is refused as `train` refuses it: exit 1, one line naming
# the flag.
tz=$1
. "$(dirname "$0")/../e2e/common.sh"
make_text "$work/t.txt"
config "$work/c.json" 0 none none
expect() {  # NAME WANT ARGS...
  local name=$1 want=$2; shift 2
  local err rc
  err=$("$tz" --log-level error "$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
     printf '%s' "$err" | grep -qF -- "$want"; then ok "$name: $err"; else bad "$name: rc=$rc: $err"; fi
}
run=(--config "$work/c.json" --model "$model")
for v in 0 -1; do
  expect "train --seq $v" "tierzero train: --seq" train "${run[@]}" --data "$work/t.txt" --steps 1 --seq "$v"
  expect "estimate --seq $v" "tierzero estimate: --seq" estimate "${run[@]}" --seq "$v"
  expect "estimate --micro-batch $v" "tierzero estimate: --micro-batch" estimate "${run[@]}" --micro-batch "$v"
done
expect "train --nvme-path unused" "--nvme-path $work but $work/c.json offloads nothing to nvme" \
  train "${run[@]}" --data "$work/t.txt" --steps 1 --nvme-path "$work"
expect "estimate --nvme-path unused" "tierzero estimate: --nvme-path $work but $work/c.json offloads nothing to nvme" \
  estimate "${run[@]}" --nvme-path "$work"
"$tz" estimate "${run[@]}" --seq 16 --micro-batch 1 > /dev/null 2>&1 && ok "positive values accepted" || bad "positive values refused"
# The device advice starts with the largest term: activations for a big micro-batch without
# checkpointing, the model's state for a big model with short sequences.
echo '{"train_micro_batch_size_per_gpu": 64, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}, "tierzero": {"device_budget": "4G"}}' > "$work/act.json"
line=$("$tz" --log-level error estimate --config "$work/act.json" --model gpt2-124m --checkpointing 0 2>&1 | grep '\[NO\] device:')
case "$line" in *"over, mostly activations"*"; turn on activation checkpointing (--checkpointing 1)"*) ok "activation advice first: $line";; *) bad "activation advice: $line";; esac
line=$("$tz" --log-level error estimate --config "$work/act.json" --model gpt2-1.5b --seq 16 --micro-batch 1 2>&1 | grep '\[NO\] device:')
case "$line" in *"over; offload the optimizer"*) ok "state advice first: $line";; *) bad "state advice: $line";; esac
# info --path FILE says it is a file, not a folder (it said "not writable").
: > "$work/afile"
r=$("$tz" info --json --path "$work/afile" 2>/dev/null | python3 -c 'import json,sys; p=json.load(sys.stdin)["paths"][0]; print(p["reason"], "|", p["error"])')
case "$r" in "not a folder | $work/afile is a file, not a folder") ok "info --path FILE: $r";; *) bad "info --path FILE: $r";; esac
exit $fail
