#!/usr/bin/env bash
# The error convention with --json (docs/cli.md): a failed command given --json prints the
# stderr line "tierzero <command>: <what>" and, on stdout, one JSON object
# {"error": "<the same what>", "command": "<command>"}; without --json stdout stays empty.
tz=$1
. "$(dirname "$0")/../e2e/common.sh"
make_text "$work/good.txt"
config "$work/stage0.json" 0 none none
: > "$work/notackpt"
# expect NAME COMMAND-WORDS ARGS...: exit 1, one stderr line "tierzero <words>: X", and stdout
# exactly {"error": "X", "command": "<words>"}.
expect() {
  local name=$1 words=$2; shift 2
  local out err rc
  out=$("$tz" "$@" 2>"$work/err"); rc=$?
  err=$(cat "$work/err")
  if python3 - "$words" "$err" "$out" <<'PY'
import json, sys
words, err, out = sys.argv[1:]
prefix = "tierzero " + words + ": "
assert err.count("\n") == 0 and err.startswith(prefix), "stderr: " + err
lines = out.strip().splitlines()
j = json.loads(lines[-1])
assert j == {"error": err[len(prefix):], "command": words}, j
PY
  then [ "$rc" -eq 1 ] && ok "$name: $out" || bad "$name: rc=$rc"
  else bad "$name: rc=$rc stdout='$out' stderr='$err'"; fi
}
expect train train train --json --config "$work/missing.json" --model "$model" --data "$work/good.txt" --steps 1
expect train_data train train --json --config "$work/stage0.json" --model "$model" --data "$work/missing.txt" --steps 1
expect estimate estimate estimate --json --config "$work/missing.json" --model "$model"
expect ckpt_info "ckpt info" ckpt info --json "$work/notackpt"
expect data_inspect "data inspect" data inspect --json "$work/missing.bin"
expect bench_nvme "bench nvme" bench nvme --json --path "$work/notackpt" --size 1M
# Without --json a failure prints nothing on stdout.
out=$("$tz" estimate --config "$work/missing.json" --model "$model" 2>/dev/null)
[ -z "$out" ] && ok "no --json: stdout empty" || bad "no --json: stdout '$out'"
exit $fail
