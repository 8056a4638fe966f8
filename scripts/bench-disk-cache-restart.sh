#!/bin/bash
# Cold vs after-restart TTFT of a 472-token system prompt, interleaved, 3 pairs.
cd /work/wt-diskcache
B=./target/release/edge-llm
start() { $B serve --port 18240 --cache-dir $1 -c 2048 2>$2 & echo $! > /tmp/dc1/pid; for i in $(seq 100); do curl -sf localhost:18240/health >/dev/null && break; sleep 0.2; done; }
stop() { kill -9 $(cat /tmp/dc1/pid); wait $(cat /tmp/dc1/pid) 2>/dev/null; sleep 0.5; }
for r in 1 2 3; do
  D=/tmp/dc1/m$r; rm -rf $D
  start $D /tmp/dc1/cold$r.log
  curl -s localhost:18240/v1/chat/completions -d @/tmp/dc1/body.json > /tmp/dc1/cold$r.json
  for i in $(seq 100); do n=$(curl -s localhost:18240/metrics | grep "^edge_llm_disk_cache_blocks " | cut -d' ' -f2); [ "$n" -ge 29 ] && break; sleep 0.2; done
  stop
  start $D /tmp/dc1/warm$r.log
  curl -s localhost:18240/v1/chat/completions -d @/tmp/dc1/body.json > /tmp/dc1/warm$r.json
  stop
  c=$(grep -o "ttft=[0-9]*" /tmp/dc1/cold$r.log | cut -d= -f2); w=$(grep -o "ttft=[0-9]*" /tmp/dc1/warm$r.log | cut -d= -f2)
  same=$(python3 -c "import json;a=json.load(open('/tmp/dc1/cold$r.json'));b=json.load(open('/tmp/dc1/warm$r.json'));print(a['choices'][0]['message']==b['choices'][0]['message'], b['usage']['prompt_tokens_details'])")
  echo "pair $r: cold ${c} ms, after restart ${w} ms, same output + usage: $same"
done
