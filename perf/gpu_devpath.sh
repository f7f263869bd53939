#!/usr/bin/env bash
# gpu_devpath.sh: the device path's check on a lent GPU machine, in one call.
#
#   perf/gpu_devpath.sh pack [-B build-gpu] [-o gpurun]   (here: a CUDA build, no GPU needed)
#   perf/gpu_devpath.sh run  [-o gpurun] [-l logdir] [-s sections]   (there, from the repo root)
#
# pack copies what the run needs into one folder (ignored by git) small enough to carry: the GPU
# test binary, the perf binaries, chorusrun, cuda_copy_bw, Chorus's libnccl.so.2 and the shared
# libraries such a machine may lack (hwloc, udev, cudart).
#
# run does, each step under its own time limit, with logs in logdir:
#   alltests every test_cuda case, each in its own process (not in the default sections)
#   tests    test_cuda's CudaDevPath cases (the collective kernel on the GPU, thread ranks), with
#            direct (CHORUS_DEVICE_DIRECT=0) and again over the slots (CHORUS_DEVICE_DIRECT=-1)
#   procs    processes sharing the GPU (copy-engine programs, CHORUS_DEVICE_PATH=ce): test_cuda's
#            forked cases each in a process of its own (CudaDevPathProcs.*, CudaColl.*Forked),
#            then all_reduce_perf with 2 processes under chorusrun, every dtype and op, checked,
#            and a 256 MiB one (busbw), each with the path it took read from its INIT log
#   copy     the GPU's copy bandwidth (the limit the busbw figures are read against)
#   correct  the perf binaries with CHORUS_DEVICE_PATH=kernel, results checked: every collective
#            with 1, 2, 3, 4 and 8 thread ranks, every dtype and op for the reducing ones at 2 and 4
#            (all-reduce, reduce-scatter, all-gather, broadcast run direct: CHORUS_DEVICE_DIRECT),
#            the same four over the slots (CHORUS_DEVICE_DIRECT=-1) at 2 and 3 ranks, unaligned
#            buffers (-u 1) for all-reduce
#   bw       256 MiB: all-reduce staged vs the kernel direct (CHORUS_DEVICE_DIRECT=0) vs over slots
#            (ring_*, CHORUS_DEVICE_DIRECT=-1) and one knob at a time (2-8 ranks), the other
#            collectives at 2 ranks (all-gather, reduce-scatter also ring and at 4); then a size
#            sweep of kernel (direct) vs ring vs staging
#   tune     all-reduce busbw per channel count, slot size and hardware queues at 2, 4, 8 ranks,
#            and the LL limit (not in the default sections)
#   torch    tests/torch/torch_nccl_gpu.py under torchrun: torch's nccl backend on Chorus
# (default sections: tests procs copy bw correct torch) and ends with a summary of every step. Each step
# starts only while the run is under its budget in seconds (AR_BUDGET for the bw and tune runs).
# Exit 0 when every step passed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
shift || true
build="$root/build-gpu"
out="$root/gpurun"
logs=${OUT:-/tmp}/gpu_devpath
sections="tests procs copy correct bw torch"
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$(realpath -m "$2"); shift 2 ;;
    -o) out=$(realpath -m "$2"); shift 2 ;;
    -l) logs=$(realpath -m "$2"); shift 2 ;;
    -s) sections=$2; shift 2 ;;
    *) echo "gpu_devpath: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ "$mode" = pack ]; then
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib"
    cp "$build"/bin/{test_cuda,chorusrun,cuda_copy_bw} "$build"/bin/*_perf "$out/bin/"
    cp -L "$build/lib/libnccl.so.2" "$out/lib/libnccl.so.2"
    for name in libhwloc.so.15 libudev.so.1 libcudart.so.13; do
        path=$(ldd "$build/bin/test_cuda" | awk -v n="$name" '$1 == n {print $3}')
        [ -n "$path" ] && cp -L "$path" "$out/lib/"
    done
    du -sh "$out"
    exit 0
fi
[ "$mode" = run ] || { sed -n '2,20p' "$0"; exit 2; }

export LD_LIBRARY_PATH="$out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin="$out/bin"
mkdir -p "$logs"
status=0
summary=()
note() { summary+=("$*"); echo "$*"; }
has() { case " $sections " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi -L 2>&1 | head -2
lib=$(ldd "$bin/all_reduce_perf" | awk '$1 == "libnccl.so.2" {print $3}')
note "perf binaries load $lib"

# nccl-tests' last data row: "size time_us busbw wrong_oop wrong_ip" (out-of-place busbw).
last_row() { awk '$1 ~ /^[0-9]+$/ && NF >= 13 {r=$1" "$6" "$8" "$9" "$13} END {print r}'; }
# Sum of the #wrong columns of every data row ("?" when there is none).
wrongs() { awk '$1 ~ /^[0-9]+$/ && NF >= 13 {w += $9 + $13; n++} END {print n ? w : "?"}'; }

kernel_ok=1
# Each step starts only while the whole run is under its budget (seconds since the start).
budget() { [ "$SECONDS" -lt "$1" ] || { note "skipped $2: past ${1}s"; return 1; }; }
if has alltests; then
    # Every test_cuda case in its own process (the forked cases need a fresh CUDA context).
    pass=0; fail=0; names=""
    for t in $("$bin/test_cuda" --gtest_list_tests | awk '/^[^ ]/ {s=$1} /^  / {print s $1}'); do
        budget 200 "test_cuda $t" || break
        if CHORUS_TIMEOUT=30 timeout -k 5 90 "$bin/test_cuda" --gtest_filter="$t" > "$logs/t_$t.log" 2>&1; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1)); names="$names $t"
        fi
    done
    note "alltests: test_cuda $pass passed, $fail failed${names:+:$names}"
    [ $fail -ne 0 ] && status=1
fi

if has tests; then
    CHORUS_DEVICE_DIRECT=0 CHORUS_TIMEOUT=20 timeout -k 5 90 "$bin/test_cuda" --gtest_filter='CudaDevPath.*' \
        > "$logs/test_cuda_devpath.log" 2>&1
    rc=$?
    note "tests: test_cuda CudaDevPath.* rc=$rc: $(grep -E '^\[  (PASSED|FAILED) ' "$logs/test_cuda_devpath.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && { status=1; grep -E 'FAILED|Failure|WARN' "$logs/test_cuda_devpath.log" | head -20; }
    # The same cases over the slots (the defaults run all-reduce, reduce-scatter, all-gather and
    # broadcast direct).
    CHORUS_DEVICE_DIRECT=-1 CHORUS_TIMEOUT=20 timeout -k 5 90 "$bin/test_cuda" --gtest_filter='CudaDevPath.*' \
        > "$logs/test_cuda_devpath_ring.log" 2>&1
    rc=$?
    note "tests: test_cuda CudaDevPath.* CHORUS_DEVICE_DIRECT=-1 rc=$rc: $(grep -E '^\[  (PASSED|FAILED) ' "$logs/test_cuda_devpath_ring.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && { status=1; grep -E 'FAILED|Failure|WARN' "$logs/test_cuda_devpath_ring.log" | head -20; }
fi

if has procs; then
    # Forked cases need a process with no CUDA context of its own yet: one gtest case a run.
    for t in CudaDevPathProcs.EveryCollectiveForked CudaDevPathProcs.PeerKilledForked \
             CudaColl.TwoRanksOneGpuForked CudaColl.FourRanksOneGpuForked; do
        budget 200 "procs $t" || break
        CHORUS_TIMEOUT=30 timeout -k 5 150 "$bin/test_cuda" --gtest_filter="$t" > "$logs/procs_$t.log" 2>&1
        rc=$?
        note "procs: $t rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/procs_$t.log" | tr '\n' ' ')"
        [ $rc -ne 0 ] && { status=1; grep -E 'FAILED|Failure|WARN|rank check' "$logs/procs_$t.log" | head -20; }
    done
    # nccl-tests style runs with 2 processes on GPU 0; the INIT log says which path each took.
    for run in "check -b 8 -e 8M -f 8 -d all -o all -n 2 -w 1 -c 1" "bw -b 256M -e 256M -n 10 -w 3 -c 1"; do
        read -r tag args <<< "$run"
        budget 280 "procs all_reduce $tag" || break
        # shellcheck disable=SC2086
        CHORUS_DEVICE_PATH=ce CHORUS_TIMEOUT=30 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout -k 5 120 "$bin/chorusrun" -n 2 \
            "$bin/all_reduce_perf" $args -m device > "$logs/procs_ar_$tag.out" 2>&1 < /dev/null
        rc=$?
        paths=$(grep -oE 'device-buffer ops run (as copy-engine programs|as the collective kernel|staged[^(]*)' \
            "$logs/procs_ar_$tag.out" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
        read -r size us busbw w1 w2 <<< "$(last_row < "$logs/procs_ar_$tag.out")"
        w=$(wrongs < "$logs/procs_ar_$tag.out")
        note "procs: all_reduce_perf 2 procs $tag rc=$rc wrong=$w last: size=${size:-?} time_us=${us:-?} busbw_GBps=${busbw:-?} paths:${paths:-none}"
        { [ "$rc" != 0 ] || [ "$w" != 0 ]; } && { status=1; grep -E 'WARN|error' "$logs/procs_ar_$tag.out" | head -10; }
        case "$paths" in *copy-engine*) ;; *) status=1; note "procs: the $tag run did not take copy-engine programs" ;; esac
    done
fi

d2d=0
if has copy; then
    "$bin/cuda_copy_bw" > "$logs/copy.log" 2>&1
    d2d=$(sed -n 's/^d2d_GBps=//p' "$logs/copy.log")
    note "copy: $(tr '\n' ' ' < "$logs/copy.log")"
fi

ar() { # tag env... -- args
    local tag=$1; shift
    budget "${AR_BUDGET:-240}" "$tag" || return 0
    case "$tag" in *kernel*) [ $kernel_ok = 1 ] || { note "skipped $tag: kernel tests failed"; return 0; } ;; esac
    env CHORUS_TIMEOUT=20 "$@" > "$logs/$tag.out" 2>&1 < /dev/null
    local rc=$?
    read -r size us busbw w1 w2 <<< "$(last_row < "$logs/$tag.out")"
    note "$(printf 'bw: %-28s rc=%s size=%s time_us=%s busbw_GBps=%s wrong=%s/%s' "$tag" "$rc" "${size:-?}" "${us:-?}" "${busbw:-?}" "${w1:-?}" "${w2:-?}")"
    [ "$rc" != 0 ] && status=1
}

if has bw; then
    big=(-b 256M -e 256M -n 10 -w 3 -m device)
    K="CHORUS_DEVICE_PATH=kernel,CHORUS_DEVICE_DIRECT=0"
    # tag | environment | collective | thread ranks: the defaults, then one knob at a time.
    while read -r tag envs coll t; do
        # shellcheck disable=SC2086
        ar "$tag" $(echo "$envs" | tr ',' ' ') timeout -k 5 90 "$bin/${coll}_perf" -t "$t" "${big[@]}"
    done <<EOF2
staged_t2 CHORUS_DEVICE_PATH=staged all_reduce 2
kernel_t2 $K all_reduce 2
ring_t2 $K,CHORUS_DEVICE_DIRECT=-1 all_reduce 2
kernel_t2_vec0 $K,CHORUS_DEVICE_VEC=0 all_reduce 2
kernel_t2_ch16 $K,CHORUS_DEVICE_CHANNELS=16 all_reduce 2
kernel_t2_slot1M $K,CHORUS_DEVICE_SLOT_BYTES=1M all_reduce 2
kernel_t2_slot4M $K,CHORUS_DEVICE_SLOT_BYTES=4M all_reduce 2
kernel_t3 $K all_reduce 3
kernel_t4 $K all_reduce 4
ring_t4 $K,CHORUS_DEVICE_DIRECT=-1 all_reduce 4
kernel_t4_slot1M $K,CHORUS_DEVICE_SLOT_BYTES=1M all_reduce 4
kernel_t8 $K all_reduce 8
ring_t8 $K,CHORUS_DEVICE_DIRECT=-1 all_reduce 8
kernel_t8_slot1M $K,CHORUS_DEVICE_SLOT_BYTES=1M all_reduce 8
ag_kernel_t2 $K all_gather 2
ag_ring_t2 $K,CHORUS_DEVICE_DIRECT=-1 all_gather 2
rs_kernel_t2 $K reduce_scatter 2
rs_ring_t2 $K,CHORUS_DEVICE_DIRECT=-1 reduce_scatter 2
ag_kernel_t4 $K all_gather 4
rs_kernel_t4 $K reduce_scatter 4
bc_kernel_t2 $K broadcast 2
red_kernel_t2 $K reduce 2
a2a_kernel_t2 $K alltoall 2
sr_kernel_t2 $K sendrecv 2
a2a_kernel_t4 $K alltoall 4
EOF2
    # kernel: direct (CHORUS_DEVICE_DIRECT=0), ring: the kernel over slots.
    for path in kernel ring staged; do
        budget 250 "sweep $path" || continue
        [ $path != staged ] && [ $kernel_ok = 0 ] && continue
        direct=0; [ $path = ring ] && direct=-1
        CHORUS_TIMEOUT=20 CHORUS_DEVICE_PATH=${path/ring/kernel} CHORUS_DEVICE_DIRECT=$direct timeout -k 5 120 \
            "$bin/all_reduce_perf" -t 2 -b 8 -e 256M -f 4 -n 20 -w 5 -m device > "$logs/sweep_$path.out" 2>&1
        echo "sweep $path rc=$?"; grep -E '^ +[0-9]+ ' "$logs/sweep_$path.out" | awk '{print "  " $1, $6, $8, $9}'
    done
    note "bw: d2d limit ${d2d} GB/s (busbw ceiling with n ranks on one GPU: d2d / n)"
fi

if has correct && [ $kernel_ok = 1 ]; then
    # Three at a time: processes share the GPU by time slices, which only slows them.
    jobs_run() {
        local tag=$1; shift
        budget 300 "$tag" || return 0
        ( CHORUS_TIMEOUT=20 CHORUS_DEVICE_PATH=kernel CHORUS_DEVICE_DIRECT=0 timeout -k 5 60 "$@" > "$logs/$tag.out" 2>&1
          echo $? > "$logs/$tag.rc" ) &
        while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 0.2; done
    }
    tags=()
    for t in 1 2 3 4 8; do
        for coll in all_reduce reduce_scatter reduce; do
            case $t in 1|3|8) extra=(-d float -o sum -e 64M -f 4) ;; *) extra=(-d all -o all -e 1M -f 32) ;; esac
            tags+=("c_${coll}_$t"); jobs_run "c_${coll}_$t" "$bin/${coll}_perf" -t $t -b 8 "${extra[@]}" -n 1 -w 1 -c 1 -m device
        done
        for coll in all_gather broadcast alltoall sendrecv; do
            case $t in 1|3|8) extra=(-d float -e 64M -f 4) ;; *) extra=(-d all -e 1M -f 32) ;; esac
            tags+=("c_${coll}_$t"); jobs_run "c_${coll}_$t" "$bin/${coll}_perf" -t $t -b 8 "${extra[@]}" -n 1 -w 1 -c 1 -m device
        done
    done
    # The kernel over slots, beside the direct runs above.
    for t in 2 3; do
        for coll in all_reduce reduce_scatter all_gather broadcast; do
            tags+=("c_ring_${coll}_$t"); jobs_run "c_ring_${coll}_$t" env CHORUS_DEVICE_DIRECT=-1 "$bin/${coll}_perf" -t $t -b 8 -d float -e 64M -f 4 -n 1 -w 1 -c 1 -m device
        done
    done
    tags+=(c_all_reduce_unaligned); jobs_run c_all_reduce_unaligned "$bin/all_reduce_perf" -t 2 -b 8 -e 8M -f 8 -u 1 -d all -n 1 -w 1 -c 1 -m device
    wait
    bad=0
    for tag in "${tags[@]}"; do
        rc=$(cat "$logs/$tag.rc" 2>/dev/null || echo "?")
        w=$(wrongs < "$logs/$tag.out")
        rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 13' "$logs/$tag.out" | wc -l)
        if [ "$rc" != 0 ] || [ "$w" != 0 ]; then bad=$((bad + 1)); note "correct: $tag rc=$rc wrong=$w rows=$rows FAILED"; fi
        grep -q "kernel" "$logs/$tag.out" || true
    done
    note "correct: ${#tags[@]} runs, $bad failed"
    [ $bad -ne 0 ] && status=1
fi

if has tune; then
    # The device path's knobs against ranks: all-reduce at 256 MiB, each run twice; then the
    # low-latency protocol's limit by a sweep of small sizes with three limits.
    K="CHORUS_DEVICE_PATH=kernel"
    while read -r tag envs t; do
        for rep in 1 2; do
            ar "tune_${tag}_$rep" $(echo "$envs" | tr ',' ' ') timeout -k 5 60 "$bin/all_reduce_perf" -t "$t" -b 256M -e 256M -n 10 -w 3 -m device
        done
    done <<EOF2
t2_ch32_1M $K,CHORUS_DEVICE_SLOT_BYTES=1M 2
t2_ch32_4M $K,CHORUS_DEVICE_SLOT_BYTES=4M 2
t4_ch32_256K $K 4
t4_ch32_1M $K,CHORUS_DEVICE_SLOT_BYTES=1M 4
t4_ch32_4M $K,CHORUS_DEVICE_SLOT_BYTES=4M 4
t4_ch16_4M $K,CHORUS_DEVICE_CHANNELS=16,CHORUS_DEVICE_SLOT_BYTES=4M 4
t4_ch32_1M_conn32 $K,CHORUS_DEVICE_SLOT_BYTES=1M,CUDA_DEVICE_MAX_CONNECTIONS=32 4
t8_ch16_256K $K 8
t8_ch16_1M $K,CHORUS_DEVICE_SLOT_BYTES=1M 8
t8_ch8_4M $K,CHORUS_DEVICE_CHANNELS=8,CHORUS_DEVICE_SLOT_BYTES=4M 8
t8_ch16_1M_conn32 $K,CHORUS_DEVICE_SLOT_BYTES=1M,CUDA_DEVICE_MAX_CONNECTIONS=32 8
t8_ch8_1M_conn32 $K,CHORUS_DEVICE_CHANNELS=8,CHORUS_DEVICE_SLOT_BYTES=1M,CUDA_DEVICE_MAX_CONNECTIONS=32 8
EOF2
    for ll in 65536 2048 0; do
        env CHORUS_TIMEOUT=20 "$K" CHORUS_DEVICE_LL_MAX=$ll timeout -k 5 60 "$bin/all_reduce_perf" -t 2 \
            -b 1K -e 256K -f 2 -n 50 -w 10 -m device > "$logs/ll_$ll.out" 2>&1 < /dev/null
        note "tune: LL_MAX=$ll rc=$? (bytes:us) $(awk '$1 ~ /^[0-9]+$/ && NF >= 13 {printf "%s:%s ", $1, $6}' "$logs/ll_$ll.out")"
    done
fi

if has torch && budget 330 torch; then
    py=$(command -v python3)
    port=$((20000 + RANDOM % 20000))
    CHORUS_EXPECT_LIB="$out/lib/libnccl.so.2" LD_PRELOAD="$out/lib/libnccl.so.2" CHORUS_TIMEOUT=60 \
        timeout -k 10 120 "$py" -m torch.distributed.run --nproc_per_node 2 --master_port $port \
        "$root/tests/torch/torch_nccl_gpu.py" > "$logs/torch.log" 2>&1
    rc=$?
    note "torch: rc=$rc $(grep -E '^torch |checks|all_reduce 64' "$logs/torch.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && { status=1; grep -vE '^\s*$' "$logs/torch.log" | grep -iE 'error|fail|warn' | head -15; }
fi

echo
echo "==== summary"
for l in "${summary[@]}"; do echo "$l"; done
exit $status
