#!/usr/bin/env bash
# The Llama family through the executable: a folder written by `bench model --save-weights`
# trains with `train --model DIR` (stage 0 and stage 3, 2 ranks each, give the same params_xxh3),
# saves a folder (`--save-weights DIR`, tokenizer copied) that `sample --model DIR` decodes from,
# `ckpt export` writes the same weights as a folder, and bad folders are one line, exit 1, nothing
# written.
tz="$1"
source "$(dirname "$0")/common.sh"
spec="llama:layers=2,heads=4,kv_heads=2,embd=32,ffn=48,vocab=256,seq=32"
make_text "$work/train.txt"
config "$work/stage0.json" 0 none none
config "$work/stage3.json" 3 cpu cpu
"$tz" bench model --model "$spec" --batch 1 --seq 8 --repeat 1 --threads 1 --save-weights "$work/init" > /dev/null ||
  bad "bench model --save-weights DIR"
[ -f "$work/init/config.json" ] && [ -f "$work/init/model.safetensors" ] && ok "a Llama folder written" || bad "no folder from bench model"
echo '{"version": "1.0"}' > "$work/init/tokenizer.json"
h0=$("$tz" train --config "$work/stage0.json" --model "$work/init" --data "$work/train.txt" --steps 3 --seq 16 --ranks 2 \
       --save-weights "$work/out" --save-dir "$work/ckpt" --json | sed -n 's/.*"params_xxh3":"\([0-9a-f]*\)".*/\1/p')
h3=$("$tz" train --config "$work/stage3.json" --model "$work/init" --data "$work/train.txt" --steps 3 --seq 16 \
       --ranks 2 --json | sed -n 's/.*"params_xxh3":"\([0-9a-f]*\)".*/\1/p')
[ -n "$h0" ] && ok "train --model DIR ($h0)" || bad "train --model DIR"
[ "$h0" = "$h3" ] && ok "stage 3 on 2 ranks = stage 0" || bad "stage 3 $h3 != stage 0 $h0"
[ -f "$work/out/model.safetensors" ] && [ -f "$work/out/tokenizer.json" ] && ok "saved folder with the tokenizer" ||
  bad "saved folder incomplete: $(ls "$work/out")"
# The placeholder tokenizer.json is no tokenizer sample can load (sample_text_test.sh uses a real one).
rm "$work/out/tokenizer.json"
out=$("$tz" sample --model "$work/out" --prompt "1 2 3" --tokens 6 --temperature 0 --json)
echo "$out" | grep -Eq '"ids":\[[0-9]+(,[0-9]+){5}\]' && ok "sample --model DIR" || bad "sample: $out"
"$tz" ckpt export "$work/ckpt" --out "$work/exported" > /dev/null && cmp -s "$work/exported/model.safetensors" "$work/out/model.safetensors" &&
  ok "ckpt export = --save-weights" || bad "ckpt export differs from --save-weights"
# Vocabulary chunks forced (vocab_chunks=3: units embed.0-2 and lm_head.0-2, docs/model.md) on
# stage 3 with 2 ranks: the checkpoint exports the folder --save-weights writes, whose embedding
# and head are one tensor each, and a sample decodes from it.
"$tz" train --config "$work/stage3.json" --model "$spec,vocab_chunks=3" --data "$work/train.txt" --steps 2 \
  --seq 16 --ranks 2 --save-weights "$work/out_c" --save-dir "$work/ckpt_c" --json > /dev/null &&
  ok "train with vocab_chunks=3" || bad "train with vocab_chunks=3"
"$tz" ckpt export "$work/ckpt_c" --out "$work/exported_c" > /dev/null &&
  cmp -s "$work/exported_c/model.safetensors" "$work/out_c/model.safetensors" &&
  ok "chunked: ckpt export = --save-weights" || bad "chunked: ckpt export differs from --save-weights"
header=$(head -c 4096 "$work/out_c/model.safetensors" | tr -d '\0' | tr -c '[:print:]' ' ')
echo "$header" | grep -q '"model.embed_tokens.weight":{"dtype":"F32","shape":\[256,32\]' &&
  echo "$header" | grep -q '"lm_head.weight":{"dtype":"F32","shape":\[256,32\]' &&
  ok "chunked: one embedding and one head tensor" || bad "chunked: the folder's tensors: $header"
out=$("$tz" sample --model "$work/out_c" --prompt "1 2 3" --tokens 4 --temperature 0 --json)
echo "$out" | grep -Eq '"ids":\[[0-9]+(,[0-9]+){3}\]' && ok "sample from the chunked model's folder" || bad "sample: $out"
# Bad folders: one line naming the file, exit 1, nothing written.
mkdir -p "$work/empty"
expect_bad() {  # NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  local err; err=$("$tz" train --config "$work/stage0.json" --data "$work/train.txt" --steps 1 --seq 16 \
                   --save-weights "$work/never_$name" "$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q -- "$pattern" && [ ! -e "$work/never_$name" ]; then
    ok "$name: $err"
  else
    bad "$name (rc $rc): $err"
  fi
}
expect_bad no_config "empty/config.json" --model "$work/empty"
cp -r "$work/init" "$work/cut"
truncate -s -100 "$work/cut/model.safetensors"
expect_bad truncated "cut/model.safetensors" --model "$work/cut"
cp -r "$work/init" "$work/yarn"
sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 2.0}/' "$work/yarn/config.json"
expect_bad rope_type "rope_scaling.rope_type" --model "$work/yarn"
exit $fail
