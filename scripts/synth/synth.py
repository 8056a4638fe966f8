#!/usr/bin/env python3
"""Synthetic GGUF models of each family edge-llm runs, and llama.cpp's logits on them.

Each case is a small model (a few layers, small dimensions) with seeded random weights and a real
vocabulary copied from one of our model files (SmolLM2's or Qwen2.5's), exercising the options of
its family: QK-norm, fused QKV and gate/up tensors, partial rotary dimensions, NoPE layers, the
granite multipliers, rope_freqs (llama3), yarn and linear rope scaling, biases, tied and separate
outputs. The same seed gives the same bytes (each reference records the file's sha256, which the
test checks before comparing).

  synth.py models OUT_DIR
      write every case's GGUF into OUT_DIR (what CI runs), the IQ-quantized ones included: their
      block matrices are the bytes llama-quantize wrote, kept in tests/synth/iq/*.gguf; and the
      encoders of scripts/synth/encoder.py (their references: scripts/synth/encoder_refs.sh).
  synth.py refs LLAMA_LOGITS LLAMA_QUANTIZE OUT_DIR
      write the GGUFs, quantize iq_base to every IQ type with llama-quantize (a synthetic
      importance matrix where llama.cpp requires one) and keep its block matrices in
      tests/synth/iq/, run llama.cpp (scripts/synth/llama_logits.cpp) on every file and write
      tests/synth/<case>.json; likewise the QUANTIZED cases in their types (blocks kept in
      tests/synth/quant/). scripts/synth/refs.sh builds the tools and runs this. LLAMA_QUANTIZE
      "-" skips the IQ and QUANTIZED cases; case names after OUT_DIR limit the references
      written (qwen3moe-Q8_0 names one quantized copy). Only the cases of the llama.cpp named by
      the LLAMA_CPP variable (old, the default, or newest; each case's `llama_cpp`) are run.

Needs the `gguf` and `numpy` packages (scripts/synth/refs.sh and scripts/test.sh install them
into an ignored venv). Run from the repository root.
"""
import functools
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import gguf

import encoder  # scripts/synth/encoder.py: the encoder cases
import gemma4  # scripts/synth/gemma4.py: the gemma4 cases
import granite  # scripts/synth/granite.py: the granitehybrid case
import o200k  # scripts/synth/o200k.py: gpt-oss's o200k vocabulary, from a PyPI wheel
import qwen35  # scripts/synth/qwen35.py: the qwen35 case
import reranker  # scripts/synth/reranker.py: the bert reranker

SMOLLM2 = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN25 = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
O200K = "o200k"  # not a file: scripts/synth/o200k.py builds it from the quicktok-v1 wheel
N_TOKENS = 40  # positions evaluated; past every case's original context (16)
N_PICKED = 96  # logits compared at these ids (plus each position's top ids)
TOP_K = 8

# Each case: the architecture, the vocabulary file and the options it exercises.
CASES = {
    "llama3_rope_freqs": dict(arch="llama", vocab=SMOLLM2, rope_freqs=True, freq_base=500000.0,
                              tied=False),
    "llama_yarn": dict(arch="llama", vocab=SMOLLM2, scaling=("yarn", 4.0), biases=True, tied=True),
    "llama_linear": dict(arch="llama", vocab=SMOLLM2, scaling=("linear", 2.0), tied=True),
    "qwen3": dict(arch="qwen3", vocab=QWEN25, qk_norm=True, head_dim=32, tied=True, neox=True),
    "phi3": dict(arch="phi3", vocab=SMOLLM2, fused_qkv=True, fused_up=True, rope_dim=8, tied=False,
                 n_kv_heads=4),
    "smollm3": dict(arch="smollm3", vocab=SMOLLM2, n_layers=4, tied=True),
    "granite": dict(arch="granite", vocab=SMOLLM2, granite=True, tied=True),
    # Mixture of experts: 8 experts of 128, 2 used per token, a router per layer, QK-norm.
    # Its reference is the newest llama.cpp's (llama_cpp="newest": refs.sh with LLAMA_CPP=newest).
    "qwen3moe": dict(arch="qwen3moe", vocab=QWEN25, qk_norm=True, n_embd=256, n_heads=4,
                     n_kv_heads=2, n_ff=256, n_layers=3, tied=True, moe=(8, 2, 128),
                     llama_cpp="newest"),
    # Gemma 4 shaped as the 31B (dense): 5 sliding-window layers of head size 64 and 2 KV heads,
    # then a full layer of head size 128 and 1 KV head, with no V projection (K is V), partial
    # "proportional" rope through rope_freqs, a layer_output_scale per layer, soft-capped logits.
    # 96 tokens: past the window of 16 many times over.
    "gemma4": dict(arch="gemma4", vocab=SMOLLM2, n_embd=256, n_heads=4, n_ff=512, n_layers=6,
                   tied=True, gemma4=dict(swa=[True] * 5 + [False], head_dim_swa=64, head_dim=128,
                                          kv_swa=2, kv_full=1, window=16),
                   n_tokens=96, llama_cpp="newest"),
    # Gemma 4 shaped as 26B-A4B: the dense case's layers with 8 experts of 128 (2 used) beside
    # the dense network, a router with its input scale, per-expert output scales, fused gate/up.
    "gemma4-moe": dict(arch="gemma4", vocab=SMOLLM2, n_embd=256, n_heads=4, n_ff=256, n_layers=6,
                       tied=True, gemma4=dict(swa=[True] * 5 + [False], head_dim_swa=64,
                                              head_dim=128, kv_swa=2, kv_full=1, window=16,
                                              moe=(8, 2, 128)),
                       n_tokens=96, llama_cpp="newest"),
    # Gemma 4 shaped as E2B: per-layer inputs (64 per layer), the last 5 of 10 layers reading
    # the KV of layers 3 (local) and 4 (global), V projections on every layer that has K.
    "gemma4-e2b": dict(arch="gemma4", vocab=SMOLLM2, n_embd=256, n_heads=4, n_ff=512,
                       n_layers=10, tied=True,
                       gemma4=dict(swa=([True] * 4 + [False]) * 2, head_dim_swa=64,
                                   head_dim=128, kv_swa=1, kv_full=1, window=16, per_layer=64,
                                   shared_kv=5, k_eq_v=False),
                       n_tokens=96, llama_cpp="newest"),
    # gpt-oss (llama.cpp's openai-moe) in gpt-oss-20b's proportions, smaller: head size 64 with
    # q wider than n_embd, 4 KV groups, experts as wide as n_embd, every other layer local with a
    # window (16) the 96-token sequence crosses many times, YaRN (factor 32 over 4096 positions),
    # sinks, biases on q/k/v/o, router and experts, clamped SwiGLU (gate and up weights scaled so
    # the clamp at 7 is reached). A vocabulary of SmolLM2's first 2048 tokens (merges among them):
    # small enough that the reference keeps every position's whole distribution for the KL
    # divergence (tests/synth/gpt-oss.logprobs.bin). Newest llama.cpp, flash attention on (as
    # llama-perplexity and llama-server run it on a CPU; off, llama.cpp rounds q and the attention
    # weights to f16, which moves its Q8_0 activations: KLD 0.0106 between its own two paths on
    # gpt-oss-MXFP4, experts routed differently at 6 of 96 positions).
    "gpt-oss": dict(arch="gpt-oss", vocab=SMOLLM2, vocab_size=2048, n_embd=256, n_heads=8,
                    n_kv_heads=2, head_dim=64, n_ff=256, n_layers=4, tied=False, moe=(8, 2, 256),
                    gpt_oss=True, biases=True, sliding_window=16, freq_base=150000.0,
                    scaling=("yarn", 32.0), orig_ctx=4096, n_ctx_train=131072, n_tokens=96,
                    full_logits=True, flash_attn=True, llama_cpp="newest"),
    # gpt-oss with its real vocabulary (o200k_base and the harmony special tokens, 201,088 ids;
    # scripts/synth/o200k.py) and its real chat template (tests/templates/, llama.cpp's
    # models/templates/openai-gpt-oss-120b.jinja): what the o200k tokenizer test
    # (tests/tokenizer_o200k.rs) and the harmony tests through real clients
    # (tests/server_harmony.rs) run on. Small (two layers, n_embd 64, f16 matrices) since the
    # embedding and output are 201,088 rows; random weights, so no logits reference (llama.cpp
    # renders its template and tokenizes its text instead).
    "gpt-oss-o200k": dict(arch="gpt-oss", vocab=O200K, n_embd=64, n_heads=2, n_kv_heads=1,
                          head_dim=64, n_ff=64, n_layers=2, tied=False, moe=(4, 2, 64),
                          gpt_oss=True, biases=True, sliding_window=16, freq_base=150000.0,
                          scaling=("yarn", 32.0), orig_ctx=4096, n_ctx_train=131072, f16=True,
                          chat_template="tests/templates/openai-gpt-oss-120b.jinja",
                          llama_cpp="none"),
    # The base of the IQ-quantized models: rows of 256 (the IQ super-block), one layer.
    "iq_base": dict(arch="llama", vocab=SMOLLM2, n_embd=256, n_heads=4, n_kv_heads=1, n_ff=256,
                    n_layers=1, tied=True),
    # LFM2 (hybrid: short convolutions and attention) in LFM2-350M's proportions, smaller: six
    # layers, attention at 2 and 5 (head_count_kv 0 marks a convolution layer), a window of 3
    # (shortconv.l_cache), QK-norm, neox rope, the final norm named token_embd_norm; block
    # matrices in F16. Its output matrix is separate (llama.cpp's lfm2 takes one when the file
    # has it) and scaled so the logits spread about 3 (a top token of some 20-40%, not the
    # one-hot of a tied embedding): KLD and same-top then measure something. A sequence of 256
    # tokens (tests/hybrid_models.rs runs it in chunks), the top 64 of each position kept (a KLD
    # over them and the rest).
    "lfm2": dict(arch="lfm2", vocab=SMOLLM2, n_embd=256, n_heads=4, n_kv_heads=2, n_ff=512,
                 n_layers=6, tied=False, output_scale=3.0, qk_norm=True, f16=True,
                 conv_layers=[0, 1, 3, 4], l_cache=3, n_tokens=256, top_k=64, n_picked=32,
                 llama_cpp="newest"),
    # Granite 4.0-H (Mamba-2 and attention; scripts/synth/granite.py) in Granite-4.0-H-Micro's
    # proportions, smaller: eight layers, attention at 2 and 6; d_inner = 2 n_embd in heads of 64,
    # d_state 128, a window of 4, 4 query heads per KV head, no rope; two groups (Micro has one)
    # so B, C and the norm's groups are exercised. The logits spread as lfm2's; 256 tokens.
    "granitehybrid": dict(arch="granitehybrid", vocab=SMOLLM2, n_embd=256, n_heads=4,
                          n_kv_heads=1, n_ff=512, n_layers=8, output_scale=24.0,
                          granite_hybrid=dict(attn_layers=[2, 6], d_conv=4, d_state=128,
                                              n_group=2, head_dim=64, out_scale=8.0),
                          n_tokens=256, top_k=64, n_picked=32, llama_cpp="newest"),
    # Granite 4.0-H-Tiny's layout, smaller: the same layers, each feed-forward block 32 experts
    # of 128 (6 used per token, softmax gating renormalised) beside a shared expert of 256.
    "granitehybrid_moe": dict(arch="granitehybrid", vocab=SMOLLM2, n_embd=256, n_heads=4,
                              n_kv_heads=1, n_ff=128, n_layers=8, output_scale=24.0,
                              granite_hybrid=dict(attn_layers=[2, 6], d_conv=4, d_state=128,
                                                  n_group=2, head_dim=64, out_scale=8.0,
                                                  moe=(32, 6, 256)),
                              n_tokens=256, top_k=64, n_picked=32, llama_cpp="newest"),
    # Qwen3.5 (gated delta-nets and gated attention) in its 0.8B/2B proportions, a quarter of the
    # width: 8 layers, attention at 3 and 7; a SmolLM2 vocabulary of 2048, a separate output
    # scaled as lfm2's; 320 tokens (tests/synth_qwen35.rs runs them in chunks).
    "qwen35": dict(arch="qwen35", vocab=SMOLLM2, vocab_size=2048, n_embd=256, n_heads=8,
                   n_kv_heads=2, n_ff=768, n_layers=8, output_scale=3.0, n_tokens=320, top_k=64,
                   n_picked=32, llama_cpp="newest",
                   qwen35=dict(head_dim=64, rope_dim=16, sections=[3, 3, 2, 0], interval=4,
                               n_k_heads=4, n_v_heads=8, state=32, d_conv=4)),
    # Qwen3.5-MoE (35B-A3B's layout: 256 experts of 512, 8 used, a shared expert of 512) smaller:
    # the qwen35 case's layers with 16 experts of 64, 4 used, a shared expert of 64.
    "qwen35moe": dict(arch="qwen35moe", vocab=SMOLLM2, vocab_size=2048, n_embd=256, n_heads=8,
                      n_kv_heads=2, n_ff=256, n_layers=8, output_scale=3.0, n_tokens=320,
                      top_k=64, n_picked=32, llama_cpp="newest", moe=(16, 4, 64, 64),
                      qwen35=dict(head_dim=64, rope_dim=16, sections=[3, 3, 2, 0], interval=4,
                                  n_k_heads=4, n_v_heads=8, state=32, d_conv=4)),
}

# Cases also written with the block matrices llama-quantize made of them in these types (the
# blocks kept in tests/synth/quant/, as the IQ ones). Not Q4_K_M: with its coarser matrices the
# two sides route 3 of the 40 rows of qwen3moe to different experts (the rows whose 2nd and 3rd
# expert probabilities are closest, within 8e-4), which no per-logit budget covers.
# Each entry: a type name (the case's suffix) and, if different, llama-quantize's file type.
QUANTIZED = {"qwen3moe": ["Q8_0"], "gpt-oss": [("MXFP4", "MXFP4_MOE")],
             "gemma4": ["Q4_K_M"], "lfm2": ["Q4_K_M"], "granitehybrid": ["Q4_K_M"],
             "qwen35": ["Q4_K_M"]}


def quant_types(case):
    """(suffix, llama-quantize file type) of each quantized copy of `case`."""
    return [t if isinstance(t, tuple) else (t, t) for t in QUANTIZED.get(case, [])]

IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S"]


@functools.lru_cache(maxsize=None)
def vocab_fields(path):
    """The tokenizer.ggml.* fields of a model file, as (key, value type, value)."""
    r = gguf.GGUFReader(path)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        out.append((key, f.types, f.contents()))
    return out


def trimmed(key, value, limit):
    """A vocabulary field cut to its first `limit` tokens: the per-token arrays cut, the merges
    kept where both parts and their join are among them (so the BPE stays whole)."""
    if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        return value[:limit]
    if key == "tokenizer.ggml.merges":
        kept = set(vocab_fields_tokens(limit))
        out = []
        for m in value:
            a, b = m.split(" ", 1)
            if a in kept and b in kept and a + b in kept:
                out.append(m)
        return out
    if key.endswith("_token_id") and value >= limit:
        sys.exit(f"{key} = {value} is past the first {limit} tokens")
    return value


def vocab_fields_tokens(limit):
    return [v for k, _, v in vocab_fields(SMOLLM2) if k == "tokenizer.ggml.tokens"][0][:limit]


def add_vocab(w, path, limit=None):
    n_vocab = 0
    for key, types, value in vocab_fields(path):
        if limit is not None:
            value = trimmed(key, value, limit)
        t = types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = types[1]
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(key, value)
            else:
                w.add_key_value(key, np.asarray(value, dtype=np.int32).tolist(), t, sub_type=sub)
        else:
            w.add_key_value(key, value, t)
    return n_vocab


def build(case, out_path, blocks=None):
    """Writes the case's GGUF; returns (n_vocab, the case's sequence of token ids). `blocks`: a
    GGUF whose tensors replace the random ones of the same name, bytes and type as they are."""
    c = CASES[case]
    if c.get("gemma4"):
        return gemma4.build(case, c, out_path, blocks, add_vocab, N_TOKENS)
    if c.get("granite_hybrid"):
        return granite.build(case, c, out_path, blocks, add_vocab, N_TOKENS)
    if c.get("qwen35"):
        return qwen35.build(case, c, out_path, blocks, add_vocab, N_TOKENS)
    replace = {}
    if blocks:
        for t in gguf.GGUFReader(blocks).tensors:
            replace[t.name] = (np.array(t.data), t.tensor_type)
    seed = int(hashlib.sha256(case.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    arch = c["arch"]
    n_embd = c.get("n_embd", 64)
    n_heads = c.get("n_heads", 4)
    n_kv_heads = c.get("n_kv_heads", 2)
    head_dim = c.get("head_dim", n_embd // n_heads)
    n_ff = c.get("n_ff", 128)
    n_layers = c.get("n_layers", 2)
    rope_dim = c.get("rope_dim", head_dim)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim

    w = gguf.GGUFWriter(out_path, arch)
    # (not the case name: llama.cpp special-cases model names containing "phi3")
    w.add_name("edge-llm synthetic model")
    w.add_context_length(c.get("n_ctx_train", 64))
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    conv_layers = c.get("conv_layers", [])
    if conv_layers:
        # Per layer: 0 KV heads marks a short-convolution layer (llama.cpp's lfm2 loader).
        w.add_head_count_kv([0 if i in conv_layers else n_kv_heads for i in range(n_layers)])
        w.add_uint32(f"{arch}.shortconv.l_cache", c["l_cache"])
    else:
        w.add_head_count_kv(n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(c.get("freq_base", 10000.0))
    if head_dim != n_embd // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_dimension_count(rope_dim)
    if "scaling" in c:
        kind, factor = c["scaling"]
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(c.get("orig_ctx", 16))
    if c.get("sliding_window"):
        w.add_sliding_window(c["sliding_window"])
    if c.get("granite"):
        w.add_embedding_scale(12.0)
        w.add_residual_scale(0.22)
        w.add_attention_scale(0.0078125 * 16)
        w.add_logit_scale(8.0)
    if c.get("moe"):
        n_expert, n_expert_used, n_ff_exp = c["moe"]
        w.add_uint32(f"{arch}.expert_count", n_expert)
        w.add_uint32(f"{arch}.expert_used_count", n_expert_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if c.get("f16") else gguf.LlamaFileType.ALL_F32)
    if c.get("vocab_size") and c["vocab"] != SMOLLM2:
        sys.exit(f"{case}: a trimmed vocabulary is SmolLM2's")
    if c["vocab"] == O200K:
        n_vocab = o200k.add_vocab(w)
    else:
        n_vocab = add_vocab(w, c["vocab"], c.get("vocab_size"))
    if c.get("chat_template"):
        with open(c["chat_template"], encoding="utf-8") as f:
            w.add_chat_template(f.read())
    add_tensor = w.add_tensor

    def add(name, value):
        if name in replace:
            data, qtype = replace.pop(name)
            add_tensor(name, data, raw_dtype=qtype)
        else:
            add_tensor(name, value)
    w.add_tensor = add

    def mat(n_out, n_in):  # [n_out][n_in], GGUF dims [n_in, n_out]
        m = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        return m.astype(np.float16) if c.get("f16") else m

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def vec(n, s=0.1):
        return (s * rng.standard_normal(n)).astype(np.float32)

    embd = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    w.add_tensor("token_embd.weight", embd.astype(np.float16))
    if c.get("rope_freqs"):
        # llama3's per-dimension factors (Llama 3.1's formula with an original context of 16):
        # 1 for high frequencies, 8 for low ones, smooth between.
        base = c.get("freq_base", 10000.0)
        freqs = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
        wavelen = 2 * np.pi / freqs
        lo, hi, factor, orig = 1.0, 4.0, 8.0, 16
        smooth = (orig / wavelen - lo) / (hi - lo)
        f = np.where(wavelen < orig / hi, 1.0, np.where(wavelen > orig / lo, factor,
                                                        1.0 / ((1 - smooth) / factor + smooth)))
        w.add_tensor("rope_freqs.weight", f.astype(np.float32))
    for i in range(n_layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        if i in conv_layers:
            # in_proj: b, c, x rows; the depthwise kernel [n_embd][l_cache] (f32, as
            # llama-quantize leaves it); out_proj.
            w.add_tensor(p + "shortconv.in_proj.weight", mat(3 * n_embd, n_embd))
            w.add_tensor(p + "shortconv.conv.weight",
                         (rng.standard_normal((n_embd, c["l_cache"])) * 0.5).astype(np.float32))
            w.add_tensor(p + "shortconv.out_proj.weight", mat(n_embd, n_embd))
        elif c.get("fused_qkv"):
            w.add_tensor(p + "attn_qkv.weight", mat(q_dim + 2 * kv_dim, n_embd))
        else:
            w.add_tensor(p + "attn_q.weight", mat(q_dim, n_embd))
            w.add_tensor(p + "attn_k.weight", mat(kv_dim, n_embd))
            w.add_tensor(p + "attn_v.weight", mat(kv_dim, n_embd))
        if i in conv_layers:
            pass
        elif c.get("biases"):
            w.add_tensor(p + "attn_q.bias", vec(q_dim))
            w.add_tensor(p + "attn_k.bias", vec(kv_dim))
            w.add_tensor(p + "attn_v.bias", vec(kv_dim))
        if c.get("qk_norm") and i not in conv_layers:
            w.add_tensor(p + "attn_q_norm.weight", norm(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(head_dim))
        if i not in conv_layers:
            w.add_tensor(p + "attn_output.weight", mat(n_embd, q_dim))
        if c.get("gpt_oss"):
            # Output bias, each head's sink logit, the pre-FFN norm under its gpt-oss name.
            w.add_tensor(p + "attn_output.bias", vec(n_embd))
            w.add_tensor(p + "attn_sinks.weight", vec(n_heads, 1.5))
            w.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
        else:
            w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        if c.get("gpt_oss"):
            # Router and experts with biases (stacked biases: numpy [n_expert][n], GGUF dims
            # [n, n_expert]); gate and up scaled by 4 so the SwiGLU clamp at 7 bites.
            w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            w.add_tensor(p + "ffn_gate_inp.bias", vec(n_expert, 0.5))
            stack = lambda n_out, n_in, k: np.stack([k * mat(n_out, n_in) for _ in range(n_expert)])
            w.add_tensor(p + "ffn_gate_exps.weight", stack(n_ff_exp, n_embd, 4.0))
            w.add_tensor(p + "ffn_up_exps.weight", stack(n_ff_exp, n_embd, 4.0))
            w.add_tensor(p + "ffn_down_exps.weight", stack(n_embd, n_ff_exp, 0.25))
            w.add_tensor(p + "ffn_gate_exps.bias", np.stack([vec(n_ff_exp) for _ in range(n_expert)]))
            w.add_tensor(p + "ffn_up_exps.bias", np.stack([vec(n_ff_exp) for _ in range(n_expert)]))
            w.add_tensor(p + "ffn_down_exps.bias", np.stack([vec(n_embd) for _ in range(n_expert)]))
        elif c.get("moe"):
            # The router ([n_expert][n_embd]) and each expert's matrices, stacked: numpy
            # [n_expert][n_out][n_in], GGUF dims [n_in, n_out, n_expert].
            w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            stack = lambda n_out, n_in: np.stack([mat(n_out, n_in) for _ in range(n_expert)])
            w.add_tensor(p + "ffn_gate_exps.weight", stack(n_ff_exp, n_embd))
            w.add_tensor(p + "ffn_up_exps.weight", stack(n_ff_exp, n_embd))
            w.add_tensor(p + "ffn_down_exps.weight", stack(n_embd, n_ff_exp))
        elif c.get("fused_up"):
            w.add_tensor(p + "ffn_up.weight", mat(2 * n_ff, n_embd))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        if not c.get("moe"):
            w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", norm(n_embd))
    if not c.get("tied"):
        w.add_tensor("output.weight",
                     (c.get("output_scale", 1.0) * mat(n_vocab, n_embd)).astype(np.float16))
    if replace:
        sys.exit(f"{blocks}: tensors not in {case}: {sorted(replace)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # Ordinary text tokens (ids past the control tokens), the same for every run.
    tokens = rng.integers(100, min(n_vocab, 40000), size=c.get("n_tokens", N_TOKENS)).tolist()
    return n_vocab, tokens


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def picked_ids(n_vocab, n=N_PICKED):
    return np.linspace(0, n_vocab - 1, n).round().astype(int).tolist()


def llama_logits(tool, model, tokens, picked, top_k=TOP_K, full=None, flash_attn=False):
    env = {**os.environ, "LLAMA_LOGITS_FLASH_ATTN": "1" if flash_attn else "0"}
    n_ctx = max(128, len(tokens))
    out = subprocess.run([tool, model, ",".join(map(str, tokens)), ",".join(map(str, picked)),
                          str(top_k), str(n_ctx)] + ([full] if full else []),
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout)


def llama_commit():
    info = os.environ.get("LLAMA_CPP_DESC", "0c1e57098 (PyPI sdist llama-cpp-python==0.3.36)")
    return f"ggml-org/llama.cpp {info}"


def write_ref(case, model_path, file_case, n_vocab, tokens, tool, extra):
    c = CASES[file_case]
    picked = picked_ids(n_vocab, c.get("n_picked", N_PICKED))
    os.makedirs("tests/synth", exist_ok=True)
    full = None
    flash_attn = CASES[file_case].get("flash_attn", False)
    if CASES[file_case].get("full_logits"):
        # Every position's whole log-softmax, f16 [positions][n_vocab], beside the JSON.
        full = f"tests/synth/{case}.logprobs.bin"
        extra = {**extra, "logprobs": os.path.basename(full)}
    ref = {
        "case": case,
        "file": os.path.basename(model_path),
        "made_by": "scripts/synth/refs.sh (scripts/synth/synth.py refs)",
        "llama_cpp": llama_commit() + ", CPU, one batch of all positions, flash attention "
                     + ("on" if flash_attn else "off"),
        "sha256": sha256(model_path),
        "base_case": file_case,
        "tokens": tokens,
        "picked_ids": picked,
        **extra,
        **llama_logits(tool, model_path, tokens, picked, c.get("top_k", TOP_K), full, flash_attn),
    }
    if full:
        ref["logprobs_sha256"] = sha256(full)
    with open(f"tests/synth/{case}.json", "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"tests/synth/{case}.json")


def write_imatrix(path, model_path, seed=7):
    """A synthetic importance matrix (llama.cpp's legacy .dat layout): for each block matrix, one
    positive weight per input column, as if from one call."""
    rng = np.random.default_rng(seed)
    entries = []
    for t in gguf.GGUFReader(model_path).tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            n_in = int(t.shape[0])
            entries.append((t.name, (0.5 + rng.random(n_in)).astype(np.float32)))
    with open(path, "wb") as f:
        f.write(np.int32(len(entries)).tobytes())
        for name, values in entries:
            f.write(np.int32(len(name)).tobytes() + name.encode())
            f.write(np.int32(1).tobytes() + np.int32(len(values)).tobytes() + values.tobytes())
        f.write(np.int32(1).tobytes())
        dataset = b"synthetic"
        f.write(np.int32(len(dataset)).tobytes() + dataset)


def keep_blocks(quantized, out_path):
    """The block matrices (blk.*, two-dimensional, or three: stacked experts) of a llama-quantize
    output, as they are."""
    r = gguf.GGUFReader(quantized)
    w = gguf.GGUFWriter(out_path, "blocks")
    kept = []
    for t in r.tensors:
        if t.name.startswith("blk.") and len(t.data.shape) in (2, 3) and t.tensor_type not in (
                gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
            kept.append(f"{t.name}:{t.tensor_type.name}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kept


def iq_blocks(t):
    return f"tests/synth/iq/iq_base-{t}.gguf"


def quant_blocks(case, t):
    return f"tests/synth/quant/{case}-{t}.gguf"


def quantize_case(case, path, n_vocab, tokens, tool, quantize, out, only):
    """The case quantized to each of its QUANTIZED types by llama-quantize: the blocks kept, the
    case rebuilt with them, llama.cpp's reference written."""
    os.makedirs("tests/synth/quant", exist_ok=True)
    for t, ftype in quant_types(case):
        if only and f"{case}-{t}" not in only:
            continue
        tmp = os.path.join(out, f"{case}-{t}.quantized.gguf")
        subprocess.run([quantize, "--token-embedding-type", "f16", path, tmp, ftype, "1"],
                       check=True, capture_output=True)
        kept = keep_blocks(tmp, quant_blocks(case, t))
        qpath = os.path.join(out, f"{case}-{t}.gguf")
        build(case, qpath, quant_blocks(case, t))
        write_ref(f"{case}-{t}", qpath, case, n_vocab, tokens, tool,
                  {"llama_quantize": f"llama-quantize --token-embedding-type f16 {case}.gguf {ftype}",
                   "block_types": kept})


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd = sys.argv[1]
    if cmd == "models":
        out = sys.argv[2]
        os.makedirs(out, exist_ok=True)
        for case in CASES:
            try:
                build(case, os.path.join(out, f"{case}.gguf"))
            except SystemExit as e:
                if CASES[case]["vocab"] != O200K:
                    raise
                # The o200k wheel could not be had: the other cases still get made, and the
                # tests of this one fail (under CI) naming the missing file.
                print(f"warning: {case}: {e}", file=sys.stderr)
                continue
            print(os.path.join(out, f"{case}.gguf"))
        encoder.models(out)  # bert.gguf, nomic_bert.gguf (tests/encoder_models.rs)
        reranker.models(out)  # bert_rerank.gguf (tests/encoder_server.rs)
        for t in IQ_TYPES:
            if os.path.exists(iq_blocks(t)):
                build("iq_base", os.path.join(out, f"iq_base-{t}.gguf"), iq_blocks(t))
                print(os.path.join(out, f"iq_base-{t}.gguf"))
        for case in QUANTIZED:
            for t, _ in quant_types(case):
                if os.path.exists(quant_blocks(case, t)):
                    build(case, os.path.join(out, f"{case}-{t}.gguf"), quant_blocks(case, t))
                    print(os.path.join(out, f"{case}-{t}.gguf"))
    elif cmd == "refs":
        tool, quantize, out = sys.argv[2], sys.argv[3], sys.argv[4]
        only = sys.argv[5:]
        os.makedirs(out, exist_ok=True)
        os.makedirs("tests/synth/iq", exist_ok=True)
        for case in CASES:
            wants_iq = not only or any(o.startswith("iq_base-") for o in only)
            wants_quant = not only or any(o.startswith(case + "-") for o in only)
            if only and case not in only and not (case == "iq_base" and wants_iq) \
                    and not (case in QUANTIZED and wants_quant):
                continue
            if CASES[case].get("llama_cpp", "old") != os.environ.get("LLAMA_CPP", "old"):
                print(f"{case}: its reference is made with LLAMA_CPP={CASES[case].get('llama_cpp', 'old')}")
                continue
            path = os.path.join(out, f"{case}.gguf")
            n_vocab, tokens = build(case, path)
            if not only or case in only:
                write_ref(case, path, case, n_vocab, tokens, tool, {})
            if case in QUANTIZED and quantize != "-":
                quantize_case(case, path, n_vocab, tokens, tool, quantize, out, only)
            if case != "iq_base" or quantize == "-":
                continue
            imatrix = os.path.join(out, "iq_base.imatrix")
            write_imatrix(imatrix, path)
            for t in IQ_TYPES:
                if only and f"iq_base-{t}" not in only:
                    continue
                tmp = os.path.join(out, f"iq_base-{t}.quantized.gguf")
                subprocess.run([quantize, "--imatrix", imatrix, "--token-embedding-type", "f16",
                                path, tmp, t, "1"], check=True, capture_output=True)
                kept = keep_blocks(tmp, iq_blocks(t))
                qpath = os.path.join(out, f"iq_base-{t}.gguf")
                build("iq_base", qpath, iq_blocks(t))
                write_ref(f"iq_base-{t}", qpath, case, n_vocab, tokens, tool,
                          {"llama_quantize": f"llama-quantize --imatrix (synthetic) "
                                             f"--token-embedding-type f16 iq_base.gguf {t}",
                           "block_types": kept})
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
