"""Vocabulary-wide sampling math as compiled CUDA kernels, with the same eager ops as fallback.

A proposal over ``B x W x V`` logits (casts, the banned token, temperature, logsumexp, Gumbel noise, argmax,
gathers) is a chain of memory-bound passes over the vocabulary; eagerly each is a kernel with a full-size
temporary. :class:`CudaCompiled` runs such a pure-tensor function through ``torch.compile`` on CUDA, which
fuses the chain into a few reductions, and eagerly elsewhere. A compiler failure logs one warning and leaves the
eager ops in place for the rest of the process (same numbers up to float rounding); running out of device memory
is not a compiler failure and propagates (the eager ops need more memory, not less).
``DARE_COMPILE_SAMPLING=0`` never compiles (``1``, the default, compiles; any other value is a one-line error).
Proposals that :mod:`dare.rollout.engine.proposal_kernel` serves do not reach these ops unless
``DARE_PROPOSAL_KERNEL=0``.
"""

from __future__ import annotations

import logging

import torch

from dare.config import env_switch
from dare.errors import first_line

log = logging.getLogger("dare.rollout")


def sampling_compiled() -> bool:
    """Whether CUDA sampling math is compiled (``DARE_COMPILE_SAMPLING=0`` keeps the eager ops; only ``0``/``1``)."""
    return env_switch("DARE_COMPILE_SAMPLING", default=True)


class CudaCompiled:
    """``fn`` compiled for CUDA tensors (the first positional argument decides), eager otherwise."""

    def __init__(self, fn):
        self.fn = fn
        self.compiled = None
        self.enabled: bool | None = None  # read from the environment at the first CUDA call

    def __call__(self, *args, **kwargs):
        if args[0].is_cuda and self.enabled is None:
            self.enabled = sampling_compiled()
        if self.enabled and args[0].is_cuda:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=None)
                return self.compiled(*args, **kwargs)
            except torch.OutOfMemoryError:
                raise
            except Exception as error:  # noqa: BLE001 - any compiler failure: the same eager ops
                self.enabled = False
                log.warning("compiled sampling (%s) unavailable, using eager ops: %s", self.fn.__name__,
                            first_line(error)[:200])
        return self.fn(*args, **kwargs)
