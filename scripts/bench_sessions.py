#!/usr/bin/env python3
"""HTTP load client for scripts/bench-vs-llamacpp.sh (python3 standard library only).

Drives any OpenAI-compatible server (edge-llm serve, llama-server) the same way:

  bench_sessions.py make-prompt --tokens 400 --tokenize-cmd "edge-llm tokenize -m M --no-special"
      Prints a system prompt of about --tokens tokens, cut from the start of the GPL-3 text
      (/usr/share/common-licenses/GPL-3), counted with --tokenize-cmd (the text is appended as
      the last argument; the command prints a JSON array of ids).

  bench_sessions.py run --url http://127.0.0.1:PORT --system-file F --tag "Run 1." \\
                        --sessions 16 --max-tokens 64 [--cached 3]
      1. one warm-up request (its own short system prompt, not measured);
      2. --sessions threads released together by a barrier, each POSTs /v1/chat/completions
         with stream=true, stream_options.include_usage, temperature 0, ignore_eos, the same
         system prompt ("<tag> " + the file's text, so each repetition's prefix is new to the
         server) and its own short user message;
      3. after all of them finished, --cached more requests, one at a time, with the same
         system prompt and new user messages: the time to first token of a session whose
         system prompt is cached.
      Prints one JSON object: aggregate generated tokens/s (tokens from the usage chunks, else
      the content chunks, over the wall time from the first request sent to the last token
      received), the median time to first token (first chunk with non-empty content) over the
      sessions, the cached sessions' TTFTs, prompt/cached token counts as the server reports
      them.
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading

from sse_client import post_stream

USER_MESSAGES = [
    "What is free software? Answer in one paragraph.",
    "Summarize the preamble in three sentences.",
    "Explain what copyleft means to a child.",
    "List three freedoms the license protects.",
    "Why would a company choose this license?",
    "Write a haiku about source code.",
    "What does 'conveying' a work mean here?",
    "Give an example of a derivative work.",
    "How is this license different from a permissive one?",
    "What is the purpose of the patent clause?",
    "Describe tivoization in simple words.",
    "Can I sell software under this license?",
    "What must I include when I distribute binaries?",
    "Explain 'Corresponding Source' briefly.",
    "Who is the Free Software Foundation?",
    "Translate the first sentence into French.",
    "What happens if someone violates the license?",
    "Is this license compatible with the Apache license?",
    "Name two famous programs that use this license.",
    "What is an 'Installation Information' requirement?",
    "Tell me a fun fact about software licenses.",
    "How long is the license valid?",
    "What does 'User Product' mean?",
    "Explain the disclaimer of warranty.",
]

GPL3 = "/usr/share/common-licenses/GPL-3"
FALLBACK_TEXT = (
    "The licenses for most software and other practical works are designed to take away your "
    "freedom to share and change the works. By contrast, the GNU General Public License is "
    "intended to guarantee your freedom to share and change all versions of a program--to make "
    "sure it remains free software for all its users. "
) * 20


def source_words():
    try:
        with open(GPL3, encoding="utf-8") as f:
            text = f.read()
        text = text[text.index("Preamble"):] if "Preamble" in text else text
    except OSError:
        text = FALLBACK_TEXT
    return text.split()


def count_tokens(cmd, text):
    out = subprocess.run(cmd + [text], check=True, capture_output=True, text=True).stdout
    return len(json.loads(out.strip().splitlines()[-1]))


def make_prompt(args):
    words = source_words()
    cmd = args.tokenize_cmd.split()
    lo, hi = 1, len(words)
    # the largest word count whose text stays within --tokens tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(cmd, " ".join(words[:mid])) <= args.tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    n = count_tokens(cmd, text)
    sys.stderr.write(f"system prompt: {lo} words of {GPL3}, {n} tokens\n")
    sys.stdout.write(text)


class Result:
    def __init__(self):
        self.sent = None
        self.first = None
        self.last = None
        self.chunks = 0
        self.usage = None
        self.timings = None
        self.finish = None
        self.error = None


def one_request(url, system, user, max_tokens, res, barrier=None):
    body = {
        "model": "bench",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }

    def on_event(now, ev):
        for ch in ev.get("choices") or []:
            content = (ch.get("delta") or {}).get("content")
            if content:
                res.chunks += 1
                res.last = now
                if res.first is None:
                    res.first = now
            if ch.get("finish_reason"):
                res.finish = ch["finish_reason"]
        if ev.get("usage"):
            res.usage = ev["usage"]
        if ev.get("timings"):
            res.timings = ev["timings"]

    post_stream(url, "/v1/chat/completions", body, res, on_event, barrier, error_chars=500)


def tokens_of(res):
    if res.usage and isinstance(res.usage.get("completion_tokens"), int):
        return res.usage["completion_tokens"]
    return res.chunks


def cached_of(res):
    try:
        return res.usage["prompt_tokens_details"]["cached_tokens"]
    except (TypeError, KeyError):
        if res.timings and "cache_n" in res.timings:
            return res.timings["cache_n"]
        return None


def run(args):
    with open(args.system_file, encoding="utf-8") as f:
        base = f.read().strip()
    system = f"{args.tag} {base}" if args.tag else base
    users = USER_MESSAGES
    need = args.sessions + args.cached
    if need > len(users):
        users = [f"{USER_MESSAGES[i % len(USER_MESSAGES)]} (session {i})" for i in range(need)]

    # warm-up: unrelated short prompt, so the measured sessions find nothing of theirs cached
    w = Result()
    one_request(args.url, "You are a helpful assistant.", "Say hello.", 4, w)
    if w.error:
        print(json.dumps({"error": "warm-up: " + w.error}))
        return 1

    results = [Result() for _ in range(args.sessions)]
    barrier = threading.Barrier(args.sessions)
    threads = [
        threading.Thread(target=one_request, args=(args.url, system, users[i], args.max_tokens, results[i], barrier))
        for i in range(args.sessions)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r.error for r in results if r.error]
    if errors:
        print(json.dumps({"error": f"{len(errors)} sessions failed; first: {errors[0]}"}))
        return 1

    start = min(r.sent for r in results)
    end = max(r.last or r.sent for r in results)
    gen = [tokens_of(r) for r in results]
    ttft = [((r.first or r.last or r.sent) - r.sent) * 1000.0 for r in results]

    cached = []
    for k in range(args.cached):
        c = Result()
        one_request(args.url, system, users[args.sessions + k], args.max_tokens, c)
        if c.error:
            print(json.dumps({"error": "cached session: " + c.error}))
            return 1
        cached.append(c)

    out = {
        "sessions": args.sessions,
        "max_tokens": args.max_tokens,
        "generated_tokens": sum(gen),
        "generated_per_session": sorted(set(gen)),
        "content_chunks": sum(r.chunks for r in results),
        "token_count_source": "usage" if all(r.usage for r in results) else "content chunks",
        "wall_s": end - start,
        "aggregate_gen_tokens_per_s": sum(gen) / (end - start),
        "ttft_ms_median": statistics.median(ttft),
        "ttft_ms_min": min(ttft),
        "ttft_ms_max": max(ttft),
        "prompt_tokens": sorted({(r.usage or {}).get("prompt_tokens") for r in results} - {None}),
        "prompt_tokens_per_session": [(r.usage or {}).get("prompt_tokens") for r in results],
        "cached_tokens_per_session": [cached_of(r) for r in results],
        "finish_reasons": sorted({str(r.finish) for r in results}),
        "cached_session_ttft_ms": [((c.first or c.last or c.sent) - c.sent) * 1000.0 for c in cached],
        "cached_session_cached_tokens": [cached_of(c) for c in cached],
        "cached_session_prompt_tokens": [(c.usage or {}).get("prompt_tokens") for c in cached],
    }
    if cached:
        out["cached_session_ttft_ms_median"] = statistics.median(out["cached_session_ttft_ms"])
    print(json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-prompt")
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--tokenize-cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--url", required=True)
    p.add_argument("--system-file", required=True)
    p.add_argument("--tag", default="")
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--cached", type=int, default=3, help="cached-prefix sessions sent one at a time after the rest")
    args = ap.parse_args()
    if args.cmd == "make-prompt":
        make_prompt(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
