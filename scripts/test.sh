#!/usr/bin/env bash
# The README's test command: configure, build (warnings are errors), run the quick test suites.
#   scripts/test.sh            build in ./build and run ctest (everything but the "nightly" label)
#   CHORUS_TEST_ARGS="-L nightly" scripts/test.sh   the long sweep
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCHORUS_WERROR=ON
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure --timeout 600 -j2 ${CHORUS_TEST_ARGS:--LE nightly}
