"""Straightforward reference forwards written independently of ``dare.models``.

They read raw state-dict tensors by the released parameter names and compute one unpadded sequence at
a time with explicit per-head loops, float64 RoPE angles (pairs ``(j, j + r/2)``), per-token MoE routing
and, for the block-diffusion families, an explicit block-causal ``[L, L]`` mask anchored at position 0.
Tests compare DARE's batched/padded/packed forwards against them.
"""

from __future__ import annotations

import math

import torch


def rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, positions, theta, rot):
    """x: [L, H, d]; rotate channels (j, j + rot/2) for j < rot/2 by angle pos * theta^(-2j/rot)."""
    half = rot // 2
    inv = torch.tensor([theta ** (-2.0 * j / rot) for j in range(half)], dtype=torch.float64)
    ang = positions.double()[:, None] * inv[None, :]
    c, s = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    a, b = x[..., :half], x[..., half:rot]
    return torch.cat([a * c - b * s, b * c + a * s, x[..., rot:]], dim=-1)


def attention(q, k, v, allowed=None):
    """q: [L, H, d], k/v: [L, Hkv, d] -> [L, H*d]; ``allowed [L, L]`` bool (None = full), loop over heads."""
    L, H, d = q.shape
    group = H // k.shape[1]
    outs = []
    for h in range(H):
        kv = h // group
        scores = q[:, h] @ k[:, kv].T / math.sqrt(d)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v[:, kv])
    return torch.cat(outs, dim=-1)


def block_causal(length, block_size):
    """allowed[i, j] = token j's block (j // block_size) is not after token i's block."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(length):
            allowed[i, j] = j // block_size <= i // block_size
    return allowed


def swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def llada_forward(sd, cfg, ids):
    p = "model.transformer."
    d, H = cfg["d_model"], cfg["n_heads"]
    Hkv = cfg.get("n_kv_heads") or H
    hd = d // H
    pos = torch.arange(len(ids))
    x = sd[p + "wte.weight"][ids]
    for i in range(cfg["n_layers"]):
        b = f"{p}blocks.{i}."
        h = rms(x, sd[b + "attn_norm.weight"], cfg["rms_norm_eps"])
        q = (h @ sd[b + "q_proj.weight"].T).view(-1, H, hd)
        k = (h @ sd[b + "k_proj.weight"].T).view(-1, Hkv, hd)
        v = (h @ sd[b + "v_proj.weight"].T).view(-1, Hkv, hd)
        q, k = rope(q, pos, cfg["rope_theta"], hd), rope(k, pos, cfg["rope_theta"], hd)
        x = x + attention(q, k, v) @ sd[b + "attn_out.weight"].T
        h = rms(x, sd[b + "ff_norm.weight"], cfg["rms_norm_eps"])
        x = x + swiglu(h, sd[b + "ff_proj.weight"], sd[b + "up_proj.weight"], sd[b + "ff_out.weight"])
    x = rms(x, sd[p + "ln_f.weight"], cfg["rms_norm_eps"])
    return x @ sd[p + "ff_out.weight"].T


def _decoder_forward(sd, cfg, ids, *, qkv_bias, qk_norm, rot, mlp):
    H = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or H
    hd = cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    pos = torch.arange(len(ids))
    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms(x, sd[b + "input_layernorm.weight"], eps)

        def proj(name, heads):
            out = h @ sd[f"{b}self_attn.{name}.weight"].T
            if qkv_bias:
                out = out + sd[f"{b}self_attn.{name}.bias"]
            return out.view(-1, heads, hd)

        q, k, v = proj("q_proj", H), proj("k_proj", Hkv), proj("v_proj", Hkv)
        if qk_norm:
            q = rms(q, sd[b + "self_attn.q_norm.weight"], eps)
            k = rms(k, sd[b + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, cfg["rope_theta"], rot), rope(k, pos, cfg["rope_theta"], rot)
        x = x + attention(q, k, v) @ sd[b + "self_attn.o_proj.weight"].T
        h = rms(x, sd[b + "post_attention_layernorm.weight"], eps)
        x = x + mlp(sd, cfg, i, h)
    x = rms(x, sd["model.norm.weight"], eps)
    return x @ sd["lm_head.weight"].T


def _dense_mlp(sd, cfg, i, h):
    b = f"model.layers.{i}.mlp."
    return swiglu(h, sd[b + "gate_proj.weight"], sd[b + "up_proj.weight"], sd[b + "down_proj.weight"])


def dream_forward(sd, cfg, ids):
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    return _decoder_forward(sd, cfg, ids, qkv_bias=True, qk_norm=False, rot=hd, mlp=_dense_mlp)


def _moe_mlp(sd, cfg, i, h):
    if not cfg["moe_layer_freq"][i]:
        return _dense_mlp(sd, cfg, i, h)
    b = f"model.layers.{i}.mlp."
    out = torch.zeros_like(h)
    bias = sd.get(b + "expert_bias")
    for t in range(h.shape[0]):
        probs = torch.softmax((h[t] @ sd[b + "gate.weight"].T).float(), dim=-1)
        if bias is not None:
            probs = probs + bias
        weights, experts = probs.topk(cfg["num_experts_per_tok"])
        for w, e in zip(weights, experts):
            e = int(e)
            eb = f"{b}experts.{e}."
            y = swiglu(h[t:t + 1], sd[eb + "gate_proj.weight"], sd[eb + "up_proj.weight"], sd[eb + "down_proj.weight"])
            out[t] += (y[0] * w.to(h.dtype))
    return out


def llada_moe_forward(sd, cfg, ids):
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = int(hd * cfg["partial_rotary_factor"])
    return _decoder_forward(sd, cfg, ids, qkv_bias=False, qk_norm=True, rot=rot, mlp=_moe_mlp)


def _expert(sd, prefix, h):
    return swiglu(h, sd[prefix + "gate_proj.weight"], sd[prefix + "up_proj.weight"], sd[prefix + "down_proj.weight"])


def sdar_forward(sd, cfg, ids, block_size=None):
    """SDAR / SDAR-MoE (Qwen3 layout, explicit head_dim, block-causal from position 0)."""
    H = cfg["num_attention_heads"]
    Hkv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    block_size = block_size or cfg.get("block_size") or 4
    pos = torch.arange(len(ids))
    allowed = block_causal(len(ids), block_size)
    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms(x, sd[b + "input_layernorm.weight"], eps)
        q = rms((h @ sd[b + "self_attn.q_proj.weight"].T).view(-1, H, hd), sd[b + "self_attn.q_norm.weight"], eps)
        k = rms((h @ sd[b + "self_attn.k_proj.weight"].T).view(-1, Hkv, hd), sd[b + "self_attn.k_norm.weight"], eps)
        v = (h @ sd[b + "self_attn.v_proj.weight"].T).view(-1, Hkv, hd)
        q, k = rope(q, pos, cfg["rope_theta"], hd), rope(k, pos, cfg["rope_theta"], hd)
        x = x + attention(q, k, v, allowed) @ sd[b + "self_attn.o_proj.weight"].T
        h = rms(x, sd[b + "post_attention_layernorm.weight"], eps)
        sparse = "num_experts" in cfg and i not in cfg["mlp_only_layers"] and (i + 1) % cfg["decoder_sparse_step"] == 0
        if not sparse:
            x = x + _expert(sd, b + "mlp.", h)
            continue
        out = torch.zeros_like(h)
        for t in range(h.shape[0]):  # softmax -> top-k -> renormalise (Qwen3-MoE)
            probs = torch.softmax((h[t] @ sd[b + "mlp.gate.weight"].T).float(), dim=-1)
            weights, experts = probs.topk(cfg["num_experts_per_tok"])
            if cfg["norm_topk_prob"]:
                weights = weights / weights.sum()
            for w, e in zip(weights, experts):
                out[t] += _expert(sd, f"{b}mlp.experts.{int(e)}.", h[t:t + 1])[0] * w.to(h.dtype)
        x = x + out
    x = rms(x, sd["model.norm.weight"], eps)
    head = sd["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else sd["lm_head.weight"]
    return x @ head.T


def _llada2_moe(sd, cfg, b, h):
    """Per token: sigmoid scores; choose on score + expert_bias within the best groups; weigh by the raw score."""
    E, G = cfg["num_experts"], cfg["n_group"]
    per_group = E // G
    out = torch.zeros(h.shape, dtype=torch.float32)
    for t in range(h.shape[0]):
        scores = torch.sigmoid(h[t].float() @ sd[b + "mlp.gate.weight"].float().T)
        biased = scores + sd[b + "mlp.gate.expert_bias"].float()
        group_score = [sorted(biased[g * per_group:(g + 1) * per_group].tolist())[-2:] for g in range(G)]
        group_score = [sum(pair) for pair in group_score]
        groups = sorted(range(G), key=lambda g: -group_score[g])[: cfg["topk_group"]]
        candidates = [e for e in range(E) if e // per_group in groups]
        chosen = sorted(candidates, key=lambda e: -float(biased[e]))[: cfg["num_experts_per_tok"]]
        weights = scores[chosen]
        weights = weights / weights.sum() * cfg["routed_scaling_factor"]
        for w, e in zip(weights, chosen):
            out[t] += _expert(sd, f"{b}mlp.experts.{e}.", h[t:t + 1])[0].float() * w
    out = out.to(h.dtype)
    if cfg.get("num_shared_experts"):
        out = out + _expert(sd, b + "mlp.shared_experts.", h)
    return out


def llada2_forward(sd, cfg, ids, block_size=32):
    """LLaDA2 (fused qkv rows [q heads | k heads | v heads], partial RoPE, group-limited sigmoid MoE, fp32 logits)."""
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    rot = int(hd * cfg["partial_rotary_factor"])
    eps = cfg["rms_norm_eps"]
    pos = torch.arange(len(ids))
    allowed = block_causal(len(ids), block_size)
    x = sd["model.word_embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms(x, sd[b + "input_layernorm.weight"], eps)
        qkv = (h @ sd[b + "attention.query_key_value.weight"].T).view(-1, H + 2 * Hkv, hd)
        q, k, v = qkv[:, :H], qkv[:, H:H + Hkv], qkv[:, H + Hkv:]
        q = rms(q, sd[b + "attention.query_layernorm.weight"], eps)
        k = rms(k, sd[b + "attention.key_layernorm.weight"], eps)
        q, k = rope(q, pos, cfg["rope_theta"], rot), rope(k, pos, cfg["rope_theta"], rot)
        x = x + attention(q, k, v, allowed) @ sd[b + "attention.dense.weight"].T
        h = rms(x, sd[b + "post_attention_layernorm.weight"], eps)
        x = x + (_expert(sd, b + "mlp.", h) if i < cfg["first_k_dense_replace"] else _llada2_moe(sd, cfg, b, h))
    x = rms(x, sd["model.norm.weight"], eps)
    return (x @ sd["lm_head.weight"].T).float()


REFERENCE_FORWARDS = {
    "llada": llada_forward, "dream": dream_forward, "llada_moe": llada_moe_forward,
    "sdar": sdar_forward, "sdar_moe": sdar_forward, "llada2": llada2_forward,
}
