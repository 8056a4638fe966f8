#!/usr/bin/env python3
"""The routing workload of tests/routers.rs against a running cluster (scripts/cluster.sh
--bench): 8 concurrent chats over 4 distinct ~400-token system prompts, each with a distinct
~100-token question, then their 8 follow-ups (the first turn, its answer, a new question), all
through the router. Prints the workers' prefix-cache hit rate (all prompts, and the follow-ups)
and the aggregate tokens/s (prompt + completion tokens of all 16 requests over the wall time).

    python3 scripts/cluster_bench.py ROUTER_URL WORKER_URL...
"""
import json, sys, threading, time, urllib.request

WORDS = ("alpha beta gamma delta river stone cloud maple orbit pixel harbor lantern velvet "
         "quartz meadow ember").split()
MASK = (1 << 64) - 1


def words(seed, n):
    # The same xorshift as tests/support/cluster.rs, so both run the same prompts.
    x = (0x9E3779B97F4A7C15 * (seed + 1)) & MASK
    out = []
    for _ in range(n):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out.append(WORDS[x % 16])
    return " ".join(out)


def system_prompt(i):
    return f"You are assistant number {i}. Keep these words in mind: {words(i, 380)}"


def question(rnd, i):
    return (f"Round {rnd}, question {i}. Here are my notes: {words(1000 + 100 * rnd + i, 90)}. "
            "Which word comes first?")


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def metric(worker, name):
    text = urllib.request.urlopen(worker + "/metrics", timeout=30).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " "))


def concurrently(router, conversations):
    out = [None] * len(conversations)

    def one(k):
        out[k] = post(router + "/v1/chat/completions",
                      {"messages": conversations[k], "max_tokens": 8, "temperature": 0})

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(conversations))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main():
    router, workers = sys.argv[1], sys.argv[2:]
    look = "edge_llm_prefix_cache_lookup_tokens_total"
    hit = "edge_llm_prefix_cache_hit_tokens_total"
    snap = lambda: (sum(metric(w, look) for w in workers), sum(metric(w, hit) for w in workers))
    l0, h0 = snap()
    start = time.time()
    first = [[{"role": "system", "content": system_prompt(i % 4)},
              {"role": "user", "content": question(0, i)}] for i in range(8)]
    answers = concurrently(router, first)
    l1, h1 = snap()
    follow = [m + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                   {"role": "user", "content": "And another one?"}] for m, a in zip(first, answers)]
    replies = concurrently(router, follow)
    elapsed = time.time() - start
    l2, h2 = snap()
    tokens = sum(r["usage"]["total_tokens"] for r in answers + replies)
    instance = lambda r: r["id"].rsplit("-", 1)[1][:-6]
    same = sum(instance(a) == instance(r) for a, r in zip(answers, replies))
    print(f"workers {len(workers)}: follow-ups on their first turn's worker {same}/8; "
          f"prefix hit rate {(h2 - h0) / (l2 - l0):.3f} (follow-ups {(h2 - h1) / (l2 - l1):.3f}); "
          f"{tokens} tokens in {elapsed:.1f} s = {tokens / elapsed:.0f} tokens/s")


if __name__ == "__main__":
    main()
