#!/usr/bin/env bash
# Configure and build Chorus in ./build (Release-with-debug-info; CUDA on when the toolkit is found).
#   scripts/build.sh [extra cmake args, e.g. -DCHORUS_CUDA=OFF]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build "$@"
cmake --build build -j"$(nproc)"
