"""The masked-diffusion NELBO and its normalisation variants (``algorithms.md`` section 1.1).

The SFT loss is a weighted sum of per-token cross-entropies ``L = sum_j w_j * (-log p(y_j | z))`` with
``w_j = 1[masked_j] / p_mask_j / normaliser``. The normalisers are computed over the **global** batch (all
micro-batches on all ranks, see :func:`nelbo_totals`) before the batch is split, so summing the per-micro-
batch losses over micro-batches and ranks gives exactly the global-batch loss, whatever the split.

Normalisations (``NORMALIZATIONS``):

* ``llada`` - LLaDA guideline: per sequence ``/ |y_i|`` (answer length *including* EOS padding), then
  ``/ B``. Same as the ``dllm`` library's ``sequence``.
* ``d1`` - d1 SFT: ``/`` the number of answer tokens in the batch. Same as ``dllm``'s ``token``.
* ``batch`` - ``dllm``'s ``batch``: per-sequence NELBO sums, averaged over sequences (``/ B``).
* ``masked`` - DARE's LLaDA/Dream SFT trainers: ``/`` the number of *masked* tokens. Since that number is
  about ``t |y|``, the effective weight is about ``1/t^2``: this is **not** the NELBO; it exists only to
  reproduce those trainers.

``inverse_t=False`` drops the ``1/t`` weight (DARE's LLaDA2 SFT, unweighted CE).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dare.errors import unknown_choice

NORMALIZATIONS = {
    "llada": "per sequence / answer length (incl. EOS padding), then / #sequences (LLaDA guideline)",
    "d1": "/ #answer tokens of the batch (d1 SFT)",
    "batch": "per-sequence sums / #sequences (dllm 'batch')",
    "masked": "/ #masked tokens (DARE trainers; not the NELBO: effective weight ~1/t^2)",
}
ALIASES = {"sequence": "llada", "token": "d1"}  # the dllm library's names


def resolve_normalization(name: str) -> str:
    """Canonical normalisation name (accepts the dllm aliases ``sequence`` and ``token``)."""
    name = ALIASES.get(name, name)
    if name not in NORMALIZATIONS:
        raise unknown_choice("loss normalisation", name, [*NORMALIZATIONS, *ALIASES])
    return name


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` computed in fp32 (``[..., V]`` and ``[...]`` -> ``[...]``)."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    return -F.cross_entropy(flat, targets.reshape(-1), reduction="none").view(targets.shape)


def local_example_ids(example_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Map global example indices ``[R, S]`` to ``0..E-1`` (``-1`` stays ``-1``); returns ``(ids, uniques)``."""
    uniques, inverse = torch.unique(example_index, return_inverse=True)
    keep = uniques >= 0
    remap = torch.cumsum(keep.long(), 0) - 1
    ids = torch.where(example_index >= 0, remap[inverse], torch.full_like(example_index, -1))
    return ids, uniques[keep]


def per_example_sum(values: torch.Tensor, example_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum ``values [R, S]`` or ``[R, n, S]`` per example -> ``(example indices [E], sums [E] or [E, n])``."""
    ids, uniques = local_example_ids(example_index)
    count = uniques.numel()
    valid = ids >= 0
    safe = ids.clamp_min(0)
    if values.ndim == 2:
        out = torch.zeros(count, dtype=values.dtype, device=values.device)
        return uniques, out.index_add(0, safe[valid], values[valid])
    n = values.shape[1]
    out = torch.zeros(count, n, dtype=values.dtype, device=values.device)
    moved = values.transpose(1, 2)[valid]  # [tokens, n]
    return uniques, out.index_add(0, safe[valid], moved)


def nelbo_totals(mask: torch.Tensor, maskable: torch.Tensor, example_index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Counts a normaliser may need, to be **summed over the global batch** before computing weights.

    Returns float64 scalars: ``sequences`` (examples with at least one answer token), ``answer_tokens``
    and ``masked_tokens``.
    """
    _, answer_len = per_example_sum(maskable.to(torch.float64), example_index)
    return {
        "sequences": (answer_len > 0).sum().to(torch.float64),
        "answer_tokens": maskable.sum().to(torch.float64),
        "masked_tokens": mask.sum().to(torch.float64),
    }


def nelbo_weights(mask: torch.Tensor, p_mask: torch.Tensor, maskable: torch.Tensor, example_index: torch.Tensor,
                  totals: dict[str, torch.Tensor], normalize: str = "llada", inverse_t: bool = True) -> torch.Tensor:
    """Per-token weights ``w [R, S]`` (float32) such that ``loss = sum(w * -log p)``.

    ``totals`` are the global-batch counts (:func:`nelbo_totals` summed over micro-batches and ranks).
    """
    normalize = resolve_normalization(normalize)
    w = mask.to(torch.float64)
    if inverse_t:
        w = w / p_mask.to(torch.float64)
    if normalize == "llada":
        ids, _ = local_example_ids(example_index)
        _, answer_len = per_example_sum(maskable.to(torch.float64), example_index)
        per_token_len = torch.where(ids >= 0, answer_len[ids.clamp_min(0)], torch.ones_like(w))
        w = w / per_token_len.clamp_min(1) / totals["sequences"].clamp_min(1)
    elif normalize == "d1":
        w = w / totals["answer_tokens"].clamp_min(1)
    elif normalize == "batch":
        w = w / totals["sequences"].clamp_min(1)
    else:
        w = w / totals["masked_tokens"].clamp_min(1)
    return w.to(torch.float32)


def sequence_elbo(logp: torch.Tensor, mask: torch.Tensor, p_mask: torch.Tensor, example_index: torch.Tensor,
                  inverse_t: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example ELBO terms ``sum_{masked} log p / p_mask``.

    ``logp``, ``mask``, ``p_mask`` are ``[R, S]`` or ``[R, n, S]`` (Monte-Carlo samples); ``example_index``
    is ``[R, S]``. Returns ``(example indices [E], terms [E] or [E, n])``; average the last dim for the
    MC-ELBO estimate. Unbiased for the ELBO ``<= log p(y | x)`` with either schedule.
    """
    term = torch.where(mask, logp.float(), torch.zeros((), dtype=torch.float32, device=logp.device))
    if inverse_t:
        term = term / p_mask.float()
    return per_example_sum(term, example_index)


__all__ = [
    "ALIASES", "NORMALIZATIONS", "local_example_ids", "nelbo_totals", "nelbo_weights", "per_example_sum",
    "resolve_normalization", "sequence_elbo", "token_logprobs",
]
