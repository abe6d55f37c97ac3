#!/usr/bin/env bash
# `tierzero info --json --path DIR` prints one valid JSON object with the expected sections,
# on any machine (no GPU included).
set -eu
tz=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$tz" info --json --path "$dir" > "$dir/info.json"
python3 - "$dir/info.json" "$dir" <<'PY'
import json, sys
info = json.load(open(sys.argv[1]))
for section in ("cpu", "memory", "kernel", "paths"):
    assert section in info, f"missing {section}: {info.keys()}"
assert info["paths"][0]["path"] == sys.argv[2], info["paths"]
# The GEMM section: library, kernel target against what /proc/cpuinfo's flags allow, the quick
# sgemm against the FMA peak of its own formula.
g = info["gemm"]
for key in ("library", "kernel_target", "cpu_target", "clock_source", "fma_units_source",
            "half_precision", "summary", "sgemm_shape"):
    assert isinstance(g[key], str) and g[key], (key, g)
assert g["library"].startswith("oneDNN"), g["library"]
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
avx512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
avx2 = {"avx2", "fma"} <= flags
if avx512:
    assert g["kernel_target"].startswith("avx512"), g
elif avx2:
    assert g["kernel_target"].startswith(("avx2", "avx512")), g
assert g["fp32_lanes"] == (16 if "avx512f" in flags else 8 if avx2 else 4), g
assert g["below_cpu"] == bool(g["warnings"]), g
assert g["threads"] >= 1 and 0.2 < g["clock_ghz"] < 10, g
peak = g["threads"] * g["clock_ghz"] * g["fma_units"] * g["fp32_lanes"] * 2
assert abs(g["peak_gflops"] - peak) <= 1e-6 * peak, (peak, g)
assert g["sgemm_gflops"] > 0 and abs(g["fraction_of_peak"] - g["sgemm_gflops"] / peak) < 1e-9, g
assert g["cpu_native_bf16"] == ("avx512_bf16" in flags or "amx_bf16" in flags), g
assert g["cpu_native_fp16"] == ("avx512_fp16" in flags), g
print("info --json ok:", ", ".join(info.keys()))
print(g["summary"])
PY
# Kernels capped below the CPU (oneDNN's own setting): a warning that names the setting.
if grep -qw avx2 /proc/cpuinfo; then
  ONEDNN_MAX_CPU_ISA=SSE41 "$tz" info --json > "$dir/capped.json"
  python3 - "$dir/capped.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))["gemm"]
assert g["kernel_target"] == "sse41" and g["below_cpu"], g
assert any("ONEDNN_MAX_CPU_ISA=SSE41" in w for w in g["warnings"]), g["warnings"]
print("capped ISA warned:", g["warnings"][0])
PY
  rm -f "$dir/capped.json"
fi
# The probe must not leave files behind in the probed directory.
[ "$(ls -A "$dir" | grep -v '^info.json$' | wc -l)" -eq 0 ] || { echo "probe left files"; ls -A "$dir"; exit 1; }
"$tz" info > /dev/null
