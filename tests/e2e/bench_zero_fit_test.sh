#!/usr/bin/env bash
# issue 29's `bench zero` case exactly (16 layers of 1024 x 1024, one rank, three steps, stage 3,
# bf16, parameters and optimizer on NVMe, --device-budget 32M --host-budget 64M): it starts; the
# device cache of parameter shards shrinks to what the gather and gradient buffers leave, and the
# gradient shards (bf16: one micro-batch a step), which do not fit the host budget beside its
# minimum, are homed on NVMe with the optimizer state; every step's peak per tier stays within
# the plan, each tier's plan within its budget; the parameters' hash equals the same run's with
# room to spare (placement is not math). A host budget below the irreducible minimum is refused,
# naming its terms, before the disk probe.
# Usage: bench_zero_fit_test.sh TIERZERO
set -u
bin=$1
source "$(dirname "$0")/common.sh"
args=(bench zero --layers 16 --hidden 1024 --tokens 128 --ranks 1 --steps 3 --dtype bf16 --stage 3
      --offload-param nvme --offload-optimizer nvme --nvme-path "$work" --json)

# A host budget below the host tier's irreducible minimum: refused, naming its terms, before the
# disk probe of the bound's bandwidths (the ranks measure once their plan is checked): strace
# shows whether the probe's file (tierzero-bench zero-probe.PID) was opened; without a usable
# strace that part is skipped.
tracer=()
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
  tracer=(strace -f -e trace=openat -o "$work/refused.strace")
fi
out=$("${tracer[@]}" "$bin" "${args[@]}" --device-budget 32M --host-budget 16M 2>&1)
rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "host tier needs at least" &&
   printf '%s' "$out" | grep -q "for two units of NVMe-homed state" &&
   printf '%s' "$out" | grep -q "of staging"; then
  ok "32M/16M: the host's irreducible minimum is refused by name"
else
  bad "32M/16M: rc=$rc, expected the host tier's minimum named: $out"
fi
if [ ${#tracer[@]} -gt 0 ]; then
  if grep -q "probe\." "$work/refused.strace"; then
    bad "32M/16M: the refused run opened the disk probe's file: $(grep 'probe\.' "$work/refused.strace" | head -1)"
  else
    ok "32M/16M: refused before the disk probe"
  fi
else
  echo "skip the refused run's probe check: no usable strace"
fi

# 32 MiB device budget, a host budget above the host's minimum: starts, peaks within the plan.
check() {  # NAME DEVICE_BUDGET_BYTES HOST_BUDGET_BYTES -> prints params_xxh3
  python3 -c '
import json, sys
name, budget, host_budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
steps = [l for l in lines if "peak_bytes" in l and "plan" not in l]
summary = lines[-1]
err = []
if len(steps) != 3: err.append("expected 3 step lines, got %d" % len(steps))
plan = summary["plan"]
if plan["plan_bytes"]["device"] > budget:
    err.append("device plan %d over the budget %d" % (plan["plan_bytes"]["device"], budget))
if plan["plan_bytes"]["host"] > host_budget:
    err.append("host plan %d over the budget %d" % (plan["plan_bytes"]["host"], host_budget))
for s in steps + [summary]:
    for tier in ("device", "host", "nvme"):
        if s["peak_bytes"][tier] > s["plan_bytes"][tier]:
            err.append("step %s: %s peak %d over the plan %d" % (s.get("step"), tier,
                       s["peak_bytes"][tier], s["plan_bytes"][tier]))
# 32 MiB of bf16 gradient shards do not fit a 64 MiB host budget beside the minimum: on NVMe.
host_home = plan["terms"]["host"]["home blocks (host-homed state)"]
if host_budget == 64 << 20 and host_home != 0:
    err.append("gradient shards still homed on the host (%d bytes)" % host_home)
if host_budget == 128 << 20 and host_home != 32 << 20:
    err.append("expected the gradient shards on the host with room, got %d" % host_home)
cache = plan["terms"]["device"]["device cache of offloaded parameter shards"]
if budget < (1 << 30) and not (2 * 2097152 <= cache < 16 * 2097152):
    err.append("device cache %d not shrunk to the budget" % cache)
if err:
    print(name + ": " + "; ".join(err)); sys.exit(1)
print(summary["params_xxh3"])
' "$1" "$2" "$3"
}
out=$("$bin" "${args[@]}" --device-budget 32M --host-budget 64M 2>&1)
if [ $? -ne 0 ]; then
  bad "32M/64M refused: $out"
elif h32=$(printf '%s\n' "$out" | check 32M/64M $((32 << 20)) $((64 << 20))); then
  ok "32M/64M: starts, the device cache shrinks, every peak within the plan and the budgets"
else
  bad "$h32"; h32=""
fi
out=$("$bin" "${args[@]}" --device-budget 1G --host-budget 128M 2>&1)
if [ $? -ne 0 ]; then
  bad "1G/128M refused: $out"
elif h1g=$(printf '%s\n' "$out" | check 1G/128M $((1 << 30)) $((128 << 20))); then
  if [ -n "$h32" ] && [ "$h32" = "$h1g" ]; then
    ok "params_xxh3 $h32 the same with 32M/64M and 1G/128M budgets"
  else
    bad "params_xxh3 differ: 32M/64M '$h32' vs 1G/128M '$h1g'"
  fi
else
  bad "$h1g"
fi
exit $fail
