#!/usr/bin/env bash
# Runs fio and `tierzero bench nvme` on the same file with the same engine, rw, block size and
# queue depth, alternating them, over read/write x 1M/8M x depth 8/32 x io_uring/libaio, and
# prints one row per case with the medians and the ratio tierzero/fio (throughput and CPU s/GB).
#
# Usage: bench/nvme_vs_fio.sh [DIR]    (DIR defaults to /tmp; the file is removed at the end)
# Environment: SIZE (bytes per pass, default 4G), REPEAT (alternations per case, default 3),
#   TIERZERO (the binary; default: first of build/release, build/dev, build/*), JSON_OUT (also
#   write every measurement as JSON lines there), FIO_URING_OPTS (default
#   "--fixedbufs --registerfiles": fio registers buffers and files as tierzero does),
#   ENGINES, RWS, BSS, QDS (space-separated lists to narrow the sweep), FIO_IOMEM (fio's --iomem,
#   e.g. shmhuge to give fio huge-page buffers; needs reserved huge pages), TZ_4K (1, default:
#   also run tierzero with --no-huge-pages, staging in 4 KiB pages like fio's malloc buffers).
# Each row also gives the mean request size the device saw for each tool (KB per request, from
# /sys/block/<disk>/stat around each run; other I/O on that disk at the same time blurs it), which
# shows how requests were split: on 4 KiB pages at the device's max_segments pages.
set -euo pipefail

DIR="${1:-/tmp}"
SIZE="${SIZE:-4G}"
REPEAT="${REPEAT:-3}"
ENGINES="${ENGINES:-io_uring libaio}"
RWS="${RWS:-read write}"
BSS="${BSS:-1M 8M}"
QDS="${QDS:-8 32}"
FIO_URING_OPTS="${FIO_URING_OPTS:---fixedbufs --registerfiles}"
FIO_IOMEM="${FIO_IOMEM:-}"
TZ_4K="${TZ_4K:-1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${TIERZERO:-}" ]; then
  for cand in "$ROOT"/build/release/src/cli/tierzero "$ROOT"/build/dev/src/cli/tierzero \
              "$ROOT"/build/*/src/cli/tierzero; do
    if [ -x "$cand" ]; then TIERZERO="$cand"; break; fi
  done
fi
if [ -z "${TIERZERO:-}" ] || [ ! -x "$TIERZERO" ]; then
  echo "nvme_vs_fio: tierzero binary not found; build it or set TIERZERO" >&2
  exit 1
fi
command -v fio >/dev/null || { echo "nvme_vs_fio: fio not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "nvme_vs_fio: python3 needed to parse fio's JSON" >&2; exit 1; }

NAME="tierzero-nvme-vs-fio.dat"
FILE="$DIR/$NAME"
RAW="$(mktemp)"
cleanup() { rm -f "$FILE" "$RAW" "$RAW.fio" "$RAW.err" "$RAW.tz"; }
trap cleanup EXIT

# The whole disk under DIR, for request sizes: /sys/block/<disk>/stat (partitions map to it).
DEV="$(basename "$(df --output=source "$DIR" | tail -1)")"
STAT=""
for cand in "/sys/class/block/$DEV/stat" "/sys/block/$DEV/stat"; do
  if [ -r "$cand" ]; then STAT="$cand"; break; fi
done
# "ios sectors" of reads or writes so far ("0 0" when the disk has no stat file).
dev_counts() {
  if [ -z "$STAT" ]; then echo "0 0"; return; fi
  if [ "$1" = read ]; then awk '{print $1, $3}' "$STAT"; else awk '{print $5, $7}' "$STAT"; fi
}
# KB per request between two dev_counts outputs (0 when unknown).
req_kb() {
  # shellcheck disable=SC2086
  set -- $1 $2
  if [ $(( $3 - $1 )) -gt 0 ]; then echo $(( ($4 - $2) / 2 / ($3 - $1) )); else echo 0; fi
}

echo "# nvme_vs_fio: $(date -u) on $(hostname), $(nproc) cpus, linux $(uname -r)" >&2
if [ -n "$STAT" ]; then
  q="$(dirname "$(readlink -f "/sys/class/block/$DEV")")"
  [ -d "/sys/class/block/$DEV/queue" ] && q="/sys/class/block/$DEV"
  echo "# disk $DEV: max_segments $(cat "$q/queue/max_segments" 2>/dev/null || echo ?), max_sectors_kb $(cat "$q/queue/max_sectors_kb" 2>/dev/null || echo ?)" >&2
fi
echo "# file $FILE, size $SIZE, repeat $REPEAT, tierzero $TIERZERO, $(fio --version)" >&2
# Create and fill the file once (tierzero writes it through; fio then reuses it).
"$TIERZERO" --log-level warn bench nvme --path "$DIR" --file-name "$NAME" --size "$SIZE" \
  --rw write --bs 8M --qd 32 --repeat 1 --keep-file --json >/dev/null

for engine in $ENGINES; do
  for rw in $RWS; do
    for bs in $BSS; do
      for qd in $QDS; do
        extra=""
        if [ "$engine" = io_uring ]; then extra="$FIO_URING_OPTS"; fi
        if [ -n "$FIO_IOMEM" ]; then extra="$extra --iomem=$FIO_IOMEM"; fi
        for r in $(seq 1 "$REPEAT"); do
          before="$(dev_counts "$rw")"
          # shellcheck disable=SC2086
          fio --name=nvme_vs_fio --filename="$FILE" --direct=1 --rw="$rw" --bs="$bs" \
              --iodepth="$qd" --ioengine="$engine" --size="$SIZE" --numjobs=1 \
              --output-format=json $extra >"$RAW.fio" 2>"$RAW.err" || {
            echo "nvme_vs_fio: fio failed ($engine $rw $bs qd $qd):" >&2
            cat "$RAW.err" >&2
            exit 1
          }
          kb="$(req_kb "$before" "$(dev_counts "$rw")")"
          python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
rw = sys.argv[1]
d = j[rw]
secs = d["runtime"] / 1000.0
gb = d["io_bytes"] / 1e9
print(json.dumps({"tool": "fio", "engine": sys.argv[2], "rw": rw, "bs": sys.argv[3],
                  "qd": int(sys.argv[4]), "gbps": d["bw_bytes"] / 1e9,
                  "cpu_s_per_gb": (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * secs / gb,
                  "req_kb": int(sys.argv[5])}))
' "$rw" "$engine" "$bs" "$qd" "$kb" <"$RAW.fio" >>"$RAW"
          variants="default"
          if [ "$TZ_4K" = 1 ]; then variants="default 4k"; fi
          for variant in $variants; do
            flag=""
            if [ "$variant" = 4k ]; then flag="--no-huge-pages"; fi
            before="$(dev_counts "$rw")"
            # shellcheck disable=SC2086
            "$TIERZERO" --log-level warn bench nvme --path "$DIR" --file-name "$NAME" \
                --size "$SIZE" --engine "$engine" --rw "$rw" --bs "$bs" --qd "$qd" --repeat 1 \
                --keep-file --json $flag 2>/dev/null >"$RAW.tz"
            kb="$(req_kb "$before" "$(dev_counts "$rw")")"
            python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
tool = "tierzero" if sys.argv[2] == "default" else "tierzero_4k"
print(json.dumps({"tool": tool, "engine": j["engine"], "rw": j["rw"], "bs": sys.argv[1],
                  "qd": j["qd"], "gbps": j["gbps_median"], "cpu_s_per_gb": j["cpu_s_per_gb"],
                  "req_kb": int(sys.argv[3])}))
' "$bs" "$variant" "$kb" <"$RAW.tz" >>"$RAW"
          done
        done
      done
    done
  done
done

if [ -n "${JSON_OUT:-}" ]; then cp "$RAW" "$JSON_OUT"; fi
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    key = (m["engine"], m["rw"], m["bs"], m["qd"])
    r = rows.setdefault(key, {})
    r.setdefault(m["tool"], []).append(m["gbps"])
    r.setdefault(m["tool"] + "_cpu", []).append(m["cpu_s_per_gb"])
    r.setdefault(m["tool"] + "_kb", []).append(m.get("req_kb", 0))
has4k = any("tierzero_4k" in r for r in rows.values())
def rng(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
head = "| engine | rw | bs | qd | fio GB/s (min-max) | tierzero GB/s (min-max) | tierzero/fio |"
sep = "| --- | --- | --- | --- | --- | --- | --- |"
if has4k:
    head += " tierzero 4K pages GB/s | 4K/fio |"
    sep += " --- | --- |"
head += " fio cpu s/GB | tierzero cpu s/GB |" + (" 4K cpu s/GB |" if has4k else "")
sep += " --- | --- |" + (" --- |" if has4k else "")
head += " KB/request fio, tierzero" + (", 4K |" if has4k else " |")
sep += " --- |"
print(head)
print(sep)
def order(k):
    return (k[0], k[1], int(k[2].rstrip("MK")) * (1024 if k[2].endswith("M") else 1), k[3])
for key in sorted(rows, key=order):
    r = rows[key]
    f = statistics.median(r["fio"])
    t = statistics.median(r["tierzero"])
    line = f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {rng(r['fio'])} | {rng(r['tierzero'])} | {t / f:.3f} |"
    if has4k:
        t4 = statistics.median(r["tierzero_4k"])
        line += f" {rng(r['tierzero_4k'])} | {t4 / f:.3f} |"
    line += f" {statistics.median(r['fio_cpu']):.4f} | {statistics.median(r['tierzero_cpu']):.4f} |"
    if has4k:
        line += f" {statistics.median(r['tierzero_4k_cpu']):.4f} |"
    kbs = [int(statistics.median(r[t + "_kb"])) for t in ("fio", "tierzero", "tierzero_4k") if t in r]
    line += " " + ", ".join(str(k) for k in kbs) + " |"
    print(line)
PY
