"""The rollout engine: how :func:`dare.rollout.generate` executes a sampler.

``SamplerConfig.engine``:

``eager``
    the reference loops (:mod:`dare.rollout.mdlm`, :mod:`dare.rollout.block`): rows leave the batch as they
    stop, any device, any model wrapper.
``static``
    the same samplers as fixed-shape steps over preallocated buffers (:mod:`dare.rollout.engine.mdlm`,
    :mod:`dare.rollout.engine.block`), run eagerly: what the CUDA graphs record, testable on CPU.
``graph``
    ``static`` steps recorded once per shape into CUDA graphs and replayed (CUDA only).
``auto`` (default)
    ``graph`` on CUDA, ``eager`` elsewhere.

Shapes are bucketed so that graphs are reused across calls: the batch is padded with inactive filler rows to the
next of :data:`BATCH_BUCKETS`, and the prompt width to a multiple of :data:`PROMPT_WIDTH_MULTIPLE` (left
padding, never attended). A batch above the largest bucket decodes in chunks of that many rows
(:func:`decode_static`; each row's random stream is its own, so the rows decode as in one batch). A model whose
step cannot be recorded (e.g. one that reads device values on the host) falls back to ``eager`` with a logged
note. A model sharded by FSDP2
(LoRA-wrapped or not) decodes with an unsharded copy of its weights that the engine owns and refreshes at every
call (:mod:`dare.rollout.engine.owned`). A peft model's steps are kept per adapter state (:func:`adapter_state`):
a call inside ``disable_adapter`` never replays steps recorded with the adapters on.

Recorded graphs and their buffers are kept per model (the last :data:`KEEP_STATES` shapes; a dropped shape that
comes back is recorded again, counted in ``EngineStats.returns``, with a warning the first time) and read the
model's parameters at their addresses: optimizer steps update them in place, so graphs stay valid; if a
parameter is re-allocated (``load_state_dict(assign=True)``, ``.to()``), the engine notices and records again.
:func:`engine_stats` reports captures, replays and graph memory; :func:`release` frees a model's graphs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from dare.config import env_switch
from dare.errors import ConfigError, first_line
from dare.rollout.config import ENGINES
from dare.rollout.engine.fused import fused_bytes, fused_projections, release_fused, wants_fusion
from dare.rollout.engine.owned import base_model, is_sharded, refreshed_twin
from dare.rollout.output import RolloutOutput

log = logging.getLogger("dare.rollout")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PROMPT_WIDTH_MULTIPLE = 64
KEEP_STATES = 4


@dataclass
class EngineStats:
    """Counters of one model's static engine (cumulative)."""

    captures: int = 0
    replays: int = 0
    graph_bytes: int = 0
    fallbacks: int = 0
    recaptures: int = 0
    capture_s: float = 0.0
    owned_refresh_s: float = 0.0
    """Seconds spent copying an FSDP model's weights into the engine's unsharded copy (:mod:`.owned`)."""
    fused_bytes: int = 0
    """Device memory of the fused q/k/v and gate/up copies small steps decode with (a LoRA policy's: every adapted
    projection, adapters unmerged), and of the merged or FP8 copies of ``SamplerConfig.weights`` (:mod:`.fused`)."""
    copies_refresh_s: float = 0.0
    """Seconds spent refreshing the merged or FP8 copies from the parameters (a LoRA merge or an FP8 quantisation,
    once per call; the bf16 fused copies' refresh, a plain copy, is not timed)."""
    evictions: int = 0
    """Decode states dropped to keep at most :data:`KEEP_STATES` (each holds its shape's buffers and graphs)."""
    returns: int = 0
    """States made again for a shape that had been dropped: its steps are recorded again (a warning is logged the
    first time)."""


_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_UNCAPTURABLE: weakref.WeakSet = weakref.WeakSet()
_UNFUSABLE: weakref.WeakSet = weakref.WeakSet()
"""Models whose fused projection copies did not fit in device memory (they decode unfused from then on)."""
_DROPPED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the keys of the states dropped to keep :data:`KEEP_STATES`."""


def kernel_settings() -> dict:
    """The environment switches that choose a decode's kernels, as results files record them next to the
    sampler settings: ``decode_attention`` (``DARE_DECODE_ATTENTION``), ``fuse_max_rows`` (largest step decoded
    with fused projections; 0 = never), ``lora_fuse_max_rows`` (the same for a LoRA policy), ``compile_sampling``
    (``DARE_COMPILE_SAMPLING``), ``proposal_kernel`` (``DARE_PROPOSAL_KERNEL``), ``top_p_kernel``
    (``DARE_TOP_P_KERNEL``), ``cache_writes_in_blocks`` (``DARE_FUSE_CACHE_WRITES``) and ``static_compile``
    (``DARE_STATIC_COMPILE``: dynamically compiled blocks decode through a static compilation)."""
    from dare.models.decode_attention import setting
    from dare.rollout.engine.compiled import sampling_compiled
    from dare.rollout.engine.forward import cache_writes_in_blocks
    from dare.rollout.engine.fused import fusion_max_rows
    from dare.rollout.engine.proposal_kernel import kernel_enabled
    from dare.rollout.engine.top_p_kernel import kernel_enabled as top_p_kernel_enabled

    return {"decode_attention": setting(), "fuse_max_rows": fusion_max_rows(),
            "lora_fuse_max_rows": fusion_max_rows(lora=True),
            "compile_sampling": sampling_compiled(), "proposal_kernel": kernel_enabled(),
            "top_p_kernel": top_p_kernel_enabled(),
            "cache_writes_in_blocks": cache_writes_in_blocks(),
            "static_compile": static_compile()}


def check_environment() -> None:
    """Check the ``DARE_*`` environment before any work (the ``dare`` command, the lm-eval and OpenCompass models):
    one warning line on stderr per ``DARE_*`` name DARE does not read (:func:`dare.config.unknown_environment`), and
    every kernel switch (and ``DARE_PROGRESS_INTERVAL``) read once, so that a misspelt value is a one-line error on
    any device, not only where (and if) a decode reads it (or a progress bar is drawn)."""
    import sys

    from dare.config import unknown_environment
    from dare.progress import progress_interval

    for line in unknown_environment():
        print(line, file=sys.stderr)
    kernel_settings()
    progress_interval()


def check_engine(name: str) -> None:
    if name not in ENGINES:
        from dare.errors import unknown_choice

        raise unknown_choice("rollout engine", name, ENGINES)


def resolve_engine(name: str, device: torch.device) -> str:
    """``auto`` -> ``graph`` on CUDA, ``eager`` elsewhere; ``graph`` off CUDA is a one-line error."""
    check_engine(name)
    if name == "auto":
        return "graph" if device.type == "cuda" else "eager"
    if name == "graph" and device.type != "cuda":
        raise ConfigError(f"rollout engine 'graph' needs CUDA (the model is on {device.type}); use 'static' or 'eager'")
    return name


def bucket(batch: int) -> int | None:
    """The smallest batch bucket holding ``batch`` rows (None above the largest)."""
    return next((b for b in BATCH_BUCKETS if b >= batch), None)


def engine_stats(model) -> EngineStats:
    return _STATS.setdefault(base_model(model), EngineStats())


def release(model) -> None:
    """Free the buffers and graphs the engine keeps for ``model``; its next rollout records afresh (also after an
    earlier recording failed and sent it to the eager fallback)."""
    base = base_model(model)
    _drop_twin(base)
    _STATES.pop(base, None)
    _DROPPED.pop(base, None)
    _FINGERPRINTS.pop(base, None)
    _UNFUSABLE.discard(base)  # with the memory freed, the copies may fit again
    _UNCAPTURABLE.discard(base)
    _release_copies(base)


def refresh_weights(model) -> bool:
    """Make recorded graphs read ``model``'s current weights; returns True when they had to be dropped.

    Optimizer steps (full fine-tuning, LoRA adapters) update parameters in place, so recorded graphs already read
    the new values and nothing is copied; a re-allocated parameter (new address) drops the model's graphs, which
    are recorded again at the next rollout (``EngineStats.recaptures``). Cost: one pass over the parameters'
    addresses. FSDP-sharded models decode with the engine's own unsharded copy, refreshed by copying at every call
    (:mod:`dare.rollout.engine.owned`).
    """
    base = base_model(model)
    fingerprint = _fingerprint(base)
    previous = _FINGERPRINTS.get(base)
    _FINGERPRINTS[base] = fingerprint
    if previous is not None and previous != fingerprint:
        engine_stats(model).recaptures += 1
        _STATES.pop(base, None)
        return True
    return False


def _synced_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def check_copies(mode: str, fused) -> None:
    """One-line error when ``SamplerConfig.weights`` asked for copies that this model does not have."""
    if mode == "fp8" and fused is None:
        raise ConfigError("weights 'fp8': no projection of this model can run in FP8 (sizes that are not multiples of "
                          "16, or LoRA adapters without a plain weight form: DoRA, LoRA bias, other peft variants); "
                          "decode with weights 'model'")
    if mode == "merged" and (fused is None or not fused.merges_lora):
        raise ConfigError("weights 'merged' merges LoRA adapters into copies of the projections, and this model has "
                          "no mergeable LoRA layer (plain peft LoRA: not DoRA, LoRA bias, other peft variants or "
                          "layers peft merged itself); decode with weights 'model'")


def _weights_not_applied(config) -> str:
    """The note a fallback to the eager loops adds when ``SamplerConfig.weights`` asked for copies."""
    if config.weights == "model":
        return ""
    return f" (weights '{config.weights}' is not applied: the eager loops read the model's weights)"


def check_fp8(model, device: torch.device, dtype: torch.dtype | None) -> None:
    """One-line error when ``model`` cannot decode with FP8 matmuls on ``device`` (activations in ``dtype``, or the
    weights' dtype when None)."""
    from dare.models.fp8 import check_fp8_device

    reason = check_fp8_device(device, dtype or next(model.parameters()).dtype)
    if reason is not None:
        raise ConfigError(f"weights 'fp8': {reason}")


def _fallback_reason(model) -> str | None:
    if base_model(model) in _UNCAPTURABLE:
        return "this model's decoding step could not be recorded earlier"
    return None


def _drop_twin(sharded) -> None:
    """Free the unsharded copy of a sharded model, with its recorded steps (nothing for other models)."""
    from dare.rollout.engine.owned import release_twin, twin_of

    twin = twin_of(sharded)
    if twin is not None:
        release(twin)
        release_twin(sharded)


def _give_up_on(sharded) -> None:
    """A sharded model whose unsharded copy could not be made or recorded: free the copy and decode eagerly."""
    _drop_twin(sharded)
    _UNCAPTURABLE.add(sharded)


def _release_copies(base) -> None:
    """Free every kind of ``base``'s projection copies; its stats then count none (``fused_bytes``)."""
    release_fused(base)
    if base in _STATS:
        _STATS[base].fused_bytes = 0


def _free_steps_and_copies(base, states: OrderedDict) -> None:
    """Free ``base``'s recorded steps and every kind of its projection copies together (no kept step may read
    freed copies)."""
    states.clear()
    _release_copies(base)


def _fingerprint(model) -> tuple:
    return tuple(p.data_ptr() for p in model.parameters())


def adapter_state(model) -> tuple:
    """What decides a peft model's path through its LoRA layers: each layer's active adapters and whether its
    adapters are disabled (peft's ``disable_adapter``); () for a model without LoRA layers. Part of the key of the
    recorded steps, so graphs recorded with adapters on never replay for a call with them off."""
    if "peft" not in sys.modules:  # no peft imported: no LoRA layers anywhere
        return ()
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    return tuple(sorted({(tuple(m.active_adapters), bool(m.disable_adapters)) for m in layers}))


def _state_key(kind: str, config, batch: int, prompt_width: int, padded: bool, graphs: bool, device,
               training: bool, copies: str | None, adapters: tuple = (), resumable: bool = False) -> tuple:
    settings = asdict(config)
    for volatile in ("seed", "engine", "max_blocks"):  # the host loop's business, not the recorded steps'
        settings.pop(volatile, None)
    autocast = torch.is_autocast_enabled(device.type) if device.type in ("cuda", "cpu") else False
    dtype = torch.get_autocast_dtype(device.type) if autocast else None
    return (kind, batch, prompt_width, padded, graphs, training, autocast, dtype, copies, adapters, resumable,
            static_compile(),  # which compilation the recorded steps ran
            tuple(sorted(settings.items())))


def decode_static(sampler, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config, *,
                  example_ids: Sequence[int], engine: str, progress: bool = False, canvas=None, step_range=None):
    """:func:`run_static`, in chunks of the largest batch bucket when the batch is larger (joined with
    :meth:`~dare.rollout.output.RolloutOutput.concat`). None when some chunk falls back to eager."""
    rows, size = input_ids.shape[0], BATCH_BUCKETS[-1]
    resume = {"canvas": canvas, "step_range": step_range} if canvas is not None or step_range is not None else {}
    if rows <= size:
        return run_static(sampler, model, input_ids, attention_mask, config, example_ids=example_ids, engine=engine,
                          progress=progress, **resume)
    outputs = []
    for start in range(0, rows, size):
        part = slice(start, start + size)
        if canvas is not None:
            resume["canvas"] = canvas[part]
        out = run_static(sampler, model, input_ids[part], None if attention_mask is None else attention_mask[part],
                         config, example_ids=list(example_ids[part]), engine=engine, progress=progress, **resume)
        if out is None:
            return None
        outputs.append(out)
    from dare.models.spec import family_of

    return RolloutOutput.concat(outputs, mask_id=family_of(model).token_ids(model.config).mask)


def _copy_mode(config, model, rows: int, prompt_width: int, lora: bool, autocast: torch.dtype | None) -> str | None:
    """The kind of projection copies (:mod:`dare.models.fusion`) a static decode of ``rows`` (bucketed) uses, or
    None. ``autocast``: its dtype, None without autocast. The kinds, in order: those ``SamplerConfig.weights`` asks
    for; fused copies while they pay (:func:`wants_fusion`); under autocast, fused copies of weights kept in
    another dtype (fp32 master weights: the copies are the casts autocast would make at every call, made once per
    engine call, i.e. per batch chunk), else copies of a LoRA policy's adapters (peft would cast each adapter
    weight at every call). ``DARE_FUSE_PROJECTIONS=0`` turns every default kind off."""
    from dare.models.fusion import casts_weights

    if config.weights != "model":
        return config.weights
    if model in _UNFUSABLE:
        return None
    if wants_fusion(rows, config, lora=lora, prompt_width=prompt_width):
        return "fused"
    if not autocast or not env_switch("DARE_FUSE_PROJECTIONS", default=True):
        return None
    if casts_weights(model, autocast):
        return "fused"  # fp32 master weights: autocast would cast every projection at every call
    return "adapters" if lora else None


def static_compile() -> bool:
    """Whether static steps call dynamically compiled blocks through their static compilation
    (``DARE_STATIC_COMPILE``, default 1)."""
    return env_switch("DARE_STATIC_COMPILE", default=True)


def _static_blocks(model):
    """The blocks' static compilation while the engine decodes (:func:`dare.models.compile.static_shapes`), unless
    ``DARE_STATIC_COMPILE=0``."""
    from dare.models.compile import static_shapes

    return static_shapes(model) if static_compile() else contextlib.nullcontext()


@torch.no_grad()
def run_static(sampler, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config, *,
               example_ids: Sequence[int], engine: str, progress: bool = False, **resume):
    """Decode at most the largest bucket's rows (:func:`decode_static` splits larger batches) with the static engine
    (``engine`` = ``static`` or ``graph``); returns a ``RolloutOutput``, or None when the batch must fall back to the
    eager loop (a note is logged). ``resume``: the ``canvas`` and
    ``step_range`` of :func:`dare.rollout.generate` (masked-diffusion samplers), decoded by states of their own."""
    from dare.rollout.rng import derive_seed

    stats = engine_stats(model)
    rows = input_ids.shape[0]
    owner = base_model(model)  # the caller's model; a sharded one is decoded through its unsharded copy
    reason = _fallback_reason(model)
    if reason is None and is_sharded(model):  # decode with the engine's unsharded copy (its addresses are fixed)
        try:
            model, seconds = refreshed_twin(model)
            stats.owned_refresh_s += seconds
            reason = _fallback_reason(model)
        except torch.OutOfMemoryError:
            reason = "no device memory for an unsharded copy of the FSDP model's weights"
        except (RuntimeError, TypeError, ValueError, KeyError) as error:  # e.g. a class that cannot be rebuilt
            reason = f"no unsharded copy of the FSDP model could be made ({first_line(error)[:200]})"
        if reason is not None:  # eager from now on (release(model) retries): free the copy, never rebuild it
            _give_up_on(owner)
    base = base_model(model)
    copies = config.weights != "model"  # merged or FP8 copies, whatever the step's size
    if reason is not None:
        log.warning("rollout engine '%s' falls back to eager: %s%s", engine, reason, _weights_not_applied(config))
        stats.fallbacks += 1
        return None
    graphs = engine == "graph"
    device = input_ids.device
    if graphs:
        refresh_weights(model)
    padded_rows = bucket(rows) if graphs else rows
    multiple = PROMPT_WIDTH_MULTIPLE if graphs else 1
    prompt_width = -(-input_ids.shape[1] // multiple) * multiple
    has_padding = sampler.static_state.needs_padding(input_ids, attention_mask, prompt_width, config)
    states = _STATES.setdefault(base, OrderedDict())
    fused = None
    adapters = adapter_state(base)
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    mode = _copy_mode(config, base, padded_rows, prompt_width, lora=bool(adapters), autocast=dtype)
    fuse = mode is not None
    if fuse:
        if mode == "fp8":
            check_fp8(base, device, dtype)
        try:
            began = _synced_clock(device) if copies else 0.0  # the default path adds no synchronisation
            fused, replaced = fused_projections(base, dtype, mode=mode)
            if copies:
                stats.copies_refresh_s += _synced_clock(device) - began
        except torch.OutOfMemoryError:  # the copies do not fit next to the model: decode with the separate weights
            _free_steps_and_copies(base, states)
            fuse, replaced = False, False
            if copies:
                raise ConfigError(f"no device memory for the '{mode}' copies of the projections; decode with "
                                  f"weights 'model'") from None
            _UNFUSABLE.add(base)
            log.warning("no memory for the fused projection copies; decoding with the separate projections "
                        "(DARE_FUSE_PROJECTIONS=0 silences this)")
        check_copies(mode, fused)
        if replaced:  # graphs recorded with the replaced copies would read freed memory
            states.clear()
        stats.fused_bytes = fused_bytes(base)
    resumable = any(value is not None for value in resume.values())
    key = _state_key(sampler.attention, config, padded_rows, prompt_width, has_padding, graphs, device, base.training,
                     mode if fuse else None, adapters, resumable)
    state = states.get(key)
    if state is None:
        dropped = _DROPPED.setdefault(base, set())
        if key in dropped:
            if not stats.returns:
                log.warning("rollout engine: this run decodes more shapes (batch buckets x prompt widths x "
                            "settings) than the %d it keeps, so shapes dropped earlier are recorded again "
                            "(engine_stats(model).returns counts them); raise dare.rollout.engine.KEEP_STATES if "
                            "device memory allows (each kept shape holds its own KV cache and graphs)", KEEP_STATES)
            stats.returns += 1
            dropped.discard(key)
        state = sampler.static_state(base, config, batch=padded_rows, prompt_width=prompt_width, padded=has_padding,
                                     device=device, use_graphs=graphs, backend=config.attn_backend or "sdpa",
                                     **({"resumable": True} if resumable else {}))
        states[key] = state
        while len(states) > KEEP_STATES:
            dropped.add(states.popitem(last=False)[0])
            stats.evictions += 1
    states.move_to_end(key)
    state.config = config  # equal to the state's own but for the volatile fields the host loop reads (max_blocks)
    seeds = [derive_seed(config.seed, i) for i in example_ids]
    runner = state.runner
    captures, replays, graph_bytes, capture_s = runner.captures, runner.replays, runner.graph_bytes, runner.capture_s
    try:
        with fused.active() if fused is not None else contextlib.nullcontext(), _static_blocks(base):
            state.load(input_ids, attention_mask, seeds, **resume)
            state.decode(progress)
    except RuntimeError as error:
        if not graphs:
            raise
        out_of_memory = isinstance(error, torch.OutOfMemoryError)
        log.warning("rollout engine 'graph' falls back to eager: the step %s (%s); this model decodes eagerly from "
                    "now on (dare.rollout.engine.release(model) lets it record again)%s",
                    "ran out of device memory, so the engine freed its recorded steps and copies" if out_of_memory
                    else "could not be recorded", first_line(error)[:200], _weights_not_applied(config))
        _UNCAPTURABLE.add(base)
        states.pop(key, None)
        if out_of_memory:  # the eager loop and the training step get that memory back
            _free_steps_and_copies(base, states)
        if owner is not base:
            _give_up_on(owner)
        stats.fallbacks += 1
        return None
    finally:
        stats.captures += state.runner.captures - captures
        stats.replays += state.runner.replays - replays
        stats.graph_bytes += state.runner.graph_bytes - graph_bytes
        stats.capture_s += state.runner.capture_s - capture_s
    return state.output(input_ids, attention_mask)
