#!/usr/bin/env bash
# run.sh: the comparison in one command (see compare.py for what runs and how it is measured).
#   perf/compare/run.sh [compare.py options]     e.g. --np 4 --maxbytes 64M
# Uses build/ of the repository unless --build is given; builds the perf binaries and chorusrun
# there first when that build directory exists.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build="$repo/build"
prev=""
for arg in "$@"; do
    if [ "$prev" = "--build" ]; then build=$arg; fi
    case "$arg" in --build=*) build=${arg#--build=} ;; esac
    prev=$arg
done
if [ -f "$build/CMakeCache.txt" ]; then
    cmake --build "$build" -j2 --target perf_binaries chorusrun >/dev/null
fi
exec python3 "$here/compare.py" --build "$build" "$@"
