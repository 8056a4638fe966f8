#!/usr/bin/env bash
# The test command: everything a fresh machine needs, then the whole test suite.
# Fetches the default model if missing, builds once in release, runs every test in release.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
cargo build --release --locked
cargo test --release --locked --no-fail-fast "$@"
