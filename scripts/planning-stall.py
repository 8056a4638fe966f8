#!/usr/bin/env python3
"""Clients flooding a running `edge-llm serve` with 2 MB prompts (issue 30's planning-stall figure).

CLIENTS threads each post a 2 MB prompt of random words to PATH in a loop (/v1/completions: each
is refused, 400; /tokenize: each is tokenized in full);
meanwhile /health is timed on fresh connections every 100 ms and one client streams a
completion of TOKENS tokens, timing the gaps between its chunks. Before the planner pool,
tokenizing the prompts held the HTTP threads: /health took seconds and the stream froze.
Prints one JSON object.

    scripts/planning-stall.py --port 8080 --clients 8 --seconds 20
"""
import argparse, http.client, json, random, statistics, string, threading, time


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def flood(port, path, body, stop, statuses):
    while not stop.is_set():
        try:
            statuses.append(post(port, path, body))
        except OSError as e:
            statuses.append(type(e).__name__)


def health(port):
    started = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/health")
    c.getresponse().read()
    c.close()
    return time.monotonic() - started


def stream(port, tokens, out):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    last, gaps, chunks = None, [], 0
    while True:
        line = r.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        now = time.monotonic()
        chunks += 1
        if last is not None:
            gaps.append(now - last)
        last = now
    c.close()
    out.update(chunks=chunks, largest_gap_s=round(max(gaps, default=0), 3),
               median_gap_s=round(statistics.median(gaps), 4) if gaps else None)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--tokens", type=int, default=200, help="tokens the streaming client asks for")
    p.add_argument("--prompt-bytes", type=int, default=2_000_000)
    p.add_argument("--path", default="/v1/completions",
                   help="where the clients post: /v1/completions (refused by the byte bound), "
                        "/v1/chat/completions, or /tokenize (tokenized in full on the planner pool)")
    args = p.parse_args()

    # Random words, no two alike, so no tokenizer cache helps (as the trial's prompts).
    rng, words, size = random.Random(30), [], 0
    while size < args.prompt_bytes - 16:
        words.append("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))))
        size += len(words[-1]) + 1
    prompt = " ".join(words)
    body = {
        "/tokenize": {"content": prompt},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16},
    }.get(args.path, {"prompt": prompt, "max_tokens": 16})
    body = json.dumps(body).encode()
    stop, statuses = threading.Event(), []
    floods = [threading.Thread(target=flood, args=(args.port, args.path, body, stop, statuses))
              for _ in range(args.clients)]
    for t in floods:
        t.start()
    time.sleep(1)
    streamed = {}
    streamer = threading.Thread(target=stream, args=(args.port, args.tokens, streamed))
    streamer.start()
    latencies, started = [], time.monotonic()
    while time.monotonic() - started < args.seconds:
        latencies.append(health(args.port))
        time.sleep(0.1)
    streamer.join()
    stop.set()
    for t in floods:
        t.join()
    counts = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    print(json.dumps({
        "clients": args.clients,
        "path": args.path,
        "prompt_bytes": len(prompt),
        "health_probes": len(latencies),
        "health_max_s": round(max(latencies), 3),
        "health_median_s": round(statistics.median(latencies), 4),
        "stream": streamed,
        "flood_statuses": counts,
    }))


if __name__ == "__main__":
    main()
