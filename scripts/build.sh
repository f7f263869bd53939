#!/usr/bin/env bash
# Configure and build Chorus in ./build (Release-with-debug-info; CUDA on when the toolkit is found):
# the library, the tools (chorusrun, chorus_info), the perf binaries and the examples. The tests are
# built by scripts/test.sh.
#   scripts/build.sh [extra cmake args, e.g. -DCHORUS_CUDA=OFF]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCHORUS_TESTS=OFF "$@"
cmake --build build -j"$(nproc)"
