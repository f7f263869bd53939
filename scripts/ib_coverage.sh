#!/usr/bin/env bash
# ib_coverage.sh: line coverage of the verbs transport (src/transport/ib) by its tests on the
# software verbs provider (tests/ibsoft), measured with gcov.
#
#   scripts/ib_coverage.sh [-B build_dir] [-m min_percent] [-R ctest_regex] [--coll] [--no-build]
#
# Configures build_dir (default build-cov) with the CUDA path off and every object compiled with
# --coverage (forked test ranks write their counts before _exit through __gcov_dump, see
# tests/common/launch.cc), builds test_transport and the providers (with --coll test_coll too),
# clears old counts, runs the ctest cases that match ctest_regex (default: every verbs case of
# test_transport: Ib*, the transport data and failure suites on ib; --coll adds the collective
# sweeps forced onto ib and CollIb*), then prints each source file's lines executed and the
# total, as "ib line coverage: P % (E of N lines)". Exit status 1 when a test failed or the total
# is below min_percent (default 85), 0 otherwise. scripts/test.sh runs it with the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-cov"
min=85
regex='Ib|Transport(Data|Fail).*/ib_'
targets="test_transport chorus_softib chorus_softib_old"
exclude=CollIb
do_build=1
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$2; shift 2 ;;
    -m) min=$2; shift 2 ;;
    -R) regex=$2; shift 2 ;;
    --coll) regex="$regex|CollIb"; exclude='^$'; targets="$targets test_coll"; shift ;;
    --no-build) do_build=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "ib_coverage: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
cov="--coverage -fprofile-update=atomic"
if [ "$do_build" = 1 ]; then
    cmake -S "$root" -B "$build" -DCHORUS_CUDA=OFF -DCHORUS_TESTS=ON -DCMAKE_BUILD_TYPE=Debug \
        "-DCMAKE_C_FLAGS=$cov" "-DCMAKE_CXX_FLAGS=$cov" \
        "-DCMAKE_EXE_LINKER_FLAGS=--coverage -Wl,-u,__gcov_dump" \
        "-DCMAKE_SHARED_LINKER_FLAGS=--coverage" > /dev/null
    # shellcheck disable=SC2086
    cmake --build "$build" -j"$(nproc)" --target $targets
fi
objdir=$(find "$build" -type d -path '*chorus_obj.dir*/src/transport/ib' | head -1)
if [ -z "$objdir" ]; then
    echo "ib_coverage: no objects of src/transport/ib under $build" >&2; exit 2
fi
find "$objdir" -name '*.gcda' -delete
status=0
(cd "$build" && ctest --output-on-failure --timeout 300 -j2 -R "$regex" -E "$exclude") || status=1

# gcov's summary per source: "File '...ib_x.c'" then "Lines executed:P% of N".
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0
hit=0
printf '%-28s %8s %8s %8s\n' file lines executed percent
for src in "$root"/src/transport/ib/*.c; do
    name=$(basename "$src")
    # Without counts (never run) gcov still reads the line table from the .gcno file.
    line=$(cd "$tmp" && gcov -n -o "$objdir/$name.o" "$src" 2>/dev/null |
           awk -v f="$name" '$0 ~ "File .*"f"\x27" {g = 1; next}
                             g && !done && /Lines executed/ {print; done = 1}')
    pct=$(printf '%s\n' "$line" | sed -n 's/Lines executed:\([0-9.]*\)% of \([0-9]*\)/\1/p')
    n=$(printf '%s\n' "$line" | sed -n 's/Lines executed:\([0-9.]*\)% of \([0-9]*\)/\2/p')
    e=$(awk -v p="$pct" -v n="$n" 'BEGIN {printf "%d", p * n / 100 + 0.5}')
    printf '%-28s %8s %8s %8s\n' "$name" "$n" "$e" "$pct"
    total=$((total + n))
    hit=$((hit + e))
done
pct=$(awk -v h="$hit" -v t="$total" 'BEGIN {printf "%.1f", t ? 100 * h / t : 0}')
echo "ib line coverage: $pct % ($hit of $total lines; minimum $min %)"
if awk -v p="$pct" -v m="$min" 'BEGIN {exit !(p < m)}'; then
    echo "ib_coverage: below $min %" >&2; status=1
fi
exit $status
