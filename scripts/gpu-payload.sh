#!/usr/bin/env bash
# gpu-payload.sh: assembles, on this machine, everything the borrowed GPU machine needs to run
# scripts/gpu-check.sh and that it does not have: the three programs built here with CUDA
# (tierzero, tz_gpu_cuda_tests, tz_ops_cuda_tests; stripped) and the shared libraries they load
# that are not the C library or CUDA's (liburing, libaio, oneTBB, hwloc, OpenBLAS and its Fortran
# runtime, Highway, xxHash, ...). CUDA's own libraries (libcudart, libcublas, libcublasLt,
# libnccl) and the driver (libcuda) are NOT shipped: the GPU machine has them (its toolkit's lib
# folder, or the nvidia-* wheels of its PyTorch venv) and gpu-check.sh finds them there at run time;
# their sonames are listed in machine-libs.txt. libstdc++ and libgcc_s go to lib/fallback/, used
# only when the machine's own are older than the programs need (gpu-check.sh tries without first:
# a newer system libstdc++ serves both us and the CUDA libraries, an older shipped one could not).
#
# The payload lands in an ignored folder (default build/gpu-payload) that the device tool carries:
#   run(command="scripts/gpu-check.sh", carry=["build/gpu-payload"])
# Its size plus the tree's tracked and untracked files must stay under the tool's 64 MiB; this
# script measures both and fails when they do not fit.
#
# Usage:
#   scripts/gpu-payload.sh                      # the programs of build/release (the standard CUDA
#                                               # build: sm_80 and sm_90 machine code), nothing rebuilt
#   scripts/gpu-payload.sh --reuse DIR          # of another configured CUDA build tree
#   scripts/gpu-payload.sh --own-build          # own tree build/gpu-payload-build: sm_90 only,
#                                               # TZ_MPI=OFF (smaller; a full build, slow here)
#   scripts/gpu-payload.sh --verify             # then run them isolated (below)
#   scripts/gpu-payload.sh --verify-only DIR    # only the isolated run of an existing payload
# Open MPI's libraries travel when the build links them (TZ_MPI=ON), but one process never starts
# MPI (NcclComm makes its own id for one rank; `tierzero info` only reads the library version), so
# Open MPI's plugins and launcher are not needed there.
# Options: --out DIR (payload folder), --build-dir DIR (the --own-build tree), --cuda-lib-dir DIR (the
# stand-in for the GPU machine's CUDA libraries in --verify; default: the build's CUDA toolkit and
# NCCL folders), --max-mib N (payload + tree limit, default 60: 4 MiB below the tool's 64).
#
# --verify runs `tierzero info` and both test programs' --gtest_list_tests with an empty
# environment and LD_LIBRARY_PATH = the payload's folders + the CUDA library folder only, under
# the loader's LD_DEBUG=libs, and fails when any library (dlopen'ed ones included) was loaded from
# anywhere else than the payload, the C library, or, for CUDA's own sonames, the CUDA folder: a
# library missing from the payload fails here, not on the GPU machine. Exit 77 (ctest: skipped)
# when the build has no CUDA (no nvcc here).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

OUT=build/gpu-payload
BUILD_DIR=build/gpu-payload-build
REUSE=build/release
VERIFY=0
VERIFY_ONLY=""
MAX_MIB=60
CUDA_LIB_DIRS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --reuse) REUSE=$2; shift 2 ;;
    --own-build) REUSE=""; shift ;;
    --verify) VERIFY=1; shift ;;
    --verify-only) VERIFY_ONLY=$2; VERIFY=1; shift 2 ;;
    --cuda-lib-dir) CUDA_LIB_DIRS+=("$2"); shift 2 ;;
    --max-mib) MAX_MIB=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-payload: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

PROGRAMS=(tierzero tz_gpu_cuda_tests tz_ops_cuda_tests)
# The C library: the GPU machine's own, never shipped.
C_LIBRARY_RE='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec|ld-linux-x86-64)\.so'
# CUDA's libraries and the driver: taken from the GPU machine (machine-libs.txt).
CUDA_LIBRARY_RE='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]*)\.so'
# Shipped in lib/fallback/, used only when the machine's are too old.
FALLBACK_RE='^(libstdc\+\+|libgcc_s)\.so'

die() { echo "gpu-payload: $*" >&2; exit 1; }
cache_value() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt" 2>/dev/null | head -1; }

# The folders holding CUDA's libraries for --verify: the toolkit's and NCCL's, as the build found.
default_cuda_lib_dirs() {
  local build=$1 d
  d=$(cache_value "$build" CUDAToolkit_LIBRARY_DIR)
  [ -n "$d" ] && echo "$d"
  d=$(cache_value "$build" NCCL_LIBRARY)
  [ -n "$d" ] && [ "$d" != "NCCL_LIBRARY-NOTFOUND" ] && dirname "$(readlink -f "$d")"
  d=$(cache_value "$build" CUDA_cudart_LIBRARY)
  [ -n "$d" ] && [ "$d" != "CUDA_cudart_LIBRARY-NOTFOUND" ] && dirname "$(readlink -f "$d")"
  return 0
}

# Bytes of what the device tool sends besides carried paths: tracked files and untracked files
# that git does not ignore.
tree_bytes() {
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    { git ls-files -z --cached; git ls-files -z --others --exclude-standard; } |
      xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}' || true
  else  # not a git checkout: everything but build trees
    du -sb --exclude='./build*' --exclude=./.git . | cut -f1
  fi
}

# verify PAYLOAD_DIR CUDA_DIRS...: unpacks PAYLOAD_DIR/payload.tar.gz as gpu-check.sh does and
# runs the programs from there.
verify() {
  local archive=$1/payload.tar.gz; shift
  local -a cuda_dirs=("$@")
  [ -f "$archive" ] || die "verify: no $archive"
  local payload; payload=$(mktemp -d)
  tar -C "$payload" -xzf "$archive"
  [ -x "$payload/bin/tierzero" ] || die "verify: no bin/tierzero in $archive"
  local libpath="$payload/lib:$payload/lib/fallback" d
  for d in "${cuda_dirs[@]}"; do libpath+=":$(readlink -f "$d")"; done
  local tmp; tmp=$(mktemp -d)
  local failed=0
  echo "verify: LD_LIBRARY_PATH=$libpath (the CUDA folder stands in for the GPU machine's CUDA libraries)"
  # run NAME ARGS...: the program with only the payload, the C library and the CUDA folder.
  run_isolated() {
    local name=$1; shift
    rm -f "$tmp"/ld.*
    local rc=0
    env -i PATH=/usr/bin:/bin HOME="$tmp" TZ_LOG_LEVEL=warn LD_LIBRARY_PATH="$libpath" \
      HWLOC_PLUGINS_PATH="$payload/lib/hwloc" \
      LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld" "$payload/bin/$name" "$@" >"$tmp/out" 2>&1 || rc=$?
    local loaded; loaded=$(sed -n 's/.*calling init: //p' "$tmp"/ld.* 2>/dev/null | sort -u)
    local bad="" path base
    for path in $loaded; do
      base=$(basename "$path")
      case "$path" in "$payload"/*) continue ;; esac
      if [[ $base =~ $C_LIBRARY_RE ]]; then continue; fi
      if [[ $base =~ $CUDA_LIBRARY_RE ]]; then continue; fi
      bad+=" $path"
    done
    if [ "$rc" -ne 0 ] || [ ! -s "$tmp/out" ] || [ -n "$bad" ]; then
      echo "verify: FAIL $name $* (exit $rc)"
      [ -n "$bad" ] && echo "  loaded from outside the payload:$bad"
      sed 's/^/  | /' "$tmp/out" | tail -15
      failed=1
    else
      echo "verify: ok   $name $* ($(wc -l <"$tmp/out") lines; $(echo "$loaded" | grep -c "$payload/") payload libraries loaded)"
    fi
  }
  run_isolated tierzero --version
  run_isolated tierzero info
  run_isolated tz_gpu_cuda_tests --gtest_list_tests
  run_isolated tz_ops_cuda_tests --gtest_list_tests
  rm -rf "$tmp" "$payload"
  [ "$failed" -eq 0 ] || die "verify failed: a library the GPU machine lacks is missing from the payload"
  echo "verify: all programs ran with only the payload, the C library and CUDA's libraries"
}

if [ -n "$VERIFY_ONLY" ]; then
  verify "$VERIFY_ONLY" "${CUDA_LIB_DIRS[@]}"
  exit 0
fi

# --- The build ----------------------------------------------------------------------------------
if [ -n "$REUSE" ]; then
  BUILD=$REUSE
  [ -f "$BUILD/CMakeCache.txt" ] || die "--reuse $BUILD: not a configured build tree"
else
  BUILD=$BUILD_DIR
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "gpu-payload: skipped: no nvcc on this machine, so no CUDA build to ship"; exit 77
  fi
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    launcher=()
    command -v ccache >/dev/null &&
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_WERROR=ON \
      "${launcher[@]}" -DTZ_CUDA=ON -DTZ_MPI=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  fi
  cmake --build "$BUILD" -j"${JOBS:-$(nproc)}" --target "${PROGRAMS[@]}"
fi
if [ "$(cache_value "$BUILD" TZ_CUDA)" != ON ]; then
  echo "gpu-payload: skipped: $BUILD was configured without CUDA (TZ_CUDA=OFF: no nvcc)"; exit 77
fi
# The machine code the build generates (nvcc's -gencode flags): sm_90 is the H200's.
ARCHS=$(cat "$BUILD/build.ninja" "$BUILD"/CMakeFiles/*.dir/flags.make 2>/dev/null |
        grep -o 'code=\[[^]]*\]' | grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' ' || true)
[[ " $ARCHS" == *" sm_90"* ]] || die "$BUILD generates machine code for '$ARCHS': the H200 needs sm_90"
NVCC_VERSION=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' \
               "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1 || true)
declare -A SRC=([tierzero]=src/cli/tierzero [tz_gpu_cuda_tests]=tests/gpu/tz_gpu_cuda_tests
                [tz_ops_cuda_tests]=tests/gpu/tz_ops_cuda_tests)
for p in "${PROGRAMS[@]}"; do
  [ -x "$BUILD/${SRC[$p]}" ] || die "$BUILD/${SRC[$p]} is not built (cmake --build $BUILD --target $p)"
done

# --- The payload --------------------------------------------------------------------------------
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
rm -rf "$OUT"
# lib/hwloc/ stays empty: hwloc's optional plugins (pci, gl, opencl, xml) are not shipped, and
# HWLOC_PLUGINS_PATH points there in --verify and on the GPU machine, so both load none.
mkdir -p "$OUT" "$STAGE/bin" "$STAGE/lib/fallback" "$STAGE/lib/hwloc"
for p in "${PROGRAMS[@]}"; do
  strip --strip-all -o "$STAGE/bin/$p" "$BUILD/${SRC[$p]}"
done
: >"$OUT/machine-libs.txt"
declare -A SEEN=()
for p in "${PROGRAMS[@]}"; do
  while read -r line; do
    case "$line" in
      *"not found"*) die "$p: ${line%% =>*} is not found here either (ldd $BUILD/${SRC[$p]})" ;;
      *" => "/*)
        soname=${line%% =>*}; path=${line#* => }; path=${path%% (*}
        ;;
      *) continue ;;
    esac
    [ -n "${SEEN[$soname]:-}" ] && continue
    SEEN[$soname]=1
    if [[ $soname =~ $C_LIBRARY_RE ]]; then
      continue
    elif [[ $soname =~ $CUDA_LIBRARY_RE ]]; then
      echo "$soname" >>"$OUT/machine-libs.txt"
    elif [[ $soname =~ $FALLBACK_RE ]]; then
      cp -L "$path" "$STAGE/lib/fallback/$soname"
    else
      cp -L "$path" "$STAGE/lib/$soname"
    fi
  done < <(ldd "$BUILD/${SRC[$p]}")
done
sort -u -o "$OUT/machine-libs.txt" "$OUT/machine-libs.txt"

glibc_needed=$(objdump -T "$STAGE"/bin/* "$STAGE"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' |
               sort -Vu | tail -1)
glibcxx_needed=$(objdump -T "$STAGE"/bin/* "$STAGE"/lib/*.so* 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' |
                 sort -Vu | tail -1)
{
  echo "tierzero GPU payload"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(uname -m), from $BUILD"
  echo "cuda machine code: $ARCHS; nvcc: $NVCC_VERSION"
  echo "TZ_MPI=$(cache_value "$BUILD" TZ_MPI) TZ_NCCL=$(cache_value "$BUILD" TZ_NCCL)"
  echo "needs from the machine: glibc >= ${glibc_needed#GLIBC_}, libstdc++ with ${glibcxx_needed:-none} (else lib/fallback/), and: $(tr '\n' ' ' <"$OUT/machine-libs.txt")"
  echo
  (cd "$STAGE" && find bin lib -type f -printf '%s\t%p\n' | sort -k2 |
     while IFS=$'\t' read -r size f; do printf '%10d  %s  %s\n' "$size" "$(sha256sum "$f" | cut -c1-16)" "$f"; done)
} >"$OUT/MANIFEST.txt"

cp "$OUT/machine-libs.txt" "$STAGE/"
# One gzip'ed tar (gzip is on every machine): OpenBLAS alone is 36 MiB unpacked, 21 MiB packed
# with everything else.
tar -C "$STAGE" -czf "$OUT/payload.tar.gz" bin lib machine-libs.txt
payload_bytes=$(du -sb "$OUT" | cut -f1)
tree=$(tree_bytes)
total=$(( payload_bytes + tree ))
limit=$(( MAX_MIB * 1024 * 1024 ))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "payload $OUT: $(mib "$payload_bytes") MiB packed, $(mib "$(du -sb "$STAGE" | cut -f1)") MiB" \
     "unpacked ($(find "$STAGE/lib" -maxdepth 1 -type f | wc -l) libraries, $(find "$STAGE/lib/fallback" -type f | wc -l)" \
     "fallback); tree $(mib "$tree") MiB;" \
     "together $(mib "$total") MiB of $MAX_MIB MiB allowed"
echo "from the GPU machine: $(tr '\n' ' ' <"$OUT/machine-libs.txt")(glibc >= ${glibc_needed#GLIBC_})"
[ "$total" -le "$limit" ] || die "payload + tree = $total B > $MAX_MIB MiB: too large to carry"

if [ "$VERIFY" -eq 1 ]; then
  if [ ${#CUDA_LIB_DIRS[@]} -eq 0 ]; then
    mapfile -t CUDA_LIB_DIRS < <(default_cuda_lib_dirs "$BUILD" | sort -u)
  fi
  verify "$OUT" "${CUDA_LIB_DIRS[@]}"
fi
