#!/usr/bin/env python3
"""The prompt tokens llama-server builds for llama.vscode's /infill requests, written to
tests/reference/infill-qwen2.5-coder-0.5b.json for tests/server_infill.rs.

Each case is a request body as llama.vscode's src/llama-server.ts (`createRequestPayload`)
builds it, sent to a real llama-server with `n_predict: 0` (evaluate only); its reply's `prompt`
(the prompt detokenized) is tokenized back with `/tokenize` (special tokens parsed, nothing
added) and kept with the request when it has the reply's `tokens_evaluated` tokens (a prompt
cut inside a run of text may tokenize back otherwise: then its text and length are kept).

    python3 scripts/synth/infill_reference.py [LLAMA_SERVER] [MODEL]

defaults: /work/main/.llama.cpp-newest/bin/llama-server and
models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf. The server runs with `-c 4096 -b 2048 -np 1`:
the FIM prompt depends on the slot's context and the batch size, and the test builds it with
the same numbers.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = sys.argv[1] if len(sys.argv) > 1 else "/work/main/.llama.cpp-newest/bin/llama-server"
MODEL = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    ROOT, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
PORT = 8093
N_CTX = 4096
N_BATCH = 2048
OUT = os.path.join(ROOT, "tests", "reference", "infill-qwen2.5-coder-0.5b.json")

CHUNKS = [
    {"filename": "src/geometry.py",
     "text": "import math\n\n\ndef distance(a, b):\n    return math.hypot(a[0] - b[0], a[1] - b[1])\n"},
    {"filename": "README.md", "text": "# Shapes\n\nArea and perimeter of simple shapes.\n"},
]
PREFIX = ("from geometry import distance\n\n\nclass Circle:\n    def __init__(self, r):\n"
          "        self.r = r\n\n    def area(self):\n")
SUFFIX = "\n\n    def perimeter(self):\n        return 2 * math.pi * self.r\n"

# The request bodies of llama.vscode's `createRequestPayload(noPredict, ...)`, as its
# src/llama-server.ts builds them (`defaultRequestParams` spread in for a completion).
CASES = {
    # A completion: the lines before the cursor, the current line up to it as `prompt`.
    "completion": {
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": CHUNKS,
        "prompt": "        return ", "n_predict": 128,
        "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True, "n_indent": 8, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
    },
    # `updateExtraContext`: the ring buffer's chunks only, to warm the cache.
    "warm_up": {
        "input_prefix": "", "input_suffix": "", "input_extra": CHUNKS, "prompt": "",
        "n_predict": 0, "samplers": [], "cache_prompt": True,
        "t_max_prompt_ms": 500, "t_max_predict_ms": 1,
    },
    # No extra context and a chunk without a filename (llama-server names it "tmp").
    "no_filename": {
        "input_prefix": "def add(a, b):\n", "input_suffix": "\n", "prompt": "    ",
        "input_extra": [{"text": "x = 1\n"}], "n_predict": 16,
    },
    # A suffix longer than its share of the batch (n_batch/4 - 2 - prompt tokens): cut.
    "long_suffix": {
        "input_prefix": "values = [\n", "prompt": "",
        "input_suffix": "".join(f"    {i},\n" for i in range(400)) + "]\n", "n_predict": 8,
    },
}


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    server = subprocess.Popen([SERVER, "-m", MODEL, "-t", "2", "--port", str(PORT), "-c", str(N_CTX),
                               "-b", str(N_BATCH), "-np", "1", "--no-warmup"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        cases = {}
        for name, body in CASES.items():
            reply = post("/infill", dict(body, n_predict=0))
            tokens = post("/tokenize", {"content": reply["prompt"], "add_special": False,
                                        "parse_special": True})["tokens"]
            n = reply["tokens_evaluated"]
            # A prompt cut inside a run of text (the long suffix) may tokenize back otherwise:
            # then only its text and length are kept.
            case = {"request": body, "prompt": reply["prompt"], "tokens_evaluated": n,
                    "tokens": tokens if len(tokens) == n else None}
            cases[name] = case
            print(f"{name}: {n} tokens{'' if case['tokens'] else ' (text and length only)'}",
                  file=sys.stderr)
        out = {"made_by": "scripts/synth/infill_reference.py",
               "llama_server": subprocess.run([SERVER, "--version"], capture_output=True,
                                              text=True).stderr.strip().splitlines()[0:1],
               "n_ctx": N_CTX, "n_batch": N_BATCH, "cases": cases}
        with open(OUT, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
