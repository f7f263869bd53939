#!/usr/bin/env bash
# gpu_check.sh: the one-command check of Chorus's CUDA path on a machine with a GPU.
#
#   perf/gpu_check.sh [-B build_dir] [--no-build] [-n "1 2 4"] [-e 256M] [-t timeout_s]
#
# 1. Builds (cmake, Release, CUDA on) into build_dir (default: build-gpu next to the sources), or
#    with --no-build uses what is there (for a machine without cmake/compilers: ship the build dir
#    and the libraries it needs, and point CHORUS_GPU_LIBDIR or LD_LIBRARY_PATH at them; nothing is
#    installed by this script).
# 2. Runs the GPU tests: build_dir/bin/test_cuda (the device-path, CUDA IPC, memkind and device
#    kernel tests; each test case in its own process, so the forked cases can use CUDA).
# 3. Measures the GPU's copy bandwidth (build_dir/bin/cuda_copy_bw): device-to-device, and pinned
#    host <-> device.
# 4. Runs all_reduce_perf, all_gather_perf, reduce_scatter_perf on device memory (-m device) with
#    1, 2 and 4 ranks that all share GPU 0 (processes under chorusrun, or perf/launch_local.sh),
#    at 64 bytes (latency: nccl-tests rounds all-gather and reduce-scatter counts per rank down
#    to 16 bytes, so 8 bytes would be an empty op) and at the largest size (bandwidth), with the
#    results checked (#wrong); with 2 and more processes once per device path between processes
#    (CHORUS_DEVICE_PATH: auto, which stages them; ce, copy-engine programs; kernel, the collective
#    kernel over slots each rank's peers map; hosts, the kernel between hosts: the ranks named as
#    two hosts with CHORUS_TEST_HOSTS, device memory within one, pinned host memory that the
#    proxies forward over TCP between them; -P "..." picks them).
# 5. Prints one table: busbw at the largest size, as a fraction of the copy limit for that pattern.
# 6. The device path between thread ranks of one process on GPU 0 (-t n, CHORUS_DEVICE_PATH): the
#    same three collectives with the collective kernel's defaults (kernel: direct, each rank
#    reading its share of every peer's buffer), the kernel over slots (ring:
#    CHORUS_DEVICE_DIRECT=-1) and with staging (staged), side by side, at 8 bytes (all-reduce; 64 for the others) and the largest size, in a second table
#    (CHORUS_DEVICE_PATH=auto takes the kernel for thread ranks on one GPU; perf/gpu_devpath.sh
#    checks that path in more depth and sweeps its parameters).
#
# The limit: with n ranks on ONE GPU every byte a rank sends is a copy inside that GPU's memory.
# For all-reduce a rank sends 2(n-1)/n x S bytes, n ranks send 2(n-1) x S, and the GPU copies at
# most D bytes/s (D = d2d_GBps), so time >= 2(n-1) S / D, algbw = S / time <= D / (2(n-1)), and
# busbw = algbw x 2(n-1)/n <= D / n. The same argument gives D / n for all-gather and
# reduce-scatter (busbw = algbw x (n-1)/n, total copy volume (n-1) x S). With 1 rank busbw is 0 by
# definition (nothing moves between ranks), so the column shows n/a.
# Ranks that are processes stage through pinned host memory under auto (src/api/cuda_enqueue.c),
# so that row's practical ceiling is PCIe (h2d/d2h_GBps), also printed; ce and kernel rows stay on
# the GPU.
#
# Exit status: 0 when the tests passed and every perf row had #wrong = 0; 1 otherwise.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
do_build=1
rank_counts="1 2 4"
proc_paths="auto ce kernel hosts"
max_bytes=256M
tmo=300
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$(cd "$2" 2>/dev/null && pwd || echo "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    -n) rank_counts=$2; shift 2 ;;
    -P) proc_paths=$2; shift 2 ;;
    -e) max_bytes=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u$/{/^#/p}' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# Libraries shipped next to the build (no package installs on the GPU machine).
for d in "${CHORUS_GPU_LIBDIR:-}" "$build/deps/lib" "$root/shared/lib"; do
    if [ -n "$d" ] && [ -d "$d" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
done
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

status=0
log="$build/gpu_check_logs"

if [ "$do_build" = 1 ]; then
    if ! command -v cmake >/dev/null; then
        echo "gpu_check: cmake not found; use --no-build with a shipped build dir" >&2; exit 1
    fi
    cmake -B "$build" -S "$root" -DCMAKE_BUILD_TYPE=Release -DCHORUS_CUDA=ON > /dev/null || exit 1
    cmake --build "$build" -j "$(nproc)" --target test_cuda test_device cuda_copy_bw perf_binaries chorusrun \
        > "$build/gpu_check_build.log" 2>&1 || {
        echo "gpu_check: build failed, see $build/gpu_check_build.log" >&2; tail -20 "$build/gpu_check_build.log" >&2; exit 1; }
fi
mkdir -p "$log"
bin="$build/bin"

if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi

# ---- 1. GPU tests, one process per test case ------------------------------------------------
tests_pass=0; tests_fail=0; tests_skip=0; failed_names=""
if [ -x "$bin/test_cuda" ]; then
    for t in $("$bin/test_cuda" --gtest_list_tests | awk '/^[^ ]/ {s=$1} /^  / {print s $1}'); do
        out=$(CHORUS_TIMEOUT=120 timeout -k 5 "$tmo" "$bin/test_cuda" --gtest_filter="$t" 2>&1)
        rc=$?
        if [ $rc -ne 0 ]; then
            tests_fail=$((tests_fail + 1)); failed_names="$failed_names $t"
            printf '%s\n' "$out" > "$log/$t.log"
        elif printf '%s' "$out" | grep -q '\[  SKIPPED \]'; then
            tests_skip=$((tests_skip + 1))
        else
            tests_pass=$((tests_pass + 1))
        fi
    done
    echo "test_cuda: $tests_pass passed, $tests_fail failed, $tests_skip skipped${failed_names:+ (failed:$failed_names; logs in $log)}"
    [ $tests_fail -ne 0 ] && status=1
else
    echo "gpu_check: $bin/test_cuda missing" >&2; status=1
fi
# The device path under the emulator (CPU threads stand in for the GPU) must pass here too.
if [ -x "$bin/test_device" ]; then
    if CHORUS_TIMEOUT=120 timeout -k 5 "$tmo" "$bin/test_device" --gtest_filter='*DevicePath*:*DeviceKProc*' \
        > "$log/test_device_path.log" 2>&1; then
        echo "test_device DevicePath (emulator): passed"
    else
        echo "test_device DevicePath (emulator): FAILED (log in $log/test_device_path.log)"; status=1
    fi
fi

# ---- 2. copy bandwidth ----------------------------------------------------------------------
d2d=0; h2d=0; d2h=0
if out=$("$bin/cuda_copy_bw" 2>&1); then
    d2d=$(printf '%s\n' "$out" | sed -n 's/^d2d_GBps=//p')
    h2d=$(printf '%s\n' "$out" | sed -n 's/^h2d_GBps=//p')
    d2h=$(printf '%s\n' "$out" | sed -n 's/^d2h_GBps=//p')
    gpu=$(printf '%s\n' "$out" | sed -n 's/^gpu=//p')
    echo "copy bandwidth on $gpu: d2d $d2d GB/s, h2d $h2d GB/s, d2h $d2h GB/s"
else
    echo "gpu_check: cuda_copy_bw failed: $out" >&2; status=1; d2d=0
fi

# ---- 3. perf runs ---------------------------------------------------------------------------
launch() { # n cmd...
    local n=$1; shift
    if [ "$n" = 1 ]; then timeout -k 5 "$tmo" "$@"
    elif [ -x "$bin/chorusrun" ]; then timeout -k 5 "$tmo" "$bin/chorusrun" -n "$n" "$@"
    else "$root/perf/launch_local.sh" -t "$tmo" "$n" "$@"; fi
}
# Last data row of nccl-tests output: "size time_us busbw wrong_oop wrong_ip".
last_row() { awk '$1 ~ /^[0-9]+$/ && NF >= 13 {r=$1" "$6" "$8" "$9" "$13} END {print r}'; }

rows=()
for coll in all_reduce all_gather reduce_scatter; do
    for n in $rank_counts; do
      paths=$proc_paths; [ "$n" = 1 ] && paths=auto
      for path in $paths; do
        p="$bin/${coll}_perf"
        tag="${coll}_${n}_${path}"
        echo "running $coll with $n rank(s) on GPU 0, CHORUS_DEVICE_PATH=$path ..." >&2
        kpath=$path; hosts=
        # hosts: ranks named as two hosts (h0,h1 / h0,h0,h1,h1): within one, device memory;
        # between them, the proxies over TCP.
        [ "$path" = hosts ] && { kpath=kernel; hosts=$(for r in $(seq 0 $((n - 1))); do printf 'h%d,' $((r * 2 / n)); done); hosts=${hosts%,}; }
        lat=$(CHORUS_TEST_HOSTS=$hosts CHORUS_DEVICE_PATH=$kpath launch "$n" "$p" -b 64 -e 64 -n 100 -w 10 -m device 2>"$log/${tag}_lat.err")
        rc1=$?
        bw=$(CHORUS_TEST_HOSTS=$hosts CHORUS_DEVICE_PATH=$kpath launch "$n" "$p" -b "$max_bytes" -e "$max_bytes" -n 10 -w 3 -m device 2>"$log/${tag}_bw.err")
        rc2=$?
        printf '%s\n' "$lat" > "$log/${tag}_lat.out"; printf '%s\n' "$bw" > "$log/${tag}_bw.out"
        lat_us=; lw1=; lw2=; size=; busbw=; bw1=; bw2=
        read -r _ lat_us _ lw1 lw2 <<< "$(printf '%s\n' "$lat" | last_row)"
        read -r size _ busbw bw1 bw2 <<< "$(printf '%s\n' "$bw" | last_row)"
        if [ -n "${lw2:-}" ] && [ -n "${bw2:-}" ]; then
            wrong=$(( lw1 + lw2 + bw1 + bw2 ))
        else
            wrong="?" # no result row: the run failed (see the logs)
        fi
        if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ "$wrong" != 0 ]; then status=1; fi
        frac=$(awk -v b="${busbw:-0}" -v d="$d2d" -v n="$n" 'BEGIN {
            if (n <= 1 || d <= 0) print "n/a"; else printf "%.0f%%", 100 * b / (d / n) }')
        rows+=("$(printf '%-15s %5s %-7s %11s %10s %12s %10s %7s %5s' "$coll" "$n" "$path" \
            "${lat_us:-?}" "${size:-?}" "${busbw:-?}" "$frac" "$wrong" "$rc1/$rc2")")
      done
    done
done

# ---- 4. device path: thread ranks, kernel vs staged -------------------------------------------
dp_rows=()
for coll in all_reduce all_gather reduce_scatter; do
    for n in $rank_counts; do
        [ "$n" -le 1 ] && continue
        for path in kernel ring staged; do
            p="$bin/${coll}_perf"
            # kernel: direct (CHORUS_DEVICE_DIRECT=0); ring: the kernel over slots.
            kpath=$path; direct=0
            [ "$path" = ring ] && { kpath=kernel; direct=-1; }
            small=64; [ "$coll" = all_reduce ] && small=8
            echo "running $coll with $n thread ranks on GPU 0, CHORUS_DEVICE_PATH=$path ..." >&2
            tag="dp_${path}_${coll}_${n}"
            lat=$(CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} CHORUS_DEVICE_PATH=$kpath CHORUS_DEVICE_DIRECT=$direct timeout -k 5 "$tmo" "$p" -t "$n" -b "$small" -e "$small" \
                -n 100 -w 10 -m device 2>"$log/${tag}_lat.err")
            rc1=$?
            bw=$(CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} CHORUS_DEVICE_PATH=$kpath CHORUS_DEVICE_DIRECT=$direct timeout -k 5 "$tmo" "$p" -t "$n" -b "$max_bytes" \
                -e "$max_bytes" -n 10 -w 3 -m device 2>"$log/${tag}_bw.err")
            rc2=$?
            printf '%s\n' "$lat" > "$log/${tag}_lat.out"; printf '%s\n' "$bw" > "$log/${tag}_bw.out"
            lat_us=; lw1=; lw2=; size=; busbw=; bw1=; bw2=
            read -r _ lat_us _ lw1 lw2 <<< "$(printf '%s\n' "$lat" | last_row)"
            read -r size _ busbw bw1 bw2 <<< "$(printf '%s\n' "$bw" | last_row)"
            if [ -n "${lw2:-}" ] && [ -n "${bw2:-}" ]; then wrong=$(( lw1 + lw2 + bw1 + bw2 )); else wrong="?"; fi
            if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ "$wrong" != 0 ]; then status=1; fi
            frac=$(awk -v b="${busbw:-0}" -v d="$d2d" -v n="$n" 'BEGIN {
                if (n <= 1 || d <= 0) print "n/a"; else printf "%.0f%%", 100 * b / (d / n) }')
            dp_rows+=("$(printf '%-15s %5s %-7s %11s %10s %12s %10s %7s %5s' "$coll" "$n" "$path" \
                "${lat_us:-?}" "${size:-?}" "${busbw:-?}" "$frac" "$wrong" "$rc1/$rc2")")
        done
    done
done

echo
echo "# Chorus CUDA path on ${gpu:-?}: ranks share GPU 0; limit = d2d / n = busbw ceiling (see header)"
echo "# d2d ${d2d} GB/s, h2d ${h2d} GB/s, d2h ${d2h} GB/s; test_cuda ${tests_pass} passed ${tests_fail} failed ${tests_skip} skipped"
printf '%-15s %5s %-7s %11s %10s %12s %10s %7s %5s\n' "collective" "ranks" "path" "64B time us" \
    "size B" "busbw GB/s" "of limit" "#wrong" "rc"
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "# Device path, thread ranks of one process on GPU 0 (-t n): collective kernel vs staging"
printf '%-15s %5s %-7s %11s %10s %12s %10s %7s %5s\n' "collective" "ranks" "path" "small us" \
    "size B" "busbw GB/s" "of limit" "#wrong" "rc"
for r in "${dp_rows[@]}"; do echo "$r"; done
exit $status
