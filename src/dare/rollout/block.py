"""Block-diffusion decoding (SDAR, TraDo, LLaDA2.0, LLaDA2.1) with an exact KV cache across blocks.

Block-causal models (``family.attention == "block_causal"``) put position ``i`` in block ``i // Lb`` (the
grid is anchored at position 0 of the prompt) and let a block attend to itself and earlier blocks only.
The references (JetAstra/SDAR ``block_diffusion_generate``, LLaDA2.0/2.1 ``generate``) decode one block at a
time:

1. blocks ``0 .. P // Lb - 1`` hold only prompt tokens; the ``P mod Lb`` remaining prompt tokens start the
   first decode block and are never overwritten; decode blocks continue until the one holding position
   ``P + G - 1``;
2. inside a block, each step runs the model on the block (attending to everything before it), proposes a
   token per masked position, and commits a selection (:mod:`dare.rollout.kernels`); step ``i`` of ``S``
   commits at least ``k_i = Lb // S + [i < Lb mod S]`` masks (clamped to the masks left);
3. LLaDA2.1 additionally rewrites decoded tokens of the block whose proposal differs with confidence above
   ``editing_threshold`` (token editing), and ends a block only when a forward edits nothing (at most
   ``max_post_steps`` edit-only forwards);
4. a row stops after the block that holds its first stop token (EOS/EOT of the family).

Because earlier blocks never attend to later ones, their keys/values are final once the block is decoded;
``cache="block"`` keeps them: a step runs only the ``Lb`` tokens of the current block against the cache
(``KVCache`` mode ``read``), which is exact (the same logits as recomputing the prefix, up to float
rounding). Storing a finished block's keys/values needs one forward of its final tokens (SDAR's
``store_kv=True`` commit forward); DARE fuses it into the first step of the next block (one forward of
``2 Lb`` tokens, mode ``append``, after which the next block's entries are dropped again) and the prompt
prefill into the first step of the first block, so every forward is a denoising step and ``nfe`` is the
same with and without the cache. ``cache="none"`` recomputes prompt and finished blocks at every step, as
LLaDA2's reference ``generate`` does.

Batches: rows are left-padded, positions count real tokens, and every row keeps the block grid of its
unpadded run (:class:`BlockLayout`); rows decode their ``k``-th decode block together. Each row takes a
step (and draws random numbers) only while its block is unfinished, so a row's result does not depend on
its batch.

Deviations from the references (all documented in the README):

* the scheduled count is clamped to the masks left (SDAR's ``topk(conf, k_step)`` is not, and once fewer
  masks than ``k_step`` remain it re-samples already decoded tokens, including prompt-tail tokens; this
  can only happen when ``block_steps < block_length``);
* the mask token is never proposed (the references may "commit" it, leaving the position masked);
* ``T > 0`` samples by float64 Gumbel-max from per-row generators (the references call ``multinomial``);
  ``T = 0`` is an explicit argmax path (SDAR divides by zero);
* stop ids are the family's EOS and end-of-turn (LLaDA2's reference checks EOS only), and a row leaves at the
  end of its stop block also in LLaDA2.1 mode (its reference decodes to ``gen_length`` unless
  ``eos_early_stop``; tokens up to the stop are the same);
* LLaDA2.1 with editing disabled skips the final edit-only forward of each block (it cannot change
  anything), so it equals the LLaDA2.0 path, nfe included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dare.errors import ConfigError
from dare.models.spec import family_of
from dare.rollout.caching import window_logits
from dare.rollout.config import SamplerConfig
from dare.rollout.kernels import NEG_INF, linear_quota, propose, select, select_edits
from dare.rollout.mdlm import check_prompts
from dare.rollout.progress import progress_bar
from dare.rollout.output import RolloutOutput, TrajectoryRecorder, completion_mask, finished_rows
from dare.rollout.rng import example_generators

# ---------------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------------


@dataclass
class BlockLayout:
    """Column layout of a left-padded batch for block decoding; each row keeps its unpadded block grid.

    Row ``r`` with ``P_r`` real prompt tokens has ``q_r = P_r // Lb`` full prompt blocks, ``rem_r = P_r mod Lb``
    prompt tokens at the start of its first decode block and ``n_r = ceil((rem_r + G) / Lb)`` decode blocks.
    Columns ``[0, prefix)`` hold the full prompt blocks, right-aligned (``prefix = max_r q_r Lb``; padding on
    the left); decode block ``k`` of every row occupies columns ``[prefix + k Lb, prefix + (k + 1) Lb)`` and
    row ``r`` gives it positions ``(q_r + k) Lb ...``. So a cache filled column by column holds, for every
    row, exactly the keys its own run would have cached.

    Attributes:
        canvas: ``[B, prefix + K Lb]`` tokens (mask id where undecided; pad id in the padding).
        key_mask: ``[B, prefix + K Lb]`` 1 for attendable columns (0 = padding), or None without padding.
        positions: ``[B, prefix + K Lb]`` RoPE positions (real-token counts; 0 in the padding).
        prompt_tail: ``[B, K Lb]`` bool, decode-region columns holding prompt tokens (never rewritten).
        num_blocks: ``[B]`` decode blocks ``n_r`` of each row.
        completion_index: ``[B, G]`` decode-region column of completion position ``j`` (``rem_r + j``).
        returned: ``[B, K Lb]`` bool, decode-region columns that are completion positions (not prompt tail, not
            past ``gen_length``).
        prefix: width of the prompt-block prefix.
        block: the block length ``Lb``.
    """

    canvas: torch.Tensor
    key_mask: torch.Tensor | None
    positions: torch.Tensor
    prompt_tail: torch.Tensor
    num_blocks: torch.Tensor
    completion_index: torch.Tensor
    returned: torch.Tensor
    prefix: int
    block: int

    @classmethod
    def build(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, block: int, gen_length: int,
              mask_id: int, pad_id: int, *, prefix: int | None = None,
              decode_blocks: int | None = None) -> BlockLayout:
        """``prefix`` / ``decode_blocks`` fix the layout's width for any prompts that fit (the static engine's
        shapes); by default they are the tightest for these prompts."""
        device = input_ids.device
        batch = input_ids.shape[0]
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        lengths = real.sum(-1)
        full_blocks, rem = lengths // block, lengths % block
        num_blocks = (rem + gen_length + block - 1) // block
        prefix = int(full_blocks.max()) * block if prefix is None else prefix
        width = prefix + (int(num_blocks.max()) if decode_blocks is None else decode_blocks) * block
        canvas = torch.full((batch, width), mask_id, dtype=input_ids.dtype, device=device)
        key_mask = torch.ones((batch, width), dtype=torch.long, device=device)
        positions = torch.zeros((batch, width), dtype=torch.long, device=device)
        prompt_tail = torch.zeros((batch, width - prefix), dtype=torch.bool, device=device)
        for r in range(batch):
            tokens = input_ids[r][real[r]]
            head = int(full_blocks[r]) * block
            canvas[r, :prefix - head] = pad_id
            key_mask[r, :prefix - head] = 0
            canvas[r, prefix - head:prefix] = tokens[:head]
            canvas[r, prefix:prefix + int(rem[r])] = tokens[head:]
            prompt_tail[r, :int(rem[r])] = True
            positions[r, prefix - head:] = torch.arange(width - prefix + head, device=device)
        completion_index = rem[:, None] + torch.arange(gen_length, device=device)[None, :]
        returned = torch.zeros_like(prompt_tail).scatter_(1, completion_index, True)
        return cls(canvas, key_mask if bool((key_mask == 0).any()) else None, positions, prompt_tail, num_blocks,
                   completion_index, returned, prefix, block)

    @property
    def region(self) -> torch.Tensor:
        """The decode region ``[B, K Lb]`` of the canvas (a view)."""
        return self.canvas[:, self.prefix:]

    def completion(self, region_values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Decode-region values ``[n, K Lb]`` (of batch ``rows``) at the completion positions ``[n, G]``."""
        index = self.completion_index if rows is None else self.completion_index[rows]
        return region_values.gather(1, index)


# ---------------------------------------------------------------------------------------------------
# forwards: full recompute or exact block KV cache
# ---------------------------------------------------------------------------------------------------


class FullRecompute:
    """``cache="none"``: every step runs the prompt, the finished blocks and the current block."""

    def __init__(self, model, block: int, full_logits: bool = False, attn_backend: str | None = None):
        self.model = model
        self.kwargs = {"block_size": block, "full_logits": full_logits, "attn_backend": attn_backend}

    def logits(self, canvas, key_mask, positions, start: int, end: int, first: bool) -> torch.Tensor:
        """Logits ``[n, Lb, V]`` of the block ``[start, end)``; ``first`` marks the block's first forward."""
        return window_logits(self.model, canvas[:, :end], start, end - start,
                             attention_mask=None if key_mask is None else key_mask[:, :end],
                             position_ids=positions[:, :end], **self.kwargs)

    def keep(self, rows: torch.Tensor) -> None:
        """Continue with the batch rows ``rows`` only."""


class BlockCache(FullRecompute):
    """``cache="block"``: the keys/values of the prompt blocks and finished blocks are cached (exact).

    The first forward of a block runs every column not yet cached (the prompt prefix before the first block,
    the previous block's final tokens afterwards) plus the block itself in ``append`` mode, then drops the
    block's own entries; later steps run the block alone in ``read`` mode.
    """

    def __init__(self, model, block: int, full_logits: bool = False, attn_backend: str | None = None):
        super().__init__(model, block, full_logits, attn_backend)
        from dare.models.cache import KVCache

        self.cache = KVCache(mode="append")
        self.cached = 0

    def logits(self, canvas, key_mask, positions, start, end, first):
        begin = self.cached if first else start
        self.cache.set_mode("append" if first else "read")
        out = window_logits(self.model, canvas[:, begin:end], start - begin, end - start,
                            attention_mask=None if key_mask is None else key_mask[:, :end],
                            position_ids=positions[:, begin:end], cache=self.cache, **self.kwargs)
        if first:
            self.cache.truncate(start)
            self.cached = start
        return out

    def keep(self, rows):
        self.cache.reorder(rows)


BLOCK_CACHES = {"block": BlockCache, "none": FullRecompute}
"""Forward strategies of the block samplers by ``SamplerConfig.cache``."""


# ---------------------------------------------------------------------------------------------------
# config hooks (used by the sampler registry)
# ---------------------------------------------------------------------------------------------------


def finalize_config(values: dict, given: SamplerConfig) -> None:
    """Block-diffusion defaults: ``block_steps = block_length`` (one token per step unless a parallel decoder
    commits more)."""
    if values["block_steps"] is None and values["block_length"] is not None:
        values["block_steps"] = values["block_length"]


def check_config(config: SamplerConfig) -> None:
    """Block-diffusion constraints (one-line :class:`ConfigError`)."""
    config.choice("cache", BLOCK_CACHES)
    config.reject_fields(("steps",), "it counts denoising steps per block: set block_steps")
    if config.refresh_every:
        raise ConfigError(f"refresh_every applies to the Fast-dLLM caches, not to sampler '{config.sampler}' "
                          "(its block cache is exact)")
    if config.schedule != "linear":
        raise ConfigError(f"sampler '{config.sampler}' uses the linear per-block schedule; got schedule "
                          f"'{config.schedule}'")
    if not 1 <= config.block_steps <= config.block_length:
        raise ConfigError(f"block_steps must be in [1, block_length={config.block_length}]; got {config.block_steps}")
    if config.num_to_transfer is not None and config.num_to_transfer < 1:
        raise ConfigError(f"num_to_transfer must be >= 1; got {config.num_to_transfer}")
    if config.max_post_steps < 0:
        raise ConfigError(f"max_post_steps must be >= 0; got {config.max_post_steps}")
    if config.editing_threshold is not None:
        if not 0 <= config.editing_threshold < 1:
            raise ConfigError(f"editing_threshold must be in [0, 1) (0 = no editing); got {config.editing_threshold}")
        if config.editing_threshold > 0 and config.confidence != "prob":
            raise ConfigError(f"token editing compares probabilities: confidence must be 'prob' "
                              f"(got '{config.confidence}')")


# ---------------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def denoise_blocks(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: SamplerConfig,
    *,
    example_ids: Sequence[int],
    progress: bool = False,
) -> RolloutOutput:
    """Decode ``G = config.gen_length`` tokens after every prompt of the left-padded batch with a block-causal
    model (see the module docstring). ``config`` must be resolved; ``example_ids`` seed the per-row streams.

    Output conventions are those of :mod:`dare.rollout.output`; in addition ``block_step_map`` holds each
    token's step counted from the start of its block (CJ-GRPO's per-block local steps). With token editing
    a position may be written several times: ``step_map``/``block_step_map``/``logprobs`` describe its last
    write, and trajectory ``transfers`` include the edits (they no longer partition the completion). The
    trajectory covers the completion only: prompt-tail tokens and the positions of the last block past
    ``gen_length`` (decoded, as in the references, but not returned) are not in it, so a step that commits only
    such positions has no transfer.
    """
    spec = family_of(model)
    tok = spec.token_ids(model.config)
    check_prompts(input_ids, attention_mask, tok.mask)
    device = input_ids.device
    batch, prompt_len = input_ids.shape
    gen, lb = config.gen_length, config.block_length
    layout = BlockLayout.build(input_ids, attention_mask, lb, gen, tok.mask, tok.pad)
    region = layout.region
    width = region.shape[1]
    generators = example_generators(config.seed, example_ids, device)
    needs_rng = config.temperature > 0 or config.confidence == "random"
    editing = bool(config.editing_threshold)
    max_post = config.max_post_steps if editing else 0  # without editing a full block is final at once
    stop_ids = torch.tensor(tok.stop_ids, device=device)

    step_at = torch.full((batch, width), -1, dtype=torch.long, device=device)  # decode-region coordinates
    local_at = torch.full((batch, width), -1, dtype=torch.long, device=device)
    logp_at = torch.zeros((batch, width), dtype=torch.float32, device=device)
    conf_at = torch.zeros((batch, width), dtype=torch.float32, device=device)
    num_steps = torch.zeros(batch, dtype=torch.long, device=device)
    recorder = TrajectoryRecorder() if config.record_trajectory else None
    strategy = BLOCK_CACHES[config.cache](model, lb, config.full_logits, config.attn_backend)
    rows = torch.arange(batch, device=device)
    bar = progress_bar(batch * gen, progress)
    nfe = 0

    num_decode_blocks = int(layout.num_blocks.max())
    if config.max_blocks is not None:
        num_decode_blocks = min(num_decode_blocks, config.max_blocks)
    for k in range(num_decode_blocks):
        if rows.numel() == 0:
            break
        start, end = layout.prefix + k * lb, layout.prefix + (k + 1) * lb
        lo, hi = k * lb, (k + 1) * lb
        n = rows.numel()
        fixed = layout.prompt_tail[rows, lo:hi]
        returned = layout.returned[rows, lo:hi]
        block_step = torch.zeros(n, dtype=torch.long, device=device)
        post = torch.zeros(n, dtype=torch.long, device=device)
        alive = torch.ones(n, dtype=torch.bool, device=device)
        canvas, key_mask = layout.canvas[rows], None if layout.key_mask is None else layout.key_mask[rows]
        positions = layout.positions[rows]
        row_list = rows.tolist()
        first = True
        while True:
            blk = canvas[:, start:end]
            masked = blk == tok.mask
            has_mask = masked.any(-1)
            post += (alive & ~has_mask).long()
            alive &= post <= max_post
            if not bool(alive.any()):
                break
            logits = strategy.logits(canvas, key_mask, positions, start, end, first)
            first = False
            nfe += 1
            if config.suppress_eos:
                logits[..., tok.eos] = NEG_INF
            masked &= alive[:, None]
            editable = ~masked & ~fixed & alive[:, None] if editing else torch.zeros_like(masked)
            candidates = masked | editable
            proposal = propose(
                logits, candidates, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                confidence=config.confidence, confidence_source=config.confidence_source,
                confidence_dtype=config.confidence_dtype, top_k_first=config.top_k_first,
                generators=[generators[r] for r in row_list] if needs_rng else None, banned=(tok.mask,),
            )
            remaining = masked.sum(-1)
            if config.num_to_transfer is not None:
                quota = torch.minimum(torch.full_like(remaining, config.num_to_transfer), remaining)
            else:
                quota = linear_quota(block_step, torch.full_like(remaining, lb), remaining, config.block_steps)
            chosen = select(config.decoder, proposal.confidence.masked_fill(~masked, NEG_INF), masked, quota,
                            threshold=config.threshold, factor=config.factor,
                            last_rank_quirk=config.factor_last_rank_quirk, entropy_bound=config.entropy_bound)
            if editing:
                chosen |= select_edits(proposal.confidence, editable, proposal.tokens, blk, config.editing_threshold)
            if recorder is not None:
                _record(recorder, layout, rows, alive, num_steps[rows], canvas[:, layout.prefix:], lo, candidates,
                        chosen, proposal)
            canvas[:, start:end] = torch.where(chosen, proposal.tokens, blk)
            step_at[rows, lo:hi] = torch.where(chosen, num_steps[rows, None], step_at[rows, lo:hi])
            local_at[rows, lo:hi] = torch.where(chosen, block_step[:, None], local_at[rows, lo:hi])
            logp_at[rows, lo:hi] = torch.where(chosen, proposal.logprob, logp_at[rows, lo:hi])
            conf_at[rows, lo:hi] = torch.where(chosen, proposal.confidence.float(), conf_at[rows, lo:hi])
            num_steps[rows] += alive.long()
            block_step += alive.long()
            if editing:
                alive &= has_mask | chosen.any(-1)  # a full block ends with a forward that edits nothing
            if bar is not None:
                bar.update(int((chosen & masked & returned).sum()))
        layout.canvas[rows] = canvas
        done = layout.num_blocks[rows] <= k + 1
        if config.eos_early_stop:
            done |= finished_rows(layout.completion(canvas[:, layout.prefix:], rows), tok.mask, stop_ids)
        if bool(done.any()):
            keep = (~done).nonzero().squeeze(-1)
            strategy.keep(keep)
            rows = rows[keep]

    if bar is not None:
        bar.close()
    step_map = layout.completion(step_at)
    decoded = step_map >= 0
    completion = layout.completion(region).masked_fill(~decoded, tok.pad)
    prompt_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    return RolloutOutput(
        sequences=torch.cat([input_ids, completion], dim=1),
        attention_mask=torch.cat([prompt_mask, torch.ones_like(completion)], dim=1),
        prompt_length=prompt_len,
        completion=completion,
        completion_mask=completion_mask(completion, tok.stop_ids, decoded),
        logprobs=layout.completion(logp_at),
        step_map=step_map,
        num_steps=num_steps,
        nfe=nfe,
        trajectory=None if recorder is None else recorder.build(batch, gen, num_steps, tok.mask),
        block_step_map=layout.completion(local_at),
        confidence_map=layout.completion(conf_at),
    )


def _record(recorder, layout, rows, alive, step_index, region, lo, candidates, chosen, proposal) -> None:
    """Store the step of the rows taking it (state before the commit), in completion coordinates."""
    hi = lo + candidates.shape[1]

    def spread(window: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        full = base.clone()
        full[:, lo:hi] = window
        return layout.completion(full, rows)

    zeros = torch.zeros(region.shape, dtype=torch.float32, device=region.device)
    no = torch.zeros(region.shape, dtype=torch.bool, device=region.device)
    predictions = spread(torch.where(candidates, proposal.tokens, region[:, lo:hi]), region)
    confidence = torch.where(candidates, proposal.confidence.float(), 0.0)
    recorder.record(
        rows[alive], step_index[alive], layout.completion(region, rows)[alive], predictions[alive],
        spread(confidence, zeros)[alive], spread(proposal.logprob, zeros)[alive], spread(candidates, no)[alive],
        spread(chosen, no)[alive],
    )
