#!/usr/bin/env bash
# The test command: everything a fresh machine needs, then the whole test suite.
# Fetches the default model and the two extra models (qwen2, gemma3) if missing, builds once in release, runs every test in release.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
scripts/fetch-extra-models.sh   # qwen2 and gemma3, which tests/extra_models.rs runs (about 25 s)
# The chat tests drive the REPL through a real terminal in tmux.
if ! command -v tmux >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get install -y -q tmux || ($SUDO apt-get update -q && $SUDO apt-get install -y -q tmux)) >/dev/null 2>&1 \
    || echo "warning: could not install tmux; the terminal chat tests will be skipped" >&2
fi
cargo build --release --locked
cargo test --release --locked --no-fail-fast "$@"
