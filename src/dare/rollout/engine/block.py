"""Static decoding of block-diffusion LMs (SDAR, TraDo, LLaDA2.0, LLaDA2.1): ``sdar``, ``llada2``, ``llada21*``.

The loop of :func:`dare.rollout.block.denoise_blocks` as fixed-shape steps (:class:`BlockState`). The layout
(:class:`~dare.rollout.block.BlockLayout`) gets a fixed width for every batch of a shape: ``prefix`` = the
rounded prompt width (full prompt blocks right-aligned before it) and enough decode blocks for any prompt
remainder. Rows stay in place when they stop; per-block ``alive``/``post`` flags, the schedule, token editing
and the block's stop rule run on the device. What the host reads (each read waits for the queued steps, and the
GPU idles until the host queues the next one):

* fixed-count decoders (``quota``, ``sequential``) without token editing: nothing inside a block after the first.
  A block that starts fully masked takes exactly its schedule's steps (:meth:`BlockState.planned_steps`; the
  schedule's last step flushes the masks left), so they are queued back to back; a device flag records a block
  that would have needed more, and the decode raises if one did (:meth:`BlockState.check_plan`);
* the first block (it may hold a prompt tail) and the decoders that commit by confidence: whether any row still
  steps, after every step;
* with ``eos_early_stop``: whether any row goes on, once per block (without it, rows stop only at their last
  block, which the host knows).

Forwards write this call's keys/values into their columns of a preallocated cache and attend to every column
under the block-causal rule (:mod:`dare.rollout.engine.forward`), so later columns are never seen:

* ``cache="block"``: the first step of block ``k`` runs the previous block's final tokens with the block
  (the prompt prefix with the first block), later steps the block alone - the eager engine's forwards;
* ``cache="none"``: every step runs the whole canvas (one shape for every block; the columns after the current
  block cannot influence it under the block-causal rule, so the tokens are the full recompute's).

With the block cache a step of block ``k`` attends over the cache columns up to the block's end rounded up to a
bucket (the later columns are masked by the block-causal rule anyway): a step is recorded once per bucket instead
of once, and the attention reads ~prompt + generation / 2 columns on average instead of all. Buckets are
:data:`KV_BUCKET` columns, widened so that one shape has at most :data:`MAX_KV_BUCKETS` of them (long
generations would otherwise record dozens of graphs per shape).
"""

from __future__ import annotations

import torch

from dare.rollout.block import BlockLayout
from dare.rollout.engine.forward import StaticKVCache, static_hidden
from dare.rollout.engine.sampling import propose_static
from dare.rollout.engine.state import StaticState
from dare.rollout.engine.trajectory import StaticTrajectory
from dare.rollout.kernels import FIXED_COUNT_DECODERS, NEG_INF, linear_quota, select, select_edits
from dare.rollout.output import RolloutOutput, completion_mask, finished_rows
from dare.rollout.progress import block_progress


KV_BUCKET = 64
"""Granularity of the cache columns a block-cache step attends over (steps are recorded per bucket)."""
MAX_KV_BUCKETS = 8
"""Most buckets of one shape (the bucket widens in multiples of :data:`KV_BUCKET` for wide canvases)."""


class BlockState(StaticState):
    """Buffers and step functions of one (batch bucket, prompt width, config) shape."""

    def __init__(self, model, config, *, batch: int, prompt_width: int, padded: bool, device, use_graphs: bool,
                 backend: str):
        super().__init__(model, config, batch=batch, device=device, use_graphs=use_graphs, backend=backend)
        self.prefix = -(-prompt_width // self.lb) * self.lb
        self.decode_blocks = -(-(self.lb - 1 + self.gen) // self.lb)
        self.width = self.prefix + self.decode_blocks * self.lb
        self.padded = padded
        long = dict(dtype=torch.long, device=device)
        region = self.width - self.prefix
        self.step_at = torch.full((batch, region), -1, **long)
        self.local_at = torch.full((batch, region), -1, **long)
        self.logp_at = torch.zeros((batch, region), dtype=torch.float32, device=device)
        self.conf_at = torch.zeros((batch, region), dtype=torch.float32, device=device)
        self.block_step = torch.zeros(batch, **long)
        self.post = torch.zeros(batch, **long)
        self.active = torch.zeros(batch, dtype=torch.bool, device=device)
        self.has_mask = torch.zeros(batch, dtype=torch.bool, device=device)
        self.all_columns = torch.arange(self.width, **long)
        self.cache = StaticKVCache(len(model.blocks), self.width)
        self.layout: BlockLayout | None = None
        self.editing = bool(config.editing_threshold)
        self.max_post = config.max_post_steps if self.editing else 0
        self.trajectory = None
        if config.record_trajectory:
            most = self.decode_blocks * (self.lb + self.max_post + 1)
            self.trajectory = StaticTrajectory(batch, self.gen, most, self.tok.mask, device)
        self.blocks_needed = 0
        self.overrun = torch.zeros((), dtype=torch.bool, device=device)

    # ---- per call ----------------------------------------------------------------------------------
    def load(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, seeds: list[int]) -> None:
        n = input_ids.shape[0]
        index = torch.tensor(list(range(n)) + [0] * (self.batch - n), device=self.device)
        ids = input_ids.index_select(0, index)
        mask = None if attention_mask is None else attention_mask.index_select(0, index)
        layout = BlockLayout.build(ids, mask, self.lb, self.gen, self.tok.mask, self.tok.pad, prefix=self.prefix,
                                   decode_blocks=self.decode_blocks)
        if self.padded:
            layout.key_mask = torch.ones_like(layout.canvas, dtype=torch.bool) if layout.key_mask is None \
                else layout.key_mask.bool()
        else:
            layout.key_mask = None
        if self.layout is None:
            self.layout = layout
        else:  # same shapes: copy into the buffers the recorded steps read
            for name in ("canvas", "positions", "prompt_tail", "num_blocks", "completion_index", "returned"):
                getattr(self.layout, name).copy_(getattr(layout, name))
            if self.layout.key_mask is not None:
                self.layout.key_mask.copy_(layout.key_mask)
        self.step_at.fill_(-1)
        self.local_at.fill_(-1)
        self.logp_at.zero_()
        self.conf_at.zero_()
        self.active.copy_(self.reset_rows(n, seeds))
        self.overrun.zero_()
        self.blocks_needed = int(layout.num_blocks[:n].max())
        if self.trajectory is not None:
            self.trajectory.reset()

    def begin_block(self, k: int) -> None:
        self.start.fill_(self.prefix + k * self.lb)
        self.block_step.zero_()
        self.post.zero_()
        self.alive.copy_(self.active)
        self.prepare_next()

    def prepare_next(self) -> None:
        """The top of the eager loop: rows with a full block count an edit-only forward and leave past
        ``max_post``; ``more`` = some row still steps."""
        block = self.layout.canvas.index_select(1, self.start + self.block_range)
        self.has_mask.copy_((block == self.tok.mask).any(-1))
        self.post.add_((self.alive & ~self.has_mask).long())
        self.alive &= self.post <= self.max_post
        self.more.copy_(self.alive.any().long())

    # ---- one step -----------------------------------------------------------------------------------
    def kv_length(self, k: int) -> int | None:
        """Cache columns the steps of block ``k`` attend over (None: all; the whole canvas without a cache)."""
        if self.config.cache == "none":
            return None
        bucket = -(-self.width // (MAX_KV_BUCKETS * KV_BUCKET)) * KV_BUCKET
        end = self.prefix + (k + 1) * self.lb
        return min(self.width, -(-end // bucket) * bucket)

    def step(self, first: bool, k: int) -> None:
        layout, lb = self.layout, self.lb
        if self.config.cache == "none":  # the whole canvas: later columns are never attended (block-causal)
            query = self.all_columns
        elif first and k == 0:
            query = torch.arange(self.prefix + lb, device=self.device)
        elif first:
            query = self.start - lb + torch.arange(2 * lb, device=self.device)
        else:
            query = self.start + self.block_range
        rows = None if not first and self.config.cache != "none" else self.start - query[0] + self.block_range
        hidden = static_hidden(self.model, layout.canvas.index_select(1, query), layout.positions.index_select(1, query),
                               key_mask=layout.key_mask, cache=self.cache, slots=query, key_positions=layout.positions,
                               block_size=lb, backend=self.backend, kv_length=self.kv_length(k), keep=rows)
        self.commit(self.model.head(hidden))

    def commit(self, logits: torch.Tensor) -> None:
        config, tok, layout = self.config, self.tok, self.layout
        cols = self.start + self.block_range
        rcols = cols - self.prefix
        block = layout.canvas.index_select(1, cols)
        if config.suppress_eos:
            logits = logits.clone()
            logits[..., tok.eos] = NEG_INF
        alive = self.alive
        masked = (block == tok.mask) & alive[:, None]
        fixed = layout.prompt_tail.index_select(1, rcols)
        editable = ~masked & ~fixed & alive[:, None] if self.editing else torch.zeros_like(masked)
        candidates = masked | editable
        proposal = propose_static(logits, candidates, config=config, banned=tok.mask, keys=self.keys,
                                  counters=self.num_steps, positions=rcols[None, :].expand_as(masked))
        remaining = masked.sum(-1)
        if config.num_to_transfer is not None:
            quota = torch.clamp(remaining, max=config.num_to_transfer)
        else:
            quota = linear_quota(self.block_step, torch.full_like(remaining, self.lb), remaining, config.block_steps)
        chosen = select(config.decoder, proposal.confidence.masked_fill(~masked, NEG_INF), masked, quota,
                        threshold=config.threshold, factor=config.factor,
                        last_rank_quirk=config.factor_last_rank_quirk, entropy_bound=config.entropy_bound)
        if self.editing:
            chosen |= select_edits(proposal.confidence, editable, proposal.tokens, block, config.editing_threshold)
        if self.trajectory is not None:
            self.record(rcols, block, candidates, chosen, proposal)
        layout.canvas.index_copy_(1, cols, torch.where(chosen, proposal.tokens, block))
        for target, value in ((self.step_at, self.num_steps[:, None]), (self.local_at, self.block_step[:, None]),
                              (self.logp_at, proposal.logprob), (self.conf_at, proposal.confidence.float())):
            target.index_copy_(1, rcols, torch.where(chosen, value, target.index_select(1, rcols)))
        self.num_steps.add_(alive.long())
        self.block_step.add_(alive.long())
        self.nfe.add_(alive.any().long())
        if self.editing:
            self.alive &= self.has_mask | chosen.any(-1)
        self.prepare_next()

    def record(self, rcols, block, candidates, chosen, proposal) -> None:
        layout = self.layout
        region = layout.canvas[:, self.prefix:]
        index = layout.completion_index
        zeros = torch.zeros(region.shape, dtype=torch.float32, device=self.device)
        no = torch.zeros(region.shape, dtype=torch.bool, device=self.device)

        def spread(window, base):
            return base.index_copy(1, rcols, window).gather(1, index)

        self.trajectory.record(
            self.alive, self.num_steps, states=region.gather(1, index),
            predictions=spread(torch.where(candidates, proposal.tokens, block), region),
            confidences=spread(torch.where(candidates, proposal.confidence.float(), 0.0), zeros),
            logprobs=spread(proposal.logprob, zeros), candidates=spread(candidates, no), transfers=spread(chosen, no),
        )

    def end_block(self, k: int) -> None:
        layout = self.layout
        done = layout.num_blocks <= k + 1
        if self.config.eos_early_stop:
            region = layout.canvas[:, self.prefix:]
            done |= finished_rows(region.gather(1, layout.completion_index), self.tok.mask, self.stop_ids)
        self.active &= ~done

    # ---- the host loop ------------------------------------------------------------------------------
    def step_key(self, first: bool, k: int) -> tuple:
        """The recorded step that serves a forward of block ``k`` (one per KV-width bucket)."""
        if self.config.cache == "none":
            kind = ("none",)
        else:
            kind = ("first", 0 if k == 0 else 1) if first else ("inner",)
        return kind + (self.kv_length(k),)

    def planned_steps(self, k: int) -> int | None:
        """The forwards block ``k`` takes when its steps are known in advance: a fixed-count decoder without token
        editing on a block after the first (every such block starts with all its columns masked; the first may hold
        a prompt tail) takes its schedule's steps, the last of which commits every mask left. None otherwise (the
        host reads after each step whether the block goes on)."""
        config = self.config
        if k == 0 or self.editing or config.decoder not in FIXED_COUNT_DECODERS:
            return None
        if config.num_to_transfer is not None:
            return -(-self.lb // config.num_to_transfer)
        return min(config.block_steps or self.lb, self.lb)

    def decode(self, progress: bool = False) -> None:
        blocks = self.blocks_needed
        if self.config.max_blocks is not None:
            blocks = min(blocks, self.config.max_blocks)
        with block_progress(blocks, progress) as advance:
            for k in range(blocks):
                self.begin_block(k)
                planned = self.planned_steps(k)
                for forward in range(planned or 1):  # every block takes a step: it starts with masks
                    self.run_step(forward == 0, k)
                if planned is None:
                    while self.flag.read(self.more)[0]:
                        self.run_step(False, k)
                else:
                    self.overrun |= self.more.bool()  # read once, by check_plan
                self.end_block(k)
                advance()
                if self.config.eos_early_stop and not self.flag.read(self.active.any().long())[0]:
                    break
        self.check_plan()

    def run_step(self, first: bool, k: int) -> None:
        """Queue one step of block ``k`` (its recorded graph, recorded at its first call)."""
        self.runner.run(self.step_key(first, k), lambda: self.step(first, k))

    def check_plan(self) -> None:
        """Raise if a block with planned steps still had masks after them (a schedule that does not flush: a bug,
        never a silently unfinished block)."""
        if self.planned_steps(1) is not None and self.flag.read(self.overrun.long())[0]:
            raise RuntimeError(f"a {self.config.decoder} block still had masks after its scheduled steps "
                               f"({self.planned_steps(1)}): please report this")

    @staticmethod
    def needs_padding(input_ids, attention_mask, prompt_width: int, config) -> bool:
        """Whether some row's prompt blocks end before the layout's fixed prefix (its columns are padding)."""
        lb = config.block_length
        prefix = -(-prompt_width // lb) * lb
        lengths = torch.full((input_ids.shape[0],), input_ids.shape[1]) if attention_mask is None else attention_mask.sum(-1)
        return bool(((lengths // lb) * lb < prefix).any())

    def output(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> RolloutOutput:
        tok, layout = self.tok, self.layout
        rows = prompt_ids.shape[0]
        index = layout.completion_index[:rows]

        def completion(values):
            return values[:rows].gather(1, index).clone()

        step_map = completion(self.step_at)
        decoded = step_map >= 0
        comp = completion(layout.canvas[:, self.prefix:]).masked_fill(~decoded, tok.pad)
        prompt_mask = torch.ones_like(prompt_ids) if attention_mask is None else attention_mask.to(prompt_ids.dtype)
        num_steps = self.num_steps[:rows].clone()
        return RolloutOutput(
            sequences=torch.cat([prompt_ids, comp], dim=1),
            attention_mask=torch.cat([prompt_mask, torch.ones_like(comp)], dim=1),
            prompt_length=prompt_ids.shape[1],
            completion=comp,
            completion_mask=completion_mask(comp, tok.stop_ids, decoded),
            logprobs=completion(self.logp_at),
            step_map=step_map,
            num_steps=num_steps,
            nfe=int(self.nfe),
            trajectory=None if self.trajectory is None else self.trajectory.build(rows, num_steps),
            block_step_map=completion(self.local_at),
            confidence_map=completion(self.conf_at),
        )
