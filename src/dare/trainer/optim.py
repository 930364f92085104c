"""AdamW and the learning-rate schedules (linear warm-up, then constant / cosine / linear decay)."""

from __future__ import annotations

import math

import torch


def build_optimizer(params, cfg) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (``cfg``: :class:`~dare.trainer.config.OptimConfig`).

    Plain CUDA parameters use the fused kernel (one pass over parameters, gradients and moments instead of one
    ``foreach`` kernel per arithmetic op); sharded (DTensor) and CPU parameters keep PyTorch's default.
    """
    params = list(params)
    fused = bool(params) and all(p.device.type == "cuda" and type(p) is torch.nn.Parameter for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                             fused=fused or None)


def lr_factor(step: int, total: int, warmup: int, kind: str, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based) of ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(max((step - warmup) / max(1, total - warmup), 0.0), 1.0)
    if kind == "cosine":
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if kind == "linear":
        return min_ratio + (1 - min_ratio) * (1 - progress)
    return 1.0


def build_scheduler(optimizer, cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = cfg.warmup_steps or int(round(cfg.warmup_ratio * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, warmup, cfg.scheduler, cfg.min_lr_ratio)
    )
