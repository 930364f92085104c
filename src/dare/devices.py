"""Resolving a user's ``--device`` choice: one-line errors for a device this machine does not have."""

from __future__ import annotations

import re

from dare.errors import ConfigError, closest

ACCELERATORS = ("cuda", "xpu", "mps", "mtia")
"""Device types whose torch module (``torch.cuda``, ``torch.xpu``, ...) says whether this machine has one and how
many; any other type but ``cpu`` (``meta``, ``hpu``, ...) is not one DARE can run on."""


def available_devices() -> list[str]:
    """``cpu`` and each accelerator type torch reports available on this machine, e.g. ``['cpu', 'cuda']``."""
    import torch

    return ["cpu", *(kind for kind in ACCELERATORS if getattr(torch, kind).is_available())]


def resolve_device(name: str | None, what: str = "--device"):
    """``torch.device`` of ``name``: None / ``auto`` = CUDA when available, else CPU. A device this machine does not
    have (``cuda`` without CUDA, ``mps`` off a Mac, an index beyond its GPUs), ``meta`` (no data to compute with) and
    an unknown device name are one-line errors naming ``what`` and the devices available."""
    import torch

    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    available = available_devices()
    use = " or ".join(f"{what} {kind}" if what.startswith("-") else f"{what}='{kind}'" for kind in available)
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        hint = closest(name.split(":")[0], ["cpu", *ACCELERATORS])
        raise ConfigError(f"{what} {name}: not a torch device" + (f" (did you mean '{hint}'?)" if hint else "")
                          + f"; this machine has: {', '.join(available)}") from None
    if device.type == "cpu":
        return device
    if device.type not in available:
        why = ("the meta device holds no data, so nothing can run on it" if device.type == "meta"
               else f"{device.type.upper()} is not available on this machine")
        raise ConfigError(f"{what} {name}: {why} (use {use})")
    count = getattr(torch, device.type).device_count()
    if device.index is not None and device.index >= count:
        raise ConfigError(f"{what} {name}: this machine has {count} {device.type.upper()} device(s)")
    return device


def out_of_memory(err: BaseException, hint: str | None = None) -> str | None:
    """One line for a device that ran out of memory (``torch.OutOfMemoryError``, raised or behind the error raised):
    torch's own figures (what it tried to allocate, what was free), then ``hint``, the command's settings that size
    its work; None for any other error."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    seen = set()
    while not isinstance(err, torch.OutOfMemoryError):  # or one raised from it (torch.compile's, a wrapper's)
        if err is None or id(err) in seen:
            return None
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    text = " ".join(str(err).split())
    figures = re.search(r"Tried to allocate [\d.]+ \w+\.?( GPU \d+ has a total capacity of [\d.]+ \w+ of which "
                        r"[\d.]+ \w+ is free)?", text)
    line = f"out of device memory ({figures.group(0).rstrip('.') if figures else text[:200]})"
    if hint:
        line += f"; to fit, lower {hint}"
    if "expandable_segments" in text:
        line += "; against fragmentation torch suggests PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    return line + " (DARE_TRACEBACK=1 shows where)"


__all__ = ["ACCELERATORS", "available_devices", "out_of_memory", "resolve_device"]
