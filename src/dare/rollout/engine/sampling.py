"""Token proposals of a static decoding step: fp32, no float64 softmax, counter-based randomness.

Same contract as :func:`dare.rollout.kernels.propose` (tokens, confidence, log-probability of the proposed token
under the distribution it is drawn from), computed the way a captured step can afford:

* everything in float32 (the logits are cast once); the probability of a token is
  ``exp(logit - logsumexp(logits))``, never a softmax over the vocabulary in float64;
* ``T = 0`` is an explicit argmax (the same ops as the eager kernels, so greedy decoding gives the same tokens);
* ``T > 0`` is Gumbel-max with the noise of :mod:`dare.rollout.engine.noise` (a per-row counter-based stream);
* the ``random`` confidence is a uniform of the same stream family.

On CUDA, the settings most rollouts use (no top-k, a ``prob``, ``neg_entropy`` or ``random`` confidence) run in
one read of the logits, two for ``neg_entropy`` (:mod:`dare.rollout.engine.proposal_kernel`), with top-p as the
nuclei of :mod:`dare.rollout.engine.top_p_kernel`; the others as compiled tensor ops
(:mod:`dare.rollout.engine.compiled`), whose top-p filter also runs without a sort on CUDA. A kernel failure logs
one warning and leaves the tensor ops (the sorted filter) in place.

Confidences come from the eager samplers' own softmax and confidence functions
(:data:`dare.rollout.kernels.CONFIDENCES`) in float32, and the kernel computes them as ``exp(x - max) / sum``, as a
softmax does (``exp(x - logsumexp)`` rounds ~30x more at trained models' logit sizes and reordered confident
positions): with float32 logits greedy static decoding commits the positions the eager loop commits. ``float64``
confidences are computed in float32: positions whose top token has all but less than ~6e-8 of the mass tie at 1.0
here (committed leftmost first), where float64 still orders them. bf16 ``model`` confidences are rounded to bf16 as
the eager samplers' softmax rounds them (nearly equal ones tie, and the leftmost commits first); fp16 ones are
float32 (:func:`confidence_rounding`).
"""

from __future__ import annotations

import logging

import torch

from dare.errors import first_line
from dare.rollout.engine import proposal_kernel, top_p_kernel
from dare.rollout.engine.compiled import CudaCompiled
from dare.rollout.engine.noise import (
    STREAM_CONFIDENCE,
    STREAM_SAMPLE,
    gumbel_argmax,
    position_hash,
    uniform,
    vocabulary_salts,
)
from dare.rollout.kernels import (
    CONFIDENCE_DTYPES,
    CONFIDENCES,
    NEG_INF,
    Proposal,
    filter_logits,
    top_k_active,
    top_p_active,
    top_p_sorted,
)

log = logging.getLogger("dare.rollout")
_KERNEL_FAILED = False
"""Set when the proposal kernel failed once: the compiled tensor ops serve every later step."""
_TOP_P_FAILED = False
"""Set when the top-p kernel failed once: the sorted filter serves every later step."""


@torch.compiler.disable
def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p filter of float32 ``scores`` (steps that also filter by top-k): without a sort on CUDA
    (:mod:`dare.rollout.engine.top_p_kernel`; sorted, a B=16 Dream window of 32 took ~20 ms on an H100),
    :func:`~dare.rollout.kernels.top_p_sorted` elsewhere. A kernel failure warns once and leaves the sorted filter
    in place."""
    if _top_p_kernel_usable(scores):
        try:
            return top_p_kernel.top_p_filter(scores, top_p).to(scores.dtype)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - any kernel failure: the sorted filter
            _top_p_kernel_failed(error)
    return top_p_sorted(scores, top_p)


@torch.compiler.disable
def _nucleus_filters(logits, *, top_p: float, temperature: float, banned: int, want_source: bool):
    """``(filtered, source)`` of a step filtered by top-p alone: the drawn distribution (the logits without
    ``banned``) and, with ``want_source``, the confidence source (the logits) after the temperature and the filter
    (else None), float32. On CUDA the kernel reads the model's ``logits`` directly (bf16: half the passes) and
    shares the two filters' passes; elsewhere, or after a kernel failure, the sorted filter."""
    if _top_p_kernel_usable(logits):
        try:
            if want_source:
                return top_p_kernel.top_p_filter_pair(logits, top_p, banned=banned, temperature=temperature)
            return top_p_kernel.top_p_filter(logits, top_p, temperature=temperature, banned=banned), None
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - any kernel failure: the sorted filter
            _top_p_kernel_failed(error)
    x = logits.float()
    filtered = filter_logits(_without(x, banned), temperature, top_p, top_p_mask=top_p_sorted)
    return filtered, filter_logits(x, temperature, top_p, top_p_mask=top_p_sorted) if want_source else None


def _without(x: torch.Tensor, banned: int) -> torch.Tensor:
    """A copy of float32 ``x`` with column ``banned`` at ``-inf`` (a fill kernel: no host-to-device copy inside a
    recorded step)."""
    choice = x.clone()
    choice[..., banned] = NEG_INF
    return choice


def _top_p_kernel_usable(tensor: torch.Tensor) -> bool:
    return not _TOP_P_FAILED and top_p_kernel.serves(tensor)


def _top_p_kernel_failed(error: Exception) -> None:
    global _TOP_P_FAILED
    _TOP_P_FAILED = True
    log.warning("top-p kernel unavailable, using the sorted filter: %s", first_line(error)[:200])


def confidence_rounding(confidence_dtype: str, logits: torch.Tensor) -> torch.dtype | None:
    """The dtype the eager samplers' confidence softmax rounds to, which static steps round to too: ``model`` takes
    the logits' dtype, except under CUDA autocast, whose softmax runs in float32 (LoRA rollouts under autocast);
    float32 and bf16 are matched; None (computed in float32, not rounded) for ``float64`` and fp16 (where Dream's
    ``p log(p + 1e-10)`` is NaN at p = 0, the epsilon underflowing, in the eager samplers too)."""
    dtype = CONFIDENCE_DTYPES[confidence_dtype] or logits.dtype
    if dtype in (torch.bfloat16, torch.float16) and logits.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.float32
    return dtype if dtype in (torch.float32, torch.bfloat16) else None


def propose_static(
    logits: torch.Tensor,
    eligible: torch.Tensor,
    *,
    config,
    banned: int,
    keys: torch.Tensor,
    counters: torch.Tensor,
    positions: torch.Tensor,
) -> Proposal:
    """Proposals for ``logits [B, W, V]`` at the ``eligible [B, W]`` positions.

    ``config`` is a resolved :class:`~dare.rollout.SamplerConfig`; ``banned`` the mask id (never proposed);
    ``keys [B, 2]``, ``counters [B]`` (each row's step) and ``positions [B, W]`` (completion coordinates) index
    the random streams. On CUDA the vocabulary-wide math runs in one pass (:mod:`~dare.rollout.engine.proposal_kernel`)
    or compiled (:mod:`dare.rollout.engine.compiled`).
    """
    global _KERNEL_FAILED
    rounding = confidence_rounding(config.confidence_dtype, logits)
    filtered = top_p_active(config.top_p)  # served with the nuclei of the top-p kernel, where it runs
    if not _KERNEL_FAILED and proposal_kernel.serves(config, logits) and (
            not filtered or _top_p_kernel_usable(logits)):
        try:
            cuts = top_p_kernel.nucleus_cuts(
                logits, config.top_p, banned=banned, temperature=config.temperature,
                want_source=proposal_kernel.filters_source(config.confidence_source, config.confidence),
            ) if filtered else None
            tokens, score, logprob = proposal_kernel.propose_fused(
                logits, eligible, banned=banned, temperature=config.temperature,
                confidence_source=config.confidence_source, confidence=config.confidence, keys=keys,
                counters=counters, positions=positions, cuts=cuts, rounding=rounding)
            return Proposal(tokens=tokens, confidence=score, logprob=logprob)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - any kernel failure: the compiled tensor ops
            _KERNEL_FAILED = True
            log.warning("proposal kernel unavailable, using compiled tensor ops: %s", first_line(error)[:200])
    salts = vocabulary_salts(logits.shape[-1], logits.device) if config.temperature > 0 else None
    tokens, score, logprob = _propose(
        logits, eligible, keys, counters, positions, salts, banned=banned, temperature=config.temperature,
        top_p=config.top_p, top_k=config.top_k, top_k_first=config.top_k_first,
        confidence_source=config.confidence_source, confidence=config.confidence, rounding=rounding)
    return Proposal(tokens=tokens, confidence=score, logprob=logprob)


def _softmax_in(source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``softmax(source.to(dtype))``, as the eager samplers take it; a bf16 / fp16 one outside compiled code."""
    if dtype == torch.float32:
        return torch.softmax(source.float(), dim=-1)
    return _rounded_softmax(source, dtype)


def _confidence_in(confidence: str, probs: torch.Tensor, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 scores of the eager samplers' confidence function on ``probs`` (held in ``dtype``); bf16 / fp16
    ones outside compiled code."""
    if dtype == torch.float32:
        return CONFIDENCES[confidence](probs, tokens).float()
    return _rounded_confidence(confidence, probs, tokens)


# Rounded (bf16 / fp16) confidences run eagerly, a graph break of the compiled ops: the eager samplers round every
# value of their softmax and confidence functions, and compiled code, even with Inductor emulating precision casts,
# did not (bf16 probabilities of tempered logits a few ulps off the eager ones in most positions at a 126k
# vocabulary, Dream's entropy in some; H100), where the proposal kernel and the eager ops agree bit for bit.

@torch.compiler.disable
def _rounded_softmax(source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.softmax(source.to(dtype), dim=-1)


@torch.compiler.disable
def _rounded_confidence(confidence: str, probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return CONFIDENCES[confidence](probs, tokens).float()


def _propose_ops(logits, eligible, keys, counters, positions, salts, *, banned: int, temperature: float, top_p,
                 top_k, top_k_first: bool, confidence_source: str, confidence: str,
                 rounding: torch.dtype | None = None):
    want_source = proposal_kernel.filters_source(confidence_source, confidence)  # (random reads no source)
    choice = None  # the logits without the banned id, where a filter or the greedy choice reads them
    if top_p_active(top_p) and not top_k_active(top_k, logits.shape[-1]):
        # the filters read the model's logits (a graph break): no float32 copies made before it for them
        filtered, source = _nucleus_filters(logits, top_p=top_p, temperature=temperature, banned=banned,
                                            want_source=want_source)
        x = None if want_source else logits.float()  # read only as the source (and a greedy logits choice)
    else:
        x = logits.float()
        choice = _without(x, banned)
        filtered = filter_logits(choice, temperature, top_p, top_k, top_k_first, top_p_mask=_top_p_filter)
        source = filter_logits(x, temperature, top_p, top_k, top_k_first, top_p_mask=_top_p_filter) \
            if want_source else None
    if not want_source:
        source = x

    # the eager samplers' softmax of the confidence source, in the dtype they round to (float32 for float64)
    probs = None if confidence == "random" else _softmax_in(source, rounding or torch.float32)
    if temperature == 0:
        if confidence_source == "logits":
            tokens = (choice if choice is not None else _without(x, banned)).argmax(-1)
        elif rounding is not None and want_source:
            # as the eager samplers (Dream's reference): the first of the drawn distribution's most probable tokens
            # under the source's softmax in their dtype, where bf16 rounding ties nearly equal logits
            tokens = probs.masked_fill(filtered == NEG_INF, -1.0).argmax(-1)
        else:
            tokens = filtered.argmax(-1)
    else:
        tokens = gumbel_argmax(filtered, position_hash(keys, counters, positions, STREAM_SAMPLE), salts)

    if confidence == "random":
        score = uniform(position_hash(keys, counters, positions, STREAM_CONFIDENCE))
    else:  # the eager samplers' confidence functions
        score = _confidence_in(confidence, probs, tokens, rounding or torch.float32)
    score = score.masked_fill(~eligible, NEG_INF)
    logprob = filtered.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(filtered, dim=-1)
    logprob = logprob.masked_fill(~eligible, 0.0)
    return tokens, score, logprob


_propose = CudaCompiled(_propose_ops)
