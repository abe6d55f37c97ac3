#!/usr/bin/env bash
# `tierzero data` through a tokenizer, end to end on the real executable: train-tokenizer writes a
# tokenizer.json, tokenize on 3 threads gives the ids of 1 thread, inspect reads the file,
# detokenize gives the text back byte for byte; the refusals exit 1 with one line naming the file.
set -u
tz=$1
data=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

python3 - "$work/corpus.txt" <<'PY'
import sys
words = ["the", "light", "darkness", "waters", "God", "said", "caf\u00e9", "\u4e2d\u6587", "1234"]
with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
    for i in range(4000):
        line = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(1 + i % 11))
        f.write(line + (".\r\n" if i % 13 == 0 else "\n"))
PY
"$tz" data train-tokenizer --text "$work/corpus.txt" --vocab 400 --out "$work/tok" > /dev/null 2>&1 \
  && [ -f "$work/tok/tokenizer.json" ] && ok "train-tokenizer" || bad "train-tokenizer"
"$tz" data tokenize --tokenizer "$work/tok" --text "$work/corpus.txt" --out "$work/a.bin" --threads 1 > /dev/null 2>&1 || bad "tokenize 1 thread"
"$tz" data tokenize --tokenizer "$work/tok/tokenizer.json" --text "$work/corpus.txt" --out "$work/b.bin" --threads 3 > /dev/null 2>&1 || bad "tokenize 3 threads"
cmp -s "$work/a.bin" "$work/b.bin" && ok "3 threads give the ids of 1" || bad "threads change the ids"
[ ! -e "$work/a.bin.tmp" ] || bad "tokenize left its temporary file"
"$tz" data inspect "$work/a.bin" --json | grep -q '"version":1' && ok "inspect" || bad "inspect"
"$tz" data detokenize --tokenizer "$work/tok" --in "$work/a.bin" --out "$work/back.txt" > /dev/null 2>&1 || bad "detokenize"
cmp -s "$work/corpus.txt" "$work/back.txt" && ok "round trip" || bad "detokenize differs from the text"
# A committed tokenizer trained by HF: the ids of a text with a special token at the start and end.
printf '<|endoftext|>Hello world<|endoftext|>' > "$work/special.txt"
"$tz" data tokenize --tokenizer "$data/gpt2.json" --text "$work/special.txt" --out "$work/s.bin" > /dev/null 2>&1
got=$(python3 -c "import array,sys; b=open(sys.argv[1],'rb').read(); print(array.array('H', b[1024:]).tolist())" "$work/s.bin")
want=$(python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(next(c['ids'] for c in e['files']['gpt2.json'] if c['text']=='<|endoftext|>Hello world<|endoftext|>'))" "$data/expected.json")
[ "$got" = "$want" ] && ok "special tokens at start and end: $got" || bad "special tokens: $got, HF $want"

# expect NAME SUBSTRING ARGS...: rc 1, one error line (after the progress lines) containing
# SUBSTRING.
expect() {
  local name=$1 want=$2; shift 2
  local err rc lines
  "$tz" data "$@" > /dev/null 2> "$work/err"; rc=$?
  err=$(grep '^tierzero data' "$work/err")
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && printf '%s' "$err" | grep -qF -- "$want"; then
    ok "$name: $err"
  else
    bad "$name: rc=$rc lines=$lines (want '$want'): $err"
  fi
}
printf 'good text\nthen \xff bad\n' > "$work/bad.txt"
printf '{"model": {"type": "Unigram", "vocab": []}}' > "$work/unigram.json"
expect invalid_utf8 "offset 15" tokenize --tokenizer "$work/tok" --text "$work/bad.txt" --out "$work/bad.bin"
[ ! -e "$work/bad.bin" ] && [ ! -e "$work/bad.bin.tmp" ] || bad "a refused tokenize left a file"
expect unigram "Unigram" tokenize --tokenizer "$work/unigram.json" --text "$work/corpus.txt" --out "$work/u.bin"
expect missing_tokenizer "nothere" tokenize --tokenizer "$work/nothere" --text "$work/corpus.txt" --out "$work/u.bin"
expect small_vocab "257" train-tokenizer --text "$work/corpus.txt" --vocab 100 --out "$work/t2"
expect train_invalid_utf8 "bad.txt" train-tokenizer --text "$work/bad.txt" --vocab 300 --out "$work/t3"
python3 -c "import struct,sys; open(sys.argv[1],'wb').write(struct.pack('<3i',20240520,1,3)+bytes(1012)+struct.pack('<3H',1,2,600))" "$work/big.bin"
expect id_past_vocab "token 600 at position 2" detokenize --tokenizer "$data/gpt2.json" --in "$work/big.bin" --out "$work/x.txt"
[ ! -e "$work/x.txt" ] || bad "a refused detokenize wrote its output"
exit $fail
