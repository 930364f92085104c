"""Pure tensor kernels shared by every diffusion sampler.

Nothing here knows about models, caches or loops; each function maps tensors to tensors so that masked
diffusion (LLaDA, Dream, Fast-dLLM) and block-diffusion decoders (SDAR, LLaDA2) can share them.

Shapes: ``B`` rows, ``W`` positions of the decoding window (the current block), ``V`` vocabulary.

* **Transfer schedules** (how many masked positions a step commits): :func:`linear_quota` (LLaDA,
  front-loaded remainder) and :func:`timestep_quota` (Dream, ``floor(n * (1 - s/t))``).
* **Sampling**: :func:`filter_logits` (temperature, then top-p and top-k in Dream's order, or top-k first as
  SDAR and LLaDA2 do) and :func:`propose`
  (token proposals, their log-probabilities and confidences, with an explicit ``T = 0`` argmax path and
  float64 Gumbel-max sampling drawn from one generator per row).
* **Confidences**: ``prob`` (probability of the proposed token), ``margin`` (top-1 minus top-2),
  ``neg_entropy`` and ``random``.
* **Selection rules** (which candidates a step commits): :func:`select_quota` (per-row top-k without
  Python loops), :func:`select_threshold` (Fast-dLLM: everything ``>= tau`` plus the top-1),
  :func:`select_factor` (Fast-dLLM factor rule), :func:`select_dynamic` (threshold with a top-k fallback,
  SDAR's ``low_confidence_dynamic`` and LLaDA2), :func:`select_leftmost` (SDAR ``sequential``),
  :func:`select_entropy_bounded` (SDAR/JetEngine ``entropy_bounded``) and :func:`select_edits` (LLaDA2.1
  token editing of already decoded positions).

Ties in selections go to the leftmost position (stable sort).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")

# ---------------------------------------------------------------------------------------------------
# transfer schedules
# ---------------------------------------------------------------------------------------------------


def linear_quota(step: torch.Tensor, initial: torch.Tensor, remaining: torch.Tensor, steps: int,
                 eps: float = 0.0) -> torch.Tensor:
    """LLaDA's linear schedule: step ``i`` of ``steps`` commits ``n // steps + [i < n % steps]`` tokens.

    ``n`` is the row's mask count when the block started (``initial``); the remainder is front-loaded, so
    the quotas of a block sum to ``n``. The last step (and any later one) flushes whatever remains; counts
    are clamped to the ``remaining`` masks. All arguments are ``[B]`` long tensors except ``steps``.
    """
    base, rem = initial // steps, initial % steps
    quota = torch.minimum(base + (step < rem).long(), remaining)
    return torch.where(step >= steps - 1, remaining, quota)


def timestep_quota(step: torch.Tensor, initial: torch.Tensor, remaining: torch.Tensor, steps: int,
                   eps: float = 1e-3) -> torch.Tensor:
    """Dream's schedule: with ``ts = linspace(1, eps, steps + 1)`` (float32), step ``i`` commits
    ``floor(remaining * (1 - ts[i+1] / ts[i]))`` tokens and the last step commits all that remain.

    Computed in float32 exactly as the reference does, so some steps commit 0 tokens (e.g. the first
    step when ``steps`` equals the number of masks).
    """
    ts = torch.linspace(1, eps, steps + 1, device=remaining.device)
    i = step.clamp(max=steps - 1)
    ratio = 1 - ts[i + 1] / ts[i]
    quota = (remaining.to(torch.float32) * ratio).floor().long()
    return torch.where(step >= steps - 1, remaining, torch.minimum(quota, remaining))


SCHEDULES: dict[str, Callable[..., torch.Tensor]] = {"linear": linear_quota, "timestep": timestep_quota}


def linear_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """The whole linear schedule ``[B, steps]`` for mask counts ``[B]`` (LLaDA's ``get_num_transfer_tokens``)."""
    idx = torch.arange(steps, device=num_masked.device)[None, :]
    n = num_masked[:, None]
    return n // steps + (idx < n % steps).long()


# ---------------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------------


def top_p_active(top_p: float | None) -> bool:
    """Whether ``top_p`` filters anything (None or >= 1 keep every token)."""
    return top_p is not None and top_p < 1


def top_k_active(top_k: int | None, vocab: int) -> bool:
    """Whether ``top_k`` filters a ``vocab``-wide distribution (None, 0 or >= ``vocab`` keep every token)."""
    return top_k is not None and 0 < top_k < vocab


def _top_p(logits: torch.Tensor, top_p: float | None, mask=None) -> torch.Tensor:
    if not top_p_active(top_p):
        return logits
    return (mask or top_p_sorted)(logits, top_p)


# Eager inside compiled proposals (a graph break): inductor's CUDA code generation for a vocabulary-wide cumsum
# (a split scan) fails in torch 2.11, and the sort it follows gains nothing from compilation.
@torch.compiler.disable
def top_p_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with the tokens outside the ``top_p`` nucleus set to ``-inf``: sort, cumulative sum of the
    probabilities, shifted by one so that the token crossing ``top_p`` is kept (Dream's and SDAR's code)."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    remove = torch.zeros_like(remove).scatter(-1, sorted_idx, remove)
    return logits.masked_fill(remove, NEG_INF)


def _top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    if not top_k_active(top_k, logits.shape[-1]):
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def filter_logits(logits: torch.Tensor, temperature: float = 0.0, top_p: float | None = None,
                  top_k: int | None = None, top_k_first: bool = False, top_p_mask=None) -> torch.Tensor:
    """Sampling preprocessing in the logits' dtype: divide by ``temperature`` (when > 0), keep the smallest
    set of tokens whose probability reaches ``top_p`` (the token crossing the threshold is kept) and the
    tokens at least as large as the ``top_k``-th largest. Removed tokens become ``-inf``. ``top_p``
    None/>= 1 and ``top_k`` None/0 disable the filters.

    The order is Dream's (top-p, then top-k) by default; ``top_k_first`` applies top-k before top-p as
    SDAR's ``sample_with_temperature_topk_topp`` and LLaDA2's ``generate`` do (the two orders differ when
    both filters are active). ``top_p_mask(logits, top_p)`` replaces the sorted top-p filter (the static engine
    passes its sort-free kernel on CUDA, :mod:`dare.rollout.engine.top_p_kernel`).
    """
    if temperature > 0:
        logits = logits / temperature
    if top_k_first:
        return _top_p(_top_k(logits, top_k), top_p, top_p_mask)
    return _top_k(_top_p(logits, top_p, top_p_mask), top_k)


def sampling_distribution(logits: torch.Tensor, temperature: float, keep: torch.Tensor) -> torch.Tensor:
    """float32 log-probabilities of the distribution tokens are drawn from: ``softmax(logits / T)``
    restricted to the tokens ``keep`` (those that survived :func:`filter_logits`) and renormalised.

    For ``T = 0`` (argmax decoding) this is the filtered distribution at temperature 1: the convention for
    the log-probabilities DARE reports with greedy decoding (the degenerate point mass would always give 0).
    """
    scaled = logits.to(torch.float32, copy=True)
    if temperature > 0:
        scaled.div_(temperature)
    return torch.log_softmax(scaled.masked_fill_(~keep, NEG_INF), dim=-1)


def gumbel_argmax(scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``argmax(scores + Gumbel noise)`` in float64 over the last axis: a sample from ``softmax(scores)``.

    Equivalent to LLaDA's ``argmax(exp(l) / (-log u)^T)`` with ``scores = l / T`` (float64 noise, as the
    reference insists for generation quality).
    """
    u = torch.rand(scores.shape, dtype=torch.float64, device=scores.device, generator=generator)
    return (scores.to(torch.float64) - torch.log(-torch.log(u))).argmax(dim=-1)


def _prob(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return probs.gather(-1, tokens[..., None]).squeeze(-1)


def _margin(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    top2 = torch.topk(probs, 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def _neg_entropy(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return (probs * torch.log(probs + 1e-10)).sum(-1)


CONFIDENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    "prob": _prob,
    "margin": _margin,
    "neg_entropy": _neg_entropy,
    "random": None,  # drawn from the row's generator
}
"""Confidence functions ``(probs [.., V], tokens [..]) -> score [..]`` (higher = commit first)."""

CONFIDENCE_ALIASES = {
    "low_confidence": "prob", "maskgit_plus": "prob", "confidence": "prob",
    "topk_margin": "margin", "entropy": "neg_entropy",
}
"""Names used by the reference samplers (LLaDA ``remasking``, Dream ``alg``) for DARE's confidences."""

CONFIDENCE_SOURCES = ("logits", "sampling")
CONFIDENCE_DTYPES = {"model": None, "float32": torch.float32, "float64": torch.float64}


@dataclass
class Proposal:
    """Candidate tokens of one denoising step for a ``[B, W]`` window.

    Attributes:
        tokens: ``[B, W]`` proposed token at every position (meaningful where ``eligible``).
        confidence: ``[B, W]`` selection score; ``-inf`` where not eligible. Kept in the dtype it was computed
            in (selections compare these values, as the references do).
        logprob: ``[B, W]`` float32 log-probability of the proposed token under the sampling distribution
            (:func:`sampling_distribution`); 0 where not eligible.
    """

    tokens: torch.Tensor
    confidence: torch.Tensor
    logprob: torch.Tensor


def propose(
    logits: torch.Tensor,
    eligible: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    confidence: str = "prob",
    confidence_source: str = "logits",
    confidence_dtype: str = "model",
    generators: Sequence[torch.Generator | None] | None = None,
    banned: Sequence[int] = (),
    top_k_first: bool = False,
) -> Proposal:
    """Propose a token, its log-probability and a confidence for every position of ``logits [B, W, V]``.

    Tokens: ``T = 0`` is an explicit argmax (of the raw logits for ``confidence_source="logits"``, of the
    filtered probabilities for ``"sampling"`` as Dream does); ``T > 0`` draws from
    ``softmax(filter(logits) / T)`` by float64 Gumbel-max with ``generators[b]`` (one per row, so a row's
    samples never depend on the other rows). Rows without an eligible position draw nothing. Tokens in
    ``banned`` (the mask token) are never proposed; they are removed from the sampling distribution but
    not from the confidence's, so that confidences equal the references' whenever those would not have
    proposed a banned token.

    Confidences are computed from ``softmax`` in ``confidence_dtype`` (``model`` = the logits' dtype, as
    in LLaDA/Dream; ``float64`` as in Fast-dLLM) of the raw logits (``confidence_source="logits"``, LLaDA,
    Fast-dLLM) or of the filtered, tempered logits the token was drawn from (``"sampling"``, Dream, SDAR,
    LLaDA2). ``top_k_first`` selects the filter order (:func:`filter_logits`).
    """
    rows = logits.shape[0]
    if generators is None:
        generators = [None] * rows
    dtype = CONFIDENCE_DTYPES[confidence_dtype] or logits.dtype
    choice = logits
    if banned:
        choice = logits.index_fill(-1, torch.as_tensor(list(banned), device=logits.device), NEG_INF)
    filtered_choice = filter_logits(choice, temperature, top_p, top_k, top_k_first)
    keep = torch.isfinite(filtered_choice)
    if confidence_source == "logits":
        source = logits
    else:
        source = filter_logits(logits, temperature, top_p, top_k, top_k_first) if banned else filtered_choice
    probs = torch.softmax(source.to(dtype), dim=-1)
    del filtered_choice
    logp_all = sampling_distribution(logits, temperature, keep)

    active = eligible.any(-1).tolist() if temperature > 0 or confidence == "random" else []
    if temperature == 0:
        if confidence_source == "logits":
            tokens = choice.argmax(-1)
        else:
            tokens = (probs.masked_fill(~keep, -1) if banned else probs).max(-1).indices
    else:
        tokens = torch.zeros(eligible.shape, dtype=torch.long, device=logits.device)
        for b in range(rows):
            if active[b]:
                scores = (logits[b].to(torch.float64) / temperature).masked_fill(~keep[b], NEG_INF)
                tokens[b] = gumbel_argmax(scores, generators[b])

    fn = CONFIDENCES[confidence]
    if fn is None:
        score = torch.zeros(eligible.shape, dtype=torch.float32, device=logits.device)
        for b in range(rows):
            if active[b]:
                score[b] = torch.rand(eligible.shape[1], device=logits.device, generator=generators[b])
    else:
        score = fn(probs, tokens)
    score = score.masked_fill(~eligible, NEG_INF)
    logprob = _prob(logp_all, tokens).masked_fill(~eligible, 0.0)
    return Proposal(tokens=tokens, confidence=score, logprob=logprob)


# ---------------------------------------------------------------------------------------------------
# selection rules
# ---------------------------------------------------------------------------------------------------


def _ranks(confidence: torch.Tensor) -> torch.Tensor:
    """Rank of every position in its row by descending confidence (0 = most confident; ties: leftmost first)."""
    order = torch.sort(confidence, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    return ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))


def select_quota(confidence: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The ``k[b]`` most confident eligible positions of every row (per-row top-k, no Python loop)."""
    k = torch.minimum(k, eligible.sum(-1))
    return (_ranks(confidence) < k[:, None]) & eligible


def select_threshold(confidence: torch.Tensor, eligible: torch.Tensor, threshold: float) -> torch.Tensor:
    """Fast-dLLM threshold rule: every eligible position with ``confidence >= threshold``, plus the most
    confident one, so each row with an eligible position commits at least one token."""
    top1 = select_quota(confidence, eligible, torch.ones_like(eligible[:, 0], dtype=torch.long))
    return ((confidence >= threshold) & eligible) | top1


def select_factor(confidence: torch.Tensor, eligible: torch.Tensor, factor: float,
                  last_rank_quirk: bool = False) -> torch.Tensor:
    """Fast-dLLM factor rule: sort the eligible confidences ``c_(1) >= c_(2) >= ...`` and commit the longest
    prefix with ``c_(n) >= 1 - factor / (n + 1)`` (``n >= 2``; the top-1 is always committed, whatever the
    confidence's scale: its bound is ``-inf``).

    ``last_rank_quirk`` reproduces dInfer's ``get_transfer_index_dynamic``, which commits all ``N``
    eligible positions when the first failure is at the last rank ``N``.
    """
    values = torch.sort(confidence, dim=-1, descending=True).values
    n = torch.arange(1, values.shape[-1] + 1, device=values.device, dtype=torch.float64)
    bound = 1.0 - factor / (n + 1.0)
    bound[0] = NEG_INF  # confidences may be negative (neg_entropy): the top-1 is committed regardless
    count = (values.to(torch.float64) >= bound).sum(-1)  # thresholds rise, values fall: a prefix
    n_eligible = eligible.sum(-1)
    count = torch.minimum(count.clamp(min=1), n_eligible)  # at least the top-1 (NaN confidences compare false)
    if last_rank_quirk:
        count = torch.where((count == n_eligible - 1) & (n_eligible >= 2), n_eligible, count)
    return select_quota(confidence, eligible, count)


def select_dynamic(confidence: torch.Tensor, eligible: torch.Tensor, threshold: float,
                   k: torch.Tensor) -> torch.Tensor:
    """Threshold with a top-k fallback (SDAR ``low_confidence_dynamic``, LLaDA2): every eligible position with
    ``confidence > threshold`` if there are at least ``k[b]`` of them, else the ``k[b]`` most confident."""
    over = (confidence > threshold) & eligible
    enough = over.sum(-1) >= k
    return torch.where(enough[:, None], over, select_quota(confidence, eligible, k))


def select_leftmost(eligible: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The ``k[b]`` leftmost eligible positions of every row (SDAR's ``sequential`` strategy: the first
    ``k`` masks of the block, i.e. autoregressive order inside the block)."""
    return (eligible.long().cumsum(-1) <= k[:, None]) & eligible


def select_entropy_bounded(confidence: torch.Tensor, eligible: torch.Tensor, bound: float) -> torch.Tensor:
    """SDAR/JetEngine ``entropy_bounded``: with ``confidence`` the negative entropy of each position's
    distribution (``neg_entropy``), sort the eligible positions by ascending entropy and commit those whose
    cumulative entropy stays below ``bound`` (``searchsorted(cumsum, bound)``), at least one."""
    entropy = (-confidence.to(torch.float64)).masked_fill(~eligible, float("inf"))
    cumulative = torch.sort(entropy, dim=-1, stable=True).values.cumsum(-1)
    count = (cumulative < bound).sum(-1).clamp(min=1)
    return select_quota(confidence, eligible, count)


def select_edits(confidence: torch.Tensor, editable: torch.Tensor, proposals: torch.Tensor,
                 current: torch.Tensor, threshold: float) -> torch.Tensor:
    """LLaDA2.1 token-to-token editing: the ``editable`` (already decoded, not prompt) positions whose
    proposal differs from the ``current`` token with ``confidence > threshold``."""
    return editable & (confidence > threshold) & (proposals != current)


DECODERS = ("quota", "threshold", "factor", "dynamic", "sequential", "entropy_bounded")
"""Selection rules by name; :func:`select` dispatches."""

DECODER_ALIASES = {"low_confidence_static": "quota", "low_confidence_dynamic": "dynamic"}
"""SDAR's ``remasking_strategy`` names for DARE's selection rules."""

DECODER_SETTINGS = {
    "threshold": ("threshold", "dynamic"),
    "factor": ("factor",),
    "factor_last_rank_quirk": ("factor",),
    "entropy_bound": ("entropy_bounded",),
}
"""The :class:`~dare.rollout.SamplerConfig` fields that only some selection rules read: field -> those rules."""

SCHEDULE_DECODERS = ("quota", "dynamic", "sequential")
"""Rules that commit a scheduled count, and so read ``steps`` and ``schedule``; the others commit by confidence."""
FIXED_COUNT_DECODERS = ("quota", "sequential")
"""Rules that commit exactly the scheduled count: a block's steps are known in advance (the static engines queue
them without reading a flag from the device)."""


def select(decoder: str, confidence: torch.Tensor, eligible: torch.Tensor, k: torch.Tensor, *,
           threshold: float = 0.9, factor: float = 1.0, last_rank_quirk: bool = False,
           entropy_bound: float = 0.35) -> torch.Tensor:
    """Apply the selection rule ``decoder`` (see :data:`DECODERS`) and return the ``[B, W]`` commit mask.

    ``k`` is the per-row scheduled count (used by ``quota``, ``dynamic`` and ``sequential``). The rules that
    commit by confidence (``threshold``, ``factor``, ``entropy_bounded``) each commit at least one eligible
    position of a row, so a decoding loop progresses every step whatever the confidences (negative, NaN).
    Schedule rules may commit nothing in a step (Dream's timestep schedule does); their last step flushes."""
    rules = {
        "quota": lambda: select_quota(confidence, eligible, k),
        "threshold": lambda: select_threshold(confidence, eligible, threshold),
        "factor": lambda: select_factor(confidence, eligible, factor, last_rank_quirk),
        "dynamic": lambda: select_dynamic(confidence, eligible, threshold, k),
        "sequential": lambda: select_leftmost(eligible, k),
        "entropy_bounded": lambda: select_entropy_bounded(confidence, eligible, entropy_bound),
    }
    return rules[decoder]()
