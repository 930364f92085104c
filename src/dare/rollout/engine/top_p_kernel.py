"""The top-p (nucleus) filter without a sort (Triton): a radix select on the probability mass.

:func:`dare.rollout.kernels.filter_logits` keeps the smallest set of tokens whose probability reaches ``top_p``
by sorting the vocabulary of every position, a cumulative sum and a scatter. On a GPU that sort dominates a
step: on an H100, ``benchmarks/proposal.py --top-p 0.95`` took 19.9 ms for a LLaDA/Dream B=16 window (512 x 152064
logits) against 0.49 ms unfiltered, and a Dream-7B B=16 dual-cache rollout at ``T = 1`` ran 37.4 ms per forward
with ``top_p = 0.95`` against 19.3 ms without.

The kept set is every token above a threshold value ``v*`` plus some of the tokens equal to it: with ``A(v)`` the
mass of the tokens strictly above ``v`` and ``P`` = ``top_p`` times the total mass, ``v*`` is the smallest value
with ``A(v*) <= P`` (the token crossing ``top_p`` is kept, as in the sorted version). It is found in two stages:

1. **Value bins** (:func:`_bins_kernel`, :func:`_compact_kernel`): after a log-sum-exp pass, one pass histograms
   the mass of 16 bins of the scores below the row's max (:data:`BIN_WIDTH` wide, the last one open below) and the
   next chooses the bin holding ``v*`` (the lowest bin whose top token has at most ``P`` of mass above it) and
   copies the columns of that bin's tokens, in vocabulary order, to a scratch buffer (the output rows, when the
   filter is written). The bins are a monotone
   function of the value, so equal values share a bin. At top-p 0.9-0.95 a few hundred to a few thousand tokens of
   a 152k vocabulary remain.
2. **Radix passes over those candidates** (:func:`_radix_kernel`): ``v*`` is found digit by digit on an
   order-preserving integer key of the values, four bits per pass: each pass histograms, per vocabulary slice, the
   mass of the candidates whose key starts with the digits chosen so far (and which buckets hold any; the last
   pass counts them), and the next pass first merges those histograms and chooses the lowest digit whose top token
   still has at most ``P`` of mass above it (the bin's mass above included).

Of the ``c`` tokens equal to ``v*`` the nucleus keeps the first ``n`` by vocabulary index, where ``n`` is how many
of them the sorted cumulative sum would keep (``A(v*) + (i - 1) p(v*) <= P`` for the ``i``-th). The cut pass
(:func:`_cut_kernel`) turns that into a **tie cut**, the column of the first tie dropped (``V`` when none is), so a
nucleus is two numbers per row: a token is in it when its key is above ``v*``'s, or equal below the cut. The output
pass (:func:`_write_kernel`) writes the filter from them; :func:`nucleus_cuts` hands them, unwritten, to the
proposal kernel (:mod:`dare.rollout.engine.proposal_kernel`), which tests each entry as it reads the logits.

* **bf16 logits take half the passes.** The kernels read the logits in their own dtype and divide by the
  temperature themselves. Division by a positive temperature keeps the order and the ties of the values, so the
  key of a bf16 logit (16 bits) orders the scores as well as their float32 key (32 bits): four radix passes
  instead of eight. Other dtypes use the float32 key of the scores.
* **The drawn and the confidence distributions share their passes** (:func:`top_p_filter_pair`). A static step
  draws from the logits without the mask id (``banned``) and may score confidence on the logits with it. The two
  nuclei differ only where the banned token's mass moves the boundary: with the source's threshold, its mass
  above, ``p(v*)`` and kept ties, the cut pass checks whether the sorted rule over the drawn distribution keeps
  exactly the source's set without the banned token (the last kept token's preceding mass at most the drawn
  budget, the first removed token's above it); then one nucleus serves both (one output pass writes both filters).
  Rows where it does not
  hold (the banned token tied at the threshold, above every other token, or heavy enough to move the boundary)
  get their own passes; the other rows' programs of those launches return at once.

Four reads of the logits instead of a sort (three for the nuclei alone), one of them with the 16-bucket histogram
(the radix passes read only the candidates). The kept set equals the sorted version's except where a
cumulative sum lies within float32 rounding of ``top_p`` (the sums are taken in a different order) and, for tied
values at the threshold, which of them: the lowest indices here, the sort's order there (torch does not promise
one). ``DARE_TOP_P_KERNEL=0`` keeps the sort.
"""

from __future__ import annotations

import torch

from dare.config import env_switch
from dare.rollout.engine.proposal_kernel import BLOCK, NUM_WARPS, key_bits, slicing, triton  # triton: None without it

if triton is not None:
    import triton.language as tl

    from dare.rollout.engine.proposal_kernel import in_nucleus as _kept  # a nucleus's membership test
    from dare.rollout.engine.proposal_kernel import merge_lse, online_lse  # the per-lane online log-sum-exp
    from dare.rollout.engine.proposal_kernel import radix_key as _key  # the radix keys

RADIX_BLOCK = 256
"""Entries per tile of the histogram passes (each entry meets all 16 buckets: smaller tiles, fewer registers)."""
RADIX_WARPS = 8
"""Warps per program of the histogram passes (H100, ``benchmarks/top_p.py --sweep``: 256 entries and 8 warps were
the fastest of 128/4, 256/4, 256/8 and 512/8 at every shape, 2445 us against 2801 with 4 warps for a pair at
512 x 152064)."""
SLICE_FACTOR = 2
"""The filters slice each row as the proposal kernel would for ``SLICE_FACTOR`` x the GPU's multiprocessors (more
programs per launch). H100, ``benchmarks/top_p.py --slices``, pair at top-p 0.9 / 0.95: 1 -> 2 took 512 x 152064
from 1479 / 1507 to 1315 / 1344 us and 256 x 152064 from 592 / 867 to 593 / 766 us; 4 was 8 % slower at 256 rows
and top-p 0.9."""
BIN_WIDTH = 1.0
"""Width of the value bins of the first histogram, in scores (nats): 15 bins below the row's max and one open
below them; only the bin holding the threshold goes on to the radix passes."""

WRITE_FLAGS = ("PER_SLICE", "KEY_BITS", "SCALED", "WITHOUT_BANNED", "GATED")
"""The chain's flags that the output pass takes (it reads no histogram and no banned score)."""

if triton is not None:
    _WIDTH = tl.constexpr(BIN_WIDTH)


def kernel_enabled() -> bool:
    """``DARE_TOP_P_KERNEL`` (default 1; only ``0``/``1``): whether CUDA top-p filters use the kernel."""
    return env_switch("DARE_TOP_P_KERNEL", default=True)


def serves(logits: torch.Tensor) -> bool:
    """Whether the filters run on ``logits``: a CUDA tensor, Triton installed, the switch on."""
    return triton is not None and logits.is_cuda and kernel_enabled()


def top_p_filter(logits: torch.Tensor, top_p: float, *, temperature: float = 0.0, banned: int | None = None,
                 processors: int | None = None) -> torch.Tensor:
    """The scores of ``logits [..., V]`` (float32: divided by ``temperature`` when it is > 0) with the tokens
    outside the ``top_p`` nucleus set to ``-inf`` (see the module); with ``banned``, that column is removed
    (``-inf``) before the nucleus is chosen. Entries that are ``-inf`` already stay out; a row without a finite
    entry comes back as ``-inf`` throughout. ``processors`` (default: :data:`SLICE_FACTOR` x the GPU's
    multiprocessor count, 8 off CUDA) sets the slicing (the proposal kernel's,
    :func:`~dare.rollout.engine.proposal_kernel.slicing`)."""
    return _nucleus(logits, top_p, temperature, banned, pair=False, processors=processors)[0]


def top_p_filter_pair(logits: torch.Tensor, top_p: float, *, banned: int, temperature: float = 0.0,
                      processors: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(drawn, source)``: :func:`top_p_filter` of ``logits`` without and with column ``banned``, sharing their
    passes (see the module)."""
    drawn, source, _, _ = _nucleus(logits, top_p, temperature, banned, pair=True, processors=processors)
    return drawn, source


def nucleus_cuts(logits: torch.Tensor, top_p: float, *, banned: int, temperature: float = 0.0,
                 want_source: bool = True, processors: int | None = None) -> torch.Tensor:
    """The nuclei of :func:`top_p_filter_pair` (``want_source``) or of the drawn filter alone, without writing
    them: int64 ``[2, 2, rows]``, for the drawn (0) and the source (1) distribution of each row of
    ``logits [..., V]``, the threshold's radix key (:func:`key_bits` wide) and the tie cut. A token is in a
    nucleus when its key is above the threshold, or equal to it at a column below the cut (the source slot is
    unset without ``want_source``). :func:`dare.rollout.engine.proposal_kernel.propose_fused` reads them."""
    return _nucleus(logits, top_p, temperature, banned, pair=want_source, processors=processors, write=False)[3]


def _nucleus(logits, top_p, temperature, banned, *, pair: bool, processors, write: bool = True):
    """``(first, second, own, cuts)``: the filter (without ``banned``), the filter with it (``pair`` only, else
    None), the int32 flags of the rows whose drawn filter took its own passes (``pair`` only) and the nuclei as
    :func:`nucleus_cuts` gives them. Without ``write`` the filters are not written (``first`` is None)."""
    shape, vocab = logits.shape, logits.shape[-1]
    if banned is not None and not 0 <= banned < vocab:
        raise ValueError(f"banned must index the vocabulary (0..{vocab - 1}), got {banned}")
    if pair and banned is None:
        raise ValueError("a pair of filters needs the banned column")
    flat = logits.reshape(-1, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, device = flat.shape[0], logits.device
    first = torch.empty((rows, vocab), dtype=torch.float32, device=device) if write else None
    second = torch.empty((rows, vocab), dtype=torch.float32, device=device) if write and pair else None
    # the candidates' columns: in the output rows until the output pass overwrites them
    scratch = first.view(torch.int32) if write else torch.empty((rows, vocab), dtype=torch.int32, device=device)
    own = torch.zeros(rows, dtype=torch.int32, device=device)
    cuts = torch.zeros((2, 2, rows), dtype=torch.int64, device=device)
    if rows > 0:
        bits = key_bits(flat.dtype)
        passes = bits // 4
        if processors is None and device.type == "cuda":
            processors = SLICE_FACTOR * torch.cuda.get_device_properties(device).multi_processor_count
        slices, per_slice = slicing(rows, vocab, processors, device)
        lse = torch.empty((2, rows, slices), dtype=torch.float32, device=device)
        hist = torch.empty((2, 2, rows, slices, 16), dtype=torch.float32, device=device)
        prefix = torch.zeros((passes, rows), dtype=torch.int64, device=device)
        above = torch.zeros((passes, rows), dtype=torch.float32, device=device)
        found = torch.empty((rows, slices), dtype=torch.int32, device=device)
        scaled = temperature > 0
        args = (flat, flat.stride(0), vocab, float(temperature) if scaled else 1.0, -1 if banned is None else banned)
        shape_args = dict(PER_SLICE=per_slice, SLICES=slices, SCALED=scaled)
        grid = (rows, slices)
        _lse_kernel[grid](*args, lse, WITHOUT_BANNED=banned is not None, BLOCK=BLOCK, KEY_BITS=bits,
                          num_warps=NUM_WARPS, **shape_args)

        def chain(out, drawn, columns, *, source: bool, gated: bool):
            """One nucleus: the source's (``source``, with the banned column; the drawn one too where it is the
            source's without it) or the drawn one (``gated``: only the rows flagged in ``own``)."""
            flags = dict(WITH_BANNED=source, WITHOUT_BANNED=not source and banned is not None, GATED=gated,
                         KEY_BITS=bits, SLICE_BLOCK=max(2, triton.next_power_of_2(slices)), **shape_args)
            state = (lse, hist, prefix, above, own)
            _bins_kernel[grid](*args, lse, hist, own, BLOCK=RADIX_BLOCK, num_warps=RADIX_WARPS, **flags)
            _compact_kernel[grid](*args, float(top_p), *state, columns, found, BLOCK=BLOCK, num_warps=NUM_WARPS,
                                  **flags)
            for step in range(passes):
                _radix_kernel[grid](*args, float(top_p), *state, columns, found, PASS=step,
                                    COUNTS=step == passes - 1, BLOCK=RADIX_BLOCK, num_warps=RADIX_WARPS, **flags)
            _cut_kernel[grid](*args, float(top_p), *state, columns, found, cuts, LAST=passes - 1, PAIR=source,
                              BLOCK=RADIX_BLOCK, num_warps=RADIX_WARPS, **flags)
            if out is not None:
                written = {name: flags[name] for name in WRITE_FLAGS}
                _write_kernel[grid](*args, own, cuts, out, drawn, PAIR=source, BLOCK=BLOCK, num_warps=NUM_WARPS,
                                    **written)

        if pair:  # the source's passes; the rows they could not settle get the drawn distribution's own
            chain(second, first, second.view(torch.int32) if write else scratch, source=True, gated=False)
            chain(first, first, scratch, source=False, gated=True)
        else:
            chain(first, first, scratch, source=False, gated=False)
    reshape = lambda t: None if t is None else t.reshape(shape)  # noqa: E731
    return reshape(first), reshape(second), own, cuts


if triton is not None:

    @triton.jit
    def _from_ukey(key):
        """The float32 whose :func:`~dare.rollout.engine.proposal_kernel.order_key` is ``key``."""
        signed = key.to(tl.int32, bitcast=True) ^ -2147483648
        bits = signed ^ ((signed >> 31) & 0x7FFFFFFF)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _key_value(key, KEY_BITS: tl.constexpr):
        """The float32 logit (16-bit keys) or score (32-bit keys) whose radix key is ``key``."""
        if KEY_BITS == 16:  # a negative value's float32 key has its low 16 bits set
            return _from_ukey((key << 16) | tl.where(key < 32768, 65535, 0).to(tl.uint32))
        else:
            return _from_ukey(key)

    @triton.jit
    def _scaled(raw, divisor, SCALED: tl.constexpr, EXACT: tl.constexpr):
        """The scores of float32 logits ``raw`` (divided by the temperature where ``SCALED``). ``EXACT``: a correctly
        rounded division (torch's ``x / T``), which 32-bit keys need (their keys are the scores'), else the faster
        ``div.full`` (within 2 ulp), enough for the masses of 16-bit keys' passes."""
        if SCALED:
            return tl.math.div_rn(raw, divisor) if EXACT else raw / divisor
        else:
            return raw

    @triton.jit
    def _scores(base, cols, V, divisor, banned, SCALED: tl.constexpr, WITHOUT_BANNED: tl.constexpr,
                EXACT: tl.constexpr):
        """``(raw, x)``: float32 logits and their scores (divided by the temperature; the banned column ``-inf``
        where it is removed), divided as :func:`_scaled` says."""
        raw = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        x = _scaled(raw, divisor, SCALED, EXACT)
        if WITHOUT_BANNED:
            x = tl.where(cols == banned, float("-inf"), x)
        return raw, x

    @triton.jit
    def _merged_lse(Lse, row, rows, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr):
        """``(max, sum exp(x - max))`` of the lse pass's slices of ``row``."""
        pieces = tl.arange(0, SLICE_BLOCK)
        used = pieces < SLICES
        at = row * SLICES + pieces
        return merge_lse(tl.load(Lse + at, mask=used, other=float("-inf")),
                         tl.load(Lse + rows * SLICES + at, mask=used, other=0.0))

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
    def _lse_kernel(Logits, stride, V, divisor, banned, Lse, PER_SLICE: tl.constexpr, SLICES: tl.constexpr,
                    BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr, WITHOUT_BANNED: tl.constexpr):
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        lanes = tl.arange(0, BLOCK)
        base = Logits + row.to(tl.int64) * stride
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), tl.float32)
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):
            raw, x = _scores(base, begin + offset + lanes, V, divisor, banned, SCALED, WITHOUT_BANNED, KEY_BITS == 32)
            m, s = online_lse(m, s, x)
        top, total = merge_lse(m, s)
        at = row * SLICES + piece
        tl.store(Lse + at, top)
        tl.store(Lse + rows * SLICES + at, total)

    @triton.jit
    def _row_state(Logits, stride, divisor, banned, Lse, row, rows, SLICES: tl.constexpr,
                   SLICE_BLOCK: tl.constexpr, SCALED: tl.constexpr, KEY_BITS: tl.constexpr,
                   WITH_BANNED: tl.constexpr):
        """``(m, total, m_lse, total_lse, x_b, key_b)``: the row's max (0 when empty) and sum-exp, those of the lse
        pass (without the banned column when it was removed there) and the banned column's score and key (unread:
        ``-inf`` and 0 without ``WITH_BANNED``)."""
        top, total = _merged_lse(Lse, row, rows, SLICES, SLICE_BLOCK)
        m_lse, total_lse = top, total
        x_b = float("-inf")
        key_b = tl.zeros((), tl.uint32)
        if WITH_BANNED:  # the lse pass left the banned column out: merge it back
            raw_b = tl.load(Logits + row.to(tl.int64) * stride + banned).to(tl.float32)
            x_b = _scaled(raw_b, divisor, SCALED, True)
            key_b = _key(raw_b, x_b, KEY_BITS)
            top, total = online_lse(top, total, x_b)  # one more value: one step of the online log-sum-exp
        return tl.where(top == float("-inf"), 0.0, top), total, m_lse, total_lse, x_b, key_b

    @triton.jit
    def _tally(mass, count, occupied, bucket, x, m, COUNTS: tl.constexpr):
        """Add entries with ``bucket`` (16: none) and scores ``x`` to the per-lane histograms: their mass
        ``exp(x - m)`` and, with ``COUNTS``, their number, else one occupancy bit per bucket. Digits along the first
        axis: Triton's default layout then gives each thread all 16 buckets of its entries (``[BLOCK, 16]`` spread
        the buckets over threads and converted every tile through shared memory)."""
        hit = tl.arange(0, 16)[:, None] == bucket[None, :]
        mass += tl.where(hit, tl.exp(x - m)[None, :], 0.0)
        if COUNTS:
            count += hit.to(tl.float32)
        else:
            occupied = occupied | (1 << bucket)
        return mass, count, occupied

    @triton.jit
    def _store_histogram(Hist, buffer, row, rows, mass, count, occupied, SLICES: tl.constexpr,
                         COUNTS: tl.constexpr):
        """Reduce the lanes' histograms and store this slice's into ``Hist[buffer]`` (mass, then counts or
        occupancy)."""
        digits = tl.arange(0, 16)
        plane = rows * SLICES * 16
        at = (row * SLICES + tl.program_id(1)) * 16 + digits
        tl.store(Hist + (2 * buffer) * plane + at, tl.sum(mass, 1))
        if COUNTS:
            counts = tl.sum(count, 1)
        else:
            counts = ((tl.reduce(occupied, 0, _bit_or) >> digits) & 1).to(tl.float32)
        tl.store(Hist + (2 * buffer + 1) * plane + at, counts)

    @triton.jit
    def _bin_digit(u, reference, scale):
        """The digit (15: the top) of the value bin of ``u``: ``BIN_WIDTH``-wide bins of scores below the row's
        ``reference``, the last one open below. A monotone function of ``u``: equal values share a bin and the bins
        order the values as their keys do."""
        steps = tl.floor((reference - u) * scale)
        return 15 - tl.minimum(tl.maximum(steps, 0.0), 15.0).to(tl.int32)

    @triton.jit
    def _bin_frame(m, divisor, KEY_BITS: tl.constexpr):
        """``(reference, scale)`` of :func:`_bin_digit` for key values ``u``: the logits (16-bit keys: bins of
        ``BIN_WIDTH * T`` in logit units) or the scores (32-bit keys)."""
        if KEY_BITS == 16:
            return m * divisor, 1.0 / (_WIDTH * divisor)
        else:
            return m, 1.0 / _WIDTH

    @triton.jit
    def _candidates(base, scratch, at, found, divisor, SCALED: tl.constexpr, KEY_BITS: tl.constexpr):
        """``(cols, raw, x)`` of the candidates at positions ``at`` of a slice's scratch (``-inf`` from ``found``
        on): their columns, logits and scores (:func:`_scaled`)."""
        valid = at < found
        cols = tl.load(scratch + at, mask=valid, other=0)
        raw = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        return cols, raw, _scaled(raw, divisor, SCALED, KEY_BITS == 32)

    @triton.jit
    def _bins_kernel(Logits, stride, V, divisor, banned, Lse, Hist, Own, PER_SLICE: tl.constexpr,
                     SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                     KEY_BITS: tl.constexpr, SCALED: tl.constexpr, WITH_BANNED: tl.constexpr,
                     WITHOUT_BANNED: tl.constexpr, GATED: tl.constexpr):
        """The value-bin histogram (into ``Hist[1]``): the mass of each bin and whether it holds tokens."""
        row = tl.program_id(0)
        active = tl.load(Own + row) != 0 if GATED else True
        if active:
            rows = tl.num_programs(0)
            m = _row_state(Logits, stride, divisor, banned, Lse, row, rows, SLICES, SLICE_BLOCK, SCALED, KEY_BITS,
                           WITH_BANNED)[0]
            reference, scale = _bin_frame(m, divisor, KEY_BITS)
            lanes = tl.arange(0, BLOCK)
            base = Logits + row.to(tl.int64) * stride
            mass = tl.zeros((16, BLOCK), tl.float32)
            occupied = tl.zeros((BLOCK,), tl.int32)
            begin = tl.program_id(1) * PER_SLICE
            for offset in range(0, PER_SLICE, BLOCK):
                raw, x = _scores(base, begin + offset + lanes, V, divisor, banned, SCALED, WITHOUT_BANNED,
                                 KEY_BITS == 32)
                u = raw if KEY_BITS == 16 else x
                bucket = tl.where(x > float("-inf"), _bin_digit(u, reference, scale), 16)
                mass, _, occupied = _tally(mass, mass, occupied, bucket, x, m, False)
            _store_histogram(Hist, 1, row, rows, mass, mass, occupied, SLICES, False)

    @triton.jit
    def _compact_kernel(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Own, Scratch, Found,
                        PER_SLICE: tl.constexpr, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr,
                        BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr,
                        WITH_BANNED: tl.constexpr, WITHOUT_BANNED: tl.constexpr, GATED: tl.constexpr):
        """Choose the bin that holds ``v*`` and copy its entries' columns, in vocabulary order, to the start of
        this slice's part of ``Scratch`` (their number to ``Found``); the mass above the bin starts the radix
        passes' ``Above``."""
        row = tl.program_id(0)
        active = tl.load(Own + row) != 0 if GATED else True
        if active:
            piece = tl.program_id(1)
            rows = tl.num_programs(0)
            m, total, _, _, _, _ = _row_state(Logits, stride, divisor, banned, Lse, row, rows, SLICES, SLICE_BLOCK,
                                              SCALED, KEY_BITS, WITH_BANNED)
            _, above, digit = _choose(Hist, 1, row, rows, 0, 0.0, top_p * total, SLICES, SLICE_BLOCK)
            if piece == 0:
                tl.store(Above + row, above)
            reference, scale = _bin_frame(m, divisor, KEY_BITS)
            lanes = tl.arange(0, BLOCK)
            base = Logits + row.to(tl.int64) * stride
            begin = piece * PER_SLICE
            scratch = Scratch + row.to(tl.int64) * V + begin
            found = tl.zeros((), tl.int32)
            for offset in range(0, PER_SLICE, BLOCK):
                cols = begin + offset + lanes
                raw, x = _scores(base, cols, V, divisor, banned, SCALED, WITHOUT_BANNED, KEY_BITS == 32)
                u = raw if KEY_BITS == 16 else x
                inside = (x > float("-inf")) & (_bin_digit(u, reference, scale) == digit)
                taken = inside.to(tl.int32)
                tl.store(scratch + found + tl.cumsum(taken, 0) - 1, cols, mask=inside)
                found += tl.sum(taken, 0)
            tl.store(Found + row * SLICES + piece, found)

    @triton.jit
    def _radix_kernel(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Own, Scratch, Found,
                      PASS: tl.constexpr, COUNTS: tl.constexpr, PER_SLICE: tl.constexpr, SLICES: tl.constexpr,
                      SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr,
                      WITH_BANNED: tl.constexpr, WITHOUT_BANNED: tl.constexpr, GATED: tl.constexpr):
        """One histogram pass over the candidates. ``COUNTS`` (the last pass): count the tokens per bucket (the
        cut pass ranks the ties at the threshold by them); the earlier passes only need to know which buckets
        hold tokens, one bit per bucket. ``GATED``: only the rows whose ``Own`` flag is set."""
        row = tl.program_id(0)
        active = tl.load(Own + row) != 0 if GATED else True
        if active:
            _radix_pass(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Scratch, Found, row,
                        PASS, COUNTS, PER_SLICE, SLICES, SLICE_BLOCK, BLOCK, KEY_BITS, SCALED, WITH_BANNED)

    @triton.jit
    def _radix_pass(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Scratch, Found, row,
                    PASS: tl.constexpr, COUNTS: tl.constexpr, PER_SLICE: tl.constexpr, SLICES: tl.constexpr,
                    SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr,
                    WITH_BANNED: tl.constexpr):
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        m, total, _, _, _, _ = _row_state(Logits, stride, divisor, banned, Lse, row, rows, SLICES, SLICE_BLOCK,
                                          SCALED, KEY_BITS, WITH_BANNED)
        if PASS == 0:  # no digit chosen yet: the prefix is empty, the mass above is the chosen bin's
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
        base = Logits + row.to(tl.int64) * stride
        scratch = Scratch + row.to(tl.int64) * V + piece * PER_SLICE
        found = tl.load(Found + row * SLICES + piece)
        mass = tl.zeros((16, BLOCK), tl.float32)
        count = tl.zeros((16, BLOCK), tl.float32)
        occupied = tl.zeros((BLOCK,), tl.int32)
        chosen = prefix.to(tl.uint32)  # the digits chosen so far (4 x PASS bits)
        shift_bits: tl.constexpr = KEY_BITS - 4 - 4 * PASS
        offset = 0
        while offset < found:  # a while loop: Triton's interpreter takes no loaded bound in range()
            columns, raw, x = _candidates(base, scratch, offset + lanes, found, divisor, SCALED, KEY_BITS)
            offset += BLOCK
            key = _key(raw, x, KEY_BITS)
            inside = x > float("-inf")
            if PASS > 0:
                inside = inside & ((key >> (shift_bits + 4)) == chosen)
            bucket = tl.where(inside, ((key >> shift_bits) & 15).to(tl.int32), 16)  # 16: no bucket
            mass, count, occupied = _tally(mass, count, occupied, bucket, x, m, COUNTS)
        _store_histogram(Hist, PASS % 2, row, rows, mass, count, occupied, SLICES, COUNTS)

    @triton.jit
    def _cut_kernel(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Own, Scratch, Found, Cuts,
                    LAST: tl.constexpr, PER_SLICE: tl.constexpr, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr,
                    BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr, WITH_BANNED: tl.constexpr,
                    WITHOUT_BANNED: tl.constexpr, GATED: tl.constexpr, PAIR: tl.constexpr):
        """The nucleus from the last histogram: the threshold key ``v*`` and the tie cut, the column of the first
        tie at ``v*`` the sorted rule drops (``V`` when it keeps them all), into ``Cuts[slot]`` (the source's
        slot 1 with ``PAIR``, else the drawn slot 0). ``PAIR``: the rows whose drawn nucleus is this one without
        the banned column get it in slot 0 too; the others are flagged in ``Own``."""
        row = tl.program_id(0)
        active = tl.load(Own + row) != 0 if GATED else True
        if active:
            _cut(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Own, Scratch, Found, Cuts, row,
                 LAST, PER_SLICE, SLICES, SLICE_BLOCK, BLOCK, KEY_BITS, SCALED, WITH_BANNED, PAIR)

    @triton.jit
    def _cut(Logits, stride, V, divisor, banned, top_p, Lse, Hist, Prefix, Above, Own, Scratch, Found, Cuts, row,
             LAST: tl.constexpr, PER_SLICE: tl.constexpr, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr,
             BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr, WITH_BANNED: tl.constexpr,
             PAIR: tl.constexpr):
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        m, total, m_drawn, total_drawn, x_b, key_b = _row_state(Logits, stride, divisor, banned, Lse, row, rows,
                                                                SLICES, SLICE_BLOCK, SCALED, KEY_BITS, WITH_BANNED)
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
        here = tl.sum(tl.where(pieces == piece, ties, 0.0), 0)
        empty = digit < 0
        threshold = tl.where(empty, 0, key_star).to(tl.uint32)  # an empty row keeps everything (all -inf)
        v_star = _key_value(threshold, KEY_BITS)  # a score for 32-bit keys, else a logit: scaled exactly
        if KEY_BITS == 16:
            v_star = _scaled(v_star, divisor, SCALED, True)
        p_star = tl.exp(v_star - m)
        keep_ties = tl.minimum(tl.floor((budget - above) / p_star) + 1.0, tied)
        same = empty
        if PAIR:
            # the drawn distribution (this one without the banned column, mass p_b) keeps this set without the
            # banned token when the sorted rule's boundary does not move: the last kept token's preceding mass is
            # within the drawn budget and the first removed token's is not (both less p_b if the banned token
            # precedes them). A banned token tied at v* or above every other token: its own passes.
            p_b = tl.where(x_b == float("-inf"), 0.0, tl.exp(x_b - m))
            budget_drawn = top_p * total_drawn  # relative to m when x_b < m_drawn
            ahead = tl.where(key_b > threshold, p_b, 0.0)
            settled = (x_b < m_drawn) & (key_b != threshold)
            settled = settled & (above + (keep_ties - 1.0) * p_star - ahead <= budget_drawn)
            settled = settled & (above + keep_ties * p_star - ahead > budget_drawn)
            same = empty | settled
            if piece == 0:
                tl.store(Own + row, tl.where(same, 0, 1))
        slot = 1 if PAIR else 0
        every = empty | (keep_ties >= tied)
        holds = (~every) & (earlier <= keep_ties) & (keep_ties < earlier + here)  # the first dropped tie is here
        cut = V
        if holds:
            lanes = tl.arange(0, BLOCK)
            base = Logits + row.to(tl.int64) * stride
            scratch = Scratch + row.to(tl.int64) * V + piece * PER_SLICE
            found = tl.load(Found + row * SLICES + piece)
            seen = earlier
            offset = 0
            while offset < found:
                cols, raw, x = _candidates(base, scratch, offset + lanes, found, divisor, SCALED, KEY_BITS)
                offset += BLOCK
                tie = (x > float("-inf")) & (_key(raw, x, KEY_BITS) == threshold)
                rank = seen + tl.cumsum(tie.to(tl.float32), 0) - 1.0  # the tie's place among the row's ties
                cut = tl.minimum(cut, tl.min(tl.where(tie & (rank == keep_ties), cols, V), 0))
                seen += tl.sum(tie.to(tl.float32), 0)
        # one program writes each number: the key slice 0, the cut the slice that found it (slice 0 when V)
        key_here = piece == 0
        cut_here = holds | (every & (piece == 0))
        _store_nucleus(Cuts, slot, row, rows, threshold, cut, key_here, cut_here)
        if PAIR:
            if same:  # the drawn nucleus is the source's
                _store_nucleus(Cuts, 0, row, rows, threshold, cut, key_here, cut_here)

    @triton.jit
    def _store_nucleus(Cuts, slot, row, rows, threshold, cut, key_here, cut_here):
        """Store ``row``'s threshold key (where ``key_here``) and tie cut (where ``cut_here``) into ``Cuts[slot]``
        (read by :func:`~dare.rollout.engine.proposal_kernel.in_nucleus`)."""
        if key_here:
            tl.store(Cuts + 2 * slot * rows + row, threshold.to(tl.int64))
        if cut_here:
            tl.store(Cuts + (2 * slot + 1) * rows + row, cut)

    @triton.jit
    def _write_kernel(Logits, stride, V, divisor, banned, Own, Cuts, Out, Drawn, PER_SLICE: tl.constexpr,
                      BLOCK: tl.constexpr, KEY_BITS: tl.constexpr, SCALED: tl.constexpr,
                      WITHOUT_BANNED: tl.constexpr, GATED: tl.constexpr, PAIR: tl.constexpr):
        """The output pass: the scores in the nucleus of ``Cuts``, ``-inf`` elsewhere. ``PAIR`` (the source's
        chain of a pair): the source's filter, and the drawn filter of the rows not flagged in ``Own``."""
        row = tl.program_id(0)
        active = tl.load(Own + row) != 0 if GATED else True
        if active:
            rows = tl.num_programs(0)
            same = tl.load(Own + row) == 0
            lanes = tl.arange(0, BLOCK)
            base = Logits + row.to(tl.int64) * stride
            out = Out + row.to(tl.int64) * V
            drawn = Drawn + row.to(tl.int64) * V
            begin = tl.program_id(1) * PER_SLICE
            for offset in range(0, PER_SLICE, BLOCK):
                cols = begin + offset + lanes
                inside = cols < V
                raw, x = _scores(base, cols, V, divisor, banned, SCALED, WITHOUT_BANNED, True)
                keep = _kept(_key(raw, x, KEY_BITS), cols, Cuts, 1 if PAIR else 0, row, rows)
                kept = tl.where(keep, x, float("-inf"))
                tl.store(out + cols, kept, mask=inside)
                if PAIR:
                    tl.store(drawn + cols, tl.where(cols == banned, float("-inf"), kept), mask=inside & same)
