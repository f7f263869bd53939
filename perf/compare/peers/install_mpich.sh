#!/usr/bin/env bash
# install_mpich.sh: MPICH (Debian's mpich + libmpich-dev) for perf/compare/compare.py's `mpich`
# peer, beside Open MPI.
#
#   perf/compare/peers/install_mpich.sh        (as root; needs Debian's package lists)
#
# Both MPIs register the same `mpi` and `mpirun` alternatives (mpicc, mpirun, mpiexec). Open MPI
# stays the one those names run: whichever MPI they pointed to before the install is put back
# after it. The harness calls MPICH by its own names, mpicc.mpich and mpiexec.mpich, and Open MPI
# as mpicc and mpirun.
set -eu
if command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null; then
    echo "MPICH already installed: $(mpichversion 2>/dev/null | awk '/Version:/ {print $3}')"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install_mpich.sh: run as root (apt-get install mpich libmpich-dev)" >&2
    exit 1
fi
# The alternatives' current values, to restore after the install.
prev_mpi=$(update-alternatives --query mpi 2>/dev/null | awk '/^Value:/ {print $2}' || true)
prev_run=$(update-alternatives --query mpirun 2>/dev/null | awk '/^Value:/ {print $2}' || true)
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show mpich >/dev/null 2>&1; then
    apt-get update -q
fi
apt-get install -y -q --no-install-recommends mpich libmpich-dev
if [ -n "$prev_mpi" ] && [ -e "$prev_mpi" ]; then
    update-alternatives --quiet --set mpi "$prev_mpi"
fi
if [ -n "$prev_run" ] && [ -e "$prev_run" ]; then
    update-alternatives --quiet --set mpirun "$prev_run"
fi
if ! command -v mpicc.mpich >/dev/null || ! command -v mpiexec.mpich >/dev/null; then
    echo "install_mpich.sh: mpicc.mpich / mpiexec.mpich missing after the install" >&2
    exit 1
fi
mpicc=$(readlink -f "$(command -v mpicc)" 2>/dev/null || echo none)
mpirun=$(readlink -f "$(command -v mpirun)" 2>/dev/null || echo none)
echo "MPICH installed: mpicc.mpich, mpiexec.mpich; mpicc runs $mpicc, mpirun runs $mpirun"
