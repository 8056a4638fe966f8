#!/usr/bin/env bash
# Decode's limits on this machine, measured interleaved: how close single-sequence decode (tg128)
# is to what the memory allows, beside llama.cpp's.
#
# Usage: scripts/decode-limits.sh [-r ROUNDS] [-m MODEL] [-t THREADS]
#   -r ROUNDS   rounds (default 6); the report gives every round and the medians
#   -m MODEL    GGUF file (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   -t THREADS  threads (default 2; x8_stream's token is always 2 threads)
#   LLAMACPP_DIR  llama.cpp's install folder (bin/llama-bench), as for bench-vs-llamacpp.sh;
#               default .llama.cpp in the source tree
#
# Each round runs, one after another:
#   llama-bench -m MODEL -t T -p 0 -n 128 -r 1 -o json        llama.cpp's tg128
#   edge-llm bench -m MODEL -t T -p 16 -n 128 -r 1 --json      edge-llm's tg128
#   target/x8_stream token                                     a token's products of the default
#       model alone (30 layers of q/k/v, o, gate/up, down and the Q8_0 output, in the engine's 151
#       parallel calls), then the same 96.4 MB only read (summed) in the same calls
#   ceil bw T 1024 10                                          the read-bandwidth ceiling of
#       bench-vs-llamacpp.sh's C program (best of 10 passes over 1 GiB)
# The last two are the default model's shapes (benches/x8_stream.c): with another model, only the
# first two columns are about it. Needs gcc and an x86-64 CPU with AVX2 (x8_stream's kernels).
# Nothing is built but the two C programs: build edge-llm (cargo build --release) and llama.cpp
# (scripts/build-llamacpp.sh) first.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=6
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2
while [ $# -gt 0 ]; do
  case "$1" in
    -r) ROUNDS="$2"; shift 2 ;;
    -m) MODEL="$2"; shift 2 ;;
    -t) THREADS="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "decode-limits: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
LLAMA_BIN="${LLAMACPP_DIR:-.llama.cpp}/bin"
EDGE=target/release/edge-llm
for f in "$MODEL" "$EDGE" "$LLAMA_BIN/llama-bench"; do
  [ -e "$f" ] || { echo "decode-limits: $f is missing (see --help)" >&2; exit 1; }
done
command -v gcc >/dev/null || { echo "decode-limits: gcc is missing" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
gcc -O3 -std=gnu11 -fno-math-errno -ffp-contract=off -Icsrc benches/x8_stream.c csrc/*.c \
  -lm -lpthread -o target/x8_stream
# The ceilings program, exactly as bench-vs-llamacpp.sh writes it.
sed -n '/^  cat >"\$TMP\/ceil.c" <<.EOF.$/,/^EOF$/p' scripts/bench-vs-llamacpp.sh | sed '1d;$d' >"$TMP/ceil.c"
gcc -O3 -march=native -pthread -o "$TMP/ceil" "$TMP/ceil.c" -lm

# field NAME: NAME of the JSON on stdin (llama-bench's array, or the last line of edge-llm bench's
# output, which prints its table first).
field() {
  python3 -c '
import json, sys
text = sys.stdin.read()
try:
    d = json.loads(text)
except ValueError:
    d = json.loads(text.strip().splitlines()[-1])
print((d[0] if isinstance(d, list) else d)[sys.argv[1]])' "$1"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r: load $(cut -d' ' -f1 /proc/loadavg)" >&2
  llama="$("$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n 128 -r 1 -o json 2>/dev/null | field avg_ts)"
  edge="$("$EDGE" bench -m "$MODEL" -t "$THREADS" -p 16 -n 128 -r 1 --json 2>/dev/null | field gen_tokens_per_s)"
  token="$(target/x8_stream token)"
  products="$(echo "$token" | awk '/products only/{for(i=1;i<=NF;i++) if($i=="tokens/s") print $(i-1)}')"
  read_only="$(echo "$token" | awk '/only read/{for(i=1;i<=NF;i++) if($i=="tokens/s") print $(i-1)}')"
  ceil="$("$TMP/ceil" bw "$THREADS" 1024 10 | field best_gb_s)"
  echo "$r $llama $edge $products $read_only $ceil" >>"$TMP/rounds"
done

python3 - "$TMP/rounds" <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1])]
print("| round | llama.cpp tg128 | 2.2x that | edge-llm tg128 | products alone | the same bytes only read | read ceiling, best pass |")
print("|---:|---:|---:|---:|---:|---:|---:|")
def line(name, llama, edge, prod, read, ceil):
    print(f"| {name} | {llama:.1f} | {2.2 * llama:.1f} | {edge:.1f} ({edge / llama:.2f}x) | {prod:.0f} | {read:.0f} | {ceil:.1f} GB/s |")
for r in rows:
    line(int(r[0]), *r[1:])
line("median", *(statistics.median(r[i] for r in rows) for i in range(1, 6)))
slower = sum(r[4] < 2.2 * r[1] for r in rows)
print(f"\ntokens/s. Rounds where only reading the weights is slower than 2.2x llama.cpp: {slower} of {len(rows)}.")
print("Products alone as a share of the plain read: " + ", ".join(f"{r[3] / r[4]:.0%}" for r in rows) + ".")
print("edge-llm's tg128 as a share of the products alone: " + ", ".join(f"{r[2] / r[3]:.0%}" for r in rows) + ".")
PY
