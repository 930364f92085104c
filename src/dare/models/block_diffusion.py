"""The ``[noisy ; clean]`` layout of block-diffusion training (BD3LM / SDAR / LLaDA2; algorithms.md 1.2).

One forward over the concatenation ``[z ; x]`` (noisy copy first, clean copy second, both at the same positions)
computes, for every block ``b`` at once, the prediction of the noisy block ``z_b`` from itself and the clean
blocks before it. Query ``q`` may attend key ``k`` (same sequence / packed document) iff

* noisy -> noisy: same block (bidirectional inside the noisy block),
* noisy -> clean: the key's block is strictly earlier,
* clean -> clean: the key's block is not later (block-causal),

and never clean -> noisy. The logits of the noisy half therefore equal those of a block-causal forward over
``[x_{<b} ; z_b]`` for every block ``b`` (tested), which is what makes the trick exact.

The rule is a FlexAttention ``mask_mod`` passed as ``model(..., attention_rule=...)``: the ``flex`` backend
builds a sparse ``BlockMask`` from it, ``sdpa``/``eager`` materialise it densely. Block ids come from positions
inside each sequence: ``block_origin="global"`` anchors the grid at position 0 (as the reference samplers do),
``"response"`` starts a fresh block at the response (prompt tokens keep ``pos // block_size``, response token
``j`` gets ``ceil(P / block_size) + (pos_j - P) // block_size``).

The SFT objective (noise, weights, normalisation) lives in :mod:`dare.diffusion`; this module only builds the
inputs, positions and attention rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dare.errors import InputError, unknown_choice
from dare.models.attention import MaskMod, documents_from_cu_seqlens
from dare.models.layers import default_positions

BLOCK_ORIGINS = ("global", "response")


def block_ids(
    positions: torch.Tensor,
    block_size: int,
    *,
    block_origin: str = "global",
    prompt_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Block index of every token from its position inside its sequence.

    Args:
        positions: ``[B, n]`` positions (restarting at 0 in every sequence / packed document).
        block_size: block length ``B'``.
        block_origin: ``global`` (``pos // block_size``) or ``response`` (fresh block at the response start).
        prompt_lengths: prompt length ``P`` per row ``[B]`` or per token ``[B, n]`` (packed rows: the prompt length
            of each token's document); required for ``response``.
    """
    if block_origin not in BLOCK_ORIGINS:
        raise unknown_choice("block origin", block_origin, BLOCK_ORIGINS)
    if not isinstance(block_size, int) or block_size < 1:
        raise InputError(f"block_size must be a positive integer; got {block_size!r}")
    positions = positions.long()
    if block_origin == "global":
        return positions // block_size
    if prompt_lengths is None:
        raise InputError("block_origin='response' needs prompt_lengths")
    prompt = prompt_lengths.to(device=positions.device, dtype=torch.long)
    if prompt.ndim == 1:
        prompt = prompt[:, None]
    prompt_blocks = (prompt + block_size - 1) // block_size
    response = prompt_blocks + (positions - prompt).clamp(min=0) // block_size
    return torch.where(positions < prompt, positions // block_size, response)


def block_diffusion_mask_mod(
    block: torch.Tensor, clean: torch.Tensor, document: torch.Tensor | None = None
) -> MaskMod:
    """The two-copy visibility rule over the tokens of a concatenated row, as a FlexAttention ``mask_mod``.

    Args:
        block: ``[B, S]`` block id of every token of the concatenated input.
        clean: ``[B, S]`` bool, True for tokens of the clean copy.
        document: ``[B, S]`` sequence id (packed rows); tokens of different documents never attend.

    An all-clean row gives plain block-causal attention over ``block``.
    """
    if block.shape != clean.shape or (document is not None and document.shape != block.shape):
        raise InputError("block, clean and document must all have shape [batch, tokens]")
    clean = clean.bool()

    def mod(b, h, q, k):
        qb, kb = block[b, q], block[b, k]
        qc, kc = clean[b, q], clean[b, k]
        allowed = ((~qc) & (~kc) & (kb == qb)) | ((~qc) & kc & (kb < qb)) | (qc & kc & (kb <= qb))
        if document is not None:
            allowed = allowed & (document[b, q] == document[b, k])
        return allowed

    return mod


@dataclass(frozen=True)
class TwoCopyInputs:
    """Model inputs of one ``[noisy ; clean]`` forward.

    Attributes:
        input_ids: ``[B, 2n]`` noisy tokens then clean tokens.
        position_ids: ``[B, 2n]`` the ``n`` positions, twice.
        attention_mask: ``[B, 2n]`` padding mask (both copies) or None.
        attention_rule: the :func:`block_diffusion_mask_mod` of this batch.
        block_ids: ``[B, n]`` block of every token of one copy.
        noisy_length: ``n``; the loss uses outputs ``[:, :n]`` (see :meth:`noisy_half`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    attention_rule: MaskMod
    block_ids: torch.Tensor
    noisy_length: int

    def model_kwargs(self) -> dict:
        """Keyword arguments of the model forward: ``model(**inputs.model_kwargs(), attn_backend=...)``."""
        return dict(
            input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=self.attention_mask,
            attention_rule=self.attention_rule,
        )

    def noisy_half(self, tensor: torch.Tensor) -> torch.Tensor:
        """The noisy-copy part ``[:, :n]`` of a per-token output (logits, hidden states)."""
        return tensor[:, : self.noisy_length]


def two_copy_inputs(
    noisy_ids: torch.Tensor,
    clean_ids: torch.Tensor,
    block_size: int,
    *,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    block_origin: str = "global",
    prompt_lengths: torch.Tensor | None = None,
) -> TwoCopyInputs:
    """Build the ``[z ; x]`` inputs of block-diffusion training.

    Args:
        noisy_ids / clean_ids: ``[B, n]`` corrupted and clean tokens (same padding, same layout).
        block_size: block length ``B'`` (the family default is ``dare.family_of(model).block_size``).
        attention_mask: ``[B, n]`` padding mask (left or right padding); positions count real tokens.
        cu_seqlens: documents of a packed ``[1, n]`` row; they never attend to each other and positions
            restart in each.
        position_ids: ``[B, n]`` explicit positions (default: from ``attention_mask`` / ``cu_seqlens``).
        block_origin: ``global`` or ``response`` (see the module docstring).
        prompt_lengths: prompt length per row ``[B]`` (per document ``[num_docs]`` when packed), in real
            tokens; required for ``response``.
    """
    if noisy_ids.ndim != 2 or noisy_ids.shape != clean_ids.shape:
        raise InputError(
            f"noisy_ids and clean_ids must both be [batch, length]; got {list(noisy_ids.shape)} and {list(clean_ids.shape)}"
        )
    batch, n = clean_ids.shape
    device = clean_ids.device
    document = doc_positions = None
    if cu_seqlens is not None:
        if batch != 1:
            raise InputError("packed inputs (cu_seqlens) must be a single row [1, total_tokens]")
        doc, doc_positions = documents_from_cu_seqlens(cu_seqlens.to(device), n)
        document = doc[None, :].repeat(1, 2)
        if prompt_lengths is not None:
            if prompt_lengths.shape != (cu_seqlens.numel() - 1,):
                raise InputError(
                    f"prompt_lengths of a packed row need one entry per document ({cu_seqlens.numel() - 1}); "
                    f"got shape {list(prompt_lengths.shape)}"
                )
            prompt_lengths = prompt_lengths.to(device)[doc][None, :]
    elif prompt_lengths is not None and prompt_lengths.shape != (batch,):
        raise InputError(f"prompt_lengths must have shape [batch] = [{batch}]; got {list(prompt_lengths.shape)}")
    if attention_mask is not None and tuple(attention_mask.shape) != (batch, n):
        raise InputError(f"attention_mask must have shape [{batch}, {n}]; got {list(attention_mask.shape)}")
    if position_ids is None:
        position_ids = default_positions(batch, n, device, attention_mask, doc_positions)
    elif tuple(position_ids.shape) != (batch, n):
        raise InputError(f"position_ids must have shape [{batch}, {n}]; got {list(position_ids.shape)}")
    blocks = block_ids(position_ids, block_size, block_origin=block_origin, prompt_lengths=prompt_lengths)
    clean = torch.zeros(batch, 2 * n, dtype=torch.bool, device=device)
    clean[:, n:] = True
    rule = block_diffusion_mask_mod(blocks.repeat(1, 2), clean, document)
    return TwoCopyInputs(
        input_ids=torch.cat([noisy_ids, clean_ids], dim=1),
        position_ids=position_ids.repeat(1, 2),
        attention_mask=None if attention_mask is None else attention_mask.repeat(1, 2),
        attention_rule=rule,
        block_ids=blocks,
        noisy_length=n,
    )
