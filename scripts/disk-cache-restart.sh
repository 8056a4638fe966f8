#!/bin/bash
# TTFT of a chat request with a 472-token system prompt on an empty disk cache (cold) and after
# the server was killed and started again on the same --cache-dir, in interleaved pairs; checks
# the outputs are identical. Usage: scripts/disk-cache-restart.sh [PAIRS] (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
B=./target/release/edge-llm
PORT=${PORT:-18240}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 - "$W/body.json" <<'PY'
import json, sys
system = " ".join(f"Rule {i}: always answer politely and mention the number {i*7} when relevant." for i in range(1, 26))
json.dump({"messages": [{"role": "system", "content": system},
                        {"role": "user", "content": "What is the capital of France?"}],
           "max_tokens": 20, "temperature": 0}, open(sys.argv[1], "w"))
PY
start() {
  $B serve --port "$PORT" --cache-dir "$1" -c 2048 2>"$2" & PID=$!
  for _ in $(seq 300); do curl -sf "localhost:$PORT/health" >/dev/null && return; sleep 0.2; done
}
stop() { kill -9 "$PID"; wait "$PID" 2>/dev/null || true; }
ttft() { grep -o "POST /v1/chat/completions 200 .*ttft=[0-9]*" "$1" | grep -o "ttft=[0-9]*" | cut -d= -f2; }
for r in $(seq "${1:-3}"); do
  D="$W/cache$r"
  start "$D" "$W/cold.log"
  curl -s "localhost:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d @"$W/body.json" >"$W/cold.json"
  # The write-behind is asynchronous: wait until the prompt's 29 full blocks are on disk.
  for _ in $(seq 300); do
    n=$(curl -s "localhost:$PORT/metrics" | awk '/^edge_llm_disk_cache_blocks /{print $2}')
    [ "${n:-0}" -ge 29 ] && break; sleep 0.2
  done
  stop
  start "$D" "$W/warm.log"
  curl -s "localhost:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d @"$W/body.json" >"$W/warm.json"
  stop
  same=$(python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print(a['choices'][0]['message']==b['choices'][0]['message'], json.dumps(b['usage']['prompt_tokens_details']))" "$W/cold.json" "$W/warm.json")
  echo "pair $r: cold $(ttft "$W/cold.log") ms, after restart $(ttft "$W/warm.log") ms; same output, usage: $same"
done
