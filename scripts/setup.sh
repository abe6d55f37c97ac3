#!/usr/bin/env bash
# Installs every Debian package that tierzero's build, tests and benchmarks need. Idempotent and
# non-interactive; run as root (or with sudo) on a fresh Debian 12 machine. The CUDA toolkit and
# NCCL are not Debian packages here: the build uses them when nvcc is on the machine.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libaio-dev libtbb-dev libhwloc-dev hwloc
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libxxhash-dev libhwy-dev libdnnl-dev
  libopenblas-pthread-dev libblis-dev libblis4-pthread libpcre2-dev libutf8proc-dev
  fio util-linux e2fsprogs python3 python3-venv
  bible-kjv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
