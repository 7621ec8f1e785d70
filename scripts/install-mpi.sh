#!/usr/bin/env bash
# Installs what the `mpi` feature builds and runs with, from Debian's packages, when missing:
# Open MPI (mpirun, and the headers and mpicc the mpi crate probes) and libclang (its bindgen).
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
# libclang itself (libclang.so, libclang-14.so.1), not libclang-cpp.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null \
  || compgen -G '/usr/lib/*/libclang-[0-9]*.so*' >/dev/null \
  || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-mpi: install ${need[*]} (Debian/Ubuntu packages) first" >&2
    exit 1
  fi
  echo "install-mpi: installing ${need[*]}" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
