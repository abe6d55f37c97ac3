#!/usr/bin/env bash
# The main job, end to end on this machine: install what is needed (skip with TZ_SKIP_SETUP=1),
# build, report the machine (`tierzero info`), then train: a byte-level BPE tokenizer (4096 ids)
# learned from the King James Bible (Debian's bible-kjv, real English, nothing downloaded), the
# corpus tokenized with it, and a Llama-architecture model trained on it with parameters and
# optimizer states on NVMe and a device budget several times smaller than the training state,
# until the validation loss has visibly fallen; the validation loss is also printed in nats per
# byte (comparable with byte-level models), and a sample from the trained weights is decoded by
# the tokenizer as it is generated. Then short benchmarks of the offload path (CPU optimizer,
# NVMe engine, device copies, tiered store).
#   TZ_DEMO_DIR    directory for the corpus and the NVMe swap files (default: a temporary folder
#                  under /var/tmp)
#   TZ_DEMO_STEPS  training steps (default 160; a step costs about what the byte-level GPT-2
#                  demo's did, about six minutes on 2 cores in all)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ "${TZ_SKIP_SETUP:-0}" != "1" ]; then scripts/setup.sh; fi

build_dir=${TZ_BUILD_DIR:-build/release}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build_dir" --parallel "${TZ_JOBS:-$(nproc)}" --target tierzero
tz="$build_dir/src/cli/tierzero"

work=${TZ_DEMO_DIR:-$(mktemp -d /var/tmp/tierzero-demo.XXXXXX)}
mkdir -p "$work"
cleanup() { if [ -z "${TZ_DEMO_DIR:-}" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

step() { printf '\n== %s\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "The machine" "$tz" info --path "$work"
step "A ZeRO-3 NVMe-offload config" "$tz" config check configs/good/ds_zero3_nvme_offload.json

# The corpus: the whole KJV as plain text without verse references; the last 5% held out.
if ! command -v bible >/dev/null 2>&1; then
  echo "demo: the bible program is missing (Debian package bible-kjv; scripts/setup.sh installs it)" >&2
  exit 1
fi
bible -f "Gen1:1-Rev22:21" | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$work/kjv.txt"
total=$(wc -c < "$work/kjv.txt")
head -c $((total * 95 / 100)) "$work/kjv.txt" > "$work/kjv-train.txt"
tail -c $((total - total * 95 / 100)) "$work/kjv.txt" > "$work/kjv-val.txt"
step "A byte-level BPE tokenizer of 4096 ids learned from the training text" \
  "$tz" data train-tokenizer --text "$work/kjv-train.txt" --vocab 4096 --out "$work/tok"
step "The corpus as llm.c token files of that tokenizer" \
  "$tz" data tokenize --tokenizer "$work/tok" --text "$work/kjv-train.txt" --out "$work/kjv-train.bin"
"$tz" data tokenize --tokenizer "$work/tok" --text "$work/kjv-val.txt" --out "$work/kjv-val.bin"
model="llama:layers=8,heads=6,kv_heads=2,embd=384,ffn=1024,vocab=4096,seq=128"
# 15.7M parameters (12.6M in the blocks, 3.1M in the untied embedding and head; per token about
# the multiply-adds of the 14.3M byte-level GPT-2 this demo trained before): 250 MB of master
# weights, Adam states and parameters on NVMe, 63 MB of fp32 gradients in a 128 MiB host tier
# (staging included), a 96 MiB device budget holding two blocks' parameter shards
# (stage3_prefetch_bucket_size 2e6), three gathered and three gradient buffers and the
# checkpointed activations.
step "Train a ${model#llama:} model, parameters and optimizer states on NVMe, 96 MiB device budget" \
  "$tz" train --config configs/train/demo_nvme.json --model "$model" --nvme-path "$work" \
  --data "$work/kjv-train.bin" --val-data "$work/kjv-val.bin" --eval-every 40 --val-batches 8 \
  --checkpointing 1 --steps "${TZ_DEMO_STEPS:-160}" --shuffle --save-weights "$work/model" \
  --metrics "$work/metrics.jsonl"
# The loss per token in nats per byte: times the validation file's tokens per byte.
val_loss=$(grep -o '"val_loss":[0-9.eE+-]*' "$work/metrics.jsonl" | tail -n 1 | cut -d: -f2)
val_tokens=$("$tz" data inspect "$work/kjv-val.bin" --json | grep -o '"tokens":[0-9]*' | cut -d: -f2)
val_bytes=$(wc -c < "$work/kjv-val.txt")
awk -v l="$val_loss" -v t="$val_tokens" -v b="$val_bytes" 'BEGIN {
  printf "\nvalidation loss %.3f nats per token = %.3f nats per byte (%d tokens for %d bytes; the\n", l, l * t / b, t, b
  printf "byte-level GPT-2 this demo trained before reached about 2.5 nats per byte)\n" }'
cp "$work/tok/tokenizer.json" "$work/model/"
step "A sample from the trained model, decoded by the tokenizer as it is generated" \
  "$tz" sample --model "$work/model" --prompt "And the LORD said unto" \
  --tokens 200 --temperature 0.8 --top-k 40 --seed 1
step "CPU AdamW: fused bf16-gradient update with bf16 copy, against the same-run memory ceiling" \
  "$tz" bench adam --params 32M --grad-dtype bf16 --param-copy bf16 --repeat 3
step "NVMe engine: O_DIRECT writes then reads" \
  "$tz" bench nvme --path "$work" --rw write --size 512M --bs 8M --qd 32 --repeat 2 --keep-file
step "NVMe engine: O_DIRECT reads" \
  "$tz" bench nvme --path "$work" --rw read --size 512M --bs 8M --qd 32 --repeat 2
step "Device copies (HostDevice without a GPU)" "$tz" bench copy --size 64M --repeats 3
step "Tiered store: a 1 GiB model walked forward and backward as stage-3 training does" \
  "$tz" bench store --model-bytes 1G --layers 16 --device-budget 128M --host-budget 256M \
  --nvme-path "$work" --compute-ms-per-layer 20 --steps 3
printf '\ndemo: done\n'
