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
print("info --json ok:", ", ".join(info.keys()))
PY
# The probe must not leave files behind in the probed directory.
[ "$(ls -A "$dir" | grep -v '^info.json$' | wc -l)" -eq 0 ] || { echo "probe left files"; ls -A "$dir"; exit 1; }
"$tz" info > /dev/null
