"""The top-p (nucleus) filter without a sort (Triton): a radix select on the probability mass.

:func:`dare.rollout.kernels.filter_logits` keeps the smallest set of tokens whose probability reaches ``top_p``
by sorting the vocabulary of every position, a cumulative sum and a scatter. On a GPU that sort dominates a
step: on an H100, ``benchmarks/proposal.py --top-p 0.95`` took 19.9 ms for a LLaDA/Dream B=16 window (512 x 152064
logits) against 0.49 ms unfiltered, and a Dream-7B B=16 dual-cache rollout at ``T = 1`` ran 37.4 ms per forward
with ``top_p = 0.95`` against 19.3 ms without.

The kept set is every token above a threshold value ``v*`` plus some of the tokens equal to it: with ``A(v)`` the
mass of the tokens strictly above ``v`` and ``P`` = ``top_p`` times the total mass, ``v*`` is the smallest value
with ``A(v*) <= P`` (the token crossing ``top_p`` is kept, as in the sorted version). ``v*`` is found digit by
digit on the order-preserving 32-bit key of the float values, four bits per pass (:func:`_radix_kernel`, eight
passes): each pass histograms, per vocabulary slice, the mass of the tokens whose key starts with the digits chosen
so far (and which buckets hold any; the last pass counts them), and the next pass first merges those histograms and
chooses the lowest digit whose top token still has at most ``P`` of mass above it. The output pass
(:func:`_write_kernel`) keeps the tokens above ``v*`` and, of the ``c`` tokens equal to it, the first ``n`` by
vocabulary index, where ``n`` is how many of them the sorted cumulative sum would keep (``A(v*) + (i - 1) p(v*) <=
P`` for the ``i``-th).

Ten reads of the logits instead of a sort. The kept set equals the sorted version's except where a cumulative
sum lies within float32 rounding of ``top_p`` (the sums are taken in a different order) and, for tied values at
the threshold, which of them: the lowest indices here, the sort's order there (torch does not promise one).
``DARE_TOP_P_KERNEL=0`` keeps the sort.
"""

from __future__ import annotations

import torch

from dare.config import env_switch
from dare.rollout.engine.proposal_kernel import BLOCK, NUM_WARPS, slicing, triton  # triton: None without it

if triton is not None:
    import triton.language as tl

    from dare.rollout.engine.proposal_kernel import merge_lse, online_lse  # the per-lane online log-sum-exp

RADIX_BLOCK = 256
"""Entries per tile of the histogram passes (each entry meets all 16 buckets: smaller tiles, fewer registers)."""
PASSES = 8
"""Histogram passes: each chooses 4 bits (one of 16 buckets) of the threshold's 32-bit key (the kernels' shifts
and bucket counts are written for 4)."""


def kernel_enabled() -> bool:
    """``DARE_TOP_P_KERNEL`` (default 1; only ``0``/``1``): whether CUDA top-p filters use the kernel."""
    return env_switch("DARE_TOP_P_KERNEL", default=True)


def serves(scores: torch.Tensor) -> bool:
    """Whether :func:`top_p_filter` runs on ``scores``: a CUDA tensor, Triton installed, the switch on."""
    return triton is not None and scores.is_cuda and kernel_enabled()


def top_p_filter(scores: torch.Tensor, top_p: float, *, processors: int | None = None) -> torch.Tensor:
    """``scores [..., V]`` (float; already divided by the temperature) with the tokens outside the ``top_p``
    nucleus set to ``-inf``, as float32 (see the module). Entries that are ``-inf`` already stay out; a row
    without a finite entry comes back unchanged. ``processors`` (default: the GPU's multiprocessor count, 8 off
    CUDA) sets the slicing (the proposal kernel's, :func:`~dare.rollout.engine.proposal_kernel.slicing`)."""
    shape, vocab = scores.shape, scores.shape[-1]
    flat = scores.reshape(-1, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    out = torch.empty((rows, vocab), dtype=torch.float32, device=scores.device)
    if rows == 0:
        return out.reshape(shape)
    slices, per_slice = slicing(rows, vocab, processors, scores.device)
    slice_block = max(2, triton.next_power_of_2(slices))
    device = scores.device
    lse = torch.empty((2, rows, slices), dtype=torch.float32, device=device)
    hist = torch.empty((2, 2, rows, slices, 16), dtype=torch.float32, device=device)
    prefix = torch.zeros((PASSES, rows), dtype=torch.int64, device=device)
    above = torch.zeros((PASSES, rows), dtype=torch.float32, device=device)
    common = dict(PER_SLICE=per_slice, SLICES=slices, SLICE_BLOCK=slice_block, BLOCK=BLOCK, num_warps=NUM_WARPS)
    grid = (rows, slices)
    _lse_kernel[grid](flat, flat.stride(0), vocab, lse, PER_SLICE=per_slice, SLICES=slices, BLOCK=BLOCK,
                      num_warps=NUM_WARPS)
    for step in range(PASSES):
        _radix_kernel[grid](flat, flat.stride(0), vocab, float(top_p), lse, hist, prefix, above, PASS=step,
                            COUNTS=step == PASSES - 1, **dict(common, BLOCK=RADIX_BLOCK))
    _write_kernel[grid](flat, flat.stride(0), vocab, float(top_p), lse, hist, prefix, above, out, LAST=PASSES - 1,
                        **common)
    return out.reshape(shape)


if triton is not None:

    @triton.jit
    def _ukey(x):
        """Order-preserving uint32 key of float32 ``x`` (``-0.0`` first made ``+0.0``, equal to it)."""
        bits = (x + 0.0).to(tl.int32, bitcast=True)
        signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # arithmetic shift: negatives have their magnitude flipped
        return (signed ^ -2147483648).to(tl.uint32, bitcast=True)

    @triton.jit
    def _from_ukey(key):
        """The float32 whose :func:`_ukey` is ``key``."""
        signed = key.to(tl.int32, bitcast=True) ^ -2147483648
        bits = signed ^ ((signed >> 31) & 0x7FFFFFFF)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _lse_kernel(Scores, stride, V, Lse, PER_SLICE: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        lanes = tl.arange(0, BLOCK)
        base = Scores + row.to(tl.int64) * stride
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):
            cols = begin + offset + lanes
            m, s = online_lse(m, s, tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32))
        top, total = merge_lse(m, s)
        at = row * SLICES + piece
        tl.store(Lse + at, top)
        tl.store(Lse + rows * SLICES + at, total)

    @triton.jit
    def _row_mass(Lse, row, rows, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr):
        """``(max, sum exp(x - max))`` of ``row``, merged from its slices."""
        pieces = tl.arange(0, SLICE_BLOCK)
        used = pieces < SLICES
        at = row * SLICES + pieces
        top, total = merge_lse(tl.load(Lse + at, mask=used, other=float("-inf")),
                            tl.load(Lse + rows * SLICES + at, mask=used, other=0.0))
        return tl.where(top == float("-inf"), 0.0, top), total  # 0 for an empty row: exp(x - max) stays 0

    @triton.jit
    def _choose(Hist, buffer, row, rows, prefix, above, budget, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr):
        """The next state ``(prefix, above, digit)`` from the previous pass's histograms: the lowest digit with
        tokens whose top token has at most ``budget`` of mass above it (``digit = -1``: none, an empty row)."""
        pieces = tl.arange(0, SLICE_BLOCK)
        digits = tl.arange(0, 16)
        used = (pieces < SLICES)[:, None]
        at = (row * SLICES + pieces)[:, None] * 16 + digits[None, :]
        plane = rows * SLICES * 16
        mass = tl.sum(tl.load(Hist + (2 * buffer) * plane + at, mask=used, other=0.0), 0)
        count = tl.sum(tl.load(Hist + (2 * buffer + 1) * plane + at, mask=used, other=0.0), 0)
        higher = digits[None, :] > digits[:, None]  # [d, d']: d' above d
        before = above + tl.sum(tl.where(higher, mass[None, :], 0.0), 1)
        valid = (count > 0) & (before <= budget)
        digit = tl.min(tl.where(valid, digits, 16), 0)
        found = digit < 16
        chosen_before = tl.sum(tl.where(digits == digit, before, 0.0), 0)
        new_prefix = tl.where(found, prefix * 16 + digit, prefix)
        new_above = tl.where(found, chosen_before, above)
        return new_prefix, new_above, tl.where(found, digit, -1)

    @triton.jit
    def _bit_or(a, b):
        return a | b

    @triton.jit
    def _radix_kernel(Scores, stride, V, top_p, Lse, Hist, Prefix, Above, PASS: tl.constexpr,
                      COUNTS: tl.constexpr, PER_SLICE: tl.constexpr, SLICES: tl.constexpr,
                      SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
        """One histogram pass. ``COUNTS`` (the last pass): count the tokens per bucket (the output pass ranks the
        ties at the threshold by them); the earlier passes only need to know which buckets hold tokens, one bit
        per bucket."""
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        m, total = _row_mass(Lse, row, rows, SLICES, SLICE_BLOCK)
        if PASS == 0:  # no digit chosen yet (the buffers start at zero)
            prefix = tl.load(Prefix + row)
            above = tl.load(Above + row)
        else:
            prefix, above, digit = _choose(Hist, (PASS - 1) % 2, row, rows, tl.load(Prefix + (PASS - 1) * rows + row),
                                           tl.load(Above + (PASS - 1) * rows + row), top_p * total, SLICES,
                                           SLICE_BLOCK)
            if piece == 0:
                tl.store(Prefix + PASS * rows + row, prefix)
                tl.store(Above + PASS * rows + row, above)
        lanes = tl.arange(0, BLOCK)
        digits = tl.arange(0, 16)
        base = Scores + row.to(tl.int64) * stride
        mass = tl.zeros((BLOCK, 16), tl.float32)  # per lane: one reduction after the loop, none per tile
        count = tl.zeros((BLOCK, 16), tl.float32)
        occupied = tl.zeros((BLOCK,), tl.int32)
        chosen = prefix.to(tl.uint32)  # the digits chosen so far (4 x PASS bits)
        shift_bits: tl.constexpr = 28 - 4 * PASS
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):
            cols = begin + offset + lanes
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            key = _ukey(x)
            inside = x > float("-inf")
            if PASS > 0:
                inside = inside & ((key >> (shift_bits + 4)) == chosen)
            bucket = tl.where(inside, ((key >> shift_bits) & 15).to(tl.int32), 16)  # 16: no bucket
            hit = bucket[:, None] == digits[None, :]
            mass += tl.where(hit, tl.exp(x - m)[:, None], 0.0)
            if COUNTS:
                count += hit.to(tl.float32)
            else:
                occupied = occupied | (1 << bucket)
        plane = rows * SLICES * 16
        at = (row * SLICES + piece) * 16 + digits
        tl.store(Hist + (2 * (PASS % 2)) * plane + at, tl.sum(mass, 0))
        if COUNTS:
            counts = tl.sum(count, 0)
        else:
            counts = ((tl.reduce(occupied, 0, _bit_or) >> digits) & 1).to(tl.float32)
        tl.store(Hist + (2 * (PASS % 2) + 1) * plane + at, counts)

    @triton.jit
    def _write_kernel(Scores, stride, V, top_p, Lse, Hist, Prefix, Above, Out, LAST: tl.constexpr,
                      PER_SLICE: tl.constexpr, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        m, total = _row_mass(Lse, row, rows, SLICES, SLICE_BLOCK)
        budget = top_p * total
        last = LAST % 2  # the last histogram pass's buffer
        key_star, above, digit = _choose(Hist, last, row, rows, tl.load(Prefix + LAST * rows + row),
                                         tl.load(Above + LAST * rows + row), budget, SLICES, SLICE_BLOCK)
        # the tokens equal to v*: their count per slice is the last histogram's chosen digit
        pieces = tl.arange(0, SLICE_BLOCK)
        ties = tl.load(Hist + (2 * last + 1) * rows * SLICES * 16 + (row * SLICES + pieces) * 16 + digit,
                       mask=(pieces < SLICES) & (digit >= 0), other=0.0)
        tied = tl.sum(ties, 0)
        earlier = tl.sum(tl.where(pieces < piece, ties, 0.0), 0)
        threshold = key_star.to(tl.uint32)
        p_star = tl.exp(_from_ukey(threshold) - m)
        keep_ties = tl.minimum(tl.floor((budget - above) / p_star) + 1.0, tied)
        empty = digit < 0
        lanes = tl.arange(0, BLOCK)
        base = Scores + row.to(tl.int64) * stride
        out = Out + row.to(tl.int64) * V
        begin = piece * PER_SLICE
        if (keep_ties >= tied) | empty:  # every tie kept (the usual case): no ranks, no per-tile reductions
            for offset in range(0, PER_SLICE, BLOCK):
                cols = begin + offset + lanes
                inside = cols < V
                x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
                keep = ((x > float("-inf")) & (_ukey(x) >= threshold)) | empty
                tl.store(out + cols, tl.where(keep, x, float("-inf")), mask=inside)
        else:
            seen = earlier
            for offset in range(0, PER_SLICE, BLOCK):
                cols = begin + offset + lanes
                inside = cols < V
                x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
                key = _ukey(x)
                finite = x > float("-inf")
                tie = finite & (key == threshold)
                rank = seen + tl.cumsum(tie.to(tl.float32), 0) - 1.0  # the tie's place among the row's ties
                keep = (finite & (key > threshold)) | (tie & (rank < keep_ties))
                tl.store(out + cols, tl.where(keep, x, float("-inf")), mask=inside)
                seen += tl.sum(tie.to(tl.float32), 0)
