#!/usr/bin/env bash
# Installs what the `mpi` feature builds and runs with, from Debian's packages, when missing:
# Open MPI (mpirun, and the headers and mpicc the mpi crate probes) and libclang (its bindgen).
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/*/libclang*.so* 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' \
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
