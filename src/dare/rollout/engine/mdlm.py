"""Static decoding of masked diffusion LMs (LLaDA, Dream, LLaDA-MoE): ``llada``, ``dream``, ``fastdllm*``.

The loop of :func:`dare.rollout.mdlm.denoise_mdlm` rewritten so that one denoising step is a fixed-shape
computation over preallocated buffers (:class:`MdlmState`):

* the canvas ``[B, Pw + G]`` holds every row for the whole run: rows that stop at EOS, and the filler rows of a
  batch bucket, stay in place with ``alive = False`` (they commit nothing and do not advance their step);
* the current block's start is a device scalar; windows, cache slots and commits are ``index_select`` /
  ``index_copy_`` with device indices; the schedule, proposals, selection, step map, log-probs, EOS stop and the
  forward count (``nfe``) are updated on the device;
* the host reads one flag: once per block for the fixed-count decoders (``quota``, ``sequential``), after each
  step for the data-dependent ones (``threshold``, ``factor``, ``dynamic``, ``entropy_bounded``); the step it
  waits for is already queued, so the device idles only for one graph launch.

Resumed and inpainted decodings (``canvas`` / ``step_range`` of :func:`dare.rollout.generate`: IGPO's hints,
d-TreeRPO's branches) get states of their own (``resumable``): the completion starts from the given canvas (its
non-mask tokens are kept, never decoded), decoding starts in the block of ``start`` with that block's remaining
steps (a host-side budget, recorded per value), and a row stops once it has taken ``stop - start`` steps (a device
scalar, so one recording serves every ``stop``).

Step kinds: ``full`` (the whole canvas: every step without a cache, the block-start and refresh forwards with
one) and ``window`` (Fast-dLLM cached steps: the block for ``dual``, ``[start, L)`` for ``prefix``). With greedy
decoding the tokens, log-probs and step maps equal the eager loop's (same ops, float32 confidences instead of
the eager ``model``/``float64`` softmax); with ``T > 0`` samples come from the engine's counter-based streams
(:mod:`dare.rollout.engine.noise`), batch-invariant like the eager ones but not the same numbers.
"""

from __future__ import annotations

import torch

from dare.models.spec import family_of
from dare.rollout.engine.forward import StaticKVCache, static_hidden
from dare.rollout.engine.sampling import propose_static
from dare.rollout.engine.state import StaticState
from dare.rollout.engine.trajectory import StaticTrajectory
from dare.rollout.kernels import FIXED_COUNT_DECODERS, SCHEDULES, select
from dare.rollout.output import RolloutOutput, completion_mask, finished_rows
from dare.rollout.progress import block_progress


class MdlmState(StaticState):
    """Buffers and step functions of one (batch bucket, prompt width, config) shape."""

    def __init__(self, model, config, *, batch: int, prompt_width: int, padded: bool, device, use_graphs: bool,
                 backend: str, resumable: bool = False):
        super().__init__(model, config, batch=batch, device=device, use_graphs=use_graphs, backend=backend)
        self.shift = family_of(model).logit_shift
        self.pw = prompt_width
        self.width = prompt_width + config.gen_length
        long = dict(dtype=torch.long, device=device)
        self.canvas = torch.full((batch, self.width), self.tok.mask, **long)
        self.key_mask = torch.ones((batch, self.width), dtype=torch.bool, device=device) if padded else None
        self.positions = torch.zeros((batch, self.width), **long)
        self.step_map = torch.full((batch, self.gen), -1, **long)
        self.logprobs = torch.zeros((batch, self.gen), dtype=torch.float32, device=device)
        self.confidences = torch.zeros((batch, self.gen), dtype=torch.float32, device=device)
        self.block_steps = torch.zeros(batch, **long)
        self.initial = torch.zeros(batch, **long)
        self.all_slots = torch.arange(self.width, **long)
        self.cache = None if config.cache == "none" else StaticKVCache(len(model.blocks), self.width)
        self.trajectory = None
        if config.record_trajectory:
            most = max(config.gen_length, config.steps)  # a step may commit nothing (Dream's schedule)
            self.trajectory = StaticTrajectory(batch, config.gen_length, most, self.tok.mask, device)
        self.schedule = SCHEDULES[config.schedule]
        self.steps_per_block = max(config.steps // config.num_blocks, 1)
        self.budget = self.steps_per_block  # steps of the current block's schedule (fewer in a resumed first block)
        self.resumable = resumable
        self.given = torch.zeros((batch, self.gen), dtype=torch.bool, device=device) if resumable else None
        self.stop_after = torch.zeros((), **long)  # steps a row may take in this call (resumable states)
        self.start_step, self.canvas_given = 0, False

    # ---- per call ----------------------------------------------------------------------------------
    def load(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, seeds: list[int],
             canvas: torch.Tensor | None = None, step_range: tuple[int, int | None] | None = None) -> None:
        """Reset every buffer in place for a new batch (rows past ``len(seeds)`` are inactive fillers); a resumable
        state also takes the starting ``canvas`` ``[n, G]`` and ``step_range`` of :func:`dare.rollout.generate`."""
        if (canvas is not None or step_range is not None) and not self.resumable:
            raise ValueError("a canvas or step_range needs a resumable static state")
        n, p = input_ids.shape
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        fill = list(range(n)) + [0] * (self.batch - n)
        index = torch.tensor(fill, device=self.device)
        prompt = torch.full((self.batch, self.pw), self.tok.pad, dtype=torch.long, device=self.device)
        prompt[:, self.pw - p:] = input_ids.index_select(0, index)
        mask = torch.zeros((self.batch, self.width), dtype=torch.bool, device=self.device)
        mask[:, self.pw - p:self.pw] = real.index_select(0, index)
        mask[:, self.pw:] = True
        self.canvas[:, :self.pw] = prompt
        self.canvas[:, self.pw:] = self.tok.mask
        if self.resumable:
            self.canvas_given = canvas is not None
            if canvas is not None:
                self.canvas[:n, self.pw:] = canvas
            self.given.copy_(self.canvas[:, self.pw:] != self.tok.mask)
            start, stop = step_range if step_range is not None else (0, None)
            self.start_step = start
            self.stop_after.fill_(self.config.steps + self.gen + 1 if stop is None else stop - start)
        if self.key_mask is not None:
            self.key_mask.copy_(mask)
        self.positions.copy_((mask.long().cumsum(-1) - 1).clamp(min=0))
        self.step_map.fill_(-1)
        self.logprobs.zero_()
        self.confidences.zero_()
        self.alive.copy_(self.reset_rows(n, seeds))
        if self.trajectory is not None:
            self.trajectory.reset()

    def begin_block(self, start: int) -> None:
        self.start.fill_(start)
        cols = self.start + self.block_range
        self.initial.copy_((self.canvas.index_select(1, cols) == self.tok.mask).sum(-1))
        self.block_steps.zero_()

    # ---- one step -----------------------------------------------------------------------------------
    def step_full(self) -> None:
        rows = self.start - self.shift + self.block_range
        hidden = static_hidden(self.model, self.canvas, self.positions, key_mask=self.key_mask, cache=self.cache,
                               slots=self.all_slots, key_positions=self.positions, backend=self.backend, keep=rows)
        self.commit(self.model.head(hidden))

    def step_window(self, length: int) -> None:
        query = self.start - self.shift + torch.arange(length, device=self.device)
        keep = None if length == self.lb else self.block_range  # the block's rows lead the window
        hidden = static_hidden(self.model, self.canvas.index_select(1, query), self.positions.index_select(1, query),
                               key_mask=self.key_mask, cache=self.cache, slots=query, key_positions=self.positions,
                               backend=self.backend, keep=keep)
        self.commit(self.model.head(hidden))

    def commit(self, logits: torch.Tensor) -> None:
        config, tok = self.config, self.tok
        cols = self.start + self.block_range
        gcols = cols - self.pw
        block = self.canvas.index_select(1, cols)
        eligible = (block == tok.mask) & self.alive[:, None]
        taking = eligible.any(-1)
        if config.suppress_eos:
            logits = logits.clone()
            logits[..., tok.eos] = float("-inf")
        quota = self.schedule(self.block_steps, self.initial, eligible.sum(-1), self.budget, config.eps)
        proposal = propose_static(logits, eligible, config=config, banned=tok.mask, keys=self.keys,
                                  counters=self.num_steps, positions=gcols[None, :].expand_as(eligible))
        chosen = select(config.decoder, proposal.confidence, eligible, quota, threshold=config.threshold,
                        factor=config.factor, last_rank_quirk=config.factor_last_rank_quirk,
                        entropy_bound=config.entropy_bound)
        if self.trajectory is not None:
            self.record(gcols, block, taking, eligible, chosen, proposal)
        self.canvas.index_copy_(1, cols, torch.where(chosen, proposal.tokens, block))
        for target, value in ((self.step_map, self.num_steps[:, None]), (self.logprobs, proposal.logprob),
                              (self.confidences, proposal.confidence.float())):
            target.index_copy_(1, gcols, torch.where(chosen, value, target.index_select(1, gcols)))
        self.num_steps.add_(taking.long())
        self.block_steps.add_(taking.long())
        self.nfe.add_(taking.any().long())
        if config.eos_early_stop:
            self.alive &= ~finished_rows(self.canvas[:, self.pw:], tok.mask, self.stop_ids)
        if self.resumable:  # the step window of this call ends: the row keeps its remaining masks
            self.alive &= self.num_steps < self.stop_after
        left = (self.canvas.index_select(1, cols) == tok.mask) & self.alive[:, None]
        self.more.copy_(left.any().long())

    def record(self, gcols, block, taking, eligible, chosen, proposal) -> None:
        state = self.canvas[:, self.pw:]
        zeros = torch.zeros(state.shape, dtype=torch.float32, device=self.device)
        no = torch.zeros(state.shape, dtype=torch.bool, device=self.device)

        def spread(window, base):
            return base.index_copy(1, gcols, window)

        self.trajectory.record(
            taking, self.num_steps, states=state.clone(),
            predictions=spread(torch.where(eligible, proposal.tokens, block), state),
            confidences=spread(torch.where(eligible, proposal.confidence.float(), 0.0), zeros),
            logprobs=spread(proposal.logprob, zeros), candidates=spread(eligible, no), transfers=spread(chosen, no),
        )

    # ---- the host loop ------------------------------------------------------------------------------
    def decode(self, progress: bool = False) -> None:
        config = self.config
        cache, refresh = config.cache, config.refresh_every
        fixed = config.decoder in FIXED_COUNT_DECODERS
        num_blocks = config.num_blocks if config.max_blocks is None else min(config.num_blocks, config.max_blocks)
        spb = self.steps_per_block
        first_block = min(self.start_step // spb, num_blocks)  # a resumed decoding starts in the block of its start
        with block_progress(num_blocks - first_block, progress) as advance:
            for b in range(first_block, num_blocks):
                start = self.pw + b * self.lb
                self.begin_block(start)
                # a decoding resumed inside this block spreads the block's remaining masks over its remaining steps
                self.budget = spb - (self.start_step % spb if b == first_block else 0)
                budget = () if self.budget == spb else (self.budget,)  # recorded per budget: it is baked in
                forward = 0
                planned = min(self.budget, self.lb) if fixed else 1
                while True:
                    full = cache == "none" or forward == 0 or (refresh > 0 and forward % refresh == 0)
                    if full:
                        self.runner.run(("full",) + budget, self.step_full)
                    else:
                        length = self.lb + self.shift if cache == "dual" else self.width - start + self.shift
                        self.runner.run(("window", length) + budget, lambda: self.step_window(length))
                    forward += 1
                    if forward >= planned and not self.flag.read(self.more)[0]:
                        break
                advance()
                if (config.eos_early_stop or self.resumable) and not bool(self.flag.read(self.alive.any().long())[0]):
                    break

    @staticmethod
    def needs_padding(input_ids, attention_mask, prompt_width: int, config) -> bool:
        """Whether some canvas column is padding (a rounded prompt width or a padded prompt)."""
        return prompt_width > input_ids.shape[1] or (attention_mask is not None and not bool(attention_mask.all()))

    def output(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> RolloutOutput:
        tok = self.tok
        rows, prompt_length = prompt_ids.shape
        crop = self.pw - prompt_length
        canvas = self.canvas[:rows, crop:].clone()
        step_map = self.step_map[:rows].clone()
        decoded = step_map >= 0
        if self.resumable:  # given tokens are part of the completion
            decoded = decoded | self.given[:rows]
        completion = canvas[:, prompt_length:]
        completion.masked_fill_(~decoded, tok.pad)
        full_mask = torch.ones_like(canvas)
        if self.key_mask is not None:
            full_mask.copy_(self.key_mask[:rows, crop:].long())
        num_steps = self.num_steps[:rows].clone()
        return RolloutOutput(
            sequences=canvas,
            attention_mask=full_mask,
            prompt_length=prompt_length,
            completion=completion,
            completion_mask=completion_mask(completion, tok.stop_ids, decoded),
            logprobs=self.logprobs[:rows].clone(),
            step_map=step_map,
            num_steps=num_steps,
            nfe=int(self.nfe),
            trajectory=None if self.trajectory is None else self.trajectory.build(rows, num_steps),
            confidence_map=self.confidences[:rows].clone(),
            given=self.given[:rows].clone() if self.resumable and self.canvas_given else None,
        )
