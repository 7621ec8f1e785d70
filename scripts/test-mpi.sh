#!/usr/bin/env bash
# Parallel runs over MPI (installing Open MPI and libclang first when missing:
# scripts/install-mpi.sh):
# - the models crate's parallel tests: TP=2, PP=2 and TP=2 x PP=2 on the tiny fixtures against
#   one process, SmolLM2 with TP=3 and PP=2 against its reference (each under mpirun);
# - the OpenAI client tests against `mpirun -n 2 ferrum serve --pipeline-parallel-size 2` (every
#   served model has layers to split; SmolLM2's 9 heads do not split in two);
# - a worker rank killed mid-request: the job must end within seconds, naming the rank.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-mpi.sh
# Open MPI refuses root unless told; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# --workspace with the feature named by package, in both builds: dependencies keep the features
# the workspace build gave them, and the MPI crates are built once for both.
echo "== parallel forward against one process (cargo test --features mpi --test parallel)"
# With the CLI's `apis` tests (a second), so this one build also makes the `ferrum` binary
# with MPI (a package's integration tests build its binaries; `cargo build` would compile the
# workspace again, with the features the dev-dependencies do not add).
# scripts/test.sh ran the parallel tests in its workspace run (FERRUM_PARALLEL_TESTS_RAN), built
# with the same features: only the binary is made here then (nothing is compiled again).
if [ -n "${FERRUM_PARALLEL_TESTS_RAN:-}" ]; then
  cargo test --workspace --features "$FERRUM_TEST_FEATURES" --test apis --no-run "$@"
else
  cargo test --workspace --features ferrum-cli/mpi --test parallel --test apis "$@"
fi

echo "== ferrum with MPI"
mkdir -p target/mpi
cp target/debug/ferrum target/mpi/ferrum
bin="$PWD/target/mpi/ferrum"

echo "== OpenAI client tests against mpirun -n 2 ferrum serve --pipeline-parallel-size 2"
FERRUM_BIN="$bin" FERRUM_LAUNCHER="mpirun --oversubscribe -n 2" \
  FERRUM_SERVE_ARGS="--pipeline-parallel-size 2" bash scripts/test-openai.sh -p test_openai.py

echo "== a worker rank killed mid-request ends the job, naming the rank"
bash scripts/unpack-fixtures.sh
log="$(mktemp)"
mpirun --oversubscribe -n 2 "$bin" serve --model tests/fixtures/tiny-smollm --port 0 \
  --pipeline-parallel-size 2 --threads 1 2>"$log" >/dev/null &
launcher=$!
trap 'kill -9 "$launcher" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "http://" "$log" && break
  sleep 0.2
done
base=$(grep -o "http://[0-9.:]*" "$log" | head -1 || true)
if [ -z "$base" ]; then
  cat "$log" >&2
  echo "test-mpi: the parallel server did not start" >&2
  exit 1
fi
stream="$(mktemp)"
curl -s -N "$base/v1/completions" -H 'content-type: application/json' \
  -d '{"model": "tests/fixtures/tiny-smollm", "prompt": "hello", "max_tokens": 1500, "stream": true}' \
  >"$stream" 2>&1 &
# Mid-request: the stream has begun.
for _ in $(seq 1 600); do
  [ -s "$stream" ] && break
  sleep 0.1
done
worker=""
for p in $(pgrep -P "$launcher" || true); do
  if grep -qzx "OMPI_COMM_WORLD_RANK=1" "/proc/$p/environ"; then worker=$p; fi
done
if [ -z "$worker" ]; then
  echo "test-mpi: no rank 1 under mpirun $launcher" >&2
  exit 1
fi
start=$(date +%s)
kill -9 "$worker"
ended=""
for _ in $(seq 1 300); do
  if ! kill -0 "$launcher" 2>/dev/null; then ended=1; break; fi
  sleep 0.1
done
elapsed=$(( $(date +%s) - start ))
wait "$launcher" && code=0 || code=$?
if [ -z "$ended" ]; then
  kill -9 "$launcher" 2>/dev/null || true
  echo "test-mpi: the job still ran 30 s after its rank 1 was killed" >&2
  exit 1
fi
if [ "$code" = 0 ] || ! grep -q "rank 1" "$log"; then
  cat "$log" >&2
  echo "test-mpi: expected a failed job whose message names rank 1 (exit status $code)" >&2
  exit 1
fi
echo "test-mpi: killing rank 1 ended the job in ${elapsed}s with status $code:"
grep -m1 -B1 -A1 "rank 1" "$log" | sed 's/^/  /'
rm -f "$log" "$stream"
