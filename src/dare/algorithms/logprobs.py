"""Model-facing log-prob helpers shared by the algorithms (the only place algorithms call the model).

Algorithms need ``log p(target)`` only at the scored (masked) positions. :func:`masked_logprobs` runs the
model without its LM head (``return_hidden=True``), aligns the hidden states with the family's logit shift
(Dream), keeps the selected positions and applies the head to them ``chunk_size`` rows at a time with an fp32
log-softmax per chunk; in the backward pass each chunk is recomputed. The ``[B, L, V]`` logits are never
materialised (LLaDA-8B: 126464 x 2 bytes per token) and the head's matmuls run on the selected rows only.
``chunk_size=0`` is the plain path (full logits, then select): the reference the chunked path is tested
against.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from tensordict import TensorDict

from dare.diffusion.elbo import token_logprobs
from dare.errors import ConfigError
from dare.models.spec import family_of

DEFAULT_LOGITS_CHUNK = 2048
"""Rows of the LM head per chunk: 2048 x 126464 fp32 log-probs is 1 GiB (LLaDA's vocabulary)."""


def model_inputs(batch: TensorDict) -> dict:
    """Layout kwargs of a micro-batch: ``attention_mask`` (padded) or ``cu_seqlens`` (packed)."""
    kwargs = {}
    if "cu_seqlens" in batch.keys():
        kwargs["cu_seqlens"] = batch["cu_seqlens"][0]
    if "attention_mask" in batch.keys():
        mask = batch["attention_mask"]
        if not bool(mask.all()):
            kwargs["attention_mask"] = mask
    return kwargs


def aligned_logits(model, input_ids: torch.Tensor, *, attn_backend: str | None = None, **layout) -> torch.Tensor:
    """Logits where position ``i`` predicts token ``i`` (the family's shift applied per packed document)."""
    out = model(input_ids, attn_backend=attn_backend, **layout)
    return family_of(model).align_logits(out.logits, layout.get("cu_seqlens"))


def _head_logprobs(head, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return token_logprobs(head(rows), targets)


def hidden_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, select: torch.Tensor, *,
                    cu_seqlens: torch.Tensor | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK) -> torch.Tensor:
    """``log p(target)`` in fp32 at ``select`` positions (0 elsewhere) from final hidden states ``[B, L, D]``.

    ``hidden`` is ``model(..., return_hidden=True).last_hidden_state``. The family's alignment is applied to the
    hidden states (the head is position-wise, so ``align(head(h)) == head(align(h))``; for Dream the output at
    ``i - 1`` predicts token ``i``, per packed document with ``cu_seqlens``); then ``model.head`` runs on the
    selected rows only, ``chunk_size`` rows at a time, each chunk recomputed in the backward pass. When nothing is
    selected the result still depends on the head and ``hidden`` (times 0) so every rank runs the same backward
    collectives.
    """
    if chunk_size < 1:
        raise ConfigError(f"the logits chunk size must be positive (0 = full logits); got {chunk_size}")
    aligned = family_of(model).align_logits(hidden, cu_seqlens)
    rows, wanted = aligned[select], targets[select]  # [N, D], [N]
    out = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    count = rows.shape[0]
    if count == 0:
        return out + 0.0 * model.head(hidden.reshape(-1, hidden.shape[-1])[:1]).float().sum()
    recompute = torch.is_grad_enabled()
    pieces = []
    for start in range(0, count, chunk_size):
        part = (rows[start:start + chunk_size], wanted[start:start + chunk_size])
        if recompute:
            pieces.append(torch.utils.checkpoint.checkpoint(_head_logprobs, model.head, *part, use_reentrant=False,
                                                            preserve_rng_state=False))
        else:
            pieces.append(_head_logprobs(model.head, *part))
    return out.masked_scatter(select, torch.cat(pieces) if len(pieces) > 1 else pieces[0])


def masked_logprobs(model, input_ids: torch.Tensor, targets: torch.Tensor, select: torch.Tensor, *,
                    attn_backend: str | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK, **layout) -> torch.Tensor:
    """``log p(targets)`` (fp32) at ``select`` positions of one forward of ``model`` on ``input_ids``; 0 elsewhere.

    ``layout`` is :func:`model_inputs` (``attention_mask`` or ``cu_seqlens``). ``chunk_size > 0``: the chunked
    head of :func:`hidden_logprobs` (never materialises ``[B, L, V]``); ``0``: full logits, then select (the
    reference path). Both give the same values and gradients.
    """
    if chunk_size == 0:
        logits = aligned_logits(model, input_ids, attn_backend=attn_backend, **layout)
        return selected_logprobs(logits, targets, select)
    out = model(input_ids, attn_backend=attn_backend, return_hidden=True, **layout)
    return hidden_logprobs(model, out.last_hidden_state, targets, select, cu_seqlens=layout.get("cu_seqlens"),
                           chunk_size=chunk_size)


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """``log p(target)`` in fp32 at ``select`` positions, 0 elsewhere (``[..., S]``).

    The log-softmax runs only on the selected rows (memory ~ #selected x V). When nothing is selected the
    result still depends on ``logits`` (times 0) so every rank runs the same backward collectives.
    """
    values = token_logprobs(logits[select], targets[select])
    out = torch.zeros(targets.shape, dtype=torch.float32, device=logits.device).masked_scatter(select, values)
    if not bool(select.any()):
        out = out + 0.0 * logits.sum()
    return out


def mc_elbo(model, input_ids: torch.Tensor, views, example_index: torch.Tensor, *, inverse_t: bool = True,
            attn_backend: str | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK,
            **layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example Monte-Carlo ELBO terms of ``model`` on stored corruptions ``views`` (``[R, n, S]``).

    One forward per MC sample (memory of one graph per sample while gradients are kept). Calling it for the
    policy and the reference with the *same* ``views`` is the antithetic (shared-noise) estimator of VRPO:
    equal models give exactly equal terms. Returns ``(example indices [E], terms [E, n])``; average the last
    dim for the estimate (:func:`dare.diffusion.sequence_elbo` for the per-term definition).
    """
    from dare.diffusion.elbo import sequence_elbo

    n = views.noisy_ids.shape[1]
    logps = []
    for m in range(n):
        logps.append(masked_logprobs(model, views.noisy_ids[:, m], input_ids, views.mask[:, m],
                                     attn_backend=attn_backend, chunk_size=chunk_size, **layout))
    return sequence_elbo(torch.stack(logps, 1), views.mask, views.p_mask, example_index, inverse_t=inverse_t)
