"""The synthetic gemma4 cases of scripts/synth/synth.py: Gemma 4's layout in small dimensions
(llama.cpp's src/models/gemma4.cpp and conversion/gemma.py's Gemma4Model give the keys and
tensors): sliding-window layers with their own head size, KV head count and rope base; full
layers with "proportional" partial rope through rope_freqs (1 for the rotated pairs, 1e30 for
the rest, as the converter writes) and, like the 31B, no V projection; QK-norm, post-norms, a
layer_output_scale per layer, GELU gated feed-forward, soft-capped logits tied to the embedding.
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
    g = c["gemma4"]
    arch = c["arch"]
    n_embd, n_heads, n_ff, n_layers = c["n_embd"], c["n_heads"], c["n_ff"], c["n_layers"]
    swa = g["swa"]
    assert len(swa) == n_layers
    hd = [g["head_dim_swa"] if s else g["head_dim"] for s in swa]
    kv = [g["kv_swa"] if s else g["kv_full"] for s in swa]

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name("edge-llm synthetic model")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_key_length(g["head_dim"])
    w.add_value_length(g["head_dim"])
    w.add_key_length_swa(g["head_dim_swa"])
    w.add_value_length_swa(g["head_dim_swa"])
    w.add_rope_dimension_count(g["head_dim"])
    w.add_rope_dimension_count_swa(g["head_dim_swa"])
    w.add_sliding_window(g["window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(g.get("shared_kv", 0))
    w.add_embedding_length_per_layer_input(g.get("per_layer", 0))
    w.add_final_logit_softcapping(30.0)
    moe = g.get("moe")
    if moe:
        n_expert, n_expert_used, n_ff_exp = moe
        w.add_uint32(f"{arch}.expert_count", n_expert)
        w.add_uint32(f"{arch}.expert_used_count", n_expert_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", n_ff_exp)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = add_vocab(w, c["vocab"])
    add_tensor = w.add_tensor

    def add(name, value):
        if name in replace:
            data, qtype = replace.pop(name)
            add_tensor(name, data, raw_dtype=qtype)
        else:
            add_tensor(name, value)

    def mat(n_out, n_in):  # [n_out][n_in], GGUF dims [n_in, n_out]
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    embd = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    add("token_embd.weight", embd.astype(np.float16))
    # Proportional rope of the full layers: a quarter of the pairs rotated.
    n_rot = g["head_dim"] // 8
    add("rope_freqs.weight",
        np.array([1.0] * n_rot + [1e30] * (g["head_dim"] // 2 - n_rot), dtype=np.float32))
    n_pl = g.get("per_layer", 0)
    if n_pl:
        add("per_layer_token_embd.weight",
            rng.standard_normal((n_vocab, n_layers * n_pl)).astype(np.float16))
        add("per_layer_model_proj.weight", mat(n_layers * n_pl, n_embd))
        add("per_layer_proj_norm.weight", norm(n_pl))
    first_shared = n_layers - g.get("shared_kv", 0)
    for i in range(n_layers):
        p = f"blk.{i}."
        q_dim, kv_dim = n_heads * hd[i], kv[i] * hd[i]
        add(p + "attn_norm.weight", norm(n_embd))
        add(p + "attn_q.weight", mat(q_dim, n_embd))
        if i < first_shared:  # the last layers read an earlier layer's KV: no K, V of their own
            add(p + "attn_k.weight", mat(kv_dim, n_embd))
            if swa[i] or not g.get("k_eq_v", True):  # else K is V (attention_k_eq_v)
                add(p + "attn_v.weight", mat(kv_dim, n_embd))
        add(p + "attn_q_norm.weight", norm(hd[i]))
        if i < first_shared:
            add(p + "attn_k_norm.weight", norm(hd[i]))
        if n_pl:
            add(p + "inp_gate.weight", mat(n_pl, n_embd))
            add(p + "proj.weight", mat(n_embd, n_pl))
            add(p + "post_norm.weight", norm(n_embd))
        add(p + "attn_output.weight", mat(n_embd, q_dim))
        add(p + "post_attention_norm.weight", norm(n_embd))
        add(p + "ffn_norm.weight", norm(n_embd))
        add(p + "ffn_gate.weight", mat(n_ff, n_embd))
        add(p + "ffn_up.weight", mat(n_ff, n_embd))
        add(p + "ffn_down.weight", mat(n_embd, n_ff))
        add(p + "post_ffw_norm.weight", norm(n_embd))
        if moe:  # 26B-A4B: experts beside the dense network (the shared expert)
            stack = lambda n_out, n_in: np.stack([mat(n_out, n_in) for _ in range(n_expert)])
            add(p + "ffn_gate_inp.weight", mat(n_expert, n_embd))
            add(p + "ffn_gate_inp.scale", norm(n_embd))
            add(p + "ffn_gate_up_exps.weight", stack(2 * n_ff_exp, n_embd))
            add(p + "ffn_down_exps.weight", stack(n_embd, n_ff_exp))
            add(p + "ffn_down_exps.scale", norm(n_expert))
            add(p + "pre_ffw_norm_2.weight", norm(n_embd))
            add(p + "post_ffw_norm_1.weight", norm(n_embd))
            add(p + "post_ffw_norm_2.weight", norm(n_embd))
        add(p + "layer_output_scale.weight",
            np.array([rng.uniform(0.6, 1.2)], dtype=np.float32))
    add("output_norm.weight", norm(n_embd))
    if replace:
        raise SystemExit(f"{blocks}: tensors not in {case}: {sorted(replace)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tokens = rng.integers(100, min(n_vocab, 40000), size=c.get("n_tokens", n_tokens_default))
    return n_vocab, tokens.tolist()
