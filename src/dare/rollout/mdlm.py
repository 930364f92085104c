"""The denoising loop of masked diffusion LMs with full attention (LLaDA, Dream, LLaDA-MoE).

One loop serves every MDLM sampler; the preset only picks kernels (:mod:`dare.rollout.kernels`) and a cache
strategy (:mod:`dare.rollout.caching`):

1. canvas = left-padded prompt + ``G`` mask tokens; positions count real tokens (padding never attended);
2. blocks ``[P + b*Lb, P + (b+1)*Lb)`` left to right; inside a block, while some row has masks there:
   one forward (cache strategy) -> logits of the block -> per-row quota from the schedule -> proposals and
   confidences -> selection rule -> commit;
3. a row that has committed its first stop token with everything before it decoded leaves the batch
   (``eos_early_stop``); the loop ends when no row is left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dare.errors import ConfigError, InputError
from dare.models.spec import family_of
from dare.rollout.caching import CACHES
from dare.rollout.config import SamplerConfig, warn_once, warn_unread
from dare.rollout.kernels import SCHEDULE_DECODERS, SCHEDULES, propose, select
from dare.rollout.registry import get_sampler
from dare.rollout.output import RolloutOutput, TrajectoryRecorder, completion_mask, finished_rows
from dare.rollout.progress import progress_bar
from dare.rollout.rng import example_generators


def finalize_config(values: dict, given: SamplerConfig) -> None:
    """Masked-diffusion defaults: a preset block longer than the generation becomes one block, ``steps``
    defaults to ``gen_length``, and setting ``factor``/``threshold`` (without a decoder) picks that decoder."""
    if values["block_length"] is None or (given.block_length is None and values["block_length"] > values["gen_length"]):
        values["block_length"] = values["gen_length"]
    if values["steps"] is None:
        values["steps"] = values["gen_length"]
    if given.decoder is None:
        if given.factor is not None:
            values["decoder"] = "factor"
        elif given.threshold is not None:
            values["decoder"] = "threshold"
    if values["decoder"] not in SCHEDULE_DECODERS:  # it commits by confidence: a step schedule is never read
        fallbacks = {"steps": values["gen_length"], "schedule": get_sampler(given.sampler).defaults.get("schedule")}
        for key, fallback in fallbacks.items():
            if getattr(given, key) not in (None, fallback):
                warn_unread(key, getattr(given, key), values["decoder"], SCHEDULE_DECODERS)


def check_config(config: SamplerConfig) -> None:
    """Masked-diffusion constraints (one-line :class:`ConfigError`)."""
    config.choice("cache", CACHES)
    config.reject_fields(("block_steps", "editing_threshold", "num_to_transfer"),
                         "block-diffusion samplers only")
    if config.gen_length % config.block_length or config.block_length > config.gen_length:
        raise ConfigError(f"block_length ({config.block_length}) must divide gen_length ({config.gen_length}); unless "
                          f"given, block_length is the {config.sampler} preset's: set it to a divisor of "
                          f"{config.gen_length} (e.g. {math.gcd(config.block_length, config.gen_length)}), or "
                          f"gen_length to a multiple of {config.block_length}")
    if config.steps < 1:
        raise ConfigError(f"steps must be >= 1; got {config.steps}")
    if config.decoder in ("quota", "dynamic", "sequential") and config.steps % config.num_blocks:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of the number of blocks "
            f"(gen_length / block_length = {config.num_blocks})"
        )
    if config.decoder in SCHEDULE_DECODERS and config.schedule == "timestep" and config.steps > config.gen_length:
        # LLaDA's linear schedule commits >= 1 token a step and skips the rest; the timestep one runs them all
        warn_once(("steps beyond gen_length", config.steps, config.gen_length),
                  f"warning: steps {config.steps} > gen_length {config.gen_length}: at most one token per step needs "
                  f"only {config.gen_length}; the timestep schedule runs all {config.steps} forwards")


def check_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, mask_id: int) -> None:
    """Reject batches the sampler cannot decode correctly (one-line :class:`InputError`)."""
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise InputError(f"prompts must be a non-empty [batch, length] tensor; got shape {list(input_ids.shape)}")
    real = torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise InputError(
                f"attention_mask shape {list(attention_mask.shape)} does not match prompts {list(input_ids.shape)}"
            )
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise InputError("attention_mask must hold 0 (padding) and 1 (prompt token) only; got values "
                             f"{attention_mask.unique().tolist()[:6]}")
        real = attention_mask.bool()
        if bool((real[:, :-1] & ~real[:, 1:]).any()):
            raise InputError("prompts must be left-padded (padding before the prompt tokens)")
        if not bool(real.any(-1).all()):
            raise InputError("every prompt needs at least one real token")
    if bool(((input_ids == mask_id) & real).any()):
        raise InputError(f"prompts contain the mask token (id {mask_id}); infilling is not supported")


@torch.no_grad()
def denoise_mdlm(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: SamplerConfig,
    *,
    example_ids: Sequence[int],
    progress: bool = False,
    canvas: torch.Tensor | None = None,
    step_range: tuple[int, int | None] | None = None,
) -> RolloutOutput:
    """Decode ``G = config.gen_length`` tokens after every prompt of the left-padded batch ``input_ids``.

    ``config`` must be resolved (:meth:`SamplerConfig.resolved`); ``example_ids`` seed the per-row random
    streams. ``canvas`` and ``step_range`` resume or inpaint a decoding (:func:`dare.rollout.generate`). See
    :mod:`dare.rollout.output` for the meaning of the returned fields.
    """
    spec = family_of(model)
    tok = spec.token_ids(model.config)
    shift = spec.logit_shift
    check_prompts(input_ids, attention_mask, tok.mask)
    device = input_ids.device
    batch, prompt_len = input_ids.shape
    gen, block = config.gen_length, config.block_length
    given = torch.zeros((batch, gen), dtype=torch.bool, device=device)
    canvas_given = canvas is not None
    start_step, stop_step = step_range if step_range is not None else (0, None)
    if canvas is None:
        canvas = torch.cat([input_ids, input_ids.new_full((batch, gen), tok.mask)], dim=1)
    else:
        given = canvas.to(device) != tok.mask
        canvas = torch.cat([input_ids, canvas.to(device=device, dtype=input_ids.dtype)], dim=1)
    full_mask = torch.ones_like(canvas)
    if attention_mask is not None:
        full_mask[:, :prompt_len] = attention_mask.to(canvas.dtype)
    attn = full_mask if bool((full_mask == 0).any()) else None
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    generators = example_generators(config.seed, example_ids, device)
    needs_rng = config.temperature > 0 or config.confidence == "random"

    step_map = torch.full((batch, gen), -1, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, gen), dtype=torch.float32, device=device)
    confidence_map = torch.zeros((batch, gen), dtype=torch.float32, device=device)
    num_steps = torch.zeros(batch, dtype=torch.long, device=device)
    recorder = TrajectoryRecorder() if config.record_trajectory else None
    schedule = SCHEDULES[config.schedule]
    steps_per_block = max(config.steps // config.num_blocks, 1)
    stop_ids = torch.tensor(tok.stop_ids, device=device)
    strategy = CACHES[config.cache](model, shift, config.refresh_every, config.full_logits, config.attn_backend)
    rows = torch.arange(batch, device=device)
    row_list = list(range(batch))
    bar = progress_bar(batch * gen, progress)
    nfe = 0

    num_blocks = config.num_blocks if config.max_blocks is None else min(config.num_blocks, config.max_blocks)
    first_block = min(start_step // steps_per_block, num_blocks)
    for b in range(first_block, num_blocks):
        if not row_list:
            break
        start, end = prompt_len + b * block, prompt_len + (b + 1) * block
        lo, hi = start - prompt_len, end - prompt_len  # the block in completion coordinates
        initial = (canvas[:, start:end] == tok.mask).sum(-1)
        block_steps = torch.zeros(batch, dtype=torch.long, device=device)
        # a decoding resumed inside this block spreads the block's remaining masks over its remaining steps
        budget = steps_per_block - (start_step % steps_per_block if b == first_block else 0)
        forward_index = 0
        while row_list:
            current = canvas[rows]
            blk = current[:, start:end]
            eligible = blk == tok.mask
            taking = eligible.any(-1)
            if not bool(taking.any()):
                break
            logits = strategy.logits(current, None if attn is None else attn[rows], positions[rows], start, end,
                                     forward_index)
            nfe += 1
            forward_index += 1
            if config.suppress_eos:
                logits[..., tok.eos] = float("-inf")
            quota = schedule(block_steps[rows], initial[rows], eligible.sum(-1), budget, config.eps)
            proposal = propose(
                logits, eligible, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                confidence=config.confidence, confidence_source=config.confidence_source,
                confidence_dtype=config.confidence_dtype, top_k_first=config.top_k_first,
                generators=[generators[r] for r in row_list] if needs_rng else None, banned=(tok.mask,),
            )
            chosen = select(config.decoder, proposal.confidence, eligible, quota, threshold=config.threshold,
                            factor=config.factor, last_rank_quirk=config.factor_last_rank_quirk,
                            entropy_bound=config.entropy_bound)
            step_index = num_steps[rows]
            canvas[rows, start:end] = torch.where(chosen, proposal.tokens, blk)
            step_map[rows, lo:hi] = torch.where(chosen, step_index[:, None], step_map[rows, lo:hi])
            logprobs[rows, lo:hi] = torch.where(chosen, proposal.logprob, logprobs[rows, lo:hi])
            confidence_map[rows, lo:hi] = torch.where(chosen, proposal.confidence.float(), confidence_map[rows, lo:hi])
            if recorder is not None:
                _record(recorder, rows, step_index, current[:, prompt_len:], lo, hi, eligible, chosen, proposal,
                        taking)
            num_steps[rows] += taking.long()
            block_steps[rows] += taking.long()
            if bar is not None:
                bar.update(int(chosen.sum()))
            done = torch.zeros_like(taking)
            if config.eos_early_stop:
                done = finished_rows(canvas[rows, prompt_len:], tok.mask, stop_ids)
            if stop_step is not None:  # the step window ends: the row keeps its remaining masks
                done |= num_steps[rows] >= stop_step - start_step
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(-1)
                strategy.reorder(keep)
                rows = rows[keep]
                row_list = rows.tolist()

    completion = canvas[:, prompt_len:]
    decoded = step_map >= 0
    completion.masked_fill_(~(decoded | given), tok.pad)
    if bar is not None:
        bar.close()
    trajectory = None
    if recorder is not None:
        trajectory = recorder.build(batch, gen, num_steps, tok.mask)
    return RolloutOutput(
        sequences=canvas,
        attention_mask=full_mask,
        prompt_length=prompt_len,
        completion=completion,
        completion_mask=completion_mask(completion, tok.stop_ids, decoded | given),
        logprobs=logprobs,
        step_map=step_map,
        num_steps=num_steps,
        nfe=nfe,
        trajectory=trajectory,
        confidence_map=confidence_map,
        given=given if canvas_given else None,
    )


def _record(recorder, rows, step_index, state, lo, hi, eligible, chosen, proposal, taking) -> None:
    """Store the step of the rows that took it (state before the commit)."""
    gen = state.shape[1]

    def spread(window: torch.Tensor, fill) -> torch.Tensor:
        full = torch.full((window.shape[0], gen), fill, dtype=window.dtype, device=window.device)
        full[:, lo:hi] = window
        return full

    predictions = state.clone()
    predictions[:, lo:hi] = torch.where(eligible, proposal.tokens, state[:, lo:hi])
    confidence = torch.where(eligible, proposal.confidence.float(), 0.0)
    recorder.record(
        rows[taking], step_index[taking], state[taking], predictions[taking], spread(confidence, 0.0)[taking],
        spread(proposal.logprob, 0.0)[taking], spread(eligible, False)[taking], spread(chosen, False)[taking],
    )
