"""FP8 (e4m3) matmuls for decoding: row-wise scaled weight copies and per-row activation quantisation.

A projection ``y = x W^T`` becomes ``torch._scaled_mm(q(x), q(W)^T)`` with one float32 scale per output channel of
``W`` (its absolute maximum / 448, the largest e4m3 value) and one per row of ``x``, computed at each call. The
weights are quantised once per refresh (:class:`~dare.models.fusion.FusedProjections` with ``mode="fp8"``); the
matmul accumulates in float32 and writes the activation dtype. Each value keeps 3 mantissa bits, so a product
differs from the bf16 one by a few percent of its magnitude: the tokens are not the reference samplers'.

Used by the static rollout engines when ``SamplerConfig.weights == "fp8"`` (:mod:`dare.rollout.engine.fused`).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
TINY = 1e-12
"""Smallest scale: an all-zero row or channel quantises to zeros instead of dividing by zero."""

MIN_CAPABILITY = (8, 9)
"""CUDA compute capability of the first GPUs with FP8 tensor cores (Ada, Hopper and later)."""


def fp8_shape_ok(in_features: int, out_features: int) -> bool:
    """Whether a ``[out, in]`` weight can run as an FP8 matmul (both sizes multiples of 16)."""
    return in_features % 16 == 0 and out_features % 16 == 0


def _quantize_rows_ops(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight.float()
    row_scale = w.abs().amax(dim=1).clamp(min=TINY) / FP8_MAX
    return (w / row_scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), row_scale


_compiled_quantize = None


def _quantize_fn(weight: torch.Tensor):
    """The quantisation ops, compiled on CUDA (one fused pass per weight instead of five: an 8B model's copies
    are refreshed at every rollout call)."""
    global _compiled_quantize
    if not weight.is_cuda:
        return _quantize_rows_ops
    if _compiled_quantize is None:
        _compiled_quantize = torch.compile(_quantize_rows_ops, dynamic=True)
    return _compiled_quantize


@torch.no_grad()
def quantize_rows(weight: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
    """Write ``weight [N, K]`` into ``out [N, K]`` (FP8) with one scale per row into ``scale [N]`` (float32), in
    place: the buffers keep their addresses (recorded CUDA graphs read them)."""
    values, row_scale = _quantize_fn(weight)(weight)
    out.copy_(values)
    scale.copy_(row_scale)


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` as FP8 values and their per-row float32 scales ``[M, 1]`` (the weights' row quantisation)."""
    values, scale = _quantize_rows_ops(x)
    return values, scale[:, None]


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x [..., K] @ dequant(weight [N, K])^T (+ bias)`` in ``out_dtype`` (default ``x``'s dtype); ``scale [N]``
    from :func:`quantize_rows`."""
    lead = x.shape[:-1]
    xq, x_scale = quantize_activation(x.reshape(-1, x.shape[-1]))
    out = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=scale[None, :], out_dtype=out_dtype or x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*lead, weight.shape[0])


def fp8_gpu_error(device: torch.device) -> str | None:
    """Why the GPU ``device`` has no FP8 matmuls (None when it has them, or ``device`` is not a GPU)."""
    if device.type != "cuda":
        return None  # PyTorch's CPU kernel (tests, small models): slow but exact to its own definition
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return (f"this GPU (compute capability {major}.{minor}) has no FP8 matmuls; they need "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper)")
    return None


def check_fp8_device(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why FP8 matmuls cannot run on ``device`` with activations of ``dtype`` (None when they can)."""
    reason = fp8_gpu_error(device)
    if reason is not None or device.type != "cuda":
        return reason
    if dtype != torch.bfloat16:
        return f"FP8 matmuls on CUDA write bfloat16; this model decodes in {dtype} (load it in bf16 or use autocast)"
    return None
