#!/usr/bin/env bash
# Measured peaks stay within the engine's plan on every tier through the CLI, at the demo's shape
# (8 blocks of 1.8M parameters, activation checkpointing) under a device budget far above the
# plan: the compute stream runs behind the model's calls on HostDevice, so released buffers whose
# free waits for it must not pile up past the plan just because the budget would allow it.
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
shape="gpt2:layers=8,heads=6,embd=384,vocab=256,seq=128"
for combo in "3 nvme nvme" "2 nvme none"; do
  set -- $combo
  name="stage$1-opt_$2-param_$3"
  config "$work/$name.json" "$1" "$2" "$3" ', "tierzero": {"device_budget": "1G"}'
  out=$("$tz" train --config "$work/$name.json" --model "$shape" --data "$work/train.txt" \
        --steps 2 --checkpointing 1 --nvme-path "$work" --json 2>"$work/$name.err"); rc=$?
  if [ "$rc" -ne 0 ]; then bad "$name: rc=$rc: $(tail -1 "$work/$name.err")"; continue; fi
  if msg=$(printf '%s' "$out" | tail -1 | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
peak, plan = d["peak_bytes"], d["plan_bytes"]
over = [f"{t} peak {peak[t]} > plan {plan[t]}" for t in ("device", "host", "nvme") if peak[t] > plan[t]]
print("; ".join(over) if over else f"peaks {peak} within plan {plan}")
sys.exit(1 if over else 0)'); then ok "$name: $msg"; else bad "$name: $msg"; fi
done
exit $fail
