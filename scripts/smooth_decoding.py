#!/usr/bin/env python3
"""Smooth decoding while another prompt prefills (issue 14), against edge-llm serve and llama-server.

python3 standard library only. For each server configuration and repetition:
  1. start the server (edge-llm with --no-disk-cache), wait for /health, send one short
     warm-up request;
  2. "alone": the long prompt (--long-tokens tokens cut from the start of the GPL-3 text,
     /usr/share/common-licenses/GPL-3, counted with `edge-llm tokenize`, behind a "Run k." tag
     so no cache holds it) goes to /v1/completions with max_tokens 1 and stream=true, nothing
     else running: its prefill time is the time to its first streamed token;
  3. "loaded": four streaming chats (/v1/chat/completions, --chat-tokens tokens each,
     temperature 0, ignore_eos, their own short questions) start together; once every chat has
     streamed --warm-tokens tokens, the long prompt (a new tag) is sent as in 2. Every gap
     between two consecutive streamed chunks of a chat is recorded, and the long prompt's
     prefill time under load;
  4. the server stops.
Configurations: edge-llm with each --max-step-ms value given (0: the cap off), and llama-server
with -np 5 (its slots: the four chats and the long prompt). Prints one JSON line per run and a
table of medians over the repetitions; --json FILE writes every run. The servers' logs go to
--log-dir (default: a new folder from tempfile.mkdtemp, printed at the start).

The default binary and model are found from the repository root, so the script runs from any
folder (paths given on the command line are taken as usual, from the current folder).
llama-server is compared only when --llama-bin names the folder holding it (for example
.llama.cpp/bin, which scripts/build-llamacpp.sh builds).

Example (2 threads, three repetitions, interleaved per repetition), from the repository root:
  scripts/build-llamacpp.sh && cargo build --release
  scripts/smooth_decoding.py --llama-bin .llama.cpp/bin --max-step-ms 100,0 -r 3
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from sse_client import post_stream

# The repository root (this file is scripts/smooth_decoding.py): relative defaults start here.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Debian's copy of the GPL-3 text (package base-files); --text names another file.
GPL3 = "/usr/share/common-licenses/GPL-3"
QUESTIONS = [
    "What is free software? Answer in one paragraph.",
    "Explain what copyleft means to a child.",
    "Write a short story about a robot who learns to paint.",
    "List some tips for learning a new programming language.",
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def count_tokens(edge, model, text):
    cmd = [edge, "tokenize", "--no-special"] + (["-m", model] if model else []) + [text]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return len(json.loads(out.strip().splitlines()[-1]))


def long_text(edge, model, path, tokens, tag_tokens):
    """The longest start of the text at `path` (by words) within `tokens - tag_tokens` tokens."""
    with open(path, encoding="utf-8") as f:
        words = f.read().split()
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(edge, model, " ".join(words[:mid])) <= tokens - tag_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


class Stream:
    """One streaming request: when it was sent and when each content chunk arrived."""

    def __init__(self):
        self.sent = None
        self.chunks = []  # arrival times of chunks carrying content
        self.usage = None
        self.error = None


def stream_request(url, path, body, res):
    def on_event(now, ev):
        for ch in ev.get("choices") or []:
            text = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
            if text:
                res.chunks.append(now)
        if ev.get("usage"):
            res.usage = ev["usage"]

    post_stream(url, path, body, res, on_event)


def chat_body(question, max_tokens):
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def long_body(prompt):
    return {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def prefill_time(url, prompt):
    res = Stream()
    stream_request(url, "/v1/completions", long_body(prompt), res)
    if res.error or not res.chunks:
        raise RuntimeError(f"long prompt: {res.error or 'no token streamed'}")
    return res.chunks[0] - res.sent, (res.usage or {}).get("prompt_tokens")


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def experiment(url, prompt_alone, prompt_loaded, args):
    alone_s, prompt_tokens = prefill_time(url, prompt_alone)
    chats = [Stream() for _ in QUESTIONS]
    threads = [
        threading.Thread(target=stream_request,
                         args=(url, "/v1/chat/completions", chat_body(q, args.chat_tokens), c))
        for q, c in zip(QUESTIONS, chats)
    ]
    for t in threads:
        t.start()
    deadline = time.time() + 600
    while not all(len(c.chunks) >= args.warm_tokens or c.error for c in chats):
        if time.time() > deadline:
            raise RuntimeError("chats did not start streaming")
        time.sleep(0.005)
    long = Stream()
    lt = threading.Thread(target=stream_request, args=(url, "/v1/completions", long_body(prompt_loaded), long))
    lt.start()
    lt.join()
    for t in threads:
        t.join()
    errors = [c.error for c in chats + [long] if c.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed; first: {errors[0]}")
    loaded_s = long.chunks[0] - long.sent
    gaps = []
    per_chat = []
    for c in chats:
        g = [(b - a) * 1000.0 for a, b in zip(c.chunks, c.chunks[1:])]
        gaps += g
        # Chunks that arrived while the long prompt was prefilling (its first chunk ends it).
        during = sum(1 for t in c.chunks if long.sent <= t <= long.chunks[0])
        per_chat.append({
            "chunks": len(c.chunks),
            "gap_ms_median": statistics.median(g),
            "gap_ms_p99": percentile(g, 0.99),
            "gap_ms_max": max(g),
            "chunks_during_prefill": during,
        })
    still = all(c.chunks[-1] >= long.chunks[0] for c in chats)
    return {
        "long_prompt_tokens": prompt_tokens,
        "prefill_alone_s": alone_s,
        "prefill_loaded_s": loaded_s,
        "prefill_ratio": loaded_s / alone_s,
        "gap_ms_median": statistics.median(gaps),
        "gap_ms_p99": percentile(gaps, 0.99),
        "gap_ms_max": max(gaps),
        "num_gaps": len(gaps),
        "chats_outlasted_prefill": still,
        "chats": per_chat,
    }


def wait_health(url, proc, timeout=300):
    u = urllib.parse.urlsplit(url)
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def run_one(name, cmd, text, tag, args):
    port = free_port()
    cmd = cmd + ["--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.log_dir, f"{name}.log"), "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        wait_health(url, proc)
        warm = Stream()
        stream_request(url, "/v1/chat/completions", chat_body("Say hello.", 4), warm)
        if warm.error:
            raise RuntimeError(f"warm-up: {warm.error}")
        r = experiment(url, f"{tag}a. {text}", f"{tag}b. {text}", args)
        r["server"] = name
        r["command"] = " ".join(cmd)
        return r
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edge", default=None,
                    help="edge-llm binary (default: target/release/edge-llm in the repository)")
    ap.add_argument("--llama-bin", default=None, help="folder with llama-server (left out: edge-llm only)")
    ap.add_argument("-m", "--model", default=None,
                    help="GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf in the repository)")
    ap.add_argument("--text", default=GPL3, help="the text the long prompt is cut from (default: %(default)s)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--max-step-ms", default="100,0", help="edge-llm configurations: comma-separated values (0: cap off)")
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=2590)
    ap.add_argument("--chat-tokens", type=int, default=150)
    ap.add_argument("--warm-tokens", type=int, default=5, help="tokens every chat streams before the long prompt is sent")
    ap.add_argument("--json", default=None, help="write every run here")
    ap.add_argument("--log-dir", default=None,
                    help="where the servers' logs go (default: a new folder from tempfile.mkdtemp)")
    args = ap.parse_args()
    if args.edge is None:
        args.edge = os.path.join(ROOT, "target", "release", "edge-llm")
    if args.model is None:
        args.model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if args.log_dir is None:
        args.log_dir = tempfile.mkdtemp(prefix="smooth-decoding.")
    os.makedirs(args.log_dir, exist_ok=True)
    sys.stderr.write(f"server logs in {args.log_dir}\n")

    configs = []
    for ms in [int(x) for x in args.max_step_ms.split(",") if x.strip()]:
        configs.append((f"edge-llm max-step-ms {ms}",
                        [args.edge, "serve", "-m", args.model, "-t", str(args.threads), "--no-disk-cache",
                         "--max-step-ms", str(ms)]))
    if args.llama_bin:
        configs.append(("llama-server -np 5",
                        [os.path.join(args.llama_bin, "llama-server"), "-m", args.model, "-t", str(args.threads),
                         "-c", str(5 * 4096), "-np", "5"]))

    # The tag ("Run 12a. ") takes a few tokens: count them once.
    tag_tokens = count_tokens(args.edge, args.model, "Run 12Ca.")
    text = long_text(args.edge, args.model, args.text, args.long_tokens, tag_tokens)
    sys.stderr.write(f"long prompt: {args.text} cut to {count_tokens(args.edge, args.model, 'Run 12Ca. ' + text)} tokens\n")

    runs = []
    for rep in range(args.reps):
        for name, cmd in configs:
            # A tag no earlier run used, so no cache (memory, disk) holds the long prompt.
            tag = f"Run {rep + 1}{chr(ord('A') + len(runs) % 26)}"
            r = run_one(name.replace(" ", "_"), cmd, text, tag, args)
            r["rep"] = rep + 1
            r["server"] = name
            print(json.dumps(r), flush=True)
            runs.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)

    keys = ["gap_ms_median", "gap_ms_p99", "gap_ms_max", "prefill_alone_s", "prefill_loaded_s", "prefill_ratio"]
    print(f"\nmedians over {args.reps} repetitions (machine: {os.cpu_count()} CPUs, {args.threads} threads)")
    print("| server | chats' gap median ms | p99 ms | max ms | long prompt alone s | under load s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, _ in configs:
        rs = [r for r in runs if r["server"] == name]
        m = {k: statistics.median(r[k] for r in rs) for k in keys}
        print(f"| {name} | {m['gap_ms_median']:.0f} | {m['gap_ms_p99']:.0f} | {m['gap_ms_max']:.0f} | "
              f"{m['prefill_alone_s']:.2f} | {m['prefill_loaded_s']:.2f} | {m['prefill_ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
