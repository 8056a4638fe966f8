"""The synthetic qwen35 and qwen35moe cases of scripts/synth/synth.py: Qwen3.5's layout (llama.cpp's
src/models/qwen35.cpp and llama-model.cpp's qwen35 loader give the keys and tensors) in the
proportions of Qwen3.5-0.8B/2B, smaller: every fourth layer full attention (full_attention_interval
4), the others gated delta-nets (ssm.* keys: a fused attn_qkv projection of q, k and v heads, the
output gate attn_gate, ssm_alpha/ssm_beta per value head, a causal conv of 4 (ssm_conv1d, f32),
ssm_dt.bias, ssm_a = -exp(A_log), ssm_norm per head, ssm_out); attention layers with the q
projection doubled (each head's queries then its output gate), QK-norm, partial IMROPE (a quarter
of the head rotated, sections summing to the rotated pairs); post_attention_norm as the norm before
the feed-forward block; SwiGLU. The k projection is correlated with the q projection (see
attn_qkv below). Value heads are twice the key heads (as the 9B's; the 0.8B/2B have
as many), so the kernel's sharing of q/k heads is checked against llama.cpp too. qwen35moe
(35B-A3B's layout, smaller): the feed-forward block is routed experts plus a shared expert with a
sigmoid gate (`ffn_gate_inp_shexp`, one logit per token).
"""
import hashlib

import numpy as np
import gguf


def build(case, c, out_path, blocks, add_vocab, n_tokens_default):
    replace = {}
    if blocks:
        for t in gguf.GGUFReader(blocks).tensors:
            replace[t.name] = (np.array(t.data), t.tensor_type)
    seed = int(hashlib.sha256(case.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    q = c["qwen35"]
    arch = c["arch"]
    n_embd, n_heads, n_kv_heads, n_ff, n_layers = (
        c["n_embd"], c["n_heads"], c["n_kv_heads"], c["n_ff"], c["n_layers"])
    head_dim, rope_dim = q["head_dim"], q["rope_dim"]
    n_k, n_v, s, d_conv = q["n_k_heads"], q["n_v_heads"], q["state"], q["d_conv"]
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    conv_dim, value_dim = (2 * n_k + n_v) * s, n_v * s

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name("edge-llm synthetic model")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(rope_dim)
    w.add_rope_dimension_sections(q["sections"])
    w.add_full_attention_interval(q["interval"])
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(s)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_group_count(n_k)
    moe = c.get("moe")
    if moe:
        n_expert, n_expert_used, n_ff_exp, n_ff_shexp = moe
        w.add_uint32(f"{arch}.expert_count", n_expert)
        w.add_uint32(f"{arch}.expert_used_count", n_expert_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", n_ff_exp)
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", n_ff_shexp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = add_vocab(w, c["vocab"], c.get("vocab_size"))
    add_tensor = w.add_tensor

    def add(name, value):
        if name in replace:
            data, qtype = replace.pop(name)
            add_tensor(name, data, raw_dtype=qtype)
        else:
            add_tensor(name, value)

    def mat(n_out, n_in, k=1.0):  # [n_out][n_in], GGUF dims [n_in, n_out], F16
        return (k * rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    add("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float16))
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(n_embd))
        if (i + 1) % q["interval"] != 0:
            # k's rows are q's plus noise: a head's first output is v * sign(q . k) after the
            # gated RMSNorm, so with independent random q and k a head near q . k = 0 flips
            # under a rounding-size change (no trained head sits there).
            qkv = mat(conv_dim, n_embd).astype(np.float32)
            kq = n_k * s
            qkv[kq:2 * kq] = (qkv[:kq] + 0.5 * qkv[kq:2 * kq]) / np.sqrt(1.25)
            add(p + "attn_qkv.weight", qkv.astype(np.float16))
            add(p + "attn_gate.weight", mat(value_dim, n_embd))
            add(p + "ssm_alpha.weight", mat(n_v, n_embd))
            add(p + "ssm_beta.weight", mat(n_v, n_embd))
            add(p + "ssm_conv1d.weight",
                (rng.standard_normal((conv_dim, d_conv)) * 0.5).astype(np.float32))
            add(p + "ssm_dt.bias", np.ones(n_v, dtype=np.float32))
            # A_log = log(uniform(1, 16)) as Qwen3-Next initialises it; the file holds -exp(A_log).
            add(p + "ssm_a", -rng.uniform(1.0, 16.0, n_v).astype(np.float32))
            add(p + "ssm_norm.weight", norm(s))
            add(p + "ssm_out.weight", mat(n_embd, value_dim))
        else:
            add(p + "attn_q.weight", mat(2 * q_dim, n_embd))
            add(p + "attn_k.weight", mat(kv_dim, n_embd))
            add(p + "attn_v.weight", mat(kv_dim, n_embd))
            add(p + "attn_q_norm.weight", norm(head_dim))
            add(p + "attn_k_norm.weight", norm(head_dim))
            add(p + "attn_output.weight", mat(n_embd, q_dim))
        add(p + "post_attention_norm.weight", norm(n_embd))
        if moe:
            # The router, the experts stacked (numpy [n_expert][n_out][n_in], GGUF dims [n_in,
            # n_out, n_expert]), the shared expert and its gate (GGUF dims [n_embd]).
            stack = lambda n_out, n_in: np.stack([mat(n_out, n_in) for _ in range(n_expert)])
            add(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            add(p + "ffn_gate_exps.weight", stack(n_ff_exp, n_embd))
            add(p + "ffn_up_exps.weight", stack(n_ff_exp, n_embd))
            add(p + "ffn_down_exps.weight", stack(n_embd, n_ff_exp))
            add(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(n_embd) / np.sqrt(n_embd)).astype(np.float32))
            add(p + "ffn_gate_shexp.weight", mat(n_ff_shexp, n_embd))
            add(p + "ffn_up_shexp.weight", mat(n_ff_shexp, n_embd))
            add(p + "ffn_down_shexp.weight", mat(n_embd, n_ff_shexp))
        else:
            add(p + "ffn_gate.weight", mat(n_ff, n_embd))
            add(p + "ffn_up.weight", mat(n_ff, n_embd))
            add(p + "ffn_down.weight", mat(n_embd, n_ff))
    add("output_norm.weight", norm(n_embd))
    add("output.weight", (c.get("output_scale", 1.0) * mat(n_vocab, n_embd)).astype(np.float16))
    if replace:
        raise SystemExit(f"{blocks}: tensors not in {case}: {sorted(replace)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tokens = rng.integers(100, min(n_vocab, 40000), size=c.get("n_tokens", n_tokens_default))
    return n_vocab, tokens.tolist()
