"""The synthetic granitehybrid case of scripts/synth/synth.py: Granite 4.0-H's layout (llama.cpp's
src/models/granite-hybrid.cpp, build_mamba2_layer in mamba-base.cpp, and conversion/granite.py's
GraniteHybridModel give the keys and tensors) in small dimensions: Mamba-2 layers (in_proj to z,
xBC and dt; a depthwise conv1d of window 4 with bias; per-head A, D and dt bias; a grouped RMSNorm;
out_proj) beside a few attention layers (0 KV heads marks a Mamba-2 layer), no rope
(rope.scaling.finetuned false, as the converter writes for Granite 4.0-H), granite's embedding,
residual, attention and logit multipliers, a SwiGLU feed-forward block in every layer; or, with
`moe` (Granite 4.0-H-Tiny's layout), in every layer routed experts of feed_forward_length (softmax
gating, renormalised top k) beside a shared expert (expert_shared_feed_forward_length).
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
    g = c["granite_hybrid"]
    arch = c["arch"]
    n_embd, n_heads, n_kv_heads = c["n_embd"], c["n_heads"], c["n_kv_heads"]
    n_ff, n_layers = c["n_ff"], c["n_layers"]
    head_dim = n_embd // n_heads
    attn_layers = g["attn_layers"]
    d_conv, d_state, n_group, ssm_head_dim = g["d_conv"], g["d_state"], g["n_group"], g["head_dim"]
    d_inner = 2 * n_embd
    n_ssm_head = d_inner // ssm_head_dim
    conv_dim = d_inner + 2 * n_group * d_state
    d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name("edge-llm synthetic model")
    w.add_context_length(2 ** 20)  # what the converter writes for a model without rope
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv([n_kv_heads if i in attn_layers else 0 for i in range(n_layers)])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_finetuned(False)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_group)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_time_step_rank(n_ssm_head)
    # Granite-4.0-H-Micro's multipliers.
    w.add_embedding_scale(12.0)
    w.add_residual_scale(0.22)
    w.add_attention_scale(0.0078125)
    w.add_logit_scale(8.0)
    moe = g.get("moe")
    if moe:
        n_expert, n_expert_used, n_ff_shexp = moe
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = add_vocab(w, c["vocab"])
    add_tensor = w.add_tensor

    def add(name, value):
        if name in replace:
            data, qtype = replace.pop(name)
            add_tensor(name, data, raw_dtype=qtype)
        else:
            add_tensor(name, value)

    def mat(n_out, n_in):  # [n_out][n_in], GGUF dims [n_in, n_out], F16
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def f32(a):
        return np.asarray(a, dtype=np.float32)

    add("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float16))
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(n_embd))
        if i in attn_layers:
            add(p + "attn_q.weight", mat(n_heads * head_dim, n_embd))
            add(p + "attn_k.weight", mat(n_kv_heads * head_dim, n_embd))
            add(p + "attn_v.weight", mat(n_kv_heads * head_dim, n_embd))
            add(p + "attn_output.weight", mat(n_embd, n_heads * head_dim))
        else:
            # in_proj rows: z, xBC, dt (dt's rows as they are: dt ~ N(0, 1) before its bias).
            add(p + "ssm_in.weight", mat(d_in_proj, n_embd))
            # conv1d [conv_dim][d_conv] (F32: llama-quantize leaves it), its bias.
            add(p + "ssm_conv1d.weight", f32(0.5 * rng.standard_normal((conv_dim, d_conv))))
            add(p + "ssm_conv1d.bias", f32(0.1 * rng.standard_normal(conv_dim)))
            # Mamba-2's initialisation: dt in [1e-3, 1e-1] through the inverse softplus, A = -exp(A_log)
            # with A in [1, 16], D = 1; GGUF dims {1, n_head}.
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n_ssm_head))
            add(p + "ssm_dt.bias", f32(dt + np.log(-np.expm1(-dt))))
            add(p + "ssm_a", f32(-rng.uniform(1.0, 16.0, (n_ssm_head, 1))))
            add(p + "ssm_d", f32(1.0 + 0.1 * rng.standard_normal((n_ssm_head, 1))))
            add(p + "ssm_norm.weight", norm(d_inner).reshape(n_group, d_inner // n_group))
            # out_proj scaled so each Mamba-2 block moves the residual stream (12x embeddings,
            # 0.22x residual adds) by some 15%, not 2%: the scan's arithmetic then shows in the logits.
            add(p + "ssm_out.weight", (g.get("out_scale", 1.0) * mat(n_embd, d_inner)).astype(np.float16))
        add(p + "ffn_norm.weight", norm(n_embd))
        if moe:
            # The router and each expert's matrices, stacked: numpy [n_expert][n_out][n_in]; the
            # shared expert's as a dense block's.
            stack = lambda n_out, n_in: np.stack([mat(n_out, n_in) for _ in range(n_expert)])
            add(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            add(p + "ffn_gate_exps.weight", stack(n_ff, n_embd))
            add(p + "ffn_up_exps.weight", stack(n_ff, n_embd))
            add(p + "ffn_down_exps.weight", stack(n_embd, n_ff))
            add(p + "ffn_gate_shexp.weight", mat(n_ff_shexp, n_embd))
            add(p + "ffn_up_shexp.weight", mat(n_ff_shexp, n_embd))
            add(p + "ffn_down_shexp.weight", mat(n_embd, n_ff_shexp))
            continue
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
