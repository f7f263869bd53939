#!/bin/bash
# netns_topology_check.sh BINDIR: two hosts (network namespaces, own hostname and /dev/shm), 2 ranks
# each, through chorusrun --nnodes 2. Checks, from the INFO lines Chorus prints, that every ring
# crosses between the hosts exactly twice, that edges inside a host use SHM and edges between hosts
# use TCP, and that all_reduce_perf finds no wrong values. Exit 77 (skip) without privileges.
set -u
bindir=${1:?usage: netns_topology_check.sh BINDIR}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp /tmp/chorus_topo_check_XXXXXX)
trap 'rm -f "$out"' EXIT
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=GRAPH "$here/netns_two_hosts.sh" -n 2 -b "$bindir" -t 120 -- \
    "$bindir/all_reduce_perf" -b 4K -e 256K -f 8 -c 1 >"$out" 2>&1
rc=$?
[ $rc -eq 77 ] && { cat "$out"; exit 77; }
fail() { echo "netns_topology_check: FAIL: $*"; echo "---- output ----"; cat "$out"; exit 1; }
[ $rc -eq 0 ] || fail "the job exited with $rc"
host_of() { [ "$1" -lt 2 ] && echo 0 || echo 1; }   # node-rank K holds ranks 2K, 2K+1

rings=$(grep -oE 'NCCL INFO Channel [0-9]+ : [0-9]+( [0-9]+)+$' "$out" | sed 's/.*: //')
[ -n "$rings" ] || fail "no ring printed"
while read -r ring; do
    set -- $ring
    n=$#; first=$1; prev=$1; cross=0
    shift
    for r in "$@" "$first"; do
        [ "$(host_of "$prev")" != "$(host_of "$r")" ] && cross=$((cross + 1))
        prev=$r
    done
    [ $cross -eq 2 ] || fail "ring '$ring' crosses between hosts $cross times, expected 2"
    echo "ring: $ring (host crossings: $cross)"
done <<<"$rings"

edges=$(grep -oE 'NCCL INFO Channel [0-9]+ : [0-9]+ -> [0-9]+ via [A-Z]+' "$out" | sed 's/.*: //')
[ "$(echo "$edges" | wc -l)" -ge 8 ] || fail "expected 8 edges (4 ranks x 2 channels)"
while read -r a arrow b via tr; do
    if [ "$(host_of "$a")" = "$(host_of "$b")" ]; then want=SHM; else want=TCP; fi
    [ "$tr" = "$want" ] || fail "edge $a -> $b uses $tr, expected $want"
done <<<"$edges"
echo "edges: $(echo "$edges" | tr '\n' ';')"
grep -q "Out of bounds values : 0 OK" "$out" || fail "wrong values"
echo "netns_topology_check: OK"
