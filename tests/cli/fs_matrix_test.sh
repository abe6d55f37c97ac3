#!/usr/bin/env bash
# Outputs on a read-only and on a full file system, through the real executable (docs/cli.md's
# output rule): each run fails with exit 1 and one line naming the flag or file, before the first
# step for train, and leaves no partial file. Needs root to mount two tmpfs; exit 77 (skipped)
# otherwise.
tz=$1
. "$(dirname "$0")/../e2e/common.sh"
ro=$work/ro; full=$work/full
mkdir -p "$ro" "$full"
if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=1m,ro tmpfs "$ro" 2>/dev/null; then
  echo "SKIP: needs root and tmpfs mounts"; exit 77
fi
if ! mount -t tmpfs -o size=1m tmpfs "$full" 2>/dev/null; then umount "$ro"; echo "SKIP: tmpfs"; exit 77; fi
trap 'umount "$ro" "$full" 2>/dev/null; rm -rf "$work"' EXIT
dd if=/dev/zero of="$full/filler" bs=64k 2>/dev/null  # fills it
make_text "$work/t.txt"
config "$work/c.json" 0 none none
run=(--config "$work/c.json" --model "$model" --data "$work/t.txt" --steps 2)
expect() {  # NAME WANT ARGS...: exit 1, one stderr line containing WANT, no step line on stdout
  local name=$1 want=$2; shift 2
  local err out rc
  out=$("$tz" --log-level error "$@" 2>"$work/err"); rc=$?; err=$(cat "$work/err")
  if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
     printf '%s' "$err" | grep -qF -- "$want" && ! printf '%s' "$out" | grep -q "step"; then
    ok "$name: $err"
  else
    bad "$name: rc=$rc: $err | $out"
  fi
}
expect "train --save-weights read-only" "--save-weights" train "${run[@]}" --save-weights "$ro/w.safetensors"
expect "train --save-dir read-only" "--save-dir" train "${run[@]}" --save-dir "$ro/ck" --save-every 1
expect "train --trace-out read-only" "--trace-out" train "${run[@]}" --trace-out "$ro/t.json"
expect "train --metrics read-only" "--metrics" train "${run[@]}" --metrics "$ro/m.jsonl"
expect "data tokenize full" "tierzero data tokenize: " data tokenize --text "$work/t.txt" --out "$full/t.bin"
[ -z "$(ls "$full" | grep -v '^filler$')" ] && ok "no partial token file" || bad "left: $(ls "$full")"
expect "bench nvme full" "tierzero bench nvme: " bench nvme --path "$full" --size 4M --bs 1M
[ -z "$(ls -A "$full" | grep -v '^filler$')" ] && ok "no bench file left" || bad "left: $(ls -A "$full")"
# ckpt export of a checkpoint with one flipped byte: the tensor named, no output left.
"$tz" --log-level error train "${run[@]}" --save-dir "$work/ck" --save-every 2 > /dev/null 2>&1 || bad "setup checkpoint"
shard=$(find "$work/ck" -name '*.safetensors' | head -1)
python3 - "$shard" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-5] ^= 0x40; open(p, "wb").write(b)
PY
expect "ckpt export flipped byte" "tensor" ckpt export "$work/ck" --out "$work/out/x.safetensors"
[ ! -e "$work/out/x.safetensors" ] && [ -z "$(ls -A "$work/out" 2>/dev/null)" ] && ok "no export left" || bad "export left: $(ls -A "$work/out")"
exit $fail
