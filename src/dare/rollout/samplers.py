"""The built-in samplers and :func:`generate`, the entry point every other area calls.

A sampler is a named preset of orthogonal choices (confidence, schedule, selection rule, cache) plus the
loop that runs them (:class:`dare.rollout.registry.Sampler`). Registering a new one is one
:func:`register_sampler` call. Masked-diffusion samplers run :func:`dare.rollout.mdlm.denoise_mdlm`;
block-diffusion samplers run :func:`dare.rollout.block.denoise_blocks`; both loops share
:mod:`dare.rollout.kernels`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from dare.errors import ConfigError, InputError
from dare.plugins import count_registration
from dare.rollout import block, mdlm
from dare.rollout.config import SamplerConfig, warn_once
from dare.rollout.engine import check_engine, decode_static, resolve_engine
from dare.rollout.engine.block import BlockState
from dare.rollout.engine.mdlm import MdlmState
from dare.rollout.inputs import check_generate_args
from dare.rollout.output import RolloutOutput
from dare.rollout.registry import SAMPLERS, Sampler, family_sampler, get_sampler


MDLM_HOOKS = dict(run=mdlm.denoise_mdlm, finalize=mdlm.finalize_config, check=mdlm.check_config,
                  static_state=MdlmState)
"""The hooks of a sampler that leaves them ``None``: the masked-diffusion loop."""


def register_sampler(sampler: Sampler) -> Sampler:
    """Register ``sampler``; returns the registered one (a name taken already, or a ``defaults`` key that is no
    :class:`SamplerConfig` field or holds a wrong type, is an error). Its ``None`` hooks are filled with :data:`MDLM_HOOKS`, and
    the ``defaults`` keys it leaves out with its loop's base preset (:data:`BLOCK_BASE` for the block loop, else
    :data:`MDLM_BASE`), so ``Sampler("s", "...", {"block_length": 4})`` decodes as ``llada`` with blocks of 4."""
    if SAMPLERS.get(sampler.name) is not None:
        raise ValueError(f"sampler '{sampler.name}' registered twice: give the second one another name")
    try:  # a misspelt default would fail only when the sampler is chosen, as a TypeError
        SamplerConfig.from_dict(dict(sampler.defaults)).check_values()
    except ConfigError as err:
        raise ValueError(f"sampler '{sampler.name}': its defaults: {err}") from None
    loop = sampler.run or mdlm.denoise_mdlm
    twins = {mdlm.denoise_mdlm: MdlmState, block.denoise_blocks: BlockState}  # a run of its own has none
    hooks = {k: v for k, v in MDLM_HOOKS.items() if getattr(sampler, k) is None and k != "static_state"}
    if sampler.static_state is None and loop in twins:
        hooks["static_state"] = twins[loop]
    base = BLOCK_BASE if loop is block.denoise_blocks else MDLM_BASE
    sampler = dataclasses.replace(sampler, defaults={**base, **sampler.defaults}, **hooks)
    count_registration()
    SAMPLERS[sampler.name] = sampler
    return sampler


def default_sampler(model) -> str:
    """The sampler registered as the default for ``model``'s family, else ``llada``."""
    from dare.models.spec import family_of

    return family_sampler(family_of(model).name)


_LLADA = dict(confidence="prob", confidence_source="logits", confidence_dtype="model", schedule="linear")
_DREAM = dict(confidence="neg_entropy", confidence_source="sampling", confidence_dtype="model", schedule="timestep")

# Block diffusion: confidence = probability of the drawn token under the sampling distribution (softmax of
# the filtered, tempered logits, top-k before top-p), in the logits' dtype; exact block KV cache.
_BLOCK = dict(confidence="prob", confidence_source="sampling", confidence_dtype="model", schedule="linear",
              top_k_first=True, cache="block")
_BLOCK_HOOKS = dict(run=block.denoise_blocks, finalize=block.finalize_config, check=block.check_config,
                    static_state=BlockState, attention="block_causal")

MDLM_BASE = dict(_LLADA, decoder="quota", cache="none")
"""The defaults of a masked-diffusion sampler's keys that its ``defaults`` leave out: the ``llada`` preset's, but
one block (``block_length`` None: the generation length)."""
BLOCK_BASE = dict(_BLOCK, block_length=4, decoder="dynamic", threshold=0.9)
"""The defaults of a block-diffusion sampler's keys that its ``defaults`` leave out: the ``sdar`` preset."""

register_sampler(Sampler(
    "llada",
    "LLaDA generate: semi-AR blocks, linear quota, float64 Gumbel-max, low-confidence remasking (bf16 softmax)",
    dict(MDLM_BASE, block_length=32),
    families=("llada", "llada_moe"),
))
register_sampler(Sampler(
    "dream",
    "Dream diffusion_generate: one block, timestep quota, entropy confidence on the sampling distribution",
    dict(_DREAM, decoder="quota", cache="none"),
    families=("dream",),
))
register_sampler(Sampler(
    "fastdllm",
    "Fast-dLLM (LLaDA): blocks of 32, prefix KV cache, threshold 0.9 parallel decoding, float64 confidence",
    dict(_LLADA, confidence_dtype="float64", block_length=32, decoder="threshold", cache="prefix"),
))
register_sampler(Sampler(
    "fastdllm_dream",
    "Fast-dLLM (Dream): blocks of 32, prefix KV cache, threshold 0.9 on the sampling distribution's probability",
    dict(_DREAM, confidence="prob", block_length=32, decoder="threshold", cache="prefix"),
))

register_sampler(Sampler(
    "sdar",
    "SDAR/TraDo block_diffusion_generate: block 4, per-block steps, low_confidence_dynamic 0.9, block KV cache",
    BLOCK_BASE,
    families=("sdar", "sdar_moe"), **_BLOCK_HOOKS,
))
register_sampler(Sampler(
    "llada2",
    "LLaDA2.0 generate: block 32, threshold 0.95 with top-k fallback, block KV cache (cache=none: reference recompute)",
    dict(_BLOCK, block_length=32, decoder="dynamic", threshold=0.95),
    families=("llada2",), **_BLOCK_HOOKS,
))
register_sampler(Sampler(
    "llada21",
    "LLaDA2.1 quality mode: M2T threshold 0.7 + T2T token editing 0.5, up to 16 edit-only forwards per block",
    dict(_BLOCK, block_length=32, decoder="dynamic", threshold=0.7, editing_threshold=0.5, num_to_transfer=1),
    **_BLOCK_HOOKS,
))
register_sampler(Sampler(
    "llada21_speed",
    "LLaDA2.1 speed mode: M2T threshold 0.5, no token editing",
    dict(_BLOCK, block_length=32, decoder="dynamic", threshold=0.5, num_to_transfer=1),
    **_BLOCK_HOOKS,
))


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ``input_ids, attention_mask`` ``[B, max_len]``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InputError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = prompt_row(i, p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def prompt_row(index: int, row: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Prompt ``index`` of a list as int64 ids: floats, bools or text among its ids are a one-line
    :class:`InputError` (casting would truncate ``1.5`` to ``1`` without a word)."""
    expected = f"prompts[{index}] must be a list of integer token ids"
    try:
        ids = torch.as_tensor(row if isinstance(row, torch.Tensor) else list(row))
    except (TypeError, ValueError, RuntimeError):
        raise InputError(f"{expected}; got {list(row)[:4]!r}") from None
    if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"{expected}; got {ids.tolist()[:4]!r} ({ids.dtype})")
    return ids.long()


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters (CPU without any); a model whose weights were never loaded (parameters
    on the ``meta`` device, e.g. built under ``torch.device("meta")`` or accelerate's ``init_empty_weights``) is a
    one-line :class:`InputError` instead of torch's error from deep inside a forward."""
    if any(p.is_meta for p in model.parameters()):
        raise InputError("the model's weights are on the meta device (never loaded): load a checkpoint, or "
                         "materialise them (model.to_empty(device=...) and an initialisation) before using it")
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def decoding_engine(config: SamplerConfig, device: torch.device) -> str:
    """The engine resolved ``config`` decodes with on ``device`` (:func:`~dare.rollout.engine.resolve_engine`); rollout
    weights other than the model's need a static engine (one-line :class:`ConfigError`). A sampler with a ``run`` of
    its own and no ``static_state`` decodes eagerly: ``auto`` picks ``eager`` for it (a note on CUDA, where it would
    be ``graph``), an explicit ``static`` / ``graph`` is the error (never the built-in loop in its place)."""
    sampler = SAMPLERS.get(config.sampler) if config.sampler is not None else None
    if sampler is not None and sampler.static_state is None:
        if config.weights != "model":
            raise ConfigError(f"weights '{config.weights}' decodes on the static engines, and sampler '{sampler.name}' "
                              "has no static_state for them (its own run): use weights 'model'")
        if config.engine not in ("auto", "eager"):
            check_engine(config.engine)
            raise ConfigError(f"sampler '{sampler.name}' decodes with its own run and has no static_state (the "
                              f"fixed-shape twin the {config.engine} engine steps): set engine 'eager' or 'auto'")
        if config.engine == "auto" and resolve_engine("auto", device) != "eager":
            warn_once(("eager sampler", sampler.name), f"note: sampler '{sampler.name}' decodes on the eager engine "
                      "(its own run, no static_state for the graph engine)")
        config = config.replace(engine="eager")
    engine = resolve_engine(config.engine, device)
    if engine == "eager" and config.weights != "model":
        raise ConfigError(f"weights '{config.weights}' decodes on the static engines; engine 'auto' is 'eager' on "
                          f"{device.type}: set engine 'static'")
    return engine


def generate(
    model,
    prompts: torch.Tensor | Sequence[Sequence[int]] | None = None,
    attention_mask: torch.Tensor | None = None,
    config: SamplerConfig | None = None,
    *,
    example_ids: Sequence[int] | torch.Tensor | None = None,
    progress: bool = False,
    canvas: torch.Tensor | None = None,
    step_range: tuple[int, int | None] | None = None,
    **overrides,
) -> RolloutOutput:
    """Decode completions for ``prompts`` with a diffusion LM.

    Args:
        model: a DARE model (``dare.models``), possibly peft-wrapped.
        prompts: ``[B, P]`` left-padded ids with ``attention_mask`` (1 = real token), or a list of token-id
            lists (left-padded here with the family's pad id). A tokenizer's output may come as keywords instead:
            ``generate(model, **tokenizer(texts, return_tensors="pt", padding=True))`` with the tokenizer padding on
            the left (``input_ids``, ``attention_mask``; ``token_type_ids`` is ignored).
        config: a :class:`SamplerConfig` (None: the defaults: the model family's sampler, ``gen_length`` 128);
            ``**overrides`` replace fields (``generate(m, p, sampler="dream",
            temperature=0.7)``).
        example_ids: global example indices seeding each row's random stream (default ``0..B-1``); pass the
            dataset indices so that samples do not depend on batching, ranks or resume. Several samples of
            one prompt need distinct ids (e.g. ``prompt_index * group_size + j``), and a training loop should
            vary ``config.seed`` per step (e.g. ``derive_seed(seed, step)``) so revisited prompts get new samples.
        progress: show a progress bar of committed tokens (the static and graph engines: of decoded blocks).
        canvas: ``[B, G]`` starting completion (masked-diffusion samplers): positions holding the mask id are
            decoded, every other position is **given** - kept as is, never rewritten, part of the completion
            (``RolloutOutput.given``). Inpainting (IGPO's hints) or resuming a partial decoding
            (``RolloutOutput.state``).
        step_range: ``(start, stop)`` run only denoising steps ``start .. stop - 1`` of the schedule
            (masked-diffusion samplers; ``stop`` None = to the end): the canvas is the state after ``start``
            steps, so decoding resumes in block ``start // (steps / num_blocks)``, whose remaining masks are spread
            over its remaining steps (LLaDA's linear quota gives the same per-step counts as an uninterrupted
            run); each row stops after ``stop - start`` steps keeping its remaining masks. Steps are counted
            from the start of this call. Tree rollouts (d-TreeRPO) branch this way.

    Returns:
        :class:`RolloutOutput` (tokens, completion mask, log-probs, step map, nfe, optional trajectory).
    """
    from dare.models.loading import evaluating
    from dare.models.spec import family_of

    if prompts is None:  # generate(model, **tokenizer(...)): its input_ids are the prompts
        if "input_ids" not in overrides:
            raise InputError("generate needs prompts: generate(model, prompts) with token ids, or a tokenizer's "
                             "output as generate(model, **encoding)")
        prompts = overrides.pop("input_ids")
        overrides.pop("token_type_ids", None)
    check_generate_args(model, prompts, attention_mask, config, example_ids=example_ids, canvas=canvas,
                        step_range=step_range)
    config = config or SamplerConfig()
    if overrides:
        config = config.replace(**overrides)
    family = family_of(model)
    config = resolve_config(config, model)  # the sampler's attention kind checked first
    device = model_device(model)
    tokens = family.token_ids(model.config)
    if not isinstance(prompts, torch.Tensor):
        if attention_mask is not None:
            raise InputError("attention_mask is only accepted with a prompt tensor")
        prompts, attention_mask = left_pad(prompts, tokens.pad, device)
    prompts = check_prompt_ids(prompts).to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    else:
        warn_unmasked_padding(prompts, tokens.pad)
    batch = prompts.shape[0] if prompts.ndim == 2 else 0
    if example_ids is None:
        example_ids = list(range(batch))
    example_ids = [int(i) for i in (example_ids.tolist() if isinstance(example_ids, torch.Tensor) else example_ids)]
    if len(example_ids) != batch:
        raise InputError(f"example_ids has {len(example_ids)} entries for {batch} prompts")
    sampler = get_sampler(config.sampler)
    warn_beyond_context(family.context_length(model.config), prompts.shape[-1], config.gen_length)
    resume = {}
    if canvas is not None or step_range is not None:
        if sampler.attention != "full":
            raise ConfigError(f"canvas and step_range are supported by the masked-diffusion samplers; "
                              f"'{sampler.name}' decodes block-causal models")
        resume = {"canvas": _check_canvas(canvas, batch, config.gen_length, device),
                  "step_range": _check_step_range(step_range)}
    engine = decoding_engine(config, device)
    with evaluating(model):  # dropout (e.g. peft's lora_dropout) never reaches a rollout
        if engine != "eager":
            mdlm.check_prompts(prompts, attention_mask, tokens.mask)
            out = decode_static(sampler, model, prompts, attention_mask, config, example_ids=example_ids,
                                engine=engine, progress=progress, **resume)
            if out is not None:
                return out
        return sampler.run(model, prompts, attention_mask, config, example_ids=example_ids, progress=progress,
                           **resume)


def resolve_config(config: SamplerConfig, model) -> SamplerConfig:
    """``config`` resolved for ``model``: an unset sampler is its family's, a sampler of the other attention kind
    is the error (before any of its own settings'), and a block sampler's unset ``block_length`` is the model's
    block size (:func:`generate` decodes with this; callers that record the settings resolve with it too)."""
    from dare.models.spec import family_of

    family = family_of(model)
    config = config.for_family(family.name)
    check_sampler_family(config.sampler, family)
    return _model_block_length(config, model, family).resolved()


def _model_block_length(config: SamplerConfig, model, family) -> SamplerConfig:
    """A block sampler decodes in the model's block size (its training block size): an unset ``block_length``
    takes it (not the preset's), and an explicit one that differs is applied with one warning. Others: as is."""
    if get_sampler(config.sampler).attention != "block_causal":
        return config
    size = model_block_size(model, family)
    if config.block_length is None:
        return dataclasses.replace(config, block_length=size)
    if isinstance(config.block_length, int) and config.block_length != size:
        warn_once(("block length", config.block_length, size),
                  f"warning: block_length={config.block_length} differs from the model's block size {size} (its "
                  f"training block size); decoding with {config.block_length}")
    return config


def model_block_size(model, family=None) -> int | None:
    """The block size ``model`` was trained with (its config's ``block_size``, else its family's); None for
    masked-diffusion models, which have none."""
    from dare.models.spec import family_of

    family = family or family_of(model)
    if family.attention != "block_causal":
        return None
    return getattr(model.config, "block_size", None) or family.block_size


def check_prompt_ids(prompts: torch.Tensor) -> torch.Tensor:
    """Integer prompt ids as int64 (int32 from numpy is common); anything else is a one-line :class:`InputError`."""
    if prompts.dtype == torch.long:
        return prompts
    if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
        raise InputError(f"prompts must hold integer token ids; got a {prompts.dtype} tensor")
    return prompts.long()


def check_sampler_family(sampler, family) -> None:
    """One-line :class:`ConfigError` unless ``sampler`` (a sampler or its name) decodes the attention kind of model
    ``family`` (a family spec or its name): full-attention samplers decode masked-diffusion models, block samplers
    block-causal ones. ``dare generate`` and RL training check it before any other sampler setting."""
    from dare.models.spec import get_family

    sampler = get_sampler(sampler) if isinstance(sampler, str) else sampler
    family = get_family(family) if isinstance(family, str) else family
    if family.attention != sampler.attention:
        fits = [s.name for s in SAMPLERS.values() if s.attention == family.attention]
        raise ConfigError(f"sampler '{sampler.name}' decodes {sampler.attention.replace('_', '-')} models; "
                          f"{family.name} is {family.attention.replace('_', '-')}: use {', '.join(fits)}")


def warn_unmasked_padding(prompts: torch.Tensor, pad_id: int) -> None:
    """One warning per process when a prompt tensor without ``attention_mask`` has rows that start with the pad id:
    the model then attends to the padding, and the row decodes differently from the same prompt alone."""
    if prompts.ndim != 2 or prompts.shape[1] < 2 or not bool((prompts[:, 0] == pad_id).any()):
        return
    warn_once(("unmasked padding",), f"warning: prompt rows start with the pad id {pad_id} but no attention_mask was "
              "given: the padding is attended as text; pass the tokenizer's attention_mask (or a list of id lists, "
              "padded for you)")


def warn_beyond_context(context: int | None, prompt_width: int, gen_length: int) -> None:
    """One warning per process and context length when prompt + generation run past the positions the model was
    configured for: nothing stops RoPE there, but the model never saw them (and a stray zero in ``gen_length``
    looks like a hang)."""
    total = prompt_width + gen_length
    if context is None or total <= context:
        return
    warn_once(("beyond context", context), f"warning: prompt ({prompt_width} tokens) + gen_length ({gen_length}) = "
              f"{total} positions, beyond the model's configured context length {context}: quality past it is untested")


def _check_canvas(canvas: torch.Tensor | None, batch: int, gen_length: int, device) -> torch.Tensor | None:
    if canvas is None:
        return None
    if tuple(canvas.shape) != (batch, gen_length):
        raise InputError(f"canvas must have shape [{batch}, {gen_length}] (rows x gen_length); "
                         f"got {list(canvas.shape)}")
    return canvas.to(device)


def _check_step_range(step_range) -> tuple[int, int | None] | None:
    if step_range is None:
        return None
    start, stop = step_range
    if start < 0 or (stop is not None and stop <= start):
        raise InputError(f"step_range must be (start, stop) with 0 <= start < stop; got {tuple(step_range)}")
    return int(start), None if stop is None else int(stop)
