#!/usr/bin/env bash
# ib_check.sh: the one-command check of the verbs transport (src/transport/ib) on a machine with an
# active RDMA port (InfiniBand, or RoCE). Nothing here has run on RDMA hardware yet: the CI runs
# the same tests on the software provider of tests/ibsoft instead.
#
#   perf/ib_check.sh [-B build_dir] [--no-build] [--soft] [-e 256M] [-t timeout_s]
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
#    The tests of several queue pairs per connection, chunks round-robin or split over them, and
#    of direct chunks from registered buffers (IbQps, IbPair.Split*, CollIbQps, IbZcopyColl) are
#    among them.
# 4. Runs all_reduce_perf between 2 local ranks forced onto ib (CHORUS_TRANSPORT=ib), 8 B to the
#    largest size, results checked (#wrong), with the INFO lines that name the device and GID.
# 5. Runs all_gather_perf with registered buffers (-R 1) and 4 queue pairs per connection, once
#    with direct chunks (CHORUS_RING_DIRECT=1: the receiver reads each chunk from the sender's
#    buffer) and once through the slots (CHORUS_IB_ZCOPY_THRESHOLD=-1), both checked, side by side:
#    the bus bandwidth of each and the registrations each range needed (INFO "deregistered").
#
# --soft runs steps 2-5 on the software provider (tests/ibsoft) instead of a port: the tests that
# need hardware are left to the CI, and step 5 shows what the provider can say, the chunks that
# went without a copy and the registrations per range, not speed.
#
# Exit status: 0 when every test passed and the perf runs had #wrong = 0; 1 otherwise; 2 when the
# machine has no active port.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-ib"
do_build=1
max_bytes=256M
tmo=600
soft=0
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$(cd "$2" 2>/dev/null && pwd || echo "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    --soft) soft=1; shift ;;
    -e) max_bytes=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "ib_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# ---- 1. devices and ports -------------------------------------------------------------------
if [ "$soft" = 1 ]; then
    :
elif ! command -v ibv_devinfo >/dev/null; then
    echo "ib_check: ibv_devinfo not found (install rdma-core / ibverbs-utils)" >&2; exit 2
fi
if [ "$soft" = 0 ]; then
    ibv_devices
    ibv_devinfo | grep -E 'hca_id|port:|state|link_layer|active_mtu'
    if ! ibv_devinfo | grep -q 'PORT_ACTIVE'; then
        echo "ib_check: no active RDMA port on this machine" >&2; exit 2
    fi
fi

# ---- 2. build -------------------------------------------------------------------------------
if [ "$do_build" = 1 ]; then
    mkdir -p "$build"
    cmake -B "$build" -S "$root" -DCMAKE_BUILD_TYPE=Release -DCHORUS_TESTS=ON > /dev/null || exit 1
    cmake --build "$build" -j "$(nproc)" \
        --target test_transport test_coll perf_binaries chorusrun chorus_softib \
        > "$build/ib_check_build.log" 2>&1 || {
        echo "ib_check: build failed, see $build/ib_check_build.log" >&2
        tail -20 "$build/ib_check_build.log" >&2; exit 1; }
fi
status=0
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. tests on the real libibverbs ----------------------------------------------------------
if [ "$soft" = 1 ]; then
    export CHORUS_IB_LIBRARY="$build/lib/libchorus_softib.so" NCCL_IB_TIMEOUT=14
    tests='IbQps|IbPair\.Split|CollIbQps|IbZcopy'
else
    export CHORUS_TEST_IB_HARDWARE=1
    tests='Transport(Data|Fail).*/ib_|IbPair\.(BothPortsUpUseIb|DifferentGeometry|QpCountsDiffer|Split)'
    tests="$tests|IbQps|CollIb|IbZcopyColl"
fi
(cd "$build" && timeout -k 5 "$tmo" ctest --output-on-failure -R "$tests") || status=1

# ---- 4. all_reduce_perf over ib ---------------------------------------------------------------
out=$(CHORUS_TRANSPORT=ib NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout -k 5 "$tmo" \
      "$build/bin/chorusrun" -n 2 "$build/bin/all_reduce_perf" -b 8 -e "$max_bytes" -f 4 -c 1 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E 'ib: |via IB|^ *[0-9]+ +[0-9]+ |Avg bus bandwidth'
wrong=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}')
if [ $rc -ne 0 ] || [ "$wrong" != 0 ]; then
    echo "ib_check: all_reduce_perf over ib failed (exit $rc, #wrong $wrong)" >&2; status=1
fi
# ---- 5. all_gather_perf: direct chunks against the slots, registered buffers, 4 queue pairs ----
info=$(mktemp -d)
for mode in direct slots; do
    if [ $mode = direct ]; then extra="CHORUS_RING_DIRECT=1"; else extra="CHORUS_IB_ZCOPY_THRESHOLD=-1"; fi
    # The table on stdout, the INFO lines in files of their own (they would split its rows).
    out=$(env $extra CHORUS_TRANSPORT=ib NCCL_IB_QPS_PER_CONNECTION=4 NCCL_DEBUG=INFO \
          NCCL_DEBUG_SUBSYS=NET,REG NCCL_DEBUG_FILE="$info/$mode.%p" timeout -k 5 "$tmo" \
          "$build/bin/chorusrun" -n 2 "$build/bin/all_gather_perf" -b 1M -e "$max_bytes" -f 4 \
          -c 1 -R 1 2>&1)
    rc=$?
    echo "== all_gather_perf, $mode =="
    cat "$info/$mode".* 2>/dev/null | grep -E 'ib: deregistered'
    printf '%s\n' "$out" | grep -E '^ *[0-9]+ +[0-9]+ |Avg bus bandwidth'
    wrong=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13} END {print w + 0}')
    if [ $rc -ne 0 ] || [ "$wrong" != 0 ]; then
        echo "ib_check: all_gather_perf ($mode) failed (exit $rc, #wrong $wrong)" >&2; status=1
    fi
done
rm -rf "$info"
[ $status = 0 ] && echo "ib_check: passed" || echo "ib_check: FAILED"
exit $status
