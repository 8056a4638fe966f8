"""One streaming OpenAI-style request, read event by event: the client both benchmark scripts
(bench_sessions.py, smooth_decoding.py) drive edge-llm and llama-server with, so they time
tokens the same way. Standard library only."""

import http.client
import json
import time
import urllib.parse


def post_stream(url, path, body, res, on_event, barrier=None, error_chars=300):
    """POSTs `body` (a dict, as JSON) to `url` + `path` and calls `on_event(now, event)` for
    each `data:` event until `[DONE]` (`now`: its arrival, `time.perf_counter()`). Sets
    `res.sent` when the request goes out (after `barrier`, if any, once connected) and
    `res.error` on a non-200 answer or any failure: reported, never raised or hidden."""
    u = urllib.parse.urlsplit(url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=1800)
        conn.connect()
        if barrier is not None:
            barrier.wait()
        res.sent = time.perf_counter()
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            res.error = f"HTTP {r.status}: {r.read()[:error_chars]!r}"
            return
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            on_event(time.perf_counter(), json.loads(data))
        conn.close()
    except Exception as e:  # reported, never hidden
        res.error = f"{type(e).__name__}: {e}"
