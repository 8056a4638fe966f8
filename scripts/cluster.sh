#!/usr/bin/env bash
# N local edge-llm workers behind a router from PyPI (installed into .routers/ by
# scripts/install-routers.sh). Every port is bound to 127.0.0.1.
#
#   scripts/cluster.sh [--workers N] [--threads T] [--policy POLICY] [--router vllm|sglang]
#                      [--port PORT] [--worker-port PORT] [--bench] [-- serve flags...]
#
#   --workers N        workers (default 2), on ports --worker-port.. (default 8101..)
#   --threads T        compute threads per worker (default 1)
#   --policy POLICY    kv_aware (default), cache_aware, round_robin, power_of_two, ... for
#                      vllm-router; cache_aware, round_robin, power_of_two, random for sglang
#   --router           vllm (vllm-router, default) or sglang (sglang-router's `smg launch`)
#   --port PORT        the router's port (default 30000); its Prometheus metrics on PORT+1
#   --bench            run scripts/cluster_bench.py (8 chats over 4 system prompts, then their
#                      follow-ups) through the router, print hit rate and tokens/s, and stop
#
# With kv_aware every worker publishes KV events (--kv-events) on its port + 1000. Without
# --bench it serves until Ctrl+C; either way it stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=2 THREADS=1 POLICY=kv_aware ROUTER=vllm PORT=30000 WORKER_PORT=8101 BENCH=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) WORKERS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --policy) POLICY=$2; shift 2 ;;
    --router) ROUTER=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --worker-port) WORKER_PORT=$2; shift 2 ;;
    --bench) BENCH=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$ROUTER" in vllm|sglang) ;; *) echo "error: --router must be vllm or sglang" >&2; exit 2 ;; esac
[ "$WORKERS" -ge 1 ] 2>/dev/null || { echo "error: --workers must be at least 1" >&2; exit 2; }
BIN=target/release/edge-llm
[ -x "$BIN" ] || { echo "error: $BIN is missing: cargo build --release first" >&2; exit 1; }
scripts/install-routers.sh
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_ID=$(basename "$MODEL" .gguf)
LOGS=$(mktemp -d /tmp/edge-llm-cluster.XXXXXX)
PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM
wait_http() { # URL SECONDS
  for _ in $(seq 1 $(( $2 * 5 ))); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.2
  done
  echo "error: $1 did not answer within $2 s (logs in $LOGS)" >&2; exit 1
}
URLS=() SOURCES=()
LOAD_FORMAT=vllm   # the shape of /get_load each router's power_of_two reads
[ "$ROUTER" = sglang ] && LOAD_FORMAT=sglang
for i in $(seq 0 $((WORKERS - 1))); do
  port=$((WORKER_PORT + i))
  events=()
  if [ "$POLICY" = kv_aware ]; then
    events=(--kv-events "tcp://127.0.0.1:$((port + 1000))")
    SOURCES+=(--kv-event-source "http://127.0.0.1:$port=tcp://127.0.0.1:$((port + 1000))")
  fi
  setsid "$BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS" \
    --load-format "$LOAD_FORMAT" "${events[@]}" "${EXTRA[@]}" >"$LOGS/worker-$port.log" 2>&1 &
  PIDS+=($!)
  URLS+=("http://127.0.0.1:$port")
done
for url in "${URLS[@]}"; do wait_http "$url/health" 60; done
if [ "$ROUTER" = vllm ]; then
  KV=()
  [ "$POLICY" = kv_aware ] && KV=(--kv-event-block-size 16 --kv-event-model "$MODEL_ID" "${SOURCES[@]}")
  setsid .routers/bin/vllm-router --host 127.0.0.1 --port "$PORT" \
    --prometheus-host 127.0.0.1 --prometheus-port $((PORT + 1)) \
    --policy "$POLICY" --worker-startup-check-interval 1 --worker-urls "${URLS[@]}" "${KV[@]}" \
    >"$LOGS/router.log" 2>&1 &
else
  setsid .routers/bin/smg launch --host 127.0.0.1 --port "$PORT" \
    --prometheus-host 127.0.0.1 --prometheus-port $((PORT + 1)) \
    --policy "$POLICY" --worker-startup-check-interval 1 --worker-urls "${URLS[@]}" \
    >"$LOGS/router.log" 2>&1 &
fi
PIDS+=($!)
wait_http "http://127.0.0.1:$PORT/v1/models" 60
echo "cluster: $WORKERS workers (${URLS[*]}), $THREADS thread(s) each, behind $ROUTER-router ($POLICY) on http://127.0.0.1:$PORT; metrics on :$((PORT + 1)); logs in $LOGS" >&2
if [ "$BENCH" = 1 ]; then
  python3 scripts/cluster_bench.py "http://127.0.0.1:$PORT" "${URLS[@]}"
else
  echo "cluster: serving until Ctrl+C" >&2
  wait "${PIDS[-1]}"
fi
