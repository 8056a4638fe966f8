#!/usr/bin/env bash
# Regenerates the synthetic models' llama.cpp references: tests/synth/<case>.json (each
# position's logits at fixed ids and its top ids, the file's sha256, the llama.cpp commit) and
# tests/synth/iq/*.gguf (the block matrices llama-quantize wrote in each IQ type). The one
# command; CI only reads what it writes.
#
#   scripts/synth/refs.sh [CASE...]     (no case: all of them)
#
# Builds llama.cpp 0c1e57098 with scripts/build-llamacpp.sh (idempotent; 20-40 min on 2 cores the
# first time), compiles scripts/synth/llama_logits.cpp against its static libraries, puts the
# gguf package into target/synth-venv and runs scripts/synth/synth.py refs.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build-llamacpp.sh
L=.llama.cpp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
B=.llama.cpp/build
g++ -O2 -std=c++17 -I"$L/include" -I"$L/ggml/include" scripts/synth/llama_logits.cpp \
  -o .llama.cpp/bin/llama_logits "$B/src/libllama.a" "$B/ggml/src/libggml.a" \
  "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm
VENV=target/synth-venv
"$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null || {
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0 numpy
}
"$VENV/bin/python" scripts/synth/synth.py refs .llama.cpp/bin/llama_logits .llama.cpp/bin/llama-quantize target/synth "$@"
"$VENV/bin/python" scripts/synth/synth.py models target/synth >/dev/null && touch target/synth/.made
