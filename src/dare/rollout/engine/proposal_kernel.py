"""A static step's token proposals in one read of the logits (Triton).

:func:`dare.rollout.engine.sampling.propose_static` needs, per window position, the proposed token (argmax, or
Gumbel-max at ``T > 0``), the log-sum-exp of the confidence source and of the sampling distribution, and two
gathered logits. Compiled as tensor ops these are several passes over the ``B x W x V`` logits; here the
vocabulary is read once (H100, ``benchmarks/proposal.py``: LLaDA-8B B=16 window, greedy, 197 -> 117 us; B=1
44 -> 12 us; SDAR-8B B=64 block, greedy 267 -> 70 us, T = 1 370 -> 170 us):

* :func:`_partial_kernel` - one program per (window position, vocabulary slice) streams its slice in tiles and
  keeps, per lane, an online max / sum-exp of the source and of the sampling scores and the best (first) index
  of the selection key; it writes one partial record per slice. Slices are chosen so that the programs fill the
  GPU several times over (:func:`num_slices`): batch 1 has as many programs as batch 64.
* :func:`_entropy_kernel` - only for the ``neg_entropy`` confidence: a second read of the slices, each program
  merging its position's log-sum-exp first. Dream's reference computes ``sum p log(p + 1e-10)``, and the epsilon
  term needs every ``p``, so the final log-sum-exp, before the sum can start;
* :func:`_probable_kernel` - only for greedy steps of a sampling source given the eager softmax's dtype
  (``rounding``): a second read that finds the first most probable token under that softmax, as the eager
  samplers choose it (nearly equal logits tie where the dtype rounds);
* :func:`_final_kernel` - one program per position merges the slices, gathers the two logits of the token and
  writes the token, its confidence and its log-probability (``-inf`` / ``0`` at positions that are not eligible).

The random numbers are those of :mod:`dare.rollout.engine.noise` (the same hashes of row key, row step, position
and vocabulary index), computed inside the kernels in uint32 arithmetic. It serves the settings most rollouts use:
no top-k filter and a ``prob``, ``neg_entropy`` or ``random`` confidence (:func:`serves`): every sampler preset's
defaults. A top-p filter comes as the nuclei of :func:`dare.rollout.engine.top_p_kernel.nucleus_cuts` (a threshold
key and a tie cut per position and distribution): the kernels test each entry's membership as they read it, so no
filtered copy of the logits is written or read. The others keep the compiled tensor ops.
``DARE_PROPOSAL_KERNEL=0`` turns the kernel off.
Greedy tokens equal the tensor ops' (both compare the same float32 values; ties go to the first index); Gumbel-max
tokens equal them unless two noisy keys lie within the float32 rounding of the logarithms. A Gumbel-max key is kept
as its pair (score, noise) and compared by differences (:func:`_noisy_better`), as the tensor ops add the noise to
scores shifted by their max: at tiny temperatures exactly tied logits are drawn evenly. Confidences and log-probabilities differ by float32 rounding
(one online log-sum-exp instead of a two-pass one); given a ``rounding``, both round confidences alike.
"""

from __future__ import annotations

import torch

from dare.config import env_switch
from dare.rollout.engine.noise import GOLDEN, STREAM_CONFIDENCE, STREAM_SAMPLE, UNIFORM_SCALE, UNIFORM_SHIFT
from dare.rollout.kernels import top_k_active

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK = 1024
"""Vocabulary entries per tile."""
NUM_WARPS = 4
"""Warps per program of the slice kernel (4 with 1024-entry tiles: 8 bf16 entries, one 16-byte load, a thread)."""
PROGRAMS_PER_SM = 4
"""Slice programs per multiprocessor the slicing aims for (:func:`num_slices`). H100, ``benchmarks/proposal.py
--sweep``: 4 against 2 took LLaDA-8B B=1 proposals from 14.2 to 11.5 us (greedy) and 28.5 to 22.7 us (T = 1),
B=16 at T = 1 from 298 to 272 us; B=16 greedy within 2 %; 2048-4096-entry tiles and 8 warps gained nothing."""
MAX_SLICES = 64
"""Most vocabulary slices per position."""


def kernel_enabled() -> bool:
    """``DARE_PROPOSAL_KERNEL`` (default 1; only ``0``/``1``): whether CUDA steps may use the kernel."""
    return env_switch("DARE_PROPOSAL_KERNEL", default=True)


def serves(config, logits: torch.Tensor) -> bool:
    """Whether :func:`propose_fused` serves ``config`` on ``logits``: CUDA, Triton installed,
    ``DARE_PROPOSAL_KERNEL`` not ``0`` and settings it computes (:func:`settings_served`)."""
    return triton is not None and logits.is_cuda and kernel_enabled() and settings_served(config, logits.shape[-1])


def settings_served(config, vocab: int) -> bool:
    """No top-k filter over a ``vocab``-wide distribution (a top-p filter comes as the nuclei of
    :func:`dare.rollout.engine.top_p_kernel.nucleus_cuts`), and a ``prob``, ``neg_entropy`` or ``random``
    confidence."""
    return not top_k_active(config.top_k, vocab) and config.confidence in CONFIDENCES


def filters_source(confidence_source: str, confidence: str) -> bool:
    """Whether a step's confidence reads its own source distribution (tempered, and cut to the source's nucleus
    under top-p), as :func:`dare.rollout.engine.sampling._propose_ops` scores it: not for the raw logits or a
    random confidence."""
    return confidence_source != "logits" and confidence != "random"


def key_bits(dtype: torch.dtype) -> int:
    """Bits of the radix key of logits of ``dtype`` (:func:`radix_key`): 16 for bfloat16 (the logit's own bits),
    else 32 (the float32 score's)."""
    return 16 if dtype == torch.bfloat16 else 32


PLANES = 7
"""Planes of a launch's partial records per (position, slice): the sampling distribution's max and sum-exp (0, 1),
the confidence source's (2, 3), the best selection score (4), the entropy sum (5) and the best's Gumbel noise (6)."""
NOT_PROBABLE = 1 << 30
"""Added to a slice's first kept column where none of its entries is the most probable (columns are below it)."""
ROUNDINGS = {None: 0, torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
"""The kernels' ``ROUND`` code of each softmax dtype (float32 or float64's float32: none; bf16; fp16)."""
CONFIDENCES = ("prob", "neg_entropy", "random")
"""The confidences the kernel computes (``margin`` needs the source's top two: the compiled tensor ops)."""


def num_slices(positions: int, vocab: int, processors: int) -> int:
    """Vocabulary slices per position: enough programs for :data:`PROGRAMS_PER_SM` per multiprocessor, each slice
    whole tiles."""
    wanted = max(1, -(-PROGRAMS_PER_SM * processors // positions))
    return max(1, min(wanted, MAX_SLICES, -(-vocab // BLOCK)))


def slicing(rows: int, vocab: int, processors: int | None, device: torch.device) -> tuple[int, int]:
    """``(slices, entries per slice)`` of a ``rows x vocab`` launch (:func:`num_slices`, each slice whole tiles and
    none empty); ``processors`` defaults to the GPU's multiprocessor count (8 off CUDA)."""
    if processors is None:
        processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    slices = num_slices(rows, vocab, processors)
    per_slice = -(-(-(-vocab // slices)) // BLOCK) * BLOCK
    return -(-vocab // per_slice), per_slice


def propose_fused(logits: torch.Tensor, eligible: torch.Tensor, *, banned: int, temperature: float,
                  confidence_source: str, confidence: str, keys: torch.Tensor, counters: torch.Tensor,
                  positions: torch.Tensor, processors: int | None = None, cuts: torch.Tensor | None = None,
                  rounding: torch.dtype | None = None):
    """``(tokens, confidence, logprob)`` for ``logits [B, W, V]`` at the ``eligible [B, W]`` positions, as
    :func:`dare.rollout.engine.sampling._propose_ops` computes them without top-k (see the module).
    ``keys [B, 2]``, ``counters [B]`` and ``positions [W]`` or ``[B, W]`` index the random streams;
    ``processors`` (default: the GPU's multiprocessor count, 8 off CUDA) sets the slices. ``cuts``: the top-p
    nuclei of the ``B x W`` positions (:func:`dare.rollout.engine.top_p_kernel.nucleus_cuts` of these logits,
    with the source's when :func:`filters_source`): tokens are drawn from the drawn nucleus and the confidence
    reads the source's, as the tensor ops do with the filtered scores. ``rounding``: the dtype of the eager
    samplers' softmax (:func:`dare.rollout.engine.sampling.confidence_rounding`; None: float64 or not asked). Given,
    greedy tokens of a sampling source are its first most probable (:func:`_probable_kernel`, one more read);
    bf16 / fp16 also round the confidence's values where the eager samplers hold them in that dtype (the engine
    asks for bf16)."""
    b, w, vocab = logits.shape
    rows = b * w
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    strides = (logits.stride(0), logits.stride(1))  # any window view of wider logits: no copy
    slices, per_slice = slicing(rows, vocab, processors, logits.device)
    pos = positions.long()
    pos = pos.expand(b, w) if pos.ndim == 2 else pos[None, :].expand(b, w)
    entropy = confidence == "neg_entropy"
    partial = torch.empty((PLANES, rows, slices), dtype=torch.float32, device=logits.device)
    best = torch.empty((rows, slices), dtype=torch.int32, device=logits.device)
    tokens = torch.empty((b, w), dtype=torch.long, device=logits.device)
    score = torch.empty((b, w), dtype=torch.float32, device=logits.device)
    logprob = torch.empty((b, w), dtype=torch.float32, device=logits.device)
    sampled = temperature > 0
    divisor = float(temperature) if sampled else 1.0  # unread when greedy
    scaled_source = sampled and confidence_source != "logits"
    want_source = confidence != "random"
    hash_args = (keys.contiguous(), counters.contiguous(), pos, w, *pos.stride())
    filtered = cuts is not None
    if filtered and tuple(cuts.shape) != (2, 2, rows):
        raise ValueError(f"cuts must be [2, 2, {rows}] (nucleus_cuts of these logits), got {tuple(cuts.shape)}")
    # the source's nucleus (read by all three kernels) and the keys its membership test compares
    source_nucleus = dict(FILTER_SOURCE=filtered and filters_source(confidence_source, confidence),
                          KEY_BITS=key_bits(logits.dtype))
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {list(ROUNDINGS)}, got {rounding}")
    rounded = dict(ROUND=ROUNDINGS[rounding])
    # greedy tokens of a sampling source: the first most probable under the source's softmax in its dtype
    by_probability = not sampled and confidence_source != "logits" and want_source and rounding is not None
    cuts = cuts if filtered else best  # unread without a filter
    _partial_kernel[(rows, slices)](
        logits, *strides, vocab, banned, divisor, partial, best, *hash_args, cuts,
        PER_SLICE=per_slice, SLICES=slices, BLOCK=BLOCK, SAMPLED=sampled, SCALED_SOURCE=scaled_source,
        WANT_SOURCE=want_source, STREAM=STREAM_SAMPLE, GOLDEN=GOLDEN, num_warps=NUM_WARPS, FILTERED=filtered,
        **source_nucleus, **rounded)
    slice_block = max(2, triton.next_power_of_2(slices))
    if entropy:
        _entropy_kernel[(rows, slices)](
            logits, *strides, vocab, w, divisor, partial, cuts, PER_SLICE=per_slice, SLICES=slices,
            SLICE_BLOCK=slice_block, BLOCK=BLOCK, SCALED_SOURCE=scaled_source, num_warps=NUM_WARPS,
            **source_nucleus, **rounded)
    if by_probability:
        _probable_kernel[(rows, slices)](
            logits, *strides, vocab, banned, w, partial, best, cuts, PER_SLICE=per_slice, SLICES=slices,
            SLICE_BLOCK=slice_block, BLOCK=BLOCK, FILTERED=filtered, num_warps=NUM_WARPS, **source_nucleus,
            **rounded)
    _final_kernel[(rows,)](
        logits, *strides, divisor, partial, best,
        eligible.reshape(rows).view(torch.uint8) if eligible.dtype == torch.bool else eligible.reshape(rows),
        tokens, score, logprob, *hash_args, cuts,
        SLICES=slices, SLICE_BLOCK=slice_block, SAMPLED=sampled, SCALED_SOURCE=scaled_source,
        WANT_SOURCE=want_source, ENTROPY=entropy, STREAM=STREAM_CONFIDENCE, GOLDEN=GOLDEN, num_warps=1,
        BY_PROBABILITY=by_probability, **source_nucleus, **rounded)
    return tokens, score, logprob


if triton is not None:
    _NOT_PROBABLE = tl.constexpr(NOT_PROBABLE)

    @triton.jit
    def _mix32(x):
        """:func:`dare.rollout.engine.noise.mix32` on uint32 (products wrap modulo 2^32)."""
        x = (x ^ (x >> 16)) * 0x21F0AAAD
        x = (x ^ (x >> 15)) * 0x735A2D97
        return x ^ (x >> 15)

    @triton.jit
    def _position_hash(row, Keys, Counters, Pos, W, spb, spw, STREAM: tl.constexpr, GOLDEN: tl.constexpr):
        """:func:`dare.rollout.engine.noise.position_hash` of one window position (uint32)."""
        b = row // W
        p = tl.load(Pos + b * spb + (row % W) * spw)
        h = _mix32(((p + STREAM * GOLDEN) & 0xFFFFFFFF).to(tl.uint32))
        h = _mix32(h ^ tl.load(Keys + 2 * b).to(tl.uint32))
        h = _mix32(h ^ tl.load(Keys + 2 * b + 1).to(tl.uint32))
        return _mix32(h ^ _mix32((tl.load(Counters + b).to(tl.int64) & 0xFFFFFFFF).to(tl.uint32)))

    _UNIFORM_SHIFT = tl.constexpr(UNIFORM_SHIFT)
    _UNIFORM_SCALE = tl.constexpr(UNIFORM_SCALE)

    @triton.jit
    def _uniform(h):
        """:func:`dare.rollout.engine.noise.uniform` of uint32 hashes (its constants): ``(k + 0.5) / 2^23`` of their
        top 23 bits, exact in float32, strictly inside ``(0, 1)`` (so the Gumbel noise is finite)."""
        return ((h >> _UNIFORM_SHIFT).to(tl.float32) + 0.5) * _UNIFORM_SCALE

    @triton.jit
    def online_lse(m, s, x):
        """One step of a per-lane online log-sum-exp with one exponential: the smaller of the running max and
        ``x`` is shifted by the larger (``-inf`` lanes stay ``(-inf, 0)``)."""
        e = tl.exp(-tl.abs(x - m))
        grows = x > m
        s = tl.where(x == float("-inf"), s, tl.where(grows, s * e + 1.0, s + e))
        return tl.maximum(m, x), s

    @triton.jit
    def merge_lse(m, s):
        """Lanes' ``(max, sum-exp)`` pairs merged into one."""
        top = tl.max(m, 0)
        shift = tl.where(top == float("-inf"), 0.0, top)
        return top, tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - shift)), 0)

    @triton.jit
    def order_key(x):
        """Order-preserving uint32 key of float32 ``x`` (``-0.0`` first made ``+0.0``, equal to it)."""
        bits = (x + 0.0).to(tl.int32, bitcast=True)
        signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # arithmetic shift: negatives have their magnitude flipped
        return (signed ^ -2147483648).to(tl.uint32, bitcast=True)

    @triton.jit
    def radix_key(raw, x, KEY_BITS: tl.constexpr):
        """The top-p radix key (:func:`key_bits` wide): of the logit ``raw`` (bf16 values, exact in float32: its
        top 16 bits) or of the exactly divided score ``x``."""
        if KEY_BITS == 16:
            return order_key(raw) >> 16
        else:
            return order_key(x)

    @triton.jit
    def in_nucleus(key, cols, Cuts, slot, row, rows):
        """Whether entries with radix keys ``key`` at columns ``cols`` are in the nucleus ``Cuts[slot]`` of
        ``row``: above the threshold key, or equal to it below the tie cut."""
        threshold = tl.load(Cuts + 2 * slot * rows + row).to(tl.uint32)
        cut = tl.load(Cuts + (2 * slot + 1) * rows + row).to(tl.int32)
        return (key > threshold) | ((key == threshold) & (cols < cut))

    @triton.jit
    def _nucleus_key(x, temperature, SCALED: tl.constexpr, KEY_BITS: tl.constexpr):
        """:func:`radix_key` of logits ``x`` (float32) whose nuclei were chosen on ``x / temperature``
        (``SCALED``) or on ``x``."""
        if KEY_BITS == 16:
            return radix_key(x, x, KEY_BITS)
        else:
            return radix_key(x, tl.math.div_rn(x, temperature) if SCALED else x, KEY_BITS)

    @triton.jit
    def _noisy_better(score, noise, best_score, best_noise):
        """Whether ``score + noise`` beats ``best_score + best_noise`` (Gumbel-max keys), compared as
        ``(score - best_score) + (noise - best_noise) > 0``: at tiny temperatures the scores ``logit / T`` are so
        large that their sum with the noise would drop its low bits (tied logits going to the lower id); their
        difference is exact for tied or close logits. A ``-inf`` score never wins; any finite one beats ``-inf``."""
        ahead = (score - best_score) + (noise - best_noise) > 0.0
        return (score > float("-inf")) & ((best_score == float("-inf")) | ahead)

    @triton.jit
    def _noisy_first_max(score_a, noise_a, col_a, score_b, noise_b, col_b):
        """Combine of a reduction to the Gumbel-max winner (:func:`_noisy_better`); equal keys: the first column."""
        b_wins = _noisy_better(score_b, noise_b, score_a, noise_a)
        tied = (score_b - score_a) + (noise_b - noise_a) == 0.0
        b_wins = b_wins | (tied & (col_b < col_a) & (score_b > float("-inf")))
        return (tl.where(b_wins, score_b, score_a), tl.where(b_wins, noise_b, noise_a),
                tl.where(b_wins, col_b, col_a))

    @triton.jit
    def _partial_kernel(Logits, stride_b, stride_w, V, banned, temperature, Partial, Best, Keys, Counters, Pos, W, spb,
                        spw, Cuts, PER_SLICE: tl.constexpr, SLICES: tl.constexpr, BLOCK: tl.constexpr,
                        SAMPLED: tl.constexpr, SCALED_SOURCE: tl.constexpr, WANT_SOURCE: tl.constexpr,
                        STREAM: tl.constexpr, GOLDEN: tl.constexpr, FILTERED: tl.constexpr,
                        FILTER_SOURCE: tl.constexpr, KEY_BITS: tl.constexpr, ROUND: tl.constexpr):
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        lanes = tl.arange(0, BLOCK)
        base = Logits + (row // W).to(tl.int64) * stride_b + (row % W).to(tl.int64) * stride_w
        if SAMPLED:
            noise_base = _position_hash(row, Keys, Counters, Pos, W, spb, spw, STREAM, GOLDEN)
        m_src = tl.full((BLOCK,), float("-inf"), tl.float32)
        s_src = tl.zeros((BLOCK,), tl.float32)
        m_smp = tl.full((BLOCK,), float("-inf"), tl.float32)
        s_smp = tl.zeros((BLOCK,), tl.float32)
        best_key = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_noise = tl.zeros((BLOCK,), tl.float32)  # Gumbel-max: the noise of the lane's best, kept apart
        best_col = tl.full((BLOCK,), 2147483647, tl.int32)
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):  # a compile-time bound: one kernel per slicing
            cols = begin + offset + lanes
            inside = cols < V
            x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
            removed = cols == banned
            if FILTERED:  # outside the drawn nucleus: removed as the banned id is
                nucleus_key = _nucleus_key(x, temperature, SAMPLED, KEY_BITS)
                removed = removed | ~in_nucleus(nucleus_key, cols, Cuts, 0, row, rows)
            if SAMPLED:
                scaled = x / temperature  # once: the sampling scores and a scaled confidence source share it
                scores = tl.where(removed, float("-inf"), scaled)
                salt = cols.to(tl.uint32) * GOLDEN  # uint32 products wrap: (v x golden) mod 2^32
                h = _mix32(noise_base ^ salt)
                noise = -tl.log(-tl.log(_uniform(h)))
                scores = tl.where(inside, scores, float("-inf"))
            else:
                scores = tl.where(removed, float("-inf"), x)
            m_smp, s_smp = online_lse(m_smp, s_smp, scores)
            if WANT_SOURCE:
                if SCALED_SOURCE:  # the tempered logits, in the model's dtype as the eager samplers hold them
                    source = _rounded(scaled, ROUND)
                else:
                    source = x
                if FILTER_SOURCE:
                    source = tl.where(in_nucleus(nucleus_key, cols, Cuts, 1, row, rows), source, float("-inf"))
                m_src, s_src = online_lse(m_src, s_src, source)
            if SAMPLED:  # strict: a lane's earlier column wins a tie
                better = _noisy_better(scores, noise, best_key, best_noise)
                best_noise = tl.where(better, noise, best_noise)
            else:
                better = scores > best_key
            best_col = tl.where(better, cols, best_col)
            best_key = tl.where(better, scores, best_key)
        if SAMPLED:
            top, top_noise, col = tl.reduce((best_key, best_noise, best_col), 0, _noisy_first_max)
        else:
            top = tl.max(best_key, 0)
            col = tl.min(tl.where(best_key == top, best_col, 2147483647), 0)  # the first column of the slice's max
        col = tl.where(top == float("-inf"), begin, col)  # no finite key: its first column, as argmax answers
        out = row * SLICES + piece
        total = rows * SLICES
        m, s = merge_lse(m_smp, s_smp)
        tl.store(Partial + out, m)
        tl.store(Partial + total + out, s)
        if WANT_SOURCE:
            m, s = merge_lse(m_src, s_src)
            tl.store(Partial + 2 * total + out, m)
            tl.store(Partial + 3 * total + out, s)
        tl.store(Partial + 4 * total + out, top)
        if SAMPLED:
            tl.store(Partial + 6 * total + out, top_noise)
        tl.store(Best + out, col)

    @triton.jit
    def _merged_record(Partial, plane: tl.constexpr, row, rows, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr):
        """``(max, sum exp(x - max))`` of ``row`` merged from its slices' partial records: planes ``plane`` (max)
        and ``plane + 1`` (sum); 0 is the sampling distribution's, 2 the confidence source's."""
        total = rows * SLICES
        pieces = tl.arange(0, SLICE_BLOCK)
        used = pieces < SLICES
        at = row * SLICES + pieces
        return merge_lse(tl.load(Partial + plane * total + at, mask=used, other=float("-inf")),
                         tl.load(Partial + (plane + 1) * total + at, mask=used, other=0.0))

    @triton.jit
    def _source_max_sum(Partial, row, rows, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr):
        """``(max, sum exp(x - max))`` of ``row``'s confidence source (the max 0 where every entry is ``-inf``):
        a probability is ``exp(x - max) / sum``, as a softmax computes it (``exp(x - logsumexp)`` rounds ~30x more
        at trained models' logit sizes)."""
        m, s = _merged_record(Partial, 2, row, rows, SLICES, SLICE_BLOCK)
        return tl.where(m == float("-inf"), 0.0, m), s

    @triton.jit
    def _rounded(x, ROUND: tl.constexpr):
        """``x`` rounded to the model's dtype (``ROUND``: 1 bf16, 2 fp16, 0 unrounded; :data:`ROUNDINGS`). bf16 to
        nearest even on the bits, as torch rounds (Triton's interpreter truncates in ``.to(tl.bfloat16)``)."""
        if ROUND == 1:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
        elif ROUND == 2:
            return x.to(tl.float16).to(tl.float32)
        else:
            return x

    @triton.jit
    def _entropy_kernel(Logits, stride_b, stride_w, V, W, temperature, Partial, Cuts, PER_SLICE: tl.constexpr,
                        SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                        SCALED_SOURCE: tl.constexpr, FILTER_SOURCE: tl.constexpr, KEY_BITS: tl.constexpr,
                        ROUND: tl.constexpr):
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        m, s = _source_max_sum(Partial, row, rows, SLICES, SLICE_BLOCK)
        lanes = tl.arange(0, BLOCK)
        base = Logits + (row // W).to(tl.int64) * stride_b + (row % W).to(tl.int64) * stride_w
        acc = tl.zeros((BLOCK,), tl.float32)
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):
            cols = begin + offset + lanes
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            if FILTER_SOURCE:  # the source's nucleus was chosen on the scores it reads
                kept = in_nucleus(_nucleus_key(x, temperature, SCALED_SOURCE, KEY_BITS), cols, Cuts, 1, row, rows)
            if SCALED_SOURCE:
                x = _rounded(x / temperature, ROUND)
            if FILTER_SOURCE:
                x = tl.where(kept, x, float("-inf"))
            p = _rounded(tl.exp(x - m) / s, ROUND)  # each value the eager code holds, in its dtype
            term = _rounded(p * _rounded(tl.log(_rounded(p + 1e-10, ROUND)), ROUND), ROUND)
            acc += tl.where(x == float("-inf"), 0.0, term)
        tl.store(Partial + 5 * rows * SLICES + row * SLICES + piece, tl.sum(acc, 0))

    @triton.jit
    def _probable_kernel(Logits, stride_b, stride_w, V, banned, W, Partial, Best, Cuts, PER_SLICE: tl.constexpr,
                         SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr, BLOCK: tl.constexpr,
                         FILTERED: tl.constexpr, FILTER_SOURCE: tl.constexpr, KEY_BITS: tl.constexpr,
                         ROUND: tl.constexpr):
        """Greedy tokens of a sampling source (``T = 0``): each slice's first entry of the drawn distribution whose
        probability under the source, rounded to the model's dtype, equals that of the distribution's max (so
        the largest), into ``Best``; where none does, its first entry plus :data:`NOT_PROBABLE` (int32 max where
        it has none). The eager samplers take the argmax of those rounded probabilities (0 outside the source's
        nucleus), where bf16 ties nearly equal logits and the first index wins."""
        row = tl.program_id(0)
        piece = tl.program_id(1)
        rows = tl.num_programs(0)
        top, _ = _merged_record(Partial, 0, row, rows, SLICES, SLICE_BLOCK)  # the drawn distribution's max
        m, s = _source_max_sum(Partial, row, rows, SLICES, SLICE_BLOCK)
        target = _rounded(tl.exp(top - m) / s, ROUND)
        target = tl.where(target > 0.0, target, float("inf"))  # probability 0 everywhere: no entry is probable
        lanes = tl.arange(0, BLOCK)
        base = Logits + (row // W).to(tl.int64) * stride_b + (row % W).to(tl.int64) * stride_w
        first = tl.full((BLOCK,), 2147483647, tl.int32)
        first_kept = tl.full((BLOCK,), 2147483647, tl.int32)
        begin = piece * PER_SLICE
        for offset in range(0, PER_SLICE, BLOCK):
            cols = begin + offset + lanes
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            kept = (cols < V) & (cols != banned) & (x > float("-inf"))
            p = _rounded(tl.exp(x - m) / s, ROUND)
            if FILTERED:  # the drawn nucleus (greedy: chosen on the logits)
                key = _nucleus_key(x, 1.0, False, KEY_BITS)
                kept = kept & in_nucleus(key, cols, Cuts, 0, row, rows)
                if FILTER_SOURCE:  # outside the source's nucleus the probability is 0
                    p = tl.where(in_nucleus(key, cols, Cuts, 1, row, rows), p, 0.0)
            first = tl.minimum(first, tl.where(kept & (p >= target), cols, 2147483647))
            first_kept = tl.minimum(first_kept, tl.where(kept, cols, 2147483647))
        found = tl.min(first, 0)
        fallback = tl.min(first_kept, 0)
        fallback = tl.where(fallback == 2147483647, fallback, fallback + _NOT_PROBABLE)
        tl.store(Best + row * SLICES + piece, tl.where(found == 2147483647, fallback, found))

    @triton.jit
    def _final_kernel(Logits, stride_b, stride_w, temperature, Partial, Best, Eligible, Tokens, Score, Logprob, Keys,
                      Counters, Pos, W, spb, spw, Cuts, SLICES: tl.constexpr, SLICE_BLOCK: tl.constexpr,
                      SAMPLED: tl.constexpr, SCALED_SOURCE: tl.constexpr, WANT_SOURCE: tl.constexpr,
                      ENTROPY: tl.constexpr, STREAM: tl.constexpr, GOLDEN: tl.constexpr, FILTER_SOURCE: tl.constexpr,
                      KEY_BITS: tl.constexpr, ROUND: tl.constexpr, BY_PROBABILITY: tl.constexpr):
        row = tl.program_id(0)
        rows = tl.num_programs(0)
        total = rows * SLICES
        pieces = tl.arange(0, SLICE_BLOCK)
        used = pieces < SLICES
        at = row * SLICES + pieces
        cols = tl.load(Best + at, mask=used, other=2147483647)
        if BY_PROBABILITY:  # the first most probable (_probable_kernel), else the first kept entry, else 0
            token = tl.min(cols, 0)
            token = tl.where(token == 2147483647, 0, tl.where(token >= _NOT_PROBABLE, token - _NOT_PROBABLE, token))
        else:
            keys = tl.load(Partial + 4 * total + at, mask=used, other=float("-inf"))
            if SAMPLED:
                noise = tl.load(Partial + 6 * total + at, mask=used, other=0.0)
                top, _, token = tl.reduce((keys, noise, cols), 0, _noisy_first_max)
                token = tl.where(top == float("-inf"), tl.min(cols, 0), token)
            else:
                top = tl.max(keys, 0)
                token = tl.min(tl.where(keys == top, cols, 2147483647), 0)  # slices in column order: the first max
        x = tl.load(Logits + (row // W).to(tl.int64) * stride_b + (row % W).to(tl.int64) * stride_w + token)
        x = x.to(tl.float32)
        if SAMPLED:
            scaled = x / temperature
        else:
            scaled = x
        m, s = _merged_record(Partial, 0, row, rows, SLICES, SLICE_BLOCK)
        logprob = scaled - (m + tl.log(s))
        if ENTROPY:
            score = _rounded(tl.sum(tl.load(Partial + 5 * total + at, mask=used, other=0.0), 0), ROUND)
        elif WANT_SOURCE:
            top_src, sum_src = _source_max_sum(Partial, row, rows, SLICES, SLICE_BLOCK)
            if SCALED_SOURCE:
                score = tl.exp(_rounded(scaled, ROUND) - top_src) / sum_src
            else:
                score = tl.exp(x - top_src) / sum_src
            score = _rounded(score, ROUND)
            if FILTER_SOURCE:  # a token outside the source's nucleus has probability 0 there
                kept = in_nucleus(_nucleus_key(x, temperature, SCALED_SOURCE, KEY_BITS), token, Cuts, 1, row, rows)
                score = tl.where(kept, score, 0.0)
        else:
            h = _position_hash(row, Keys, Counters, Pos, W, spb, spw, STREAM, GOLDEN)
            score = _uniform(h)
        eligible = tl.load(Eligible + row) != 0
        tl.store(Tokens + row, token.to(tl.int64))
        tl.store(Score + row, tl.where(eligible, score, float("-inf")))
        tl.store(Logprob + row, tl.where(eligible, logprob, 0.0))
