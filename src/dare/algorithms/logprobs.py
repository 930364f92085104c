"""Model-facing log-prob helpers shared by the algorithms (the only place algorithms call the model)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dare.diffusion.elbo import token_logprobs
from dare.models.spec import family_of


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
            attn_backend: str | None = None, **layout) -> tuple[torch.Tensor, torch.Tensor]:
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
        logits = aligned_logits(model, views.noisy_ids[:, m], attn_backend=attn_backend, **layout)
        logps.append(selected_logprobs(logits, input_ids, views.mask[:, m]))
    return sequence_elbo(torch.stack(logps, 1), views.mask, views.p_mask, example_index, inverse_t=inverse_t)
