#!/usr/bin/env bash
# install_oneccl.sh: Intel oneCCL for CPUs (PyPI's oneccl-cpu-devel, with the Intel MPI it runs
# on) in a Python venv, for perf/compare/compare.py's `oneccl-mpi` and `oneccl-ofi` peers.
#
#   perf/compare/peers/install_oneccl.sh [VENV]
#
# VENV defaults to $CHORUS_PEERS_DIR/oneccl, CHORUS_PEERS_DIR to ~/.cache/chorus-peers; compare.py
# looks in the same place (or where --oneccl-venv says). Installs oneccl-cpu-devel (2022.1.2
# unless $ONECCL_VERSION says another), which brings Intel MPI's runtime (impi-rt: libmpi.so,
# mpiexec, libfabric), and impi-devel of the same version for mpi.h. compare.py compiles
# perf/compare/oneccl_bench.cpp against the venv at the start of each run: the wheel's shared
# libccl.so.1 does not load, so the benchmark links the static CPU archive
# lib/ccl/cpu/lib/libccl.a with hwloc and perf/compare/peers/oneccl_link_shims.c. Needs python3
# with venv, g++ and libhwloc-dev.
set -eu
V=${1:-${CHORUS_PEERS_DIR:-$HOME/.cache/chorus-peers}/oneccl}
# The version the comparison was set up with; ONECCL_VERSION= (empty) takes the newest.
ver=${ONECCL_VERSION-2022.1.2}
spec=oneccl-cpu-devel${ver:+==$ver}
if [ ! -x "$V/bin/pip" ]; then
    python3 -m venv "$V"
fi
"$V/bin/pip" install -q --disable-pip-version-check "$spec"
impi=$("$V/bin/pip" show impi-rt 2>/dev/null | awk '/^Version:/ {print $2}')
if [ -z "$impi" ]; then
    echo "install_oneccl.sh: $spec did not bring impi-rt (Intel MPI)" >&2
    exit 1
fi
"$V/bin/pip" install -q --disable-pip-version-check "impi-devel==$impi"
missing=""
for f in lib/ccl/cpu/lib/libccl.a include/oneapi/ccl.hpp include/mpi.h lib/libmpi.so \
    bin/mpiexec; do
    [ -e "$V/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
    echo "install_oneccl.sh: missing in $V after the install:$missing" >&2
    exit 1
fi
if ! echo '#include <hwloc.h>' | g++ -x c++ -fsyntax-only - 2>/dev/null; then
    echo "install_oneccl.sh: hwloc.h not found: apt-get install libhwloc-dev" >&2
    exit 1
fi
ccl=$("$V/bin/pip" show oneccl-cpu-devel | awk '/^Version:/ {print $2}')
echo "oneCCL $ccl with Intel MPI $impi in $V"
