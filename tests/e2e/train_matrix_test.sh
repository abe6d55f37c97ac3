#!/usr/bin/env bash
# A tiny run under each ZeRO stage and offload choice through the CLI, on 2 rank threads: every
# one finishes and, as the engine's exact overlap promises, lands on the same weights (xxh3) as
# the stage-0, no-offload run (fp32 all through, the same reduction order).
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
ref=""
for combo in "0 none none" "1 none none" "2 none none" "3 none none" "1 cpu none" "2 cpu none" \
             "3 cpu none" "3 cpu cpu" "3 nvme none" "3 nvme nvme" "3 cpu nvme"; do
  set -- $combo
  name="stage$1-opt_$2-param_$3"
  config "$work/$name.json" "$1" "$2" "$3"
  nvme=()
  if [ "$2" = nvme ] || [ "$3" = nvme ]; then nvme=(--nvme-path "$work"); fi
  out=$("$tz" train --config "$work/$name.json" --model "$model" --data "$work/train.txt" \
        --steps 2 --ranks 2 "${nvme[@]}" --json 2>"$work/$name.err"); rc=$?
  if [ "$rc" -ne 0 ]; then bad "$name: rc=$rc: $(tail -1 "$work/$name.err")"; continue; fi
  h=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["params_xxh3"])')
  [ -z "$ref" ] && ref=$h
  if [ "$h" = "$ref" ]; then ok "$name: params_xxh3 $h"; else bad "$name: params_xxh3 $h != stage 0's $ref"; fi
done
exit $fail
