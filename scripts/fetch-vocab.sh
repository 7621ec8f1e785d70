#!/usr/bin/env bash
# Fetches llama.cpp's vocabulary GGUFs with their test texts and reference ids
# (ggml-vocab-NAME.gguf, .gguf.inp, .gguf.out) from the llama-cpp-python 0.3.36 source
# distribution on PyPI (vendor/llama.cpp/models/, MIT licensed) into models/vocab/ (or
# $FERRUM_MODELS_DIR/vocab), unless they are already there. The archive and every file are
# checked by SHA-256. Only PyPI is contacted. Used by crates/models/tests/text.rs and the fuzz
# tests (tests/fixtures/vocab/README.md).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${FERRUM_MODELS_DIR:-$root/models}/vocab"
python=$(command -v python3 || command -v python || true)
if [ -z "$python" ]; then
  echo "fetch-vocab: python3 is needed" >&2
  exit 1
fi
mkdir -p "$dest"
"$python" - "$dest" <<'PY'
import hashlib, io, os, re, subprocess, sys, tarfile, tempfile, urllib.parse, urllib.request

dest = sys.argv[1]
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
FILES = {
    "ggml-vocab-gpt-2.gguf": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "ggml-vocab-phi-3.gguf": "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
    "ggml-vocab-qwen2.gguf": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "ggml-vocab-starcoder.gguf": "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
}
INP = "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"
OUT = {
    "gpt-2": "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
    "llama-bpe": "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
    "llama-spm": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "phi-3": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "qwen2": "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
    "starcoder": "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764",
}
want = dict(FILES)
for name, sha in OUT.items():
    want[f"ggml-vocab-{name}.gguf.inp"] = INP
    want[f"ggml-vocab-{name}.gguf.out"] = sha

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

missing = [f for f, s in want.items()
           if not os.path.isfile(os.path.join(dest, f)) or sha256(os.path.join(dest, f)) != s]
if not missing:
    print(dest)
    sys.exit(0)

# The index pip is set up to use (PIP_INDEX_URL or pip's config), else PyPI's.
index = os.environ.get("PIP_INDEX_URL") or subprocess.run(
    [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
    capture_output=True, text=True).stdout.strip() or "https://pypi.org/simple"
page_url = index.rstrip("/") + "/llama-cpp-python/"
print(f"fetch-vocab: downloading {SDIST} (77 MB) from {urllib.parse.urlsplit(index).netloc}...",
      file=sys.stderr)
page = urllib.request.urlopen(page_url, timeout=120).read().decode()
hrefs = [h for h in re.findall(r'href="([^"]+)"', page) if SDIST in h]
if not hrefs:
    sys.exit(f"fetch-vocab: {page_url} does not list {SDIST}")
url = urllib.parse.urljoin(page_url, hrefs[0].split("#")[0])
with tempfile.TemporaryDirectory(dir=dest) as tmp:
    archive = os.path.join(tmp, SDIST)
    with urllib.request.urlopen(url, timeout=600) as r, open(archive, "wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    got = sha256(archive)
    if got != SDIST_SHA:
        sys.exit(f"fetch-vocab: {SDIST} has SHA-256 {got}, expected {SDIST_SHA}")
    prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
    with tarfile.open(archive) as t:
        for name in missing:
            member = t.extractfile(prefix + name)
            if member is None:
                sys.exit(f"fetch-vocab: {SDIST} lacks {prefix + name}")
            part = os.path.join(tmp, name)
            with open(part, "wb") as out:
                out.write(member.read())
            if sha256(part) != want[name]:
                sys.exit(f"fetch-vocab: {name} has SHA-256 {sha256(part)}, expected {want[name]}")
            os.replace(part, os.path.join(dest, name))
print(f"fetch-vocab: {len(missing)} files into {dest}", file=sys.stderr)
print(dest)
PY
