#!/usr/bin/env bash
# Prepares a GPU round: builds the release `ferrum`, the GPU test binaries (cuda_kernels,
# cuda_attention, cuda_variants, cuda_streams, cuda_fixtures, cuda_kv, cuda_fp8) and
# `ferrum-testdata` (it unpacks the packed fixtures where there is no cargo),
# compresses them into .gpu-pack/bins.tar.xz (ignored by git; carried by the call), compiles
# the tuning sweep's candidates into .gpu-pack/sweeps (kernels/sweep.py build), and prints
# what the call will send: the working tree (tracked files and untracked ones git does not
# ignore, the folder shared/ if the checkout has one) plus the carried pack. Refuses above
# 60 MiB (the device tool's limit is 64 MiB). On the GPU machine, scripts/test-gpu.sh and
# benchmarks/gpu/run.sh find the pack and use its binaries (scripts/gpu/use-pack.sh).
#
#   bash scripts/gpu/pack.sh             # build (release), pack, print the call's size
#   bash scripts/gpu/pack.sh --dry-run   # no build: pack the binaries the tests already built
#                                        # (dev profile: the same code plus line tables, so an
#                                        # upper bound of the release pack), print the sizes,
#                                        # refuse above the limit, then remove the pack. CI runs
#                                        # this, so a GPU session never learns at the device that
#                                        # its call is too large.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

dry=0
case "${1:-}" in
  "") ;;
  --dry-run) dry=1 ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
limit=$((60 * 1024 * 1024))
pack=.gpu-pack

# Executables cargo reports for the GPU test targets (TESTS) and the bin
# ferrum, as "NAME PATH" lines. --workspace: the features the workspace's test build has.
executables() { # CARGO_TEST_ARGS...
  cargo test --workspace "$@" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("executable") and (
            (t.get("name") in ("cuda_kernels", "cuda_attention", "cuda_variants", "cuda_streams",
                                "cuda_fixtures", "cuda_kv", "cuda_fp8")
             and t.get("kind") == ["test"])
            or (t.get("name") == "ferrum" and t.get("kind") == ["bin"] and not m["profile"]["test"])):
        print(t["name"], m["executable"])'
}

declare -A exe=()
if [[ $dry -eq 1 ]]; then
  # What the test run built (fresh: nothing is compiled again).
  profile=debug
  # With the test run's features (FERRUM_TEST_FEATURES, scripts/test-features.sh), so cargo
  # finds its binaries; they link MPI, which a real pack's do not: still an upper bound.
  while read -r name path; do exe[$name]=$path; done \
    < <(executables ${FERRUM_TEST_FEATURES:+--features "$FERRUM_TEST_FEATURES"})
  cargo build --quiet -p ferrum-testdata --bin ferrum-testdata
else
  profile=release
  echo "== building the release ferrum, ferrum-testdata and the GPU test binaries"
  cargo build --release --workspace --bin ferrum --bin ferrum-testdata
  while read -r name path; do exe[$name]=$path; done \
    < <(executables --release --test cuda_kernels --test cuda_attention --test cuda_variants \
      --test cuda_streams --test cuda_fixtures --test cuda_kv --test cuda_fp8)
  exe[ferrum]="target/release/ferrum"
fi
exe[ferrum-testdata]="target/$profile/ferrum-testdata"
for name in ferrum ferrum-testdata cuda_kernels cuda_attention cuda_variants cuda_streams \
    cuda_fixtures cuda_kv cuda_fp8; do
  if [[ ! -x "${exe[$name]:-}" ]]; then
    echo "pack: no $name executable (cargo gave: ${!exe[*]})" >&2
    exit 1
  fi
done

rm -rf "$pack"
mkdir -p "$pack/bin"
for name in "${!exe[@]}"; do
  cp "${exe[$name]}" "$pack/bin/$name"
done
raw=$(du -cb "$pack"/bin/* | tail -1 | cut -f1)
# Without debug information (line tables are most of a dev build; symbols stay, so a
# backtrace still names its functions), and with a dictionary (-9: 64 MiB) that spans the
# binaries, which share most of their code and the embedded kernels.
strip --strip-debug "$pack"/bin/*
tar -C "$pack" -cf - bin | xz -T0 -9 > "$pack/bins.tar.xz"
rm -rf "$pack/bin"
if [[ $dry -eq 0 ]]; then
  # The round's tuning candidates, compiled here with the pinned Triton (the GPU machine's
  # may differ) for sm_90, as overlays of the swept kernels only (about 1 MiB in all).
  echo "== the sweep's candidates (kernels/sweep.py build)"
  venv=target/triton-venv
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "pack: the sweep needs the pinned Triton: run scripts/test-cuda-interpret.sh first" >&2
    exit 1
  fi
  TRITON_CACHE_DIR="$(mktemp -d)" "$venv/bin/python" kernels/sweep.py build \
    --out "$pack/sweeps" --arch sm90 >/dev/null
fi
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.gpu-pack' || echo ' (with uncommitted changes)')"
  echo "profile $profile"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$pack/MANIFEST"

# What the call sends: git's view of the working tree (deleted files left out), shared/ inside
# the checkout when there is one, and the carried pack.
tree=$(git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done \
  | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
shared=0
[[ -d shared ]] && shared=$(du -sb shared | cut -f1)
packed=$(du -sb "$pack" | cut -f1)
total=$((tree + shared + packed))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "pack: ferrum, ferrum-testdata and the test binaries cuda_kernels, cuda_attention, cuda_variants, cuda_streams, cuda_fixtures, cuda_kv and cuda_fp8 ($profile): $(mib "$raw") -> $(mib "$packed") stripped and compressed in $pack/"
echo "pack: the call sends the working tree $(mib "$tree") + shared/ $(mib "$shared") + carried $pack $(mib "$packed") = $(mib "$total") (limit $(mib "$limit"))"
if [[ $dry -eq 1 ]]; then
  rm -rf "$pack"
fi
if ((total > limit)); then
  echo "pack: REFUSED: the call would send $(mib "$total"), over $(mib "$limit"); largest files:" >&2
  git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
    | du -b --files0-from=- | sort -rn | head -10 >&2
  exit 1
fi
if [[ $dry -eq 0 ]]; then
  echo "pack: ready. One call: run(carry=[\"$pack\"], command=\"bash scripts/gpu/round.sh \$OUT\")"
fi
