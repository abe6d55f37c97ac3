#!/usr/bin/env bash
# Weights holding NaN or Inf are refused on load (train --init, sample) with one line naming the
# file and the tensor; the file is left as it was.
tz=$1
. "$(dirname "$0")/../e2e/common.sh"
make_text "$work/t.txt"
config "$work/c.json" 0 none none
"$tz" train --config "$work/c.json" --model "$model" --data "$work/t.txt" --steps 1 \
  --save-weights "$work/good.safetensors" > /dev/null 2>&1 || { echo "FAIL setup"; exit 1; }
# poison SRC DST TENSOR VALUE: copy with element 3 of TENSOR (fp32) set to VALUE.
poison() {
  python3 - "$@" <<'PY'
import json, struct, sys
src, dst, name, value = sys.argv[1:]
b = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
key = next(k for k in h if k.endswith(name))
assert h[key]["dtype"] == "F32", h[key]
off = 8 + n + h[key]["data_offsets"][0] + 3 * 4
b[off:off + 4] = struct.pack("<f", float(value))
open(dst, "wb").write(b)
PY
}
cp "$work/config.json" "$work/config.json.keep" 2>/dev/null
for case in "h.1.mlp.c_fc.weight nan NaN" "ln_f.bias inf inf" "wpe.weight -inf -inf"; do
  set -- $case
  poison "$work/good.safetensors" "$work/bad.safetensors" "$1" "$2"
  sum=$(md5sum < "$work/bad.safetensors")
  for cmd in "train --config $work/c.json --model $model --data $work/t.txt --steps 1 --init $work/bad.safetensors" \
             "sample --weights $work/bad.safetensors --prompt hi --tokens 2"; do
    err=$($tz --log-level error $cmd 2>&1 >/dev/null); rc=$?
    want="$work/bad.safetensors: tensor '"
    if [ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
       printf '%s' "$err" | grep -qF "$want" && printf '%s' "$err" | grep -qF "$1': element 3 is $3"; then
      ok "${cmd%% *} $1=$3: $err"
    else
      bad "${cmd%% *} $1=$3: rc=$rc: $err"
    fi
  done
  [ "$(md5sum < "$work/bad.safetensors")" = "$sum" ] && ok "input unchanged" || bad "input changed"
done
# The unpoisoned file still loads.
"$tz" train --config "$work/c.json" --model "$model" --data "$work/t.txt" --steps 1 \
  --init "$work/good.safetensors" > /dev/null 2>&1 && ok "finite weights load" || bad "finite weights refused"
exit $fail
