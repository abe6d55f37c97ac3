#!/usr/bin/env bash
# The main job, end to end on this machine: install what is needed (skip with TZ_SKIP_SETUP=1),
# build, report the machine (`tierzero info`), validate a ZeRO-3 NVMe-offload config, and run
# short benchmarks of the offload path (CPU optimizer, NVMe engine, device copies, tiered
# store). Training itself (zero/, model/) is not built yet; this is the most complete job so far.
#   TZ_DEMO_DIR  directory for the NVMe swap files (default: a temporary folder under /var/tmp)
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
