#!/usr/bin/env bash
# launch_local.sh: run N copies of a command as ranks of one job on this machine, the way
# chorusrun/torchrun do (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
# A fallback for tests and the comparison harness where chorusrun is not built.
#   usage: launch_local.sh [-t timeout_s] N command [args...]
# Exit status: 0 when every rank exits 0; otherwise the first non-zero status (124 on timeout).
# Rank 0's output goes to stdout; the others' to stderr prefixed by their rank.
set -u
timeout_s=300
if [ "${1:-}" = "-t" ]; then timeout_s=$2; shift 2; fi
if [ $# -lt 2 ]; then echo "usage: $0 [-t timeout_s] N command [args...]" >&2; exit 2; fi
n=$1; shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The job secret, as chorusrun makes it: without one Chorus refuses the fixed root address.
if [ -z "${CHORUS_JOB_SECRET:-}" ] && [ -z "${CHORUS_JOB_SECRET_FILE:-}" ]; then
    CHORUS_JOB_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
    export CHORUS_JOB_SECRET
fi
pids=()
for ((r = 0; r < n; r++)); do
    if [ "$r" -eq 0 ]; then
        RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port timeout -k 5 "$timeout_s" "$@" &
    else
        RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port timeout -k 5 "$timeout_s" "$@" > >(sed "s/^/[rank $r] /" >&2) 2>&1 &
    fi
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
    wait "$p"; s=$?
    if [ "$s" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$s; fi
done
exit $rc
