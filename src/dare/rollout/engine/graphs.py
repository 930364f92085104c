"""Capture-once, replay-many execution of static decoding steps (CUDA graphs), with an eager twin.

A :class:`StepRunner` runs a step function ``fn()`` that only reads and writes preallocated device buffers.
With graphs enabled, the first call of each key executes ``fn`` eagerly (it is the real step and warms up
lazily initialised kernels), then records it into a ``torch.cuda.CUDAGraph`` without executing it; later calls
replay the graph. Every graph of a model shares one memory pool (:func:`shared_pool`): steps replay one at a
time on one stream and keep nothing in pool memory between replays (their results live in the static buffers),
so temporaries of one graph may reuse another's. A pool is shared only while one of its graphs lives: once the
engine has dropped them all (``release``, new weight addresses, replaced fused copies) the next recording starts a
fresh pool. The allocator refuses to record into a pool whose graphs are all gone while a block of it is still
held (an internal assert), which would send every later rollout of the model to the eager fallback.

``captures`` counts recordings (a second call with the same shapes records nothing); ``graph_bytes`` the
device memory reserved while recording.

Under autocast (the trainer's bf16 autocast over fp32 weights or fp32 LoRA adapters) the step is run and recorded
with autocast's weight-cast cache off: a cached cast made by the eager run would be read by the graph at its
address and never recomputed, so replays would decode with freed memory and never see an optimizer step. With
the cache off the casts are recorded and every replay casts the current weights.
"""

from __future__ import annotations

import contextlib
import time
import weakref

import torch

_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class GraphPool:
    """A model's CUDA graph memory pool: one handle, shared by every graph recorded while another still lives."""

    def __init__(self, new_handle=None):
        self.new_handle = new_handle or torch.cuda.graph_pool_handle
        self.handle = None
        self.graphs: weakref.WeakSet = weakref.WeakSet()

    def for_recording(self):
        """The handle the next recording should use: the live pool, or a fresh one when no graph holds it."""
        if self.handle is None or not self.graphs:
            self.handle = self.new_handle()
        return self.handle

    def add(self, graph) -> None:
        self.graphs.add(graph)


def shared_pool(model) -> GraphPool:
    """One CUDA graph memory pool per model, shared by every batch bucket and step kind."""
    if model not in _POOLS:
        _POOLS[model] = GraphPool()
    return _POOLS[model]


class StepRunner:
    """Runs step functions by key: eagerly, or recorded once and replayed (``use_graphs``)."""

    def __init__(self, model, device: torch.device, use_graphs: bool):
        self.use_graphs = use_graphs and device.type == "cuda"
        self.device = device
        self.model = model
        self.graphs: dict = {}
        self.captures = 0
        self.replays = 0
        self.graph_bytes = 0
        self.capture_s = 0.0

    def run(self, key, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        began = time.perf_counter()
        with uncached_autocast(self.device):
            fn()  # the real step, eagerly (also the warm-up the capture needs)
        torch.cuda.synchronize(self.device)
        # a recording cannot return cached blocks to the driver when it runs short (e.g. after an eager rollout
        # or a training step left large blocks cached): free them first
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        pool = shared_pool(self.model)
        with torch.cuda.graph(graph, pool=pool.for_recording()), uncached_autocast(self.device):
            fn()
        pool.add(graph)
        torch.cuda.synchronize(self.device)
        self.graph_bytes += max(torch.cuda.memory_reserved(self.device) - before, 0)
        self.graphs[key] = graph
        self.captures += 1
        self.capture_s += time.perf_counter() - began


def uncached_autocast(device: torch.device):
    """The active autocast of ``device``, with its weight-cast cache off (a no-op without autocast)."""
    if not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type), cache_enabled=False)


class HostFlag:
    """Reads a small device tensor on the host after the queued work: a pinned, non-blocking copy and one event
    (on CPU, a plain read)."""

    def __init__(self, device: torch.device, size: int = 1):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.host = torch.zeros(size, dtype=torch.long, pin_memory=True)
            self.event = torch.cuda.Event()

    def read(self, value: torch.Tensor) -> list[int]:
        if not self.cuda:
            return value.reshape(-1).tolist()
        self.host.copy_(value.reshape(-1), non_blocking=True)
        self.event.record()
        self.event.synchronize()
        return self.host.tolist()
