#!/usr/bin/env bash
# tierzero's tokenizer against Hugging Face `tokenizers` in one run:
#  1. HF trains tokenizers of each kind on the corpus (byte-level BPE with a Llama 3 Split regex,
#     the same with 65,100 added tokens so ids pass 65,535, GPT-2's ByteLevel, SentencePiece-style
#     Prepend/Replace + byte_fallback, and the Metaspace pre-tokenizer form), and one trained by
#     `tierzero data train-tokenizer`;
#  2. for each, `tierzero data tokenize` (2 threads) writes the ids of the whole corpus and HF's
#     Tokenizer.encode(whole text) must give the same ids; `tierzero data detokenize` must give
#     the corpus back byte for byte;
#  3. unless --no-speed: tokens/s of `tierzero data tokenize --threads N` (whole command: read,
#     encode, write) against HF's encode_batch over batches of 1,000 lines with
#     RAYON_NUM_THREADS=N, alternated, medians.
# tokenizers goes into a throw-away venv under build/ (never in CI).
#
# usage: bench/tokenizer_vs_hf.sh [--build build/release] [--venv build/peers-venv]
#        [--corpus FILE] [--vocab 8000] [--threads 2] [--rounds 3] [--no-speed] [--out FILE]
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="$root/build/release"
venv="$root/build/peers-venv"
corpus=""
vocab=8000
threads=2
rounds=3
speed=1
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --venv) venv="$2"; shift 2 ;;
    --corpus) corpus="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --no-speed) speed=0; shift ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "tokenizer_vs_hf: unknown argument $1" >&2; exit 2 ;;
  esac
done
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_peer_start tokenizer_vs_hf
peers_venv_need "$venv" tokenizer_vs_hf tokenizers tokenizers || exit 1
py="$(peers_python "$venv")"

work="$(mktemp -d "${TMPDIR:-/tmp}/tz_tokenizer_vs_hf.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [[ -z "$corpus" ]]; then
  command -v bible >/dev/null || { echo "tokenizer_vs_hf: no --corpus and no bible program (bible-kjv)" >&2; exit 1; }
  # The KJV, plus lines of other scripts, combining characters, emoji and \r\n, so every kind
  # meets more than ASCII.
  bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$work/corpus.txt"
  for i in $(seq 1 200); do
    printf 'Verse %d: caf\xc3\xa9 cafe\xcc\x81 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97 \xf0\x9f\x98\x80 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 line\r\n' "$i" >> "$work/corpus.txt"
  done
  corpus="$work/corpus.txt"
fi
echo "corpus: $corpus ($(wc -c < "$corpus") bytes); HF tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)')"
echo "training HF tokenizers (vocab $vocab) ..."
"$py" "$here/tokenizer_peer.py" train "$corpus" "$work/tok" "$vocab"
# The 65k tokenizer's corpus: the added tokens appear in it (some ids past 65,535).
awk 'NR % 40 == 0 { printf "<extra_%d>", (NR * 7919) % 65100 } { print }' "$corpus" > "$work/corpus_65k.txt"

# tierzero's own trainer: HF must load its tokenizer.json and give the same ids.
"$tierzero" data train-tokenizer --text "$corpus" --vocab "$vocab" --out "$work/tok/tierzero_trained" \
  --threads "$threads" 2>/dev/null

status=0
results=()
for kind in bytelevel_split bytelevel_65k gpt2 sentencepiece metaspace tierzero_trained; do
  text="$corpus"
  [[ "$kind" == bytelevel_65k ]] && text="$work/corpus_65k.txt"
  tok="$work/tok/$kind"
  "$tierzero" data tokenize --tokenizer "$tok" --text "$text" --out "$work/$kind.bin" \
    --threads "$threads" 2>/dev/null | sed "s|^|$kind: |"
  if ! "$py" "$here/tokenizer_peer.py" ids "$tok/tokenizer.json" "$text" "$work/$kind.bin" | sed "s|^|$kind: |"; then
    status=1
  fi
  "$tierzero" data detokenize --tokenizer "$tok" --in "$work/$kind.bin" --out "$work/$kind.txt" > /dev/null
  if cmp -s "$text" "$work/$kind.txt"; then
    echo "$kind: detokenize gives the text back byte for byte"
  else
    echo "$kind: detokenize DIFFERS from the text"; status=1
  fi
  if [[ "$speed" == 1 ]]; then
    tz_rates=(); hf_rates=()
    ntok=$(( ($(stat -c %s "$work/$kind.bin") - 1024) / ($(od -An -tu4 -j4 -N4 "$work/$kind.bin") * 2) ))
    for r in $(seq 1 "$rounds"); do
      t0=$(date +%s.%N)
      "$tierzero" data tokenize --tokenizer "$tok" --text "$text" --out "$work/speed.bin" --threads "$threads" > /dev/null 2>&1
      t1=$(date +%s.%N)
      tz_rates+=("$(echo "$ntok / ($t1 - $t0)" | bc -l)")
      hf_rates+=("$(RAYON_NUM_THREADS="$threads" "$py" "$here/tokenizer_peer.py" time "$tok/tokenizer.json" "$text" 1)")
    done
    tz=$(printf '%s\n' "${tz_rates[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    hf=$(printf '%s\n' "${hf_rates[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    ratio=$(echo "$tz / $hf" | bc -l)
    line=$(printf '{"bench":"tokenizer_vs_hf","kind":"%s","threads":%d,"rounds":%d,"tokens":%d,"tierzero_tokens_per_s":%.0f,"hf_encode_batch_tokens_per_s":%.0f,"ratio":%.3f}' \
      "$kind" "$threads" "$rounds" "$ntok" "$tz" "$hf" "$ratio")
    echo "$line"
    results+=("$line")
  fi
done
if [[ -n "$out" && ${#results[@]} -gt 0 ]]; then printf '%s\n' "${results[@]}" > "$out"; fi
if [[ "$status" == 0 ]]; then echo "tokenizer_vs_hf: all ids equal HF's, all texts round-trip"; fi
exit "$status"
