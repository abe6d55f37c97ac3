#!/usr/bin/env bash
# `--metrics` has one JSON line per step with every documented key (val_loss on eval steps), and
# `--json` prints a summary with every documented key.
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
make_text "$work/val.txt"
config "$work/c.json" 0 none none
"$tz" train --config "$work/c.json" --model "$model" --data "$work/train.txt" \
  --val-data "$work/val.txt" --eval-every 2 --steps 3 --metrics "$work/m.jsonl" --json \
  > "$work/summary.json" || bad "train exited $?"
python3 - "$work/m.jsonl" "$work/summary.json" <<'PY' || fail=1
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
step_keys = ["step", "loss", "lr", "grad_norm", "loss_scale", "step_s", "tokens_per_s", "bound_s",
             "bound_term", "bound_terms_s",
             "stall_fraction", "wait_params_fraction", "wait_grads_fraction",
             "wait_optimizer_fraction", "bytes_in_use", "disks"]
assert [l["step"] for l in lines] == [1, 2, 3], [l.get("step") for l in lines]
for l in lines:
    missing = [k for k in step_keys if k not in l]
    assert not missing, f"step {l['step']} lacks {missing}"
    assert set(l["bytes_in_use"]) == {"device", "host", "nvme"}, l["bytes_in_use"]
    assert l["disks"] == {}, l["disks"]  # no NVMe offload: no swap disk
    assert math.isfinite(l["loss"]) and l["loss"] > 0, l
    # Byte-level model at init: the loss is near ln(256) = 5.55, never far from it in 3 steps.
    assert 3.0 < l["loss"] < 7.0, l["loss"]
    # The three waits split the stall: each in [0, 1], their sum the stall fraction.
    waits = [l[k] for k in ("wait_params_fraction", "wait_grads_fraction", "wait_optimizer_fraction")]
    assert all(0 <= w <= 1.0 + 1e-9 for w in waits), waits
    assert abs(sum(waits) - l["stall_fraction"]) < 1e-9, (waits, l["stall_fraction"])
assert [("val_loss" in l) for l in lines] == [False, True, True], lines
s = json.load(open(sys.argv[2]))
summary_keys = ["steps", "final_loss", "val_loss", "tokens_per_s", "step_s_median", "bound_s",
                "bound_term", "bound_terms_s",
                "params", "params_xxh3", "peak_bytes", "plan_bytes", "comm_bytes",
                "nvme_bytes_per_param"]
missing = [k for k in summary_keys if k not in s]
assert not missing, f"summary lacks {missing}"
assert s["steps"] == 3 and s["final_loss"] == lines[-1]["loss"], s
assert s["val_loss"] == lines[-1]["val_loss"], s
# 2 layers, embd 32, vocab 256, seq 32: the GPT-2 parameter count by formula.
e, L, V, S = 32, 2, 256, 32
params = V * e + S * e + L * (12 * e * e + 13 * e) + 2 * e
assert s["params"] == params, (s["params"], params)
print("ok   metrics: 3 lines with every key; summary complete")
PY
exit $fail
