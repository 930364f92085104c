"""Model-facing log-prob helpers shared by the algorithms (the only place algorithms call the model).

**Denoiser.** The training-time denoiser of any family is one forward chosen from
``dare.family_of(model).attention`` through :data:`DENOISERS`: over the corrupted ids for full-attention MDLMs,
over the ``[noisy ; clean]`` block-diffusion layout for block-causal families (``algorithms.md`` 1.2), whose
noisy half predicts noisy block ``b`` from itself and the clean blocks before it (:func:`denoiser_outputs`).

**Log-probs.** Algorithms need ``log p(target)`` only at the scored (masked) positions. :func:`masked_logprobs`
runs the denoiser without the LM head (hidden states of the noisy positions, aligned with the family's logit
shift: :func:`denoising_hidden`), keeps the selected positions and applies the head to them ``chunk_size`` rows
at a time with an fp32 log-softmax per chunk (:func:`hidden_logprobs`); in the backward pass each chunk is
recomputed.
The ``[B, L, V]`` logits are never materialised (LLaDA-8B: 126464 x 2 bytes per token) and the head's matmuls
run on the selected rows only. ``chunk_size=0`` is the plain path (the model's logits at every noisy position,
then select, :func:`denoising_logits`): the reference the chunked path is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from tensordict import TensorDict

from dare.diffusion.elbo import token_logprobs
from dare.errors import ConfigError, InputError, unknown_choice
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


# ------------------------------------------------------------------------------------------- denoiser
def _one_copy(model, noisy_ids, clean_ids, *, blocks, prompt_lengths, attn_backend, hidden, sequence=None, **layout):
    if sequence is not None:
        return model(noisy_ids, attn_backend=attn_backend, return_hidden=True, sequence_parallel=sequence, **layout)
    out = model(noisy_ids, attn_backend=attn_backend, return_hidden=hidden, **layout)
    return out.last_hidden_state if hidden else out.logits


def _two_copy(model, noisy_ids, clean_ids, *, blocks, prompt_lengths, attn_backend, hidden, sequence=None, **layout):
    from dare.models.block_diffusion import two_copy_inputs
    from dare.models.loading import unwrap

    if blocks is None:  # the model's own block length, blocks anchored at position 0
        blocks = BlockLayout(unwrap(model).block_size)
    inputs = two_copy_inputs(
        noisy_ids, clean_ids, blocks.size, attention_mask=layout.get("attention_mask"),
        cu_seqlens=layout.get("cu_seqlens"), block_origin=blocks.origin,
        prompt_lengths=prompt_lengths if blocks.origin == "response" else None,
    )
    if sequence is not None:  # this rank's slice of [noisy ; clean]; the noisy half is positions [0, n)
        return model(**inputs.model_kwargs(), attn_backend=attn_backend, return_hidden=True, sequence_parallel=sequence)
    noisy = slice(0, inputs.noisy_length)  # nothing reads the clean half: no logits for it
    out = model(**inputs.model_kwargs(), attn_backend=attn_backend, return_hidden=hidden, logits_positions=noisy)
    return inputs.noisy_half(out.last_hidden_state) if hidden else out.logits


DENOISERS: dict[str, Callable[..., torch.Tensor]] = {"full": _one_copy, "block_causal": _two_copy}
"""Training-time denoiser per attention topology (``FamilySpec.attention``): ``fn(model, noisy_ids, clean_ids, *,
blocks, prompt_lengths, attn_backend, hidden, **layout)`` -> the raw outputs at the ``[R, S]`` noisy positions.
With ``sequence=`` (sequence parallelism) -> the model output of this rank's shard of the (padded) row
(``last_hidden_state`` and ``sequence_slice``), whose noisy positions are ``[0, S)``."""


def denoiser_outputs(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, *, hidden: bool = False,
                     blocks: BlockLayout | None = None, prompt_lengths: torch.Tensor | None = None,
                     attn_backend: str | None = None, **layout) -> torch.Tensor:
    """Raw outputs of the denoiser at the noisy positions: final hidden states ``[R, S, D]`` (``hidden=True``; apply
    ``model.head`` yourself) or logits ``[R, S, V]``, before the family's logit shift.

    Full-attention families: one forward over ``noisy_ids``. Block-causal families: one forward over ``[noisy ;
    clean]`` (:func:`dare.models.block_diffusion.two_copy_inputs`) whose noisy half predicts noisy block ``b`` from
    itself and the clean blocks ``< b``; ``blocks`` gives the block length and origin (default: the model's block
    length, ``global``), ``prompt_lengths`` (:func:`prompt_lengths_of`) are needed with ``origin="response"``.
    ``layout`` is ``attention_mask`` (padded) or ``cu_seqlens`` (packed), as from :func:`model_inputs`.
    """
    return DENOISERS[family_of(model).attention](model, noisy_ids, clean_ids, blocks=blocks,
                                                 prompt_lengths=prompt_lengths, attn_backend=attn_backend,
                                                 hidden=hidden, **layout)


def denoising_logits(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, *, blocks: BlockLayout | None = None,
                     prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                     **layout) -> torch.Tensor:
    """Logits ``[R, S, V]`` where position ``i`` predicts clean token ``i`` from the corruption ``noisy_ids``
    (:func:`denoiser_outputs`, then the family's shift per packed document). Materialises every noisy position's
    logits: the plain path; losses use :func:`masked_logprobs`."""
    logits = denoiser_outputs(model, noisy_ids, clean_ids, blocks=blocks, prompt_lengths=prompt_lengths,
                              attn_backend=attn_backend, **layout)
    return family_of(model).align_logits(logits, layout.get("cu_seqlens"))


def denoising_hidden(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, *, blocks: BlockLayout | None = None,
                     prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                     **layout) -> torch.Tensor:
    """The final hidden states ``[R, S, D]`` behind :func:`denoising_logits` (same forward, no LM head, same
    alignment: position ``i`` is the state that predicts token ``i``): the input of :func:`hidden_logprobs`, or
    of a value head."""
    hidden = denoiser_outputs(model, noisy_ids, clean_ids, hidden=True, blocks=blocks, prompt_lengths=prompt_lengths,
                              attn_backend=attn_backend, **layout)
    return family_of(model).align_logits(hidden, layout.get("cu_seqlens"))


# ------------------------------------------------------------------------------------------- log-probs
def _temperatures(temperature, shape: torch.Size, device) -> torch.Tensor | None:
    """``temperature`` (a float or one per row ``[R]``) as ``[R, S]`` fp32, or None."""
    if temperature is None:
        return None
    temp = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    return (temp[:, None] if temp.ndim == 1 else temp).expand(shape)


def _without(logits: torch.Tensor, banned: tuple[int, ...]) -> torch.Tensor:
    """``logits`` with the ``banned`` token ids removed from the distribution (logit -inf)."""
    if not banned:
        return logits
    return logits.index_fill(-1, torch.as_tensor(banned, device=logits.device), float("-inf"))


def _head_logprobs(head, rows: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None,
                   banned: tuple[int, ...] = ()) -> torch.Tensor:
    logits = head(rows)
    if temperature is not None:
        logits = logits / temperature[:, None].to(logits.dtype)
    return token_logprobs(_without(logits, banned), targets)


def hidden_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, select: torch.Tensor, *,
                    chunk_size: int = DEFAULT_LOGITS_CHUNK,
                    temperature: torch.Tensor | float | None = None, banned: tuple[int, ...] = ()) -> torch.Tensor:
    """``log p(target)`` in fp32 at ``select`` positions (0 elsewhere) from aligned final hidden states ``[R, S, D]``.

    ``hidden`` is :func:`denoising_hidden` (position ``i`` holds the state that predicts token ``i``: the head is
    position-wise, so aligning hidden states equals aligning logits). ``model.head`` runs on the selected rows
    only, ``chunk_size`` rows at a time, each chunk recomputed in the backward pass. ``temperature`` (a float or one
    per row ``[R]``) divides the logits; ``banned`` token ids are removed from the distribution (renormalised
    without them, as the samplers never propose the mask token). When nothing is selected the result still
    depends on the head and ``hidden`` (times 0) so every rank runs the same backward collectives.
    """
    if chunk_size < 1:
        raise ConfigError(f"the logits chunk size must be positive (0 = full logits); got {chunk_size}")
    temps = _temperatures(temperature, targets.shape, hidden.device)
    return _scatter_logprobs(model, hidden, hidden[select], targets, select, temps, chunk_size, banned)


def _scatter_logprobs(model, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, select: torch.Tensor,
                      temps: torch.Tensor | None, chunk_size: int, banned: tuple[int, ...] = ()) -> torch.Tensor:
    """The chunked head on ``rows`` (the hidden states scoring ``targets[select]``, in row-major order of
    ``select``), scattered into ``[R, S]`` zeros, ``banned`` token ids removed from the distribution. Without rows
    the result still depends on the head and ``hidden`` (times 0), so every rank runs the same backward
    collectives."""
    wanted = targets[select]
    temps = None if temps is None else temps[select]
    out = torch.zeros(targets.shape, dtype=torch.float32, device=hidden.device)
    count = rows.shape[0]
    if count == 0:
        return out + 0.0 * model.head(hidden.reshape(-1, hidden.shape[-1])[:1]).float().sum()
    recompute = torch.is_grad_enabled()
    pieces = []
    for start in range(0, count, chunk_size):
        part = (rows[start:start + chunk_size], wanted[start:start + chunk_size],
                None if temps is None else temps[start:start + chunk_size], tuple(banned))
        if recompute:
            pieces.append(torch.utils.checkpoint.checkpoint(_head_logprobs, model.head, *part, use_reentrant=False,
                                                            preserve_rng_state=False))
        else:
            pieces.append(_head_logprobs(model.head, *part))
    return out.masked_scatter(select, torch.cat(pieces) if len(pieces) > 1 else pieces[0])


def aligned_sources(model, rows: int, length: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """``[R, S]`` raw position whose output predicts each token after the family's logit shift (identity for
    unshifted families; Dream: the previous position, a document's first token its own), from
    ``FamilySpec.align_logits`` applied to the position indices."""
    index = torch.arange(length, device=device)[None, :, None]
    return family_of(model).align_logits(index, cu_seqlens)[..., 0].expand(rows, length)


def sharded_logprobs(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, select: torch.Tensor, *, sequence,
                     targets: torch.Tensor, blocks: BlockLayout | None = None,
                     prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                     chunk_size: int = DEFAULT_LOGITS_CHUNK, temperature: torch.Tensor | float | None = None,
                     banned: tuple[int, ...] = (), **layout) -> torch.Tensor:
    """:func:`masked_logprobs` under sequence parallelism (``sequence``: a
    :class:`dare.distributed.sequence.SequenceParallel`; every rank of its group calls it with the same batch).

    One sharded denoiser forward; this rank scores the selected tokens whose (shift-aligned) hidden state lies in
    its slice of the row - so a Dream token at the start of a shard is scored by the rank holding the previous
    position - and the group sums the per-token results. Every rank returns the full ``[R, S]`` log-probs; the
    gradient of each entry flows back through the rank that computed it only. ``chunk_size=0`` scores all owned
    rows in one chunk (the same values).
    """
    out = DENOISERS[family_of(model).attention](model, noisy_ids, clean_ids, blocks=blocks,
                                                prompt_lengths=prompt_lengths, attn_backend=attn_backend,
                                                hidden=True, sequence=sequence, **layout)
    hidden, window = out.last_hidden_state, out.sequence_slice
    source = aligned_sources(model, *targets.shape, layout.get("cu_seqlens"), hidden.device)
    owned = select & (source >= window.start) & (source < window.stop)
    row, _ = owned.nonzero(as_tuple=True)
    local = hidden[row, source[owned] - window.start]  # [N, D] in row-major order of ``owned``
    temps = _temperatures(temperature, targets.shape, hidden.device)
    chunk = chunk_size or max(1, local.shape[0])
    return sequence.sum_shards(_scatter_logprobs(model, hidden, local, targets, owned, temps, chunk, banned))


def selected_logprobs(logits: torch.Tensor, targets: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """``log p(target)`` in fp32 at ``select`` positions, 0 elsewhere (``[..., S]``), from full logits.

    The log-softmax runs only on the selected rows (memory ~ #selected x V). When nothing is selected the
    result still depends on ``logits`` (times 0) so every rank runs the same backward collectives.
    """
    values = token_logprobs(logits[select], targets[select])
    out = torch.zeros(targets.shape, dtype=torch.float32, device=logits.device).masked_scatter(select, values)
    if not bool(select.any()):
        out = out + 0.0 * logits.sum()
    return out


def masked_logprobs(model, noisy_ids: torch.Tensor, clean_ids: torch.Tensor, select: torch.Tensor, *,
                    targets: torch.Tensor | None = None, blocks: BlockLayout | None = None,
                    prompt_lengths: torch.Tensor | None = None, attn_backend: str | None = None,
                    chunk_size: int = DEFAULT_LOGITS_CHUNK, temperature: torch.Tensor | float | None = None,
                    banned: tuple[int, ...] = (), sequence=None, **layout) -> torch.Tensor:
    """``log p(targets)`` (fp32) at ``select`` positions of one denoiser forward on ``noisy_ids``; 0 elsewhere.

    ``targets`` defaults to ``clean_ids`` (the clean copy of block-causal families, :func:`denoiser_outputs` for
    ``blocks`` / ``prompt_lengths`` / ``layout``). ``temperature`` (a float or one per row ``[R]``) divides the
    logits; ``banned`` token ids are removed from the distribution. ``chunk_size > 0``: the chunked head of
    :func:`hidden_logprobs` (never materialises ``[R, S, V]``); ``0``: full logits, then select (the reference
    path). Both give the same values and gradients. ``sequence``: sequence parallelism (:func:`sharded_logprobs`;
    same result).
    """
    targets = clean_ids if targets is None else targets
    options = dict(blocks=blocks, prompt_lengths=prompt_lengths, attn_backend=attn_backend, **layout)
    if sequence is not None:
        return sharded_logprobs(model, noisy_ids, clean_ids, select, sequence=sequence, targets=targets,
                                chunk_size=chunk_size, temperature=temperature, banned=banned, **options)
    if chunk_size == 0:
        logits = denoising_logits(model, noisy_ids, clean_ids, **options)
        temps = _temperatures(temperature, targets.shape, logits.device)
        if temps is not None:
            logits = logits / temps[..., None].to(logits.dtype)
        return selected_logprobs(_without(logits, tuple(banned)), targets, select)
    hidden = denoising_hidden(model, noisy_ids, clean_ids, **options)
    return hidden_logprobs(model, hidden, targets, select, chunk_size=chunk_size, temperature=temperature,
                           banned=banned)


def mc_elbo(model, input_ids: torch.Tensor, views, example_index: torch.Tensor, *, inverse_t: bool = True,
            attn_backend: str | None = None, blocks: BlockLayout | None = None,
            prompt_lengths: torch.Tensor | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK, sequence=None,
            **layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example Monte-Carlo ELBO terms of ``model`` on stored corruptions ``views`` (``[R, n, S]``).

    One forward per MC sample (memory of one graph per sample while gradients are kept). Calling it for the
    policy and the reference with the *same* ``views`` is the antithetic (shared-noise) estimator of VRPO:
    equal models give exactly equal terms. Returns ``(example indices [E], terms [E, n])``; average the last
    dim for the estimate (:func:`dare.diffusion.sequence_elbo` for the per-term definition). Log-probs come
    from :func:`masked_logprobs` (block-causal families: the ``[noisy ; clean]`` layout; ``blocks`` /
    ``prompt_lengths`` / ``chunk_size`` as there).
    """
    from dare.diffusion.elbo import sequence_elbo

    n = views.noisy_ids.shape[1]
    logps = []
    for m in range(n):
        logps.append(masked_logprobs(model, views.noisy_ids[:, m], input_ids, views.mask[:, m], blocks=blocks,
                                     prompt_lengths=prompt_lengths, attn_backend=attn_backend, chunk_size=chunk_size,
                                     sequence=sequence, **layout))
    return sequence_elbo(torch.stack(logps, 1), views.mask, views.p_mask, example_index, inverse_t=inverse_t)
