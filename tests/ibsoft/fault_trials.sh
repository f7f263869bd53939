#!/usr/bin/env bash
# fault_trials.sh: every fault knob of the software verbs provider, many trials each, as a table.
#
#   tests/ibsoft/fault_trials.sh [-B build_dir] [-n trials] [-t trial_timeout_s] [-f filter]
#
# The cases are the fault tests of the verbs transport (they set the knob,
# NCCL_IB_QPS_PER_CONNECTION and NCCL_IB_SPLIT_DATA_ON_QPS themselves):
#   test_transport Knobs/IbFault.ErrorNamesPeerBeforeDeadline/*  two forked ranks move 40 MiB each
#       way with the knob set on both (failing reg_mr, create_qp or modify_qp at INIT, RTR or
#       RTS; a completion error on the Nth request; a dead peer; a port down from the start or
#       after the Nth request; with 1 or 4 queue pairs, round-robin or split); each rank must fail
#       within 4 s (CHORUS_TIMEOUT 5) with an error that names the other rank
#   test_coll Coll/CollIbFault.QpErrorFailsEveryRank/*  three forked ranks in all-reduce, one
#       queue pair of rank 1 failing (4 queue pairs, round-robin or split); every rank must fail
#       within 8 s (CHORUS_TIMEOUT 10) naming rank 1
# filter (a grep -E regex on the case names) picks some. Each case runs trials times (default 20)
# in a process of its own under `timeout trial_timeout_s` (default 120; the cases' own forked
# ranks are killed after 60 or 90 s): a trial that runs out is a hang. Each rank prints
# "fault-trial: rank R failed after T s: <error>"; the table gives per case the trials that
# passed, failed and hung, the slowest rank's error time and how many rank errors named no rank.
# Exit status 0 when every trial passed, 1 otherwise.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build"
trials=20
tmo=120
filter=.
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$2; shift 2 ;;
    -n) trials=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -f) filter=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "fault_trials: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
cases=()
for spec in "test_transport:Knobs/IbFault.ErrorNamesPeerBeforeDeadline/*" \
            "test_coll:Coll/CollIbFault.QpErrorFailsEveryRank/*"; do
    bin="$build/bin/${spec%%:*}"
    if [ ! -x "$bin" ]; then
        echo "fault_trials: $bin is not built (its target and chorus_softib): its cases left out" >&2
        continue
    fi
    # --gtest_list_tests: the suite on a line of its own, then each case indented.
    while read -r name; do
        cases+=("$bin:$name")
    done < <("$bin" --gtest_list_tests --gtest_filter="${spec#*:}" |
             awk '/^[^ ]/ {suite = $1; next} {print suite $1}' | grep -E -- "$filter")
done
if [ ${#cases[@]} -eq 0 ]; then
    echo "fault_trials: no case matches $filter" >&2; exit 2
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
printf '%-62s %6s %6s %6s %6s %10s %9s\n' case trials passed failed hangs "slowest_s" unnamed
for c in "${cases[@]}"; do
    bin=${c%%:*}
    name=${c#*:}
    pass=0 fail=0 hang=0 unnamed=0 slow=0
    for ((i = 0; i < trials; i++)); do
        timeout -k 5 "$tmo" "$bin" --gtest_filter="$name" > "$log" 2>&1
        rc=$?
        if [ $rc -eq 124 ] || [ $rc -eq 137 ] || grep -q 'timed out' "$log"; then
            hang=$((hang + 1))
        elif [ $rc -eq 0 ] && grep -q '\[  PASSED  \] 1 test' "$log"; then
            pass=$((pass + 1))
        else
            fail=$((fail + 1))
            if [ $fail -eq 1 ]; then
                echo "---- $name, trial $((i + 1)) failed:"
                grep -E 'FAILED|rank [0-9]+:|Failure' "$log" | head -8
            fi >&2
        fi
        # "fault-trial: rank R failed after T s: <error>": the slowest T, errors naming no rank.
        slow=$(awk -v s="$slow" '/^fault-trial: rank/ {t = $6 + 0; if (t > s) s = t}
                                 END {print s}' "$log")
        n=$(grep '^fault-trial: rank' "$log" | sed 's/^fault-trial: [^:]*: //' |
            grep -vc 'rank [0-9]')
        unnamed=$((unnamed + n))
    done
    [ $pass -eq "$trials" ] || status=1
    printf '%-62s %6d %6d %6d %6d %10.2f %9d\n' "$name" "$trials" $pass $fail $hang "$slow" $unnamed
done
[ $status = 0 ] && echo "fault_trials: every trial passed" || echo "fault_trials: FAILED"
exit $status
