# Sourced by scripts/test-gpu.sh and benchmarks/gpu/run.sh: when the carried pack of
# scripts/gpu/pack.sh is here (.gpu-pack/bins.tar.xz) and no binary was named, unpacks it once
# into target/gpu-pack and points FERRUM_BIN, FERRUM_GPU_TEST_BINS and FERRUM_TESTDATA_BIN at it.
# Expects the repository root as the current folder.
if [[ -f .gpu-pack/bins.tar.xz && -z "${FERRUM_BIN:-}" ]]; then
  if [[ ! -x target/gpu-pack/bin/ferrum || .gpu-pack/bins.tar.xz -nt target/gpu-pack/bin/ferrum ]]; then
    rm -rf target/gpu-pack
    mkdir -p target/gpu-pack
    tar -C target/gpu-pack -xJf .gpu-pack/bins.tar.xz
    touch target/gpu-pack/bin/*
  fi
  export FERRUM_BIN="$PWD/target/gpu-pack/bin/ferrum"
  export FERRUM_GPU_TEST_BINS="$PWD/target/gpu-pack/bin"
  export FERRUM_TESTDATA_BIN="$PWD/target/gpu-pack/bin/ferrum-testdata"
  echo "using the carried pack: $(head -1 .gpu-pack/MANIFEST 2>/dev/null)"
fi
