#!/usr/bin/env bash
# `tierzero config check`: every configs/bad file exits non-zero with exactly one error line
# naming a key (or the file problem); every configs/good file exits 0 with one OK line.
set -u
tz=$1 dir=$2
fail=0
for f in "$dir"/bad/*.json "$dir/bad/does-not-exist.json"; do
  out=$("$tz" config check "$f" 2>&1 >/dev/null); rc=$?
  lines=$(printf '%s\n' "$out" | grep -c ': error: ')
  if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL $f: rc=$rc error lines=$lines: $out"; fail=1
  else
    echo "ok   $f: $out"
  fi
done
for f in "$dir"/good/*.json; do
  out=$("$tz" config check "$f" 2>&1); rc=$?
  if [ "$rc" -ne 0 ] || [ "$out" != "$f: OK" ]; then
    echo "FAIL $f: rc=$rc: $out"; fail=1
  else
    echo "ok   $f"
  fi
done
# --print shows the resolved config with defaults, as JSON.
"$tz" config check --print "$dir/good/ds_zero2_cpu_offload.json" | tail -n +2 |
  python3 -c 'import json,sys; c=json.load(sys.stdin); assert c["aio"]["queue_depth"]==32, c' ||
  { echo "FAIL --print"; fail=1; }
exit $fail
