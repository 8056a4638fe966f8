#!/bin/bash
# A hybrid model (recurrent layers: the synthetic LFM2 by default) served from the disk tier
# across a restart: a chat with a long system prompt on an empty --cache-dir, the server killed
# (SIGKILL, as a crash) once the prompt's blocks and its state snapshot are on disk, started
# again, the same chat. Prints cached_tokens before and after, whether the outputs are
# identical, and the state and disk gauges from /metrics after the restart.
# Usage: scripts/hybrid-disk-restart.sh [MODEL] (default target/synth/lfm2.gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
B=./target/release/edge-llm
M=${1:-target/synth/lfm2.gguf}
PORT=${PORT:-18250}
W=$(mktemp -d)
trap 'kill -9 ${PID:-} 2>/dev/null || true; rm -rf "$W"' EXIT
python3 - "$W/body.json" <<'PY'
import json, sys
system = " ".join(f"Rule {i}: always answer politely and mention the number {i*7} when relevant." for i in range(1, 26))
json.dump({"messages": [{"role": "system", "content": system},
                        {"role": "user", "content": "What is the capital of France?"}],
           "max_tokens": 20, "temperature": 0}, open(sys.argv[1], "w"))
PY
start() {
  $B serve -m "$M" --port "$PORT" --cache-dir "$W/cache" -c 1024 2>"$1" & PID=$!
  for _ in $(seq 300); do curl -sf "localhost:$PORT/health" >/dev/null && return; sleep 0.2; done
  echo "the server did not start:"; cat "$1"; exit 1
}
stop() { kill -9 "$PID"; wait "$PID" 2>/dev/null || true; }
metric() { curl -s "localhost:$PORT/metrics" | awk -v m="$1" '$1==m {print $2}'; }
chat() { curl -s "localhost:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d @"$W/body.json"; }
usage() { python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['usage']['prompt_tokens_details']))" "$1"; }
start "$W/cold.log"
grep "KV cache on" "$W/cold.log" || true
chat >"$W/cold.json"
# Snapshots are written when taken, blocks behind when the sequence ends: wait for both.
for _ in $(seq 300); do
  [ "$(metric edge_llm_disk_cache_state_snapshots)" -ge 1 ] 2>/dev/null \
    && [ "$(metric edge_llm_disk_cache_blocks)" -ge 20 ] 2>/dev/null && break
  sleep 0.2
done
echo "before the restart: usage $(usage "$W/cold.json")"
curl -s "localhost:$PORT/metrics" | grep -E '^edge_llm_(state_|disk_cache_(blocks|state_snapshots|written_state))' | sed 's/^/  /'
stop
start "$W/warm.log"
chat >"$W/warm.json"
same=$(python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); print(a['choices'][0]['message']==b['choices'][0]['message'])" "$W/cold.json" "$W/warm.json")
echo "after the restart: usage $(usage "$W/warm.json"); same output: $same"
curl -s "localhost:$PORT/metrics" | grep -E '^edge_llm_(state_|prefix_cache_hit_tokens|disk_cache_(blocks|hit_blocks|state_snapshots|hit_state|rejected))' | sed 's/^/  /'
stop
