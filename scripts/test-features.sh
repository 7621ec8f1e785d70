# Sourced by scripts/test.sh, scripts/test-cuda-interpret.sh, scripts/test-mpi.sh and
# scripts/gpu/pack.sh: the features the workspace's tests build with, in one place, so that one
# test build serves every stage (a different feature set rebuilds the crates under it).
# Both are additive and inert unless used: `mpi` (the parallel tests launch mpirun; the ferrum
# binary initializes MPI only when launched by it) and `fault-injection` (hooks a test must
# set). The `mpi` feature builds against Open MPI and libclang: scripts/install-mpi.sh.
# Exported: the scripts test.sh runs build with them too (each uses its default features when
# run alone without this variable).
export FERRUM_TEST_FEATURES="ferrum-cli/mpi,ferrum-engine/fault-injection"
