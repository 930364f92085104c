"""Resolving a user's ``--device`` choice: one-line errors for a device this machine does not have."""

from __future__ import annotations

from dare.errors import ConfigError


def resolve_device(name: str | None, what: str = "--device"):
    """``torch.device`` of ``name``: None / ``auto`` = CUDA when available, else CPU. A CUDA device on a machine
    without CUDA (or an index beyond its GPUs) and an unknown device name are one-line errors naming ``what``."""
    import torch

    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{what} {name}: not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            use = f"{what} cpu" if what.startswith("-") else f"{what}='cpu'"
            raise ConfigError(f"{what} {name}: CUDA is not available on this machine (use {use})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{what} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


__all__ = ["resolve_device"]
