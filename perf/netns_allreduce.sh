#!/bin/bash
# netns_allreduce.sh: all-reduce between "hosts" made of network namespaces on this machine, L
# ranks per host, each algorithm in alternating rounds; prints the median time per size.
#
#   netns_allreduce.sh [-H "2 4 8"] [-L RANKS_PER_HOST] [-a "ring tree auto"] [-R ROUNDS] [-r RATE]
#                      [-b MIN] [-e MAX] [-n ITERS] [-w WARMUP] [-B BINDIR] [-m COST_MODEL]
#
# For each host count H: H network namespaces, each joined to one bridge by a veth pair
# (10.78.0.K/24); each host's L ranks (-L, default 1) run in one UTS and mount namespace of their
# own with the host's hostname and a private /dev/shm (so ranks of one host share memory and see
# the other hosts' ranks as other hosts, over TCP). Rank k*L+j is local rank j of host k. With -r RATE (e.g. 1gbit) every
# host's link is shaped with tc tbf at its egress (the kernel here has no netem, so no added
# latency). Then ROUNDS rounds, each running all_reduce_perf -b MIN -e MAX -f 4 once per
# algorithm in the list, in an order that rotates each round ("auto" is the tuner's own choice;
# the others set CHORUS_ALGO; "hier" is the hierarchical all-reduce, which needs L >= 2; an entry
# ALGO:NAME=VALUE[,NAME=VALUE...] also sets those variables for its runs, e.g.
# "tree tree:CHORUS_TREE_LAG=0" compares two settings of one algorithm). Output:
# one line per host count, algorithm and size with the median over rounds of rank 0's time per
# call (us) and the per-round values.
# Needs root (ip netns). The namespaces and the bridge are removed on exit.
set -u

here=$(cd "$(dirname "$0")" && pwd)
bindir="$here/../build/bin"
host_counts="2 4 8"
algos="ring tree auto"
rounds=3
rate=""
minb=64K
maxb=4M
iters=20
warm=3
per=1
model=""
while getopts "H:L:a:R:r:b:e:n:w:B:m:h" opt; do
    case $opt in
    H) host_counts=$OPTARG ;;
    L) per=$OPTARG ;;
    w) warm=$OPTARG ;;
    a) algos=$OPTARG ;;
    R) rounds=$OPTARG ;;
    r) rate=$OPTARG ;;
    b) minb=$OPTARG ;;
    e) maxb=$OPTARG ;;
    n) iters=$OPTARG ;;
    B) bindir=$OPTARG ;;
    m) model=$OPTARG ;;
    h)
        sed -n '2,20p' "$0"
        exit 0
        ;;
    *) exit 2 ;;
    esac
done
perfbin="$bindir/all_reduce_perf"
[ -x "$perfbin" ] || { echo "netns_allreduce: $perfbin not found (-B BINDIR)" >&2; exit 2; }
libdir=$(cd "$bindir/../lib" && pwd)

tag="$$"
br="chbr$tag"
br=${br:0:15}
nss=()
tmpd=$(mktemp -d /tmp/chorus_netns_ar_XXXXXX)
cleanup() {
    for ns in "${nss[@]:-}"; do [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null; done
    ip link del "$br" 2>/dev/null
    rm -rf "$tmpd"
    true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip link add "$br" type bridge || { echo "netns_allreduce: needs root (ip link add bridge)" >&2; exit 77; }
ip link set "$br" up

# Hosts 0..H-1 (made once, reused by smaller counts).
made=0
make_hosts() {
    local want=$1
    while [ $made -lt "$want" ]; do
        local k=$made ns="chns${tag}_$made" a="cha${tag}_$made" b="chb${tag}_$made"
        a=${a:0:15}
        b=${b:0:15}
        ip netns add "$ns"
        nss+=("$ns")
        ip link add "$a" type veth peer name "$b"
        ip link set "$a" netns "$ns"
        ip link set "$b" master "$br"
        ip link set "$b" up
        ip -n "$ns" addr add "10.78.0.$((k + 1))/24" dev "$a"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$a" up
        if [ -n "$rate" ]; then
            ip netns exec "$ns" tc qdisc add dev "$a" root tbf rate "$rate" burst 256kb latency 50ms
        fi
        made=$((made + 1))
    done
}

secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
port=29600
# One run: H hosts of $per ranks; rank 0's output in $tmpd/out.0.0.
run_once() {
    local h=$1 algo=$2
    port=$((port + 1))
    local pids=() env_algo="" name=${algo%%:*} extra=""
    [ "$name" != "$algo" ] && extra=$(echo "${algo#*:}" | tr ',' ' ')
    [ "$name" != auto ] && env_algo="CHORUS_ALGO=$name"
    env_algo="$env_algo $extra"
    for ((k = 0; k < h; k++)); do
        ip netns exec "chns${tag}_$k" unshare --uts --mount --propagation private sh -c "
            hostname chorus-h$k && mount -t tmpfs -o size=$((64 * per))m shm$k /dev/shm || exit 1
            j=0; pids=''
            while [ \$j -lt $per ]; do
                env LD_LIBRARY_PATH=$libdir CHORUS_JOB_SECRET=$secret RANK=\$(($k * $per + j)) \
                    WORLD_SIZE=$((h * per)) LOCAL_RANK=\$j LOCAL_WORLD_SIZE=$per \
                    MASTER_ADDR=10.78.0.1 MASTER_PORT=$port CHORUS_TIMEOUT=120 \
                    ${model:+CHORUS_COST_MODEL=$model} $env_algo \
                    timeout -k 5 600 $perfbin -b $minb -e $maxb -f 4 -n $iters -w $warm -c 0 -a 0 \
                    >$tmpd/out.$k.\$j 2>&1 &
                pids=\"\$pids \$!\"
                j=\$((j + 1))
            done
            rc=0
            for p in \$pids; do wait \$p || rc=1; done
            exit \$rc
        " &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc -ne 0 ]; then
        echo "netns_allreduce: $h hosts x $per, $algo failed:" >&2
        tail -5 "$tmpd/out.0.0" >&2
        return 1
    fi
    # Rows: size count type redop root time algbw busbw ... (out of place): bytes and time.
    awk '$1 ~ /^[0-9]+$/ && NF >= 6 { print $1, $6 }' "$tmpd/out.0.0"
}

for h in $host_counts; do
    make_hosts "$h"
    set -- $algos
    na=$#
    : >"$tmpd/results"
    for ((r = 0; r < rounds; r++)); do
        for ((i = 0; i < na; i++)); do
            idx=$(((i + r) % na + 1))
            algo=${!idx}
            run_once "$h" "$algo" | while read -r size us; do echo "$algo $size $us"; done \
                >>"$tmpd/results"
        done
    done
    python3 - "$h" "$tmpd/results" "$per" <<'EOF'
import sys, statistics, collections
h = sys.argv[1] + "x" + sys.argv[3]
rows = collections.OrderedDict()
for line in open(sys.argv[2]):
    algo, size, us = line.split()
    rows.setdefault((algo, int(size)), []).append(float(us))
for (algo, size), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"hosts {h:5s} algo {algo:5s} bytes {size:8d} median_us {statistics.median(v):10.1f} "
          f"rounds {' '.join(f'{x:.1f}' for x in v)}")
EOF
done
