#!/usr/bin/env bash
# issue 29: every byte the process holds is in the plan. `bench zero` (stage 3, bf16, both
# offloads on NVMe, one rank, on HostDevice, where the device tier is host memory too) at two
# shapes and budgets: the process's maximum RSS (getrusage of the child) is within 10% of the
# plan's device + host + process total, read from the run's own JSON (plan.plan_bytes and
# plan.process_bytes: the process's baseline, the pinned pool's slack; docs/estimate.md, "The
# process's memory").
# Usage: rss_plan_test.sh TIERZERO
set -u
bin=$1
source "$(dirname "$0")/common.sh"
run() {  # NAME ARGS... : runs bench zero, checks max RSS against the plan
  local name=$1; shift
  python3 - "$name" "$bin" bench zero --ranks 1 --steps 2 --dtype bf16 --stage 3 \
      --offload-param nvme --offload-optimizer nvme --nvme-path "$work" --json "$@" <<'PY'
import json, resource, subprocess, sys
name, cmd = sys.argv[1], sys.argv[2:]
p = subprocess.run(cmd, capture_output=True, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
if p.returncode != 0:
    print("FAIL %s: rc=%d %s" % (name, p.returncode, p.stdout[-400:] + p.stderr[-400:])); sys.exit(1)
summary = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")][-1]
plan = summary["plan"]
if not plan["device_is_host_memory"]:
    print("FAIL %s: the device is not host memory (set TZ_DEVICE=host)" % name); sys.exit(1)
total = plan["plan_bytes"]["device"] + plan["plan_bytes"]["host"] + plan["process_bytes"]
ratio = rss / total
line = "%s: max RSS %d, plan %d (device %d + host %d + process %d), RSS/plan %.3f" % (
    name, rss, total, plan["plan_bytes"]["device"], plan["plan_bytes"]["host"],
    plan["process_bytes"], ratio)
if abs(ratio - 1) > 0.10:
    print("FAIL " + line); sys.exit(1)
print("ok   " + line)
PY
  [ $? -eq 0 ] || fail=1
}
run "16x1024 64M/256M" --layers 16 --hidden 1024 --tokens 128 --device-budget 64M --host-budget 256M
run "8x1024 64M/256M" --layers 8 --hidden 1024 --tokens 128 --device-budget 64M --host-budget 256M
exit $fail
