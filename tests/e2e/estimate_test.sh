#!/usr/bin/env bash
# `tierzero estimate --measure --json` on a small shape, 2 rank threads, bf16, stages 1-3 with and
# without offload (cpu, nvme, of the optimizer and of the parameters): on every tier the measured
# peak of two training steps never passes the engine's plan, and is within 10% of it (a tier
# planned at 0 bytes must measure 0). Correctness of the plan, not timing. Also: --all prints one
# row per stage and offload choice, and bad input is one line.
tz=$1
. "$(dirname "$0")/common.sh"
shape="gpt2:layers=2,heads=4,embd=128,vocab=1024,seq=64"
for combo in "1 none none" "2 none none" "3 none none" "1 cpu none" "2 cpu none" "1 nvme none" \
             "2 nvme none" "3 cpu none" "3 nvme none" "3 none cpu" "3 none nvme" "3 cpu cpu" \
             "3 nvme nvme" "3 cpu nvme"; do
  set -- $combo
  name="stage$1-opt_$2-param_$3"
  config "$work/$name.json" "$1" "$2" "$3" ', "bf16": {"enabled": true}'
  nvme=()
  if [ "$2" = nvme ] || [ "$3" = nvme ]; then nvme=(--nvme-path "$work"); fi
  out=$("$tz" estimate --config "$work/$name.json" --model "$shape" --ranks 2 --seq 64 \
        --measure --json "${nvme[@]}" 2>"$work/$name.err"); rc=$?
  if [ "$rc" -ne 0 ]; then bad "$name: rc=$rc: $(tail -1 "$work/$name.err")"; continue; fi
  verdict=$(printf '%s' "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
plan, peak = j["plan_bytes"], j["measured_peak_bytes"]
bad = []
for tier in ("device", "host", "nvme"):
    p, m = plan[tier], peak[tier]
    ok = (m == 0) if p == 0 else (m <= p and p - m <= 0.10 * p)
    if not ok:
        bad.append("%s plan %d measured %d (%.3f)" % (tier, p, m, m / p if p else float("inf")))
print("; ".join(bad) if bad else "ok " + " ".join(
    "%s %.3f" % (t, peak[t] / plan[t]) for t in ("device", "host", "nvme") if plan[t]))
')
  case "$verdict" in
    ok*) ok "$name: measured/plan ${verdict#ok }" ;;
    *) bad "$name: $verdict" ;;
  esac
done
config "$work/all.json" 3 none none ', "bf16": {"enabled": true}'
rows=$("$tz" estimate --config "$work/all.json" --model "$shape" --ranks 2 --all --json |
       python3 -c 'import json,sys; print(len(json.load(sys.stdin)["rows"]))')
if [ "$rows" = 16 ]; then ok "--all: 16 rows"; else bad "--all: $rows rows, expected 16"; fi
err=$("$tz" estimate --config "$work/all.json" --model "gpt2:layers=0" 2>&1 >/dev/null); rc=$?
if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ]; then
  ok "bad model: one line, rc 1: $err"
else
  bad "bad model: rc=$rc: $err"
fi
# Adapters given twice are refused as train refuses them (one function resolves both).
err=$("$tz" estimate --config "$work/all.json" --model "$shape" --lora r=4 --adapter "$work" 2>&1 >/dev/null); rc=$?
if [ "$rc" -eq 1 ] && [ "$err" = "tierzero estimate: --lora and --adapter both give the adapters; give one" ]; then
  ok "--lora with --adapter: $err"
else
  bad "--lora with --adapter: rc=$rc: $err"
fi
# Ranks as threads: each rank's overlap pool (delayed's pending update) is the process's too, so
# the host check counts it per rank beside the engine's pool.
config "$work/delayed.json" 1 cpu none ', "bf16": {"enabled": true}, "tierzero": {"overlap": "delayed"}'
out=$("$tz" estimate --config "$work/delayed.json" --model "$shape" --ranks 2 2>&1)
if printf '%s\n' "$out" | grep -Eq "host: 2 x [0-9.]+ [KMG]iB pinned \([0-9.]+ [KMG]iB of it the overlap mode's\)"; then
  ok "delayed on 2 ranks: $(printf '%s\n' "$out" | grep -o 'host: 2 x [^=]*')"
else
  bad "delayed on 2 ranks: the host check leaves out the overlap pools: $(printf '%s\n' "$out" | grep 'host:')"
fi
# A swap path that train would refuse (a file, not a folder) does not fit here either.
config "$work/nvme.json" 3 nvme nvme
: > "$work/a_file"
out=$("$tz" estimate --config "$work/nvme.json" --model "$shape" --nvme-path "$work/a_file" 2>&1)
if printf '%s\n' "$out" | grep -q "fits this machine: no (nvme)" &&
   printf '%s\n' "$out" | grep -q "is a file, not a folder"; then
  ok "a file as the NVMe path: does not fit, named"
else
  bad "a file as the NVMe path: $out"
fi
exit $fail
