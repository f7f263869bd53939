#!/usr/bin/env bash
# Install the Debian packages that building and testing Chorus need. Used by .ci/run and the README.
#   scripts/install_deps.sh          build + test dependencies
#   scripts/install_deps.sh --peers  also the peers for perf/compare (gnuplot, iperf3)
# The CUDA toolkit comes from the machine image; without it Chorus builds without the CUDA path.
set -euo pipefail
# python3-torch: Debian's CPU torch 1.13, for the tests of the PyTorch package (tests/torch).
# libasan8, libubsan1, libtsan2: the runtimes of gcc 12's sanitizers for the build-asan and
# build-tsan stages of scripts/test.sh (gcc-12 pulls them in already; named so that they stay).
pkgs=(build-essential cmake pkg-config libhwloc-dev hwloc libgtest-dev googletest libibverbs-dev
      zlib1g-dev iproute2 util-linux procps openmpi-bin libopenmpi-dev dataset-fashion-mnist
      clang libclang-rt-14-dev libasan8 libubsan1 libtsan2 python3-torch)
if [ "${1:-}" = "--peers" ]; then
  pkgs+=(gnuplot-nox iperf3)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
