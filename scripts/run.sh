#!/usr/bin/env bash
# The main job: fetch the default model if missing, build, and run edge-llm with the given
# arguments (default: a greedy completion on the default model).
#   scripts/run.sh                                   # greedy completion of a sample prompt
#   scripts/run.sh run -p "Once upon a time" -n 64   # any subcommand
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo build --release --locked --quiet
if [ $# -eq 0 ]; then
  set -- run -p "The capital of France is" -n 48 --temp 0
fi
exec target/release/edge-llm "$@"
