#!/usr/bin/env bash
# The step's bound carries the NVMe and copy terms measured in the same run (docs/train.md, "The
# step's bound"): a stage-3 run with both offloads on NVMe reports disk bandwidths > 0 in its
# summary and in every --metrics line, each step's bound_s is at least the NVMe term computed here
# from the reported bytes and bandwidths over the run's raise of them (nvme_ceiling_scale, which
# is at least 1, never falls, and is said once when it first rises), equal to it when bound_term
# says "nvme", and bound_term is one of the documented names; every line and the summary carry
# the terms (bound_terms_s), the bound is their max by the documented rule and its term names the
# one that set it, the NVMe term is the one computed here, and the shared-cores union (a
# host-memory device) lies within the step's window; a run without NVMe reports no disk bandwidth
# and never "nvme" (its NVMe term null); --no-bandwidth-probe measures nothing and leaves both
# terms out (null). The probe leaves no file behind.
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
mkdir -p "$work/nvme"
# A host tier of 1 MiB (the least this model's plan takes) so the states move to and from NVMe.
config "$work/c_nvme.json" 3 nvme nvme ', "tierzero": {"host_budget": "1M"}'
config "$work/c_cpu.json" 3 cpu cpu
run() {  # NAME CONFIG [flags...]
  local name=$1 cfg=$2
  shift 2
  "$tz" train --config "$cfg" --model "$model" --data "$work/train.txt" --steps 3 \
    --metrics "$work/$name.jsonl" --json "$@" > "$work/$name.json" 2> "$work/$name.err" \
    || { bad "$name: train exited $?"; cat "$work/$name.err"; }
}
run nvme "$work/c_nvme.json" --nvme-path "$work/nvme"
run cpu "$work/c_cpu.json"
run noprobe "$work/c_nvme.json" --nvme-path "$work/nvme" --no-bandwidth-probe
# A run the plan refuses (a device budget below the plan's irreducible minimum) fails with the
# plan's error and never runs the disk probe: the ranks measure the bandwidths after the engine
# has checked its plan. strace shows whether the probe's file (tierzero-train-probe.PID) was
# opened; without strace the check is skipped.
config "$work/c_refused.json" 3 nvme nvme ', "tierzero": {"device_budget": "64K"}'
if command -v strace > /dev/null && strace -o /dev/null true 2> /dev/null; then
  strace -f -e trace=openat -o "$work/refused.strace" "$tz" train --config "$work/c_refused.json" \
    --model "$model" --data "$work/train.txt" --steps 1 --nvme-path "$work/nvme" \
    > /dev/null 2> "$work/refused.err"
  rc=$?
  if [ "$rc" = 1 ] && grep -q "engine plan" "$work/refused.err" \
     && ! grep -q "tierzero-train-probe" "$work/refused.strace"; then
    ok "a run the plan refuses fails with the plan's error before any disk probe"
  else
    bad "refused run: rc $rc, $(tail -1 "$work/refused.err"), probe opened: $(grep -c tierzero-train-probe "$work/refused.strace")"
  fi
else
  echo "skip the refused run's probe check: no usable strace"
fi
left=$(ls "$work/nvme" | grep -c probe)
[ "$left" = 0 ] && ok "no probe file left in the swap path" || bad "probe files left: $(ls "$work/nvme")"
python3 - "$work" <<'PY' || fail=1
import json, os, re, sys
work = sys.argv[1]
names = {"compute", "optimizer", "nvme", "copy"}
def load(name):
    lines = [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
    summary = json.load(open(f"{work}/{name}.json"))
    err = open(f"{work}/{name}.err").read()
    assert [l["step"] for l in lines] == [1, 2, 3], name
    for l in lines + [summary]:
        assert l["bound_term"] in names, (name, l["bound_term"])
        assert l["bandwidth_bytes_per_s"] == summary["bandwidth_bytes_per_s"], (name, l)
        assert set(l["bandwidth_bytes_per_s"]) == {"nvme_read", "nvme_write", "copy"}, l
    for l in lines:
        # The process's CPU time in the step: some, and no more than its cores give it.
        assert 0 < l["process_cpu_s"] <= l["step_s"] * (os.cpu_count() or 1) * 1.02 + 0.02, (name, l)
        assert isinstance(l["trace_followed"], bool) and (l["step"] > 1 or not l["trace_followed"]), l
    # The text step lines name the term: "bound 0.123 s (compute)".
    terms = re.findall(r"bound [0-9.]+ s \(([a-z]+)\)", err)
    assert terms == [l["bound_term"] for l in lines], (name, terms, err)
    for l in lines + [summary]:
        check_terms(name, l)
    return lines, summary, err

def check_terms(name, l):
    """bound_s is the max of the terms (docs/zero.md): compute and optimizer are one term where
    the cores are shared (the union, at least each of the two), separate terms otherwise; null
    terms are out. Per step (not the summary's medians): the union lies within the step."""
    t = l["bound_terms_s"]
    assert list(t) == ["compute", "optimizer", "shared_busy", "nvme", "copy"], (name, t)
    assert t["compute"] is not None and t["optimizer"] is not None, (name, t)
    if "summary" in l or "step" not in l:
        return
    cores = {"compute": t["compute"], "optimizer": t["optimizer"]}
    if t["shared_busy"] is not None:
        assert t["shared_busy"] <= l["step_s"] * 1.01 + 0.01, (name, l["step"], t, l["step_s"])
        cores = {"compute": max(t["shared_busy"], t["compute"], t["optimizer"])}
    cand = dict(cores)
    for k in ("nvme", "copy"):
        if t[k] is not None:
            cand[k] = t[k]
    best = max(cand.values())
    assert abs(l["bound_s"] - best) <= 1e-9 * max(best, 1e-12), (name, l["step"], l["bound_s"], cand)
    assert abs(cand[l["bound_term"]] - best) <= 1e-9 * max(best, 1e-12), (name, l["bound_term"], cand)

lines, s, err = load("nvme")
bw = s["bandwidth_bytes_per_s"]
# A step that moved its bytes faster than the probe allows raises the disk's ceiling for the rest
# of the run (the probe met a stall): the scale never falls below 1 nor goes down, the run says so
# once when it first rises and only then, and the summary carries the last step's.
scales = [l["nvme_ceiling_scale"] for l in lines]
assert scales[0] >= 1 and all(b >= a for a, b in zip(scales, scales[1:])), scales
said = err.count("the bound's disk ceiling is raised")
assert said == (1 if scales[-1] > 1 else 0), (scales, said)
assert s["nvme_ceiling_scale"] == scales[-1], (s["nvme_ceiling_scale"], scales)
# Only a step too short to calibrate by (under 0.25 s) can still pass its NVMe term: warned once.
over = [l for l in lines if l["bound_terms_s"]["nvme"] > 1.05 * l["step_s"]]
assert all(l["step_s"] < 0.25 for l in over), over
assert err.count("too short to raise the disk's ceiling by") == (1 if over else 0), (over, err)
assert bw["nvme_read"] > 0 and bw["nvme_write"] > 0 and bw["copy"] > 0, bw
assert re.search(r"^bound bandwidths: disk read [0-9.]+ GB/s, write [0-9.]+ GB/s; copy [0-9.]+ GB/s", err, re.M), err
for l in lines:
    # The update streams into the next forward (docs/zero.md), so its NVMe traffic falls in the
    # next step: step 1 may move nothing, every later one moves the previous update's states.
    if l["step"] >= 2:
        assert l["nvme_read_bytes"] > 0 and l["nvme_write_bytes"] > 0, l
    nvme_s = (l["nvme_read_bytes"] / bw["nvme_read"] + l["nvme_write_bytes"] / bw["nvme_write"]) \
        / l["nvme_ceiling_scale"]
    assert l["bound_s"] >= nvme_s * (1 - 1e-9), (l["step"], l["bound_s"], nvme_s)
    if l["bound_term"] == "nvme":
        assert abs(l["bound_s"] - nvme_s) <= 1e-9 * nvme_s, (l["step"], l["bound_s"], nvme_s)
    assert abs(l["bound_terms_s"]["nvme"] - nvme_s) <= 1e-9 * max(nvme_s, 1e-12), (l, nvme_s)
    assert l["bound_terms_s"]["copy"] is not None, l
print(f"ok   nvme: read {bw['nvme_read']/1e9:.2f} GB/s write {bw['nvme_write']/1e9:.2f} GB/s, "
      f"bounds {[round(l['bound_s'], 4) for l in lines]} >= their NVMe terms, terms "
      f"{[l['bound_term'] for l in lines]}, the max of {[l['bound_terms_s'] for l in lines]}")

lines, s, err = load("cpu")
bw = s["bandwidth_bytes_per_s"]
assert bw["nvme_read"] == 0 and bw["nvme_write"] == 0 and bw["copy"] > 0, bw
assert all(l["bound_term"] != "nvme" for l in lines + [s]), lines
assert "disk read" not in err, err
assert all(l["bound_terms_s"]["nvme"] is None and l["bound_terms_s"]["copy"] is not None
           for l in lines + [s]), lines
assert all(l["nvme_ceiling_scale"] == 1 for l in lines + [s]), lines
print("ok   no NVMe: no disk bandwidth, never bound by nvme")

lines, s, err = load("noprobe")
assert s["bandwidth_bytes_per_s"] == {"nvme_read": 0, "nvme_write": 0, "copy": 0}, s
assert all(l["bound_term"] in ("compute", "optimizer") for l in lines + [s]), lines
assert "bound bandwidths" not in err, err
assert all(l["bound_terms_s"]["nvme"] is None and l["bound_terms_s"]["copy"] is None
           for l in lines + [s]), lines
assert all(l["nvme_ceiling_scale"] == 1 for l in lines + [s]), lines
print("ok   --no-bandwidth-probe: nothing measured, the bound without NVMe and copies")
PY
exit $fail
