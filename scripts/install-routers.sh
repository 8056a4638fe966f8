#!/usr/bin/env bash
# Installs the routers that tests/routers.rs and scripts/cluster.sh put in front of edge-llm
# workers: vllm-router and sglang-router from PyPI, pinned, into a virtual environment in
# .routers/ (ignored by git). Idempotent: does nothing when both are there at these versions.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_ROUTER="vllm-router==0.1.17"
SGLANG_ROUTER="sglang-router==0.3.2"
VENV=.routers
have() {
  [ -x "$VENV/bin/vllm-router" ] && [ -x "$VENV/bin/smg" ] &&
    "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m
assert m.version("vllm-router") == "0.1.17" and m.version("sglang-router") == "0.3.2"
PY
}
if have; then echo "routers ok: $VENV ($VLLM_ROUTER, $SGLANG_ROUTER)" >&2; exit 0; fi
if ! python3 -m venv "$VENV" 2>/dev/null; then
  # Debian splits venv (ensurepip) out of python3.
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get install -y -q python3-venv || ($SUDO apt-get update -q && $SUDO apt-get install -y -q python3-venv)) >/dev/null
  rm -rf "$VENV"
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --disable-pip-version-check "$VLLM_ROUTER" "$SGLANG_ROUTER"
have || { echo "error: the routers did not install into $VENV" >&2; exit 1; }
echo "routers ok: $VENV ($VLLM_ROUTER, $SGLANG_ROUTER)" >&2
