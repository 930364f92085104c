"""Forward (corruption) processes of masked diffusion: pure tensor functions, no model code.

Conventions (``algorithms.md`` section 0):

* ``maskable [R, S]`` marks the tokens a process may corrupt (response tokens, including EOS padding
  when a recipe trains on it). Prompt and padding are never maskable, hence never masked.
* ``example_index [R, S]`` gives, per token, the global index of the example it belongs to (``-1`` on
  padding). A padded batch has one example per row; a packed ``[1, T]`` row holds several contiguous
  examples. All noise of an example comes from :func:`~dare.diffusion.noise.example_generator`, so the
  corruption of an example is the same in any batch layout.
* A corruption is stored explicitly (:class:`Corruption`: noisy ids, mask, ``p_mask``) so old, reference
  and current log-probs of one ratio can be evaluated on identical inputs.

Schedules (linear, as in every reference repo):

* ``continuous``: one ``t ~ U(t_low, t_high)`` per example (per block with ``block_size``); each maskable
  token is masked i.i.d. with probability ``t``; ``p_mask = t``.
* ``discrete``: ``l ~ U{1..L}`` of the ``L`` maskable tokens (per block with ``block_size``) are masked
  uniformly at random; ``p_mask = l / L``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dare.diffusion.noise import example_generator, sample_t
from dare.errors import ConfigError, InputError, unknown_choice

SCHEDULES = ("continuous", "discrete")
BLOCK_ORIGINS = ("response", "global")

# Streams of example_generator (see its docstring): adding one never shifts the draws of another.
STREAM_MASK = 0
STREAM_STRATIFY = 1


@dataclass(frozen=True)
class ForwardProcess:
    """How clean sequences are corrupted.

    Attributes:
        schedule: ``continuous`` (i.i.d. masking with prob ``t``) or ``discrete`` (exactly ``l`` of ``L``).
        t_low / t_high: range of the uniform masking ratio, ``t = t_low + (t_high - t_low) u``; the LLaDA
            default ``(1e-3, 1)`` is ``t = (1 - eps) u + eps`` with ``eps = 1e-3``. Ignored by ``discrete``.
        block_size: when set, every block of ``block_size`` maskable-region tokens draws its own ``t``
            (block diffusion); ``None`` = one ``t`` per example.
        block_origin: where block 0 starts: ``response`` (first maskable token of the example) or
            ``global`` (first token of the example, i.e. blocks aligned with absolute positions).
    """

    schedule: str = "continuous"
    t_low: float = 1e-3
    t_high: float = 1.0
    block_size: int | None = None
    block_origin: str = "response"

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise unknown_choice("masking schedule", self.schedule, SCHEDULES)
        if not 0.0 < self.t_low <= self.t_high <= 1.0:
            raise ConfigError(f"masking ratio range must satisfy 0 < t_low <= t_high <= 1; got [{self.t_low}, {self.t_high}]")
        if self.block_size is not None and self.block_size < 1:
            raise ConfigError(f"block_size must be positive; got {self.block_size}")
        if self.block_origin not in BLOCK_ORIGINS:
            raise unknown_choice("block origin", self.block_origin, BLOCK_ORIGINS)


@dataclass
class Corruption:
    """One corruption of a batch (any leading shape ``[...]``, last dim = sequence).

    Attributes:
        noisy_ids: input ids with the mask id at masked positions.
        mask: ``bool``, True where the token was replaced by the mask id.
        p_mask: ``float32`` probability with which each token was masked (its example's / block's ``t``,
            or ``l/L`` for the discrete schedule) on maskable positions; ``1`` elsewhere, so ``1/p_mask``
            is always finite.
    """

    noisy_ids: torch.Tensor
    mask: torch.Tensor
    p_mask: torch.Tensor

    def to(self, device) -> Corruption:
        return Corruption(self.noisy_ids.to(device), self.mask.to(device), self.p_mask.to(device))

    def as_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Fields for a TensorDict batch (``{prefix}noisy_ids``, ``{prefix}mask``, ``{prefix}p_mask``)."""
        return {f"{prefix}noisy_ids": self.noisy_ids, f"{prefix}mask": self.mask, f"{prefix}p_mask": self.p_mask}

    @classmethod
    def from_dict(cls, fields, prefix: str = "") -> Corruption:
        return cls(fields[f"{prefix}noisy_ids"], fields[f"{prefix}mask"], fields[f"{prefix}p_mask"])

    @staticmethod
    def stack(items: list[Corruption], dim: int) -> Corruption:
        """Stack corruptions along a new dim (e.g. Monte-Carlo samples: ``[R, n, S]`` with ``dim=1``)."""
        return Corruption(*(torch.stack([getattr(c, k) for c in items], dim) for k in ("noisy_ids", "mask", "p_mask")))


# ---- single-example primitives (1-D tensors) --------------------------------------------------------
def iid_mask(maskable: torch.Tensor, prob: float | torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Mask each maskable token independently with probability ``prob`` (a float or a per-token tensor)."""
    u = torch.rand(maskable.shape, generator=gen, dtype=torch.float64)
    prob = prob.to(torch.float64) if torch.is_tensor(prob) else prob
    return maskable & (u < prob)


def exact_mask(maskable: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """Mask exactly ``count`` maskable tokens, chosen uniformly at random."""
    total = int(maskable.sum())
    if not 0 <= count <= total:
        raise InputError(f"cannot mask {count} of {total} maskable tokens")
    scores = torch.rand(maskable.shape, generator=gen, dtype=torch.float64)
    scores = scores.masked_fill(~maskable, math.inf)
    chosen = torch.zeros_like(maskable)
    chosen[torch.argsort(scores)[:count]] = True
    return chosen


def block_index(maskable: torch.Tensor, block_size: int, origin: str = "response") -> torch.Tensor:
    """Block id of every token of one example (``-1`` before the origin).

    ``origin="response"`` starts block 0 at the first maskable token; ``"global"`` at position 0.
    """
    length = maskable.shape[-1]
    positions = torch.arange(length)
    if origin == "global" or not bool(maskable.any()):
        start = 0
    else:
        start = int(maskable.to(torch.int8).argmax())
    return torch.where(positions >= start, (positions - start) // block_size, torch.full_like(positions, -1))


def uniform_count(total: int, gen: torch.Generator) -> int:
    """``l ~ U{1..total}`` (the discrete schedule's number of masked tokens)."""
    return int(torch.randint(1, total + 1, (), generator=gen))


def stratified_counts(total: int, n: int, k: int) -> list[int]:
    """VRPO's stratified mask counts ``l_m = ((k + round(m total / n) - 1) mod total) + 1``, ``m < n``.

    With ``k ~ U{1..total}`` every ``l_m`` is marginally uniform on ``{1..total}`` and the ``n`` counts are
    spread evenly over the range (one per stratum), which lowers the variance of the ELBO estimate. Only the
    stride is rounded: each ``l_m`` is ``k`` shifted by a constant (rounding ``k + m total / n`` as a whole, half
    to even, gave ``m >= 1`` counts of one parity only when ``total / n`` is a half-integer, e.g. 5 / 2).
    """
    return [((k + round(m * total / n) - 1) % total) + 1 for m in range(n)]


def stratified_levels(n: int, offset: float, low: float = 1e-3, high: float = 1.0) -> list[float]:
    """Continuous analogue: ``t_m = low + (high - low) ((offset + m / n) mod 1)``, ``offset ~ U(0, 1)``."""
    return [low + (high - low) * ((offset + m / n) % 1.0) for m in range(n)]


def corrupt_example(maskable: torch.Tensor, gen: torch.Generator, process: ForwardProcess, *,
                    t: float | None = None, count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt one example: returns ``(mask [S] bool, p_mask [S] float32)``.

    ``t`` (continuous) or ``count`` (discrete) fix the level instead of drawing it (used by the stratified
    estimators and sanity checks); they are only valid without ``block_size``.
    """
    p_mask = torch.ones(maskable.shape, dtype=torch.float32)
    if not bool(maskable.any()):
        return torch.zeros_like(maskable), p_mask
    if process.block_size is None:
        if process.schedule == "continuous":
            level = sample_t(gen, process.t_low, process.t_high) if t is None else float(t)
            mask = iid_mask(maskable, level, gen)
        else:
            total = int(maskable.sum())
            l = uniform_count(total, gen) if count is None else int(count)
            mask = exact_mask(maskable, l, gen)
            level = l / total
        p_mask[maskable] = level
        return mask, p_mask
    if t is not None or count is not None:
        raise InputError("a fixed masking level cannot be combined with per-block levels")
    blocks = block_index(maskable, process.block_size, process.block_origin)
    mask = torch.zeros_like(maskable)
    for b in range(int(blocks.max()) + 1):
        in_block = maskable & (blocks == b)
        total = int(in_block.sum())
        if total == 0:
            continue
        if process.schedule == "continuous":
            level = sample_t(gen, process.t_low, process.t_high)
            mask |= iid_mask(in_block, level, gen)
        else:
            l = uniform_count(total, gen)
            mask |= exact_mask(in_block, l, gen)
            level = l / total
        p_mask[in_block] = level
    return mask, p_mask


# ---- batches -------------------------------------------------------------------------------------------
def example_spans(example_index: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """``(row, start, end, example)`` of every contiguous example in ``example_index [R, S]`` (-1 skipped)."""
    ex = example_index.detach().cpu()
    spans = []
    for row in range(ex.shape[0]):
        values = ex[row]
        if values.numel() == 0:
            continue
        cut = torch.nonzero(values[1:] != values[:-1]).flatten().add(1).tolist()
        bounds = [0, *cut, values.numel()]
        for start, end in zip(bounds[:-1], bounds[1:]):
            idx = int(values[start])
            if idx >= 0:
                spans.append((row, start, end, idx))
    return spans


def _check_shapes(input_ids, maskable, example_index):
    if input_ids.shape != maskable.shape or input_ids.shape != example_index.shape or input_ids.ndim != 2:
        raise InputError(
            f"input_ids, maskable and example_index must share one [rows, length] shape; got "
            f"{list(input_ids.shape)}, {list(maskable.shape)}, {list(example_index.shape)}"
        )


def _assemble(input_ids, mask, p_mask, mask_id) -> Corruption:
    device = input_ids.device
    mask, p_mask = mask.to(device), p_mask.to(device)
    return Corruption(torch.where(mask, torch.full_like(input_ids, mask_id), input_ids), mask, p_mask)


def corrupt(input_ids: torch.Tensor, maskable: torch.Tensor, example_index: torch.Tensor, mask_id: int, *,
            seed: int, step: int, mc_index: int = 0, process: ForwardProcess = ForwardProcess(),
            t: float | None = None) -> Corruption:
    """Corrupt a batch ``[R, S]`` with ``process``; every example uses its own generator.

    Args:
        input_ids / maskable / example_index: ``[R, S]`` (see the module docstring).
        mask_id: the family's mask token id (``dare.family_of(model).token_ids(config).mask``).
        seed / step / mc_index: select the random stream (:func:`example_generator`).
        t: force one masking ratio for every example (continuous schedule, no blocks), e.g. ``t=1``.
    """
    _check_shapes(input_ids, maskable, example_index)
    cpu_maskable = maskable.detach().cpu().bool()
    mask = torch.zeros_like(cpu_maskable)
    p_mask = torch.ones(cpu_maskable.shape, dtype=torch.float32)
    for row, start, end, ex in example_spans(example_index):
        gen = example_generator(seed, ex, step, mc_index, STREAM_MASK)
        m, p = corrupt_example(cpu_maskable[row, start:end], gen, process, t=t)
        mask[row, start:end], p_mask[row, start:end] = m, p
    return _assemble(input_ids, mask, p_mask, mask_id)


def corrupt_mc(input_ids: torch.Tensor, maskable: torch.Tensor, example_index: torch.Tensor, mask_id: int, *,
               seed: int, step: int, n: int, process: ForwardProcess = ForwardProcess(),
               stratified: bool = False) -> Corruption:
    """``n`` Monte-Carlo corruptions per example, stacked as ``[R, n, S]``.

    ``stratified=False``: independent corruptions (``mc_index = 0..n-1``). ``stratified=True``: the
    levels are spread over strata (VRPO's "one mask per timestep" allocation): discrete schedule ->
    :func:`stratified_counts` with ``k ~ U{1..L}``; continuous -> :func:`stratified_levels`. The offset is
    drawn once per example from a separate stream; each sample's positions from its own ``mc_index``.
    """
    if n < 1:
        raise ConfigError(f"the number of Monte-Carlo samples must be positive; got {n}")
    if not stratified:
        return Corruption.stack([corrupt(input_ids, maskable, example_index, mask_id, seed=seed, step=step,
                                         mc_index=m, process=process) for m in range(n)], dim=1)
    if process.block_size is not None:
        raise ConfigError("stratified Monte-Carlo levels are not defined with per-block levels (block_size)")
    _check_shapes(input_ids, maskable, example_index)
    cpu_maskable = maskable.detach().cpu().bool()
    rows, length = cpu_maskable.shape
    mask = torch.zeros(rows, n, length, dtype=torch.bool)
    p_mask = torch.ones(rows, n, length, dtype=torch.float32)
    for row, start, end, ex in example_spans(example_index):
        m_ex = cpu_maskable[row, start:end]
        total = int(m_ex.sum())
        if total == 0:
            continue
        offset_gen = example_generator(seed, ex, step, 0, STREAM_STRATIFY)
        if process.schedule == "discrete":
            levels = {"count": stratified_counts(total, n, uniform_count(total, offset_gen))}
        else:
            offset = torch.rand((), generator=offset_gen, dtype=torch.float64).item()
            levels = {"t": stratified_levels(n, offset, process.t_low, process.t_high)}
        for m in range(n):
            gen = example_generator(seed, ex, step, m, STREAM_MASK)
            kw = {key: values[m] for key, values in levels.items()}
            mask[row, m, start:end], p_mask[row, m, start:end] = corrupt_example(m_ex, gen, process, **kw)
    ids = input_ids.unsqueeze(1).expand(rows, n, length)
    return _assemble(ids, mask, p_mask, mask_id)


def corrupt_complementary(input_ids: torch.Tensor, maskable: torch.Tensor, example_index: torch.Tensor,
                          mask_id: int, *, seed: int, step: int, mc_index: int = 0, t_low: float = 0.2,
                          t_high: float = 0.8) -> tuple[Corruption, Corruption]:
    """Coupled-GRPO's complementary pair: masks ``C = {u < t}`` and ``C' = maskable \\ C``.

    Per example ``t ~ U(t_low, t_high)`` and ``u ~ U(0,1)^S``; ``p_mask`` is ``t`` in the first corruption and
    ``1 - t`` in the second, so every maskable token is scored exactly once across the pair with weight
    ``1/p``. (The reference draws one ``t`` per micro-batch; a per-example ``t`` keeps the result
    independent of micro-batching.)
    """
    _check_shapes(input_ids, maskable, example_index)
    cpu_maskable = maskable.detach().cpu().bool()
    masks = [torch.zeros_like(cpu_maskable), torch.zeros_like(cpu_maskable)]
    probs = [torch.ones(cpu_maskable.shape, dtype=torch.float32) for _ in range(2)]
    for row, start, end, ex in example_spans(example_index):
        m_ex = cpu_maskable[row, start:end]
        gen = example_generator(seed, ex, step, mc_index, STREAM_MASK)
        t = sample_t(gen, t_low, t_high)
        first = iid_mask(m_ex, t, gen)
        masks[0][row, start:end], masks[1][row, start:end] = first, m_ex & ~first
        probs[0][row, start:end][m_ex] = t
        probs[1][row, start:end][m_ex] = 1.0 - t
    return tuple(_assemble(input_ids, m, p, mask_id) for m, p in zip(masks, probs))


__all__ = [
    "BLOCK_ORIGINS", "Corruption", "ForwardProcess", "SCHEDULES", "block_index", "corrupt", "corrupt_complementary",
    "corrupt_example", "corrupt_mc", "example_spans", "exact_mask", "iid_mask", "stratified_counts",
    "stratified_levels", "uniform_count",
]
