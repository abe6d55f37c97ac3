#!/usr/bin/env bash
# SIGTERM, the preemption signal of cluster schedulers, is handled as Ctrl-C: a 2-rank run with
# both offloads on NVMe and --save-dir stops after the current step, saves a checkpoint that
# verifies, removes its swap files, prints the summary and exits 143 (128 + SIGTERM).
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
config "$work/c.json" 3 nvme nvme
mkdir -p "$work/nvme"
"$tz" train --config "$work/c.json" --model "$model" --data "$work/train.txt" --ranks 2 \
  --nvme-path "$work/nvme" --steps 100000 --save-dir "$work/ck" --json \
  > "$work/out.json" 2> "$work/err.txt" &
pid=$!
# Wait for the first step line (steps_per_print is 1), then preempt.
for _ in $(seq 1 600); do
  grep -q "^step" "$work/err.txt" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
grep -q "^step" "$work/err.txt" || bad "no step line before the signal: $(tail -3 "$work/err.txt")"
kill -TERM "$pid"
wait "$pid"; rc=$?
[ "$rc" -eq 143 ] && ok "exit status 143 after SIGTERM" || bad "exit status $rc after SIGTERM, want 143: $(tail -3 "$work/err.txt")"
grep -q "interrupted: stopped after step" "$work/err.txt" && ok "stopped after a whole step" \
  || bad "no 'interrupted' line: $(tail -3 "$work/err.txt")"
python3 -c 'import json,sys; j=json.loads(open(sys.argv[1]).read().splitlines()[-1]); assert j["interrupted"] is True, j' \
  "$work/out.json" && ok "summary printed, interrupted: true" || bad "no JSON summary with interrupted: true"
latest=$(ls -d "$work"/ck/step-* 2>/dev/null | tail -1)
[ -n "$latest" ] && ok "checkpoint $latest saved" || bad "no checkpoint saved under $work/ck"
[ -n "$latest" ] && { "$tz" ckpt info "$latest" > /dev/null 2>&1 && ok "checkpoint verifies" \
  || bad "ckpt info $latest failed"; }
left=$(ls -d "$work"/nvme/tierzero-swap-* 2>/dev/null)
[ -z "$left" ] && ok "no swap files left" || bad "swap files left behind: $left"
exit $fail
