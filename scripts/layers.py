#!/usr/bin/env python3
"""The import graph of src/: which top-level module uses which (`crate::NAME` paths in the
code, comments and strings left out), every import of a layer above the importer's, and
every circle across folders. Exits 1 when either exists.

    python3 scripts/layers.py          # the check (tests/layout.rs runs it)
    python3 scripts/layers.py --graph  # also print the edges
"""
import os
import re
import sys

# Lower numbers are lower layers; a module may use its own layer's siblings and any below.
LAYERS = {
    "kernels": 0,   # safe wrappers over csrc/ (the C kernels), tensor types
    "gguf": 1,      # the GGUF reader
    "tokenizer": 2,
    "chat_template": 2,
    "model": 3,     # config, weights, batch, Backend, the layer loop, the CPU backend, KV pool
    "cuda": 3,      # the CUDA backend (another model::Backend)
    "device": 4,    # Executor: a model loaded on one backend
    "constraint": 4,
    "engine": 5,    # sequences, blocks, scheduler, sampler, the engine thread
    "scoring": 5,   # one sequence's logits: perplexity, KL divergence
    "api": 6,       # request bodies into engine requests, shared by the faces
    "flags": 6,     # the flags every face takes
    "cli": 7,       # the terminal faces
    "server": 7,    # the HTTP face
    "fuzz": 7,      # the fuzz targets' entry points
}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def strip(code):
    """Code without comments and string literals (so doc comments naming a module don't count)."""
    code = re.sub(r"//[^\n]*", "", code)
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r'r#*"(?:.|\n)*?"#*', '""', code)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    return code


def top_module(path):
    rel = os.path.relpath(path, ROOT)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def edges():
    found = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            src = top_module(path)
            if src in ("lib", "main"):
                continue
            code = strip(open(path, encoding="utf-8").read())
            names = set(re.findall(r"\bcrate::(\w+)", code))
            # `use crate::{a, b::c}` groups
            for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
                names |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
            for dst in names:
                if dst != src:
                    found.setdefault((src, dst), set()).add(os.path.relpath(path, ROOT))
    return found


def circles(found):
    graph = {}
    for a, b in found:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    found = edges()
    bad = 0
    if "--graph" in sys.argv:
        for (a, b) in sorted(found):
            print(f"{a} -> {b}")
    for (a, b), files in sorted(found.items()):
        la, lb = LAYERS.get(a), LAYERS.get(b)
        if la is None or lb is None:
            print(f"unplaced module: {a if la is None else b} (add it to LAYERS)")
            bad += 1
        elif lb > la:
            print(f"upward: {a} (layer {la}) uses {b} (layer {lb}) in {', '.join(sorted(files))}")
            bad += 1
    for comp in circles(found):
        print("circle: " + " <-> ".join(comp))
        bad += 1
    mods = sorted({m for e in found for m in e})
    print(f"{len(mods)} modules, {len(found)} edges, {bad} problems")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
