#!/usr/bin/env bash
# Installs what the build needs (skip with TZ_SKIP_SETUP=1), configures, builds in parallel and
# runs the test suite with ctest, printing ctest's summary line. Extra arguments go to ctest,
# e.g. `scripts/test.sh -L unit` or `scripts/test.sh -LE slow`.
#   TZ_BUILD_DIR   build folder (default build/release)
#   TZ_BUILD_TYPE  CMake build type (default RelWithDebInfo)
#   TZ_JOBS        parallel build jobs (default: number of cores)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [ "${TZ_SKIP_SETUP:-0}" != "1" ]; then
  scripts/setup.sh
fi

build_dir=${TZ_BUILD_DIR:-build/release}
jobs=${TZ_JOBS:-$(nproc)}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE="${TZ_BUILD_TYPE:-RelWithDebInfo}" \
    -DTZ_WERROR=ON
fi
cmake --build "$build_dir" --parallel "$jobs"

# ctest prints "100% tests passed, 0 tests failed out of N" as its summary line.
cd "$build_dir"
ctest --output-on-failure --timeout 600 "$@"
