#!/usr/bin/env bash
# The README's test command: configure, build (warnings are errors), run the test suites.
#   scripts/test.sh                                  build in ./build, run ctest (all but "nightly")
#   CHORUS_TEST_ARGS="-L nightly" scripts/test.sh    the long sweep
# It also checks that the library and tools build with the CUDA path forced off (build-nocuda).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -DCHORUS_WERROR=ON -DCHORUS_TESTS=ON
cmake --build build -j"$jobs"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cmake -S . -B build-nocuda -DCHORUS_CUDA=OFF -DCHORUS_WERROR=ON -DCHORUS_TESTS=OFF >/dev/null
  cmake --build build-nocuda -j"$jobs"
fi
cd build
ctest --output-on-failure --timeout 600 -j2 ${CHORUS_TEST_ARGS:--LE nightly}
cd ..

# ---- fuzzing ------------------------------------------------------------------------------------
# The libFuzzer harnesses of tests/fuzz, built with clang in build-fuzz, each run for
# CHORUS_FUZZ_SECONDS (10 by default; 0 skips the stage) from its seed corpus; any crash fails.
# Skipped with a message where clang's libFuzzer runtime is missing.
if [ "${CHORUS_FUZZ_SECONDS:-10}" != "0" ]; then
  scripts/fuzz.sh "${CHORUS_FUZZ_SECONDS:-10}"
fi
