#!/usr/bin/env bash
# Two ranks as threads (--ranks 2, LocalComm) and as processes (mpirun -np 2, MpiComm) train to
# bit-identical weights: the same params_xxh3, and the same per-step losses (one kernel thread
# per rank in both, so the kernels sum in the same order).
tz=$1 mpirun=$2
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
config "$work/c.json" 3 cpu none
args=(train --config "$work/c.json" --model "$model" --data "$work/train.txt" --steps 3 --shuffle --seed 5 --cpu-threads 1 --json)
a=$("$tz" "${args[@]}" --ranks 2 --metrics "$work/threads.jsonl") || bad "--ranks 2 exited $?"
b=$($mpirun "$tz" "${args[@]}" --metrics "$work/procs.jsonl" | grep '^{') || bad "mpirun exited $?"
ha=$(printf '%s' "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["params_xxh3"])')
hb=$(printf '%s' "$b" | python3 -c 'import json,sys; print(json.load(sys.stdin)["params_xxh3"])')
if [ -n "$ha" ] && [ "$ha" = "$hb" ]; then ok "params_xxh3 $ha both ways"; else bad "threads $ha, processes $hb"; fi
la=$(python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$work/threads.jsonl")
lb=$(python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$work/procs.jsonl")
if [ "$la" = "$lb" ]; then ok "losses $la"; else bad "losses threads $la, processes $lb"; fi
exit $fail
