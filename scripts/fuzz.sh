#!/usr/bin/env bash
# Build the libFuzzer harnesses of tests/fuzz (clang, AddressSanitizer + UndefinedBehaviorSanitizer,
# in a tree of their own: build-fuzz) and run each one for a fixed time from its seed corpus
# (tests/fuzz/<harness>/). Any crash, sanitizer report, leak, timeout or failed invariant fails the
# run; the input that caused it is left in build-fuzz/artifacts/.
#   scripts/fuzz.sh                      every harness for 10 s (what scripts/test.sh runs)
#   scripts/fuzz.sh 600 bs_peer param    those harnesses for 10 minutes each
# Harnesses run CHORUS_FUZZ_JOBS at a time (the core count by default).
# Inputs the fuzzer finds interesting go to build-fuzz/corpus/<harness>/ (not committed; copy a
# small one that found a bug into tests/fuzz/<harness>/ as a regression seed).
# Skips with a message (exit 0) when clang or its libFuzzer runtime is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${CHORUS_FUZZ_SECONDS:-10}}
[ $# -gt 0 ] && shift
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=(unique_id bs_root bs_peer tcp_handshake shm_blob param algo_filter ring_order topo_xml
             perf_args)
fi

cc=${CHORUS_FUZZ_CC:-clang}
cxx=${CHORUS_FUZZ_CXX:-clang++}
if ! command -v "$cc" >/dev/null 2>&1 || ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: $cc/$cxx not found (scripts/install_deps.sh installs clang)"
  exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$probe/p.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: $cc has no libFuzzer runtime (scripts/install_deps.sh installs" \
       "libclang-rt-14-dev)"
  exit 0
fi

launcher=()
command -v ccache >/dev/null 2>&1 &&
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=$cc CXX=$cxx cmake -S . -B build-fuzz -DCHORUS_FUZZ=ON "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_harnesses

mkdir -p build-fuzz/artifacts
# run_one <harness>: one harness for $secs; its exit status goes to build-fuzz/fuzz_<h>.rc.
run_one() {
  local h=$1 rc=0
  mkdir -p "build-fuzz/corpus/$h"
  # -timeout: one input running longer than that is a hang; -rss_limit_mb: a leak or runaway
  # allocation. The working corpus comes first: new inputs are written there, not to tests/fuzz.
  timeout $((secs + 120)) "build-fuzz/bin/fuzz_$h" -max_total_time="$secs" -timeout=25 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$h-" \
    "build-fuzz/corpus/$h" "tests/fuzz/$h" >"build-fuzz/fuzz_$h.log" 2>&1 || rc=$?
  echo "$rc" >"build-fuzz/fuzz_$h.rc"
}
# The harnesses are single-threaded: run as many at once as there are cores.
par=${CHORUS_FUZZ_JOBS:-$(nproc)}
running=0
for h in "${harnesses[@]}"; do
  rm -f "build-fuzz/fuzz_$h.rc"
  run_one "$h" &
  running=$((running + 1))
  if [ "$running" -ge "$par" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
failed=()
for h in "${harnesses[@]}"; do
  log="build-fuzz/fuzz_$h.log"
  rc=$(cat "build-fuzz/fuzz_$h.rc" 2>/dev/null || echo "missing")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" != 0 ]; then
    echo "fuzz: $h FAILED (exit $rc after ${runs:-?} executions); last lines of $log:"
    tail -n 40 "$log"
    failed+=("$h")
  else
    echo "fuzz: $h ok: ${runs:-?} executions in ${secs} s, no crash"
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in build-fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: all ${#harnesses[@]} harnesses ran ${secs} s each without a crash"
