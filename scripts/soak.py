#!/usr/bin/env python3
"""Soak test of `edge-llm serve` (issue 12): many requests against one server, then checks.

Starts the release binary (`serve --port 0` on the default model unless --model is given),
sends --requests requests from --concurrency client threads: chat and completions, streaming
and not; a quarter of the streams are cut after their first event (the client hangs up);
--hostile of them (5% by default) are hostile (malformed JSON, wrong types, unknown roles,
an over-large Content-Length, a half-sent body, a wrong method, an unknown route). Then it
checks, and exits 1 if any check fails:

  - no 5xx answer at all, and every hostile request answered with a 4xx (or closed, for the
    half-sent body);
  - zero KV blocks in use once the run is over (`edge_llm_kv_blocks{state="used"}` in /metrics);
  - the server's resident memory (VmRSS) after the run within 10% of after the first 10%
    of the requests (half with --tenants) (checked from 2,000 requests on; shorter runs only
    report it);
  - /health still answers 200.

With --tenants (issue 30) the server has two API keys and an admin key: every request carries
one of the two keys; a tenth ask for a JSON schema (an enum of words, one in three never seen
before, so the per-key grammar cache compiles, hits and evicts); and 3% are the admin pinning a
system prompt (`POST /v1/cache/pin`, 200, or 400 past the pin budget) or removing a pin
(`DELETE /v1/cache/pin/{id}`, 200 or 404). The same checks hold (no 5xx; every pin removed at the
end, then zero blocks used and zero pinned), and a key's /metrics must show nothing of the
server's pool.

Prints one JSON object with the figures. Standard library only.

    nice -n 10 scripts/soak.py --tenants             # 10,000 requests, 16 concurrent
    scripts/soak.py --requests 300 --concurrency 8 --tenants   # the short version CI runs
"""
import argparse, http.client, json, os, random, re, socket, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = [
    "The capital of France is", "Once upon a time", "def fibonacci(n):",
    "The three primary colours are", "Write a haiku about rust.", "What is 2+2?",
    "List three fruits.", "Explain photosynthesis in one sentence.", "Say hi.",
    "Translate 'good morning' to French.",
]
SYSTEM = "You are a concise assistant for a soak test. Answer in one short sentence."


def start_server(binary, model, extra):
    cmd = [binary, "serve", "--port", "0", "-c", "1024"] + (["-m", model] if model else []) + extra
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


KEYS = ["soak-key-a", "soak-key-b"]
ADMIN = "soak-admin"
# The grammar cache is bounded by bytes (--grammar-cache-mib): small here, so the never-seen
# schemas fill it in the first half of the run and memory must stay flat over the second.
TENANT_ARGS = ["--api-key", KEYS[0], "--api-key", KEYS[1], "--admin-api-key", ADMIN,
               "--grammar-cache-mib", "16"]


def auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def metric(host, port, name, key=None):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics", headers=auth(key))
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def schema_format(rng):
    """A JSON schema response format: an enum of words, one in three never seen before."""
    k = rng.randint(0, 1 << 30) if rng.random() < 1 / 3 else rng.randint(0, 7)
    words = [f"w{k}_{i}" for i in range(200)]
    schema = {"type": "object", "properties": {"a": {"enum": words}}, "required": ["a"]}
    return {"type": "json_schema", "json_schema": {"name": "soak", "schema": schema}}


def normal_request(rng, tenants=False):
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    body = {"max_tokens": rng.randint(1, 12), "temperature": rng.choice([0, 0.7]),
            "seed": rng.randint(0, 1 << 30), "stream": stream}
    if chat:
        body["messages"] = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": rng.choice(PROMPTS)}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = rng.choice(PROMPTS)
        path = "/v1/completions"
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if tenants and chat and rng.random() < 0.2:
        body["response_format"] = schema_format(rng)
    cut = stream and rng.random() < 0.25
    return path, json.dumps(body).encode(), stream, cut


def pin_request(host, port, rng, pins, stats, lock):
    """The admin pins one of a few system prompts, or removes a pin it made."""
    with lock:
        remove = pins and rng.random() < 0.5
        pin = rng.choice(sorted(pins)) if remove else None
    c = http.client.HTTPConnection(host, port, timeout=300)
    try:
        if remove:
            c.request("DELETE", f"/v1/cache/pin/{pin}", headers=auth(ADMIN))
            r = c.getresponse()
            r.read()
            ok = r.status in (200, 404)
            with lock:
                pins.discard(pin)
        else:
            prompt = f"{SYSTEM} Rule {rng.randint(0, 5)}: " + "be brief. " * rng.randint(2, 30)
            body = json.dumps({"messages": [{"role": "system", "content": prompt}]}).encode()
            c.request("POST", "/v1/cache/pin", body,
                      {"Content-Type": "application/json", **auth(ADMIN)})
            r = c.getresponse()
            v = json.loads(r.read() or b"{}")
            ok = r.status in (200, 400)
            if r.status == 200:
                with lock:
                    pins.add(v["id"])
        status = r.status
    except (ConnectionResetError, BrokenPipeError, http.client.HTTPException, OSError) as e:
        status, ok = -2, False
        with lock:
            stats["errors"].append(f"pin: {e!r}")
    finally:
        c.close()
    with lock:
        stats["pin_ops"] = stats.get("pin_ops", 0) + 1
        if status >= 500:
            stats["5xx"] += 1
        if not ok:
            stats["failed"] += 1
            stats["errors"].append(f"pin {'DELETE' if remove else 'POST'}: {status}")


HOSTILE = [
    ("POST", "/v1/completions", b'{"prompt": "Hi", "max_tokens": ', {}),
    ("POST", "/v1/completions", b'{"prompt": 42}', {}),
    ("POST", "/v1/completions", b'{"prompt": "Hi", "max_tokens": 0}', {}),
    ("POST", "/v1/completions", b'{"prompt": "Hi", "temperature": "hot"}', {}),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "Hi"}]}', {}),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": null}]}', {}),
    ("POST", "/v1/chat/completions", b'{"messages": []}', {}),
    ("POST", "/v1/chat/completions", b'\xff\xfe\x00garbage', {}),
    ("POST", "/v1/completions", b'[1, 2, 3]', {}),
    ("GET", "/v1/completions", b'', {}),
    ("POST", "/v1/nothing-here", b'{}', {}),
    ("POST", "/v1/completions", b'', {"Content-Length": "3000000"}),
    ("HALF", "/v1/completions", b'{"prompt": "Hi"', {}),
]


def raw_exchange(host, port, method, path, body, headers, timeout=60, key=None):
    """One request on a raw socket; the status (0: closed without an answer)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        if method == "HALF":
            # A body that promises more than it sends, then the client gives up.
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
            s.shutdown(socket.SHUT_WR)
        else:
            head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
            if key:
                head += f"Authorization: Bearer {key}\r\n"
            if "Content-Length" not in headers:
                head += f"Content-Length: {len(body)}\r\n"
            for k, v in headers.items():
                head += f"{k}: {v}\r\n"
            s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        m = re.match(rb"HTTP/1\.1 (\d{3})", data)
        return int(m.group(1)) if m else 0
    except (ConnectionResetError, BrokenPipeError):
        return 0
    finally:
        s.close()


def run_one(host, port, rng, hostile_share, stats, lock, tenants=None):
    key = rng.choice(KEYS) if tenants is not None else None
    if tenants is not None and rng.random() < 0.03:
        return pin_request(host, port, rng, tenants, stats, lock)
    if rng.random() < hostile_share:
        method, path, body, headers = rng.choice(HOSTILE)
        status = raw_exchange(host, port, method, path, body, headers, key=key)
        with lock:
            stats["hostile"] += 1
            if status >= 500:
                stats["5xx"] += 1
                stats["errors"].append(f"hostile {method} {path} {body[:40]!r}: {status}")
            elif not (400 <= status < 500 or (method == "HALF" and status == 0)):
                stats["hostile_unexpected"] += 1
                stats["errors"].append(f"hostile {method} {path} {body[:40]!r}: {status}")
        return
    path, body, stream, cut = normal_request(rng, tenants is not None)
    c = http.client.HTTPConnection(host, port, timeout=300)
    try:
        c.request("POST", path, body, {"Content-Type": "application/json", **auth(key)})
        r = c.getresponse()
        status = r.status
        if stream and cut and status == 200:
            r.readline()  # the first event, then hang up
            c.sock.shutdown(socket.SHUT_RDWR)
            kind = "cut"
        else:
            data = r.read()
            kind = "stream" if stream else "plain"
            if status == 200 and stream and b"data: [DONE]" not in data:
                status = -1
    except (ConnectionResetError, BrokenPipeError, http.client.HTTPException, OSError) as e:
        status, kind = -2, "transport"
        with lock:
            stats["errors"].append(f"{path}: {e!r}")
    finally:
        c.close()
    with lock:
        stats[kind] = stats.get(kind, 0) + 1
        if status >= 500:
            stats["5xx"] += 1
            stats["errors"].append(f"{path} {body[:60]!r}: {status}")
        elif status != 200:
            stats["failed"] += 1
            stats["errors"].append(f"{path} {body[:60]!r}: {status}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--hostile", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/edge-llm"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--server-arg", action="append", default=[])
    ap.add_argument("--tenants", action="store_true",
                    help="two API keys, schemas and an admin's pins (see above)")
    a = ap.parse_args()
    extra = a.server_arg + (TENANT_ARGS if a.tenants else [])
    proc, host, port = start_server(a.binary, a.model, extra)
    pins = set() if a.tenants else None
    admin = ADMIN if a.tenants else None
    stats = {"5xx": 0, "failed": 0, "hostile": 0, "hostile_unexpected": 0, "errors": []}
    lock = threading.Lock()
    counter = {"next": 0}
    # Memory is compared from a point where every bounded cache is warm: the first 10% of the
    # requests (the interleaved weight copies), the first half with --tenants (the grammar cache).
    checkpoint = max(1, a.requests // (2 if a.tenants else 10))
    rss = {}
    started = time.monotonic()

    def worker(k):
        rng = random.Random(a.seed * 1000 + k)
        while True:
            with lock:
                i = counter["next"]
                if i >= a.requests:
                    return
                counter["next"] += 1
                if i == checkpoint:
                    rss["early_kib"] = rss_kib(proc.pid)
            run_one(host, port, rng, a.hostile, stats, lock, pins)

    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        # Every pin removed, then nothing may stay pinned or used.
        for pin in sorted(pins or ()):
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request("DELETE", f"/v1/cache/pin/{pin}", headers=auth(ADMIN))
            c.getresponse().read()
            c.close()
        pinned = metric(host, port, "edge_llm_kv_blocks_pinned", admin) if a.tenants else 0
        leak = None
        if a.tenants:
            own = http.client.HTTPConnection(host, port, timeout=30)
            own.request("GET", "/metrics", headers=auth(KEYS[1]))
            text = own.getresponse().read().decode()
            own.close()
            leak = [n for n in ("kv_blocks", "vllm:", "key=") if n in text]
        # Blocks of cut streams come back when the engine sees the hang-up: a moment.
        used = None
        for _ in range(100):
            used = metric(host, port, 'edge_llm_kv_blocks{state="used"}', admin)
            if used == 0:
                break
            time.sleep(0.1)
        rss["end_kib"] = rss_kib(proc.pid)
        c = http.client.HTTPConnection(host, port, timeout=5)
        c.request("GET", "/health")
        health = c.getresponse().status
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    early = rss.get("early_kib") or rss["end_kib"]
    growth = (rss["end_kib"] - early) / early
    out = {
        "requests": a.requests, "concurrency": a.concurrency, "seconds": round(elapsed, 1),
        "requests_per_s": round(a.requests / elapsed, 1),
        "plain": stats.get("plain", 0), "streams": stats.get("stream", 0),
        "streams_cut": stats.get("cut", 0), "hostile": stats["hostile"],
        "5xx": stats["5xx"], "failed": stats["failed"],
        "hostile_unexpected": stats["hostile_unexpected"],
        "kv_blocks_used_after": used,
        f"rss_mib_after_first_{100 // (2 if a.tenants else 10)}pct": round(early / 1024, 1),
        "rss_mib_after": round(rss["end_kib"] / 1024, 1), "rss_growth": round(growth, 4),
        "health_after": health, "first_errors": stats["errors"][:5],
    }
    if a.tenants:
        out.update({"pin_ops": stats.get("pin_ops", 0), "kv_blocks_pinned_after": pinned,
                    "key_sees_server_figures": leak})
    print(json.dumps(out))
    # The first requests warm the server up (the interleaved weight copies are made on first
    # use): memory is compared only when the first 10% is at least 1,000 requests' worth.
    rss_checked = a.requests >= 2000
    out["rss_checked"] = rss_checked
    ok = (stats["5xx"] == 0 and stats["failed"] == 0 and stats["hostile_unexpected"] == 0
          and used == 0 and (not rss_checked or abs(growth) <= 0.10) and health == 200
          and (not a.tenants or (pinned == 0 and not leak)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
