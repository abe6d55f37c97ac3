#!/usr/bin/env bash
# The main job, end to end on this machine: install what is needed (skip with TZ_SKIP_SETUP=1),
# build, report the machine (`tierzero info`), then train: a byte-level GPT-2 on the King James
# Bible (Debian's bible-kjv, real English, nothing downloaded) with parameters and optimizer
# states on NVMe and a device budget several times smaller than the training state, until the
# validation loss has visibly fallen, and print a sample from the trained weights. Then short
# benchmarks of the offload path (CPU optimizer, NVMe engine, device copies, tiered store).
#   TZ_DEMO_DIR    directory for the corpus and the NVMe swap files (default: a temporary folder
#                  under /var/tmp)
#   TZ_DEMO_STEPS  training steps (default 48, about five minutes on 2 cores)
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
step "The corpus as byte-level llm.c token files" \
  "$tz" data tokenize --text "$work/kjv-train.txt" --out "$work/kjv-train.bin"
"$tz" data tokenize --text "$work/kjv-val.txt" --out "$work/kjv-val.bin"
mkdir -p "$work/weights"
model="gpt2:layers=8,heads=6,embd=384,vocab=256,seq=128"
# 14.3M parameters: 230 MB of master weights, Adam states and parameters on NVMe, 57 MB of fp32
# gradients in a 128 MiB host tier (staging included), a 96 MiB device budget holding two
# blocks' parameter shards (stage3_prefetch_bucket_size 2e6), three gathered and three gradient
# buffers and the checkpointed activations.
step "Train a ${model#gpt2:} model, parameters and optimizer states on NVMe, 96 MiB device budget" \
  "$tz" train --config configs/train/demo_nvme.json --model "$model" --nvme-path "$work" \
  --data "$work/kjv-train.bin" --val-data "$work/kjv-val.bin" --eval-every 16 --val-batches 8 \
  --checkpointing 1 --steps "${TZ_DEMO_STEPS:-48}" --shuffle --save-weights "$work/weights/model.safetensors" \
  --metrics "$work/metrics.jsonl"
step "A sample from the trained model" \
  "$tz" sample --weights "$work/weights/model.safetensors" --prompt "And the LORD said unto" \
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
