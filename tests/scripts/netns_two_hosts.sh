#!/bin/bash
# netns_two_hosts.sh: run a job across two "hosts" made of network namespaces on this machine.
#
#   netns_two_hosts.sh [-n RANKS_PER_HOST] [-b BINDIR] [-t SECONDS] [-p PORT] [-N] [-r RATE] [--]
#                      [program args...]
#
# Two network namespaces joined by a veth pair (10.77.0.1/24 and 10.77.0.2/24, loopback up). Each
# host runs in its own UTS and mount namespace (unshare --uts --mount) with its own hostname
# (chorus-host0/1) and a private tmpfs on /dev/shm, so neither can see the other's shared memory,
# as on two real machines. Each runs
#   chorusrun --nnodes 2 --node-rank K --master-addr 10.77.0.1 --master-port 29577 -n N program...
# With -N the master address is the host name chorus-host0, and each host gets its own /etc/hosts
# the way Debian writes it: its own name on 127.0.1.1, the other's on its veth address (so the
# name resolves differently on the two hosts, a classic trap).
# With -r RATE (e.g. 1gbit) the link between the hosts is shaped with tc tbf in both directions.
# Output lines are prefixed with [host0]/[host1]. The default program is BINDIR/bs_rank_main
# (bootstrap across the hosts). BINDIR defaults to build/bin next to this script's repository.
#
# Exit status: 0 when both hosts succeed; 77 (skip, with a message) when this user cannot create
# network namespaces or a needed tool is missing; otherwise non-zero. The namespaces are always
# removed (trap), also on failure or interruption. Traffic stays inside the two namespaces.
set -u

here=$(cd "$(dirname "$0")" && pwd)
nranks=2
bindir="$here/../../build/bin"
limit=120
port=29577
names=0
rate=""
while getopts "r:n:b:t:p:Nh" opt; do
    case $opt in
    N) names=1 ;;
    n) nranks=$OPTARG ;;
    b) bindir=$OPTARG ;;
    t) limit=$OPTARG ;;
    p) port=$OPTARG ;;
    r) rate=$OPTARG ;;
    h)
        sed -n '2,22p' "$0"
        exit 0
        ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
chorusrun="$bindir/chorusrun"
if [ $# -eq 0 ]; then
    set -- "$bindir/bs_rank_main"
fi
if [ ! -x "$chorusrun" ]; then
    echo "netns_two_hosts: $chorusrun not found (build it, or pass -b BINDIR)" >&2
    exit 2
fi

skip() {
    echo "netns_two_hosts: SKIP: $*" >&2
    exit 77
}
for tool in ip unshare timeout hostname mount; do
    command -v $tool >/dev/null 2>&1 || skip "'$tool' is not installed"
done

tag="$$"
ns0="chorus_h0_$tag"
ns1="chorus_h1_$tag"
veth0="chv0_$tag"
veth1="chv1_$tag"
veth0=${veth0:0:15}
veth1=${veth1:0:15}
pids=()

cleanup() {
    for p in "${pids[@]:-}"; do
        [ -n "$p" ] && kill -TERM "$p" 2>/dev/null
    done
    sleep 0.2
    for p in "${pids[@]:-}"; do
        [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
    done
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    ip link del "$veth0" 2>/dev/null
    [ -n "${tmpd:-}" ] && rm -rf "$tmpd"
    true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! ip netns add "$ns0" 2>/dev/null; then
    skip "cannot create network namespaces (needs root or CAP_SYS_ADMIN)"
fi
ip netns add "$ns1" || { echo "netns_two_hosts: ip netns add $ns1 failed" >&2; exit 1; }
set -e
ip link add "$veth0" type veth peer name "$veth1"
ip link set "$veth0" netns "$ns0"
ip link set "$veth1" netns "$ns1"
ip -n "$ns0" addr add 10.77.0.1/24 dev "$veth0"
ip -n "$ns1" addr add 10.77.0.2/24 dev "$veth1"
for ns in "$ns0" "$ns1"; do
    ip -n "$ns" link set lo up
done
ip -n "$ns0" link set "$veth0" up
ip -n "$ns1" link set "$veth1" up
if [ -n "$rate" ]; then
    # A slow link between the hosts (e.g. -r 1gbit), shaped in both directions.
    ip netns exec "$ns0" tc qdisc add dev "$veth0" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$ns1" tc qdisc add dev "$veth1" root tbf rate "$rate" burst 256kb latency 50ms
fi
set +e

# Quote the program and its arguments for the inner shell.
prog=""
for a in "$@"; do
    prog="$prog $(printf '%q' "$a")"
done

master=10.77.0.1
hosts_setup=("true" "true")
if [ $names -eq 1 ]; then
    master=chorus-host0
    tmpd=$(mktemp -d /tmp/chorus_netns_XXXXXX)
    printf '127.0.0.1 localhost\n127.0.1.1 chorus-host0\n10.77.0.2 chorus-host1\n' >"$tmpd/hosts0"
    printf '127.0.0.1 localhost\n10.77.0.1 chorus-host0\n127.0.1.1 chorus-host1\n' >"$tmpd/hosts1"
    hosts_setup=("mount --bind $tmpd/hosts0 /etc/hosts" "mount --bind $tmpd/hosts1 /etc/hosts")
fi

# Both hosts' chorusruns get the same job secret (a multi-node chorusrun cannot make one itself).
if [ -z "${CHORUS_JOB_SECRET:-}" ] && [ -z "${CHORUS_JOB_SECRET_FILE:-}" ]; then
    CHORUS_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export CHORUS_JOB_SECRET
fi

run_host() {
    local k=$1 ns=$2
    ip netns exec "$ns" unshare --uts --mount --propagation private sh -c "
        hostname chorus-host$k &&
        mount -t tmpfs -o size=256m chorus-shm$k /dev/shm &&
        ${hosts_setup[$k]} &&
        exec timeout -k 5 $limit $(printf '%q' "$chorusrun") --nnodes 2 --node-rank $k \
            --master-addr $master --master-port $port -n $nranks --tag-output $prog
    " 2>&1 | sed -u "s/^/[host$k] /"
    return "${PIPESTATUS[0]}"
}

run_host 0 "$ns0" &
pids+=($!)
run_host 1 "$ns1" &
pids+=($!)
wait "${pids[0]}"
rc0=$?
wait "${pids[1]}"
rc1=$?
pids=()
echo "netns_two_hosts: host0 exit $rc0, host1 exit $rc1"
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
    exit 1
fi
exit 0
