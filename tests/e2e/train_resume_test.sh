#!/usr/bin/env bash
# Checkpoints through the CLI: 3 steps saved every step (keep 2) and resumed to step 6 give the
# same params_xxh3 as 6 uninterrupted steps, with NVMe offload of parameters and optimizer at
# stage 3 on 2 ranks; the same checkpoint resumed on 1 rank at stage 1 with the optimizer on the CPU
# (accumulation doubled, so the global batch and data order stay) tracks the uninterrupted run;
# `ckpt info` verifies the checkpoint; `ckpt export` writes HF weights that `sample` loads; a
# corrupted checkpoint is refused by name before any step.
tz=$1
. "$(dirname "$0")/common.sh"
make_text "$work/train.txt"
config "$work/c.json" 3 nvme nvme
hash() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["params_xxh3"])'; }
final_loss() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["final_loss"])'; }
run() { "$tz" train --config "$work/c.json" --model "$model" --data "$work/train.txt" --ranks 2 \
          --nvme-path "$work" --json "$@"; }
whole_out=$(run --steps 6 2>/dev/null) || bad "uninterrupted run failed"
whole=$(echo "$whole_out" | hash)
run --steps 3 --save-dir "$work/ck" --save-every 1 --keep 2 > /dev/null 2>&1 || bad "saving run failed"
[ -d "$work/ck/step-000003" ] && [ -d "$work/ck/step-000002" ] && [ ! -d "$work/ck/step-000001" ] \
  || bad "keep 2 did not keep exactly steps 2 and 3: $(ls "$work/ck")"
resumed=$(run --steps 6 --resume "$work/ck" 2>/dev/null | hash) || bad "resumed run failed"
[ "$whole" = "$resumed" ] || bad "resumed params_xxh3 $resumed != uninterrupted $whole"
# Reshard at load: 2 ranks, stage 3, NVMe -> 1 rank, stage 1, CPU; 2 x 2 micro-batches per step
# become 1 x 4, so every step sums the same sequences in another order (fp32: within 1e-4).
config "$work/c1.json" 1 cpu none
sed -i 's/"gradient_accumulation_steps": 2/"gradient_accumulation_steps": 4/' "$work/c1.json"
one=$("$tz" train --config "$work/c1.json" --model "$model" --data "$work/train.txt" --ranks 1 \
        --steps 6 --resume "$work/ck" --json 2>&1) || bad "resume on 1 rank at stage 1 failed: $one"
python3 - "$(echo "$whole_out" | final_loss)" "$(echo "$one" | final_loss)" <<'PY' || bad "1-rank resume does not track the uninterrupted run"
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
print(f"     final loss uninterrupted {a:.8f}, resharded 2->1 ranks {b:.8f}")
sys.exit(0 if abs(a - b) <= 1e-4 * abs(a) else 1)
PY
"$tz" ckpt info "$work/ck" > "$work/info.txt" || bad "ckpt info failed"
grep -q "verified" "$work/info.txt" || bad "ckpt info did not verify: $(cat "$work/info.txt")"
mkdir -p "$work/hf"
"$tz" ckpt export "$work/ck" --out "$work/hf/model.safetensors" > /dev/null || bad "export failed"
"$tz" sample --weights "$work/hf/model.safetensors" --prompt "the " --tokens 8 --temperature 0 \
  > /dev/null || bad "sample could not load the exported weights"
f=$(ls "$work"/ck/step-000003/state1.safetensors)
printf '\xff' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 5 )) conv=notrunc status=none
if out=$(run --steps 6 --resume "$work/ck" 2>&1); then bad "a corrupted checkpoint was trained on"; fi
echo "$out" | grep -q "state1.safetensors" || bad "corruption not reported by file: $out"
[ "${fail:-0}" = 0 ] && echo "ok   resume: bit-identical ($whole), info, export, corruption refused"
exit "${fail:-0}"
