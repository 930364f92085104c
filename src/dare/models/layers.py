"""Building blocks shared by the model families (exact numerics of the reference implementations)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dare.models.fusion import project, project_one


class RMSNorm(nn.Module):
    """RMSNorm, normalised in fp32, in one of the two orders the reference implementations use:

    * ``scale_in_fp32=False`` (HF/Llama: LLaDA, Dream, LLaDA-MoE, LLaDA2): cast the normalised value back to the
      input dtype, then multiply by ``weight`` (in bf16 a bf16 x bf16 product);
    * ``scale_in_fp32=True`` (the fused triton RMSNorm of SDAR's reference, ``rms_norm_fn``): multiply by
      ``weight`` in fp32, then cast to the input dtype.

    Both are identical in fp32; in bf16 they differ by about one ulp per norm.
    """

    def __init__(self, dim: int, eps: float, scale_in_fp32: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.scale_in_fp32 = scale_in_fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale_in_fp32:
            return (x32 * self.weight.float()).to(dtype)
        return self.weight * x32.to(dtype)

    def extra_repr(self) -> str:
        order = ", scale_in_fp32=True" if self.scale_in_fp32 else ""
        return f"{self.weight.shape[0]}, eps={self.eps}{order}"


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with the HF parameter names ``gate_proj/up_proj/down_proj``."""

    fused_groups = {"gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}

    def __init__(self, hidden: int, inner: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(self, "gate_up", x)
        return project_one(self, "down", F.silu(gate) * up)


def rope_angles(positions: torch.Tensor, rot_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``cos, sin`` of shape ``[B, 1, L, rot_dim]`` for integer ``positions [B, L]`` (NeoX layout)."""
    device = positions.device
    with torch.autocast(device_type=device.type, enabled=False):
        inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, device=device, dtype=torch.float32) / rot_dim))
        freqs = positions.to(torch.float32)[..., None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, full_precision: bool
) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of each head of ``x [B, H, L, d]``.

    ``full_precision`` (LLaDA's ``rope_full_precision``) rotates in fp32 and casts back; otherwise, as in
    HF Llama/Qwen, ``cos``/``sin`` are cast to the activation dtype first. Channels past the rotary
    width (partial rotary) pass through unchanged.
    """
    rot_dim = cos.shape[-1]
    dtype = x.dtype
    if full_precision:
        xr = x.float()
    else:
        xr = x
        cos, sin = cos.to(dtype), sin.to(dtype)
    rot = xr[..., :rot_dim]
    x1, x2 = rot.chunk(2, dim=-1)
    rotated = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    if rot_dim < x.shape[-1]:
        rotated = torch.cat((rotated, xr[..., rot_dim:]), dim=-1)
    return rotated.to(dtype)


def default_positions(
    batch_size: int,
    length: int,
    device: torch.device,
    attention_mask: torch.Tensor | None = None,
    doc_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions ``[B, L]`` when the caller gives none.

    Packed rows restart at 0 in every document; padded rows count real tokens only (left padding does not
    shift positions, matching Dream's ``tok_idx``); otherwise ``0..L-1``.
    """
    if doc_positions is not None:
        return doc_positions[None, :].expand(batch_size, -1)
    if attention_mask is not None and not bool(attention_mask.all()):
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return torch.arange(length, device=device)[None, :].expand(batch_size, -1)
