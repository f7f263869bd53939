#!/usr/bin/env bash
# ib_check.sh: the one-command check of the verbs transport (src/transport/ib) on a machine with an
# active RDMA port (InfiniBand, or RoCE). Nothing here has run on RDMA hardware yet: the CI runs
# the same tests on the software provider of tests/ibsoft instead.
#
#   perf/ib_check.sh [-B build_dir] [--no-build] [-e 256M] [-t timeout_s]
#
# 1. Lists the RDMA devices with ibv_devices / ibv_devinfo (rdma-core's tools): each port's state
#    and link layer. Stops (exit 2) when no port is PORT_ACTIVE.
# 2. Builds (cmake, Release) into build_dir (default: build-ib next to the sources), or with
#    --no-build uses what is there.
# 3. Runs the transport tests that need no fault knob on the real libibverbs
#    (CHORUS_TEST_IB_HARDWARE=1 keeps the tests from loading the software provider): the ib data
#    and failure suites (1 B to 64 MiB, every byte checked, threads and forked ranks, killed peers),
#    the pair tests with both ports up and with different slot geometry, and the collective sweep
#    forced onto ib. Two ranks of one machine reach each other through the NIC's loopback.
# 4. Runs all_reduce_perf between 2 local ranks forced onto ib (CHORUS_TRANSPORT=ib), 8 B to the
#    largest size, results checked (#wrong), with the INFO lines that name the device and GID.
#
# Exit status: 0 when every test passed and the perf run had #wrong = 0; 1 otherwise; 2 when the
# machine has no active port.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-ib"
do_build=1
max_bytes=256M
tmo=600
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$(cd "$2" 2>/dev/null && pwd || echo "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    -e) max_bytes=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "ib_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# ---- 1. devices and ports -------------------------------------------------------------------
if ! command -v ibv_devinfo >/dev/null; then
    echo "ib_check: ibv_devinfo not found (install rdma-core / ibverbs-utils)" >&2; exit 2
fi
ibv_devices
ibv_devinfo | grep -E 'hca_id|port:|state|link_layer|active_mtu'
if ! ibv_devinfo | grep -q 'PORT_ACTIVE'; then
    echo "ib_check: no active RDMA port on this machine" >&2; exit 2
fi

# ---- 2. build -------------------------------------------------------------------------------
if [ "$do_build" = 1 ]; then
    mkdir -p "$build"
    cmake -B "$build" -S "$root" -DCMAKE_BUILD_TYPE=Release -DCHORUS_TESTS=ON > /dev/null || exit 1
    cmake --build "$build" -j "$(nproc)" --target test_transport test_coll perf_binaries chorusrun \
        > "$build/ib_check_build.log" 2>&1 || {
        echo "ib_check: build failed, see $build/ib_check_build.log" >&2
        tail -20 "$build/ib_check_build.log" >&2; exit 1; }
fi
status=0
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. tests on the real libibverbs ----------------------------------------------------------
export CHORUS_TEST_IB_HARDWARE=1
(cd "$build" && timeout -k 5 "$tmo" ctest --output-on-failure \
    -R 'Transport(Data|Fail).*/ib_|IbPair\.(BothPortsUpUseIb|DifferentGeometry)|CollIb') || status=1

# ---- 4. all_reduce_perf over ib ---------------------------------------------------------------
out=$(CHORUS_TRANSPORT=ib NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout -k 5 "$tmo" \
      "$build/bin/chorusrun" -n 2 "$build/bin/all_reduce_perf" -b 8 -e "$max_bytes" -f 4 -c 1 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E 'ib: |via IB|^ *[0-9]+ +[0-9]+ |Avg bus bandwidth'
wrong=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}')
if [ $rc -ne 0 ] || [ "$wrong" != 0 ]; then
    echo "ib_check: all_reduce_perf over ib failed (exit $rc, #wrong $wrong)" >&2; status=1
fi
[ $status = 0 ] && echo "ib_check: passed" || echo "ib_check: FAILED"
exit $status
