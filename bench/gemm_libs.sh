#!/usr/bin/env bash
# The CPU GEMM libraries side by side at GPT-2-small's matmul shapes (bench/gemm_libs.cc): OpenBLAS
# as Debian ships it (its own CPU table) and with OPENBLAS_CORETYPE forced to the best kernel the
# CPU's features allow, BLIS (runtime dispatch, per-call threads) and oneDNN (JIT for the ISA it
# finds, per-thread threads); 1 and 2 library threads, and 2 callers x 1 thread at once (ranks as
# threads: OpenBLAS must serialise them behind a lock, the others run them concurrently).
# Prints `uptime` and tierzero-independent machine facts first, then one JSON line per measurement
# and a table. Needs libopenblas-pthread-dev, libblis-dev, libdnnl-dev (scripts/setup.sh).
#
# usage: bench/gemm_libs.sh [--repeat 5] [--out FILE] [--coretype NAME]
#   --coretype: the OPENBLAS_CORETYPE to compare against (default: Haswell on AVX2+FMA,
#               SkylakeX on AVX-512F/BW/DQ/VL, Sandybridge on AVX, Prescott otherwise)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repeat=5
out=""
coretype=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --coretype) coretype="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gemm_libs: unknown argument $1" >&2; exit 2 ;;
  esac
done
flags="$(grep -m1 '^flags' /proc/cpuinfo)"
has() { [[ " $flags " == *" $1 "* ]]; }
if [[ -z "$coretype" ]]; then
  if has avx512f && has avx512bw && has avx512dq && has avx512vl; then coretype=SkylakeX
  elif has avx2 && has fma; then coretype=Haswell
  elif has avx; then coretype=Sandybridge
  else coretype=Prescott; fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cxx=(g++ -std=c++20 -O2 -march=x86-64 -pthread)
"${cxx[@]}" -DLIB_OPENBLAS -I/usr/include/x86_64-linux-gnu/openblas-pthread "$here/gemm_libs.cc" \
  -o "$work/openblas" -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
  -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-pthread
blis_dir=/usr/lib/x86_64-linux-gnu/blis-pthread  # libblis4-pthread; the OpenMP build otherwise
[[ -e "$blis_dir/libblis.so.4" ]] || blis_dir=/usr/lib/x86_64-linux-gnu/blis-openmp
"${cxx[@]}" -fopenmp -DLIB_BLIS -I/usr/include/x86_64-linux-gnu "$here/gemm_libs.cc" \
  -o "$work/blis" "$blis_dir/libblis.so.4" -Wl,-rpath,"$blis_dir"
"${cxx[@]}" -fopenmp -DLIB_DNNL "$here/gemm_libs.cc" -o "$work/onednn" -ldnnl

{
  echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) CPUs"
  echo "# uptime: $(uptime)"
  echo "# OPENBLAS_CORETYPE in the environment: ${OPENBLAS_CORETYPE:-unset}; forced variant: $coretype"
  echo "# BLIS from $blis_dir; oneDNN $(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null || echo '?')"
} | tee "$work/log"
run() {  # label, env..., -- binary threads ranks
  local label="$1"; shift
  env "$@" "$repeat" | sed "s/^{/{\"variant\":\"$label\",/" | tee -a "$work/log"
}
for mode in "1 1" "2 1" "1 2"; do
  set -- $mode
  run openblas-default -u OPENBLAS_CORETYPE "$work/openblas" "$1" "$2"
  run "openblas-$coretype" OPENBLAS_CORETYPE="$coretype" "$work/openblas" "$1" "$2"
  run blis "$work/blis" "$1" "$2"
  run onednn OMP_WAIT_POLICY=passive "$work/onednn" "$1" "$2"
done
echo "# uptime after: $(uptime)" | tee -a "$work/log"
python3 - "$work/log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
variants = list(dict.fromkeys(r["variant"] for r in rows))
modes = list(dict.fromkeys((r["threads"], r["ranks"]) for r in rows))
shapes = list(dict.fromkeys(r["shape"] for r in rows))
tgt = {r["variant"]: r["target"] for r in rows}
print("\nGFLOP/s (median); mode = library threads x concurrent callers")
print("| shape | mode | " + " | ".join(f"{v} ({tgt[v]})" for v in variants) + " |")
print("|---|---|" + "---|" * len(variants))
for s in shapes:
    for m in modes:
        cells = []
        for v in variants:
            g = [r["gflops"] for r in rows if r["variant"] == v and r["shape"] == s and (r["threads"], r["ranks"]) == m]
            cells.append(f"{g[0]:.1f}" if g else "-")
        print(f"| {s} | {m[0]}t x {m[1]} | " + " | ".join(cells) + " |")
PY
[[ -n "$out" ]] && cp "$work/log" "$out"
exit 0
