#!/usr/bin/env bash
# gpu_bundle.sh: prepare, on a machine without a GPU, what a lent GPU machine needs to check
# Chorus's CUDA path (it cannot install packages and may lack hwloc):
#
#   perf/gpu_bundle.sh [-B build-gpu] [-a 90]
#
# 1. Builds with CUDA on, Release, for compute capability -a (90: H100/H200) into -B.
# 2. Copies the shared libraries the binaries need that such a machine may lack (libhwloc,
#    libudev, libcudart) into devlibs/ (ignored by git) with a copy of the top-level
#    CTestTestfile.cmake, so that ctest can run there from a build carried without CMakeFiles/.
# 3. Prints the paths to carry and the command to run there. The build's absolute paths are
#    this checkout's; the command links them to wherever the copy lands.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu"
arch=90
while [ $# -gt 0 ]; do
    case "$1" in
    -B) build=$(realpath -m "$2"); shift 2 ;;
    -a) arch=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_bundle: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
cmake -B "$build" -S "$root" -DCMAKE_BUILD_TYPE=Release -DCHORUS_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCHORUS_WERROR=ON > /dev/null
cmake --build "$build" -j "$(nproc)" > "$build/gpu_bundle_build.log" 2>&1 || {
    tail -20 "$build/gpu_bundle_build.log" >&2; exit 1; }
libs="$root/devlibs"
mkdir -p "$libs"
for name in libhwloc.so.15 libudev.so.1 libcudart.so.13; do
    path=$(ldd "$build/bin/test_cuda" | awk -v n="$name" '$1 == n {print $3}')
    if [ -n "$path" ]; then cp -L "$path" "$libs/"; else echo "gpu_bundle: $name not linked" >&2; fi
done
cp "$build/CTestTestfile.cmake" "$libs/top_CTestTestfile.cmake"
rel=${build#"$root"/}
echo "carry: devlibs $rel/bin $rel/lib $rel/tests $rel/perf $rel/src $rel/tools $rel/examples"
echo "there: export LD_LIBRARY_PATH=\$PWD/devlibs; [ \"\$PWD\" = $root ] || { mkdir -p $(dirname "$root"); ln -sfn \"\$PWD\" $root; };" \
     "cp devlibs/top_CTestTestfile.cmake $rel/CTestTestfile.cmake; perf/gpu_check.sh -B $rel --no-build;" \
     "(cd $rel && ctest -j14 -LE nightly)"
