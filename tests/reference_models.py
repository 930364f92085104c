"""Straightforward reference forwards written independently of ``dare.models``.

They read raw state-dict tensors by the released parameter names and compute one unpadded sequence at
a time with explicit per-head loops, float64 RoPE angles (pairs ``(j, j + r/2)``) and per-token MoE
routing. Tests compare DARE's batched/padded/packed forwards against them.
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


def attention(q, k, v):
    """q: [L, H, d], k/v: [L, Hkv, d] -> [L, H*d], full bidirectional, explicit loop over heads."""
    L, H, d = q.shape
    group = H // k.shape[1]
    outs = []
    for h in range(H):
        kv = h // group
        scores = q[:, h] @ k[:, kv].T / math.sqrt(d)
        outs.append(torch.softmax(scores, dim=-1) @ v[:, kv])
    return torch.cat(outs, dim=-1)


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


REFERENCE_FORWARDS = {"llada": llada_forward, "dream": dream_forward, "llada_moe": llada_moe_forward}
