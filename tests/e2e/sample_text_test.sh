#!/usr/bin/env bash
# `sample` through a tokenizer.json: a Llama folder (untrained weights from `bench model
# --save-weights`) with a tokenizer trained by `data train-tokenizer` in it takes a text prompt
# (the ids `data tokenize` gives for it), its --json `text` is `data detokenize` of its `ids`, the
# streamed text equals that text, and a tokenizer that does not fit is one line, exit 1.
tz="$1"
source "$(dirname "$0")/common.sh"
spec="llama:layers=2,heads=4,kv_heads=2,embd=32,ffn=48,vocab=320,seq=64"
make_text "$work/corpus.txt"
"$tz" bench model --model "$spec" --batch 1 --seq 8 --repeat 1 --threads 1 --save-weights "$work/m" > /dev/null ||
  bad "bench model --save-weights"
"$tz" data train-tokenizer --text "$work/corpus.txt" --vocab 320 --out "$work/m" > /dev/null 2>&1 &&
  [ -f "$work/m/tokenizer.json" ] && ok "a Llama folder with a tokenizer" || bad "no tokenizer in the folder"
prompt="The quick brown fox"
out=$("$tz" sample --model "$work/m" --prompt "$prompt" --tokens 24 --temperature 0 --json) || bad "sample --json exited $?"
printf '%s' "$prompt" > "$work/prompt.txt"
"$tz" data tokenize --tokenizer "$work/m" --text "$work/prompt.txt" --out "$work/prompt.bin" > /dev/null 2>&1 ||
  bad "data tokenize of the prompt"
# A streamed run, and the JSON's ids as a version-1 llm.c token file for `data detokenize`.
"$tz" sample --model "$work/m" --prompt "$prompt" --tokens 24 --temperature 0 > "$work/streamed.txt" ||
  bad "sample (streamed) exited $?"
python3 - "$work" "$out" <<'PY' || fail=1
import json, struct, sys
work, out = sys.argv[1], json.loads(sys.argv[2])
ids = out["ids"]
assert len(ids) == 24 and all(0 <= i < 320 for i in ids), ids
with open(f"{work}/prompt.bin", "rb") as f:
    head = struct.unpack("<256i", f.read(1024))
    want = list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))
assert out["prompt_ids"] == want and len(want) > 1, (out["prompt_ids"], want)
print(f"ok   prompt as text: {len(want)} ids, those of data tokenize")
with open(f"{work}/ids.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
    f.write(struct.pack(f"<{len(ids)}H", *ids))
with open(f"{work}/text.txt", "wb") as f:
    f.write(out["text"].encode("utf-8"))
PY
"$tz" data detokenize --tokenizer "$work/m" --in "$work/ids.bin" --out "$work/back.txt" > /dev/null 2>&1 ||
  bad "data detokenize"
cmp -s "$work/back.txt" "$work/text.txt" && ok "json text = data detokenize of its ids" ||
  bad "json text '$(cat "$work/text.txt")' != detokenized '$(cat "$work/back.txt")'"
printf '\n' >> "$work/text.txt"
cmp -s "$work/streamed.txt" "$work/text.txt" && ok "streamed text = json text" ||
  bad "streamed '$(cat "$work/streamed.txt")' != json '$(cat "$work/text.txt")'"
# --tokenizer FILE overrides the folder's; one that does not fit or does not load is one line.
"$tz" sample --model "$work/m" --tokenizer "$work/m/tokenizer.json" --prompt "$prompt" --tokens 2 --json > /dev/null &&
  ok "--tokenizer FILE" || bad "--tokenizer FILE"
"$tz" data train-tokenizer --text "$work/corpus.txt" --vocab 400 --out "$work/big" > /dev/null 2>&1
expect_bad() {  # NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  local err; err=$("$tz" sample --model "$work/m" --prompt "$prompt" --tokens 2 "$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -eq 1 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && echo "$err" | grep -q "^tierzero sample: .*$pattern" &&
     ! echo "$err" | grep -q "INVALID_ARGUMENT\|NOT_FOUND"; then
    ok "$name: $err"
  else
    bad "$name (rc $rc): $err"
  fi
}
expect_bad too_big "more than the model's vocabulary of 320" --tokenizer "$work/big"
expect_bad missing "nowhere" --tokenizer "$work/nowhere/tokenizer.json"
exit $fail
