"""Model-facing log-prob helpers shared by the algorithms (the only place algorithms call the model).

:func:`denoising_logits` is the training-time denoiser of any family: one forward over the corrupted ids for
full-attention MDLMs, one forward over the ``[noisy ; clean]`` block-diffusion layout for block-causal families
(``algorithms.md`` 1.2), chosen from ``dare.family_of(model).attention`` through :data:`DENOISERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.diffusion.elbo import token_logprobs
from dare.errors import ConfigError, InputError, unknown_choice
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


@dataclass(frozen=True)
class BlockLayout:
    """How a block-causal model sees a training sequence.

    Attributes:
        size: block length ``B'`` (must match the block length used at inference).
        origin: ``global`` (blocks at ``position // size``, as the SDAR / LLaDA2 samplers) or ``response``
            (the response starts a fresh block; the prompt keeps ``position // size``).
    """

    size: int
    origin: str = "global"

    def __post_init__(self):
        from dare.models.block_diffusion import BLOCK_ORIGINS

        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ConfigError(f"block_size must be a positive integer; got {self.size!r}")
        if self.origin not in BLOCK_ORIGINS:
            raise unknown_choice("block origin", self.origin, BLOCK_ORIGINS)


def prompt_lengths_of(maskable: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Prompt length (offset of the first maskable token) per row ``[R]``, or per packed document ``[D]``.

    A row / document without maskable tokens counts as all prompt (its length).
    """
    maskable = maskable.bool()
    if cu_seqlens is None:
        length = maskable.shape[-1]
        first = maskable.to(torch.int8).argmax(-1)
        return torch.where(maskable.any(-1), first, torch.full_like(first, length))
    if maskable.shape[0] != 1:
        raise InputError("packed batches (cu_seqlens) must be a single row")
    cu = cu_seqlens.to(device=maskable.device, dtype=torch.long)
    lengths = cu.diff()
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    offset = torch.arange(maskable.shape[-1], device=cu.device) - cu[:-1][doc]
    offset = torch.where(maskable[0], offset, lengths[doc])  # non-maskable tokens never win the minimum
    return torch.empty_like(lengths).scatter_reduce(0, doc, offset, reduce="amin", include_self=False)


def _one_copy_logits(model, noisy_ids, clean_ids, *, blocks, prompt_lengths, attn_backend, hidden=False, **layout):
    if hidden:
        out = model(noisy_ids, attn_backend=attn_backend, return_hidden=True, **layout).last_hidden_state
        return family_of(model).align_logits(out, layout.get("cu_seqlens"))
    return aligned_logits(model, noisy_ids, attn_backend=attn_backend, **layout)


def _two_copy_logits(model, noisy_ids, clean_ids, *, blocks, prompt_lengths, attn_backend, hidden=False, **layout):
    from dare.models.block_diffusion import two_copy_inputs
    from dare.models.loading import unwrap

    if blocks is None:  # the model's own block length, blocks anchored at position 0
        blocks = BlockLayout(unwrap(model).block_size)
    inputs = two_copy_inputs(
        noisy_ids, clean_ids, blocks.size, attention_mask=layout.get("attention_mask"),
        cu_seqlens=layout.get("cu_seqlens"), block_origin=blocks.origin,
        prompt_lengths=prompt_lengths if blocks.origin == "response" else None,
    )
    noisy = slice(0, inputs.noisy_length)  # the loss never reads the clean half: no logits for it
    if hidden:
        out = model(**inputs.model_kwargs(), attn_backend=attn_backend, return_hidden=True).last_hidden_state[:, noisy]
    else:
        out = model(**inputs.model_kwargs(), attn_backend=attn_backend, logits_positions=noisy).logits
    return family_of(model).align_logits(out, layout.get("cu_seqlens"))


DENOISERS: dict[str, Callable[..., torch.Tensor]] = {"full": _one_copy_logits, "block_causal": _two_copy_logits}
"""Training-time denoiser per attention topology (``FamilySpec.attention``)."""


def denoising_logits(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, *, blocks: BlockLayout | None = None,
                     prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                     **layout) -> torch.Tensor:
    """Logits ``[R, S, V]`` where position ``i`` predicts clean token ``i`` from the corruption ``noisy_ids``.

    Full-attention families: one forward over ``noisy_ids`` (:func:`aligned_logits`). Block-causal families: one
    forward over ``[noisy ; clean]`` (:func:`dare.models.block_diffusion.two_copy_inputs`) whose noisy half predicts
    noisy block ``b`` from itself and the clean blocks ``< b``; ``blocks`` gives the block length and origin (default:
    the model's block length, ``global``), ``prompt_lengths`` (:func:`prompt_lengths_of`) are needed with
    ``origin="response"``. ``layout`` is ``attention_mask`` (padded) or ``cu_seqlens`` (packed), as from
    :func:`model_inputs`.
    """
    return DENOISERS[family_of(model).attention](model, noisy_ids, clean_ids, blocks=blocks,
                                                 prompt_lengths=prompt_lengths, attn_backend=attn_backend, **layout)


def denoising_hidden(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, *, blocks: BlockLayout | None = None,
                     prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                     **layout) -> torch.Tensor:
    """The final hidden states ``[R, S, D]`` behind :func:`denoising_logits` (same forward, no LM head, same
    alignment: position ``i`` is the state that predicts token ``i``), e.g. for a value head."""
    return DENOISERS[family_of(model).attention](model, noisy_ids, clean_ids, blocks=blocks, hidden=True,
                                                 prompt_lengths=prompt_lengths, attn_backend=attn_backend, **layout)


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
            attn_backend: str | None = None, blocks: BlockLayout | None = None,
            prompt_lengths: torch.Tensor | None = None, **layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example Monte-Carlo ELBO terms of ``model`` on stored corruptions ``views`` (``[R, n, S]``).

    One forward per MC sample (memory of one graph per sample while gradients are kept). Calling it for the
    policy and the reference with the *same* ``views`` is the antithetic (shared-noise) estimator of VRPO:
    equal models give exactly equal terms. Returns ``(example indices [E], terms [E, n])``; average the last
    dim for the estimate (:func:`dare.diffusion.sequence_elbo` for the per-term definition). Block-causal families
    use the ``[noisy ; clean]`` layout (:func:`denoising_logits`; ``blocks`` / ``prompt_lengths`` as there).
    """
    from dare.diffusion.elbo import sequence_elbo

    n = views.noisy_ids.shape[1]
    logps = []
    for m in range(n):
        logits = denoising_logits(model, views.noisy_ids[:, m], input_ids, blocks=blocks, prompt_lengths=prompt_lengths,
                                  attn_backend=attn_backend, **layout)
        logps.append(selected_logprobs(logits, input_ids, views.mask[:, m]))
    return sequence_elbo(torch.stack(logps, 1), views.mask, views.p_mask, example_index, inverse_t=inverse_t)
