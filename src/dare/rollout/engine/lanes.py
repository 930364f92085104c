"""Decoding lanes: a static step's model forward split by batch rows into halves that run side by side.

A step of a large batch runs its projection matmuls near the GPU's compute peak, and between them a series of
small memory-bound kernels (norms, RoPE, attention, SwiGLU, residual adds) during which most of the matmul units
idle. With two lanes, the forward of rows ``[0, B/2)`` runs on one CUDA stream and that of rows ``[B/2, B)`` on
another, both recorded into the step's graph (a fork and a join), so one lane's small kernels can overlap the
other lane's matmuls. The LM head and the decoder's commit stay whole-batch on the step's stream.

Each lane reads and writes its rows of the same buffers: the canvas, positions and key masks are sliced by row,
and the KV cache is viewed by row (``StaticKVCache.lanes``), so the lanes decode exactly the rows a whole-batch step
decodes, with the same ops per row. Off CUDA the lanes run one after the other (what CPU tests compare with the
whole-batch step).

``DARE_DECODE_LANES=1`` turns lanes on for steps of at least :data:`LANE_MIN_ROWS` query rows (batch bucket x
block length) whose bucket holds at least two rows; ``0`` (the default) decodes every step whole.
"""

from __future__ import annotations

import contextlib

import torch

from dare.config import env_switch

LANES = 2
LANE_MIN_ROWS = 256
"""Smallest step (batch bucket x block length) decoded in lanes when ``DARE_DECODE_LANES=1``."""

_STREAMS: dict = {}


def decode_lanes(batch: int, config) -> int:
    """Lanes of a state of ``batch`` (bucketed) rows under ``config``: :data:`LANES`, or 1 (whole steps)."""
    if not lanes_enabled() or batch < LANES or batch % LANES:
        return 1
    return LANES if batch * (config.block_length or config.gen_length) >= LANE_MIN_ROWS else 1


def lanes_enabled() -> bool:
    return env_switch("DARE_DECODE_LANES", default=False)


def lane_streams(device: torch.device) -> list:
    """One side stream per lane on ``device``, made once (None per lane off CUDA)."""
    if device.type != "cuda":
        return [None] * LANES
    key = torch.device(device.type, device.index if device.index is not None else torch.cuda.current_device())
    if key not in _STREAMS:
        _STREAMS[key] = [torch.cuda.Stream(key) for _ in range(LANES)]
    return _STREAMS[key]


def lane_rows(batch: int, lanes: int) -> list[slice]:
    size = batch // lanes
    return [slice(i * size, (i + 1) * size) for i in range(lanes)]


def run_lanes(device: torch.device, lanes: int, forward) -> torch.Tensor:
    """``torch.cat([forward(i) for i in lanes])`` with lane ``i`` on its own stream (forked from and joined back to
    the current stream, so a CUDA graph records both lanes); off CUDA, one lane after the other."""
    streams = lane_streams(device)[:lanes]
    main = torch.cuda.current_stream(device) if device.type == "cuda" else None
    outputs = []
    for index, stream in enumerate(streams):
        if stream is not None:
            stream.wait_stream(main)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            outputs.append(forward(index))
    for stream, output in zip(streams, outputs):
        if stream is not None:
            main.wait_stream(stream)
            output.record_stream(main)  # read by the join below on the main stream
    return torch.cat(outputs)
