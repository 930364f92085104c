"""Regional ``torch.compile``: compile every transformer block, leave attention to its own kernels.

Each block is compiled in place (``nn.Module.compile``), so parameter names, checkpoints, LoRA and FSDP
wrapping are unchanged. Compilation stops at :func:`dare.models.base.cached_attend` (a graph break): the
attention kernels are already fused (flash / FlexAttention / varlen) and the attention layout changes every
batch, while the code around it - RMSNorm in fp32, RoPE, SwiGLU, residual adds - is where fusion pays.

Compilation is dynamic by default (sequence length and batch size are symbolic), so all blocks and all
packed-row lengths share one graph per region: the first step compiles, later steps never recompile. Parameter
shapes stay static (``torch._dynamo.config.force_parameter_static_shapes``), so the hidden size and the
reductions over it are specialised.

``dynamic=False`` compiles one graph per input shape instead, shared by all blocks (a block never reads its
layer index in compiled code). Its kernels index with constants: on an H200 the fused RoPE kernel of a decoding
step runs 2.4-2.8x faster than the dynamic-shape one (``benchmarks/small_kernels.py``). It suits fixed-shape
work - the rollout engine's recorded steps, a handful of shapes - and not training on varying row lengths,
where every new length would compile again. A model compiled for training gets both: inside
:func:`static_shapes` (the rollout engine's decoding) each dynamically compiled block runs a second, static
compilation of itself, made on first use and kept, so training forwards keep their one dynamic graph and the
rollout's steps get constant-indexed kernels.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass

from dare.errors import ConfigError

log = logging.getLogger("dare.models")
_STATIC_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per block class, the block input shapes its static compilation serves (:func:`static_shapes`)."""

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
COMPILE_MODES = {
    "default": {},
    "max-autotune-no-cudagraphs": {"max_autotune": True, "coordinate_descent_tuning": True},
    "max-autotune-tma": {"max_autotune": True, "coordinate_descent_tuning": True,
                         "triton.enable_persistent_tma_matmul": True},
    "pdl": {"triton.enable_pdl": True},
    "combo": {"combo_kernels": True},
    "pointwise-tuned": {"coordinate_descent_tuning": True},
}
"""Compile modes for blocks -> inductor options. ``max-autotune-no-cudagraphs`` is torch's mode of that name (its
options); ``max-autotune-tma`` adds inductor's persistent TMA matmul template (Hopper) to the autotuned choices.
Three modes target the many small generated kernels of a decoding step instead of its matmuls: ``pdl``
(programmatic dependent launch, Hopper and newer: a generated kernel starts while its predecessor drains),
``combo`` (independent kernels of a block horizontally fused into one launch) and ``pointwise-tuned`` (block sizes
of the generated kernels tuned by coordinate descent, without matmul autotuning).
The torch modes that record CUDA graphs themselves (``reduce-overhead``, ``max-autotune``) would nest inside the
rollout engine's graphs and are not offered."""
STATIC_RECOMPILE_LIMIT = 64
"""Shapes one static compilation may specialise on (dynamo's default limit is 8; a prefix-cache rollout of 8
blocks alone has 9 step shapes)."""
STATIC_SHAPES = 32
"""Block input shapes (and autocast / grad modes) per block class that :func:`static_shapes` runs on the static
compilation; later ones run the dynamic compilation (a note is logged once). Each costs a compilation, and dynamo
runs a frame past its recompile limit eagerly (with one warning of its own): a long RL run over many prompt widths
(each prefix-cache width adds ~2 block input shapes per step shape: the last block computes only the kept rows)
keeps its fast kernels for the first shapes and compiled ones for the rest. Static decoding raises dynamo's limit
to :data:`STATIC_DECODE_RECOMPILE_LIMIT`, leaving room for the entries its key does not tell apart."""
STATIC_DECODE_RECOMPILE_LIMIT = 4 * STATIC_SHAPES
"""Dynamo's recompile limit once :func:`static_shapes` is used (one limit per code object: it also counts the
dynamic compilation's graphs and those of other models of the same block class)."""


@dataclass
class BlockCompilation:
    """How :func:`compile_blocks` compiled a block (kept on it), and its static twin once :func:`static_shapes` made
    one: ``static_call`` is ``torch.compile`` of the block's call with ``dynamic=False`` and the same backend and
    options."""

    backend: str
    dynamic: bool | None
    options: dict | None
    static_call: object = None

    def __getstate__(self) -> dict:
        """Pickled or deep-copied without ``static_call``: it compiled this block's own call (a copy makes its own
        on first use), and a compiled function cannot be pickled."""
        return {**self.__dict__, "static_call": None}


COMPILATION = "_dare_compilation"
"""The attribute of a compiled block that holds its :class:`BlockCompilation`."""


def compile_blocks(model, backend: str = "inductor", dynamic: bool | None = True, mode: str = "default"):
    """Compile each block of ``model`` (a DARE model, possibly peft-wrapped) in place; returns ``model``.

    Args:
        backend: ``inductor`` (generated kernels; the fast one), ``aot_eager`` (graph capture and autograd
            tracing without code generation: checks correctness cheaply) or ``eager`` (capture only).
        dynamic: ``torch.compile``'s ``dynamic``: True (default) = symbolic lengths from the first compile; None =
            specialise on the first shapes, recompile once with symbolic ones when they change; False = one
            static graph per shape (the recompile limit is raised to :data:`STATIC_RECOMPILE_LIMIT` shapes).
        mode: a key of :data:`COMPILE_MODES`: ``default``, or an autotuning mode (inductor benchmarks matmul
            kernels per shape at compile time: minutes of warm-up; with ``dynamic=False`` each step shape gets its
            own choice).
    """
    import torch._dynamo.config

    from dare.errors import unknown_choice
    from dare.models.loading import unwrap

    if backend not in COMPILE_BACKENDS:
        raise unknown_choice("compile backend", backend, COMPILE_BACKENDS)
    if mode not in COMPILE_MODES:
        raise unknown_choice("compile mode", mode, COMPILE_MODES)
    if mode != "default" and backend != "inductor":
        raise ConfigError(f"compile mode {mode} needs the inductor backend (it tunes generated kernels); got {backend}")
    base = unwrap(model)
    blocks = getattr(base, "blocks", None)
    if blocks is None:
        raise ConfigError(f"{type(base).__name__} has no transformer blocks to compile")
    # Block modules carry int attributes (head counts, ...); keep them from specialising a dynamic compilation.
    torch._dynamo.config.allow_unspec_int_on_nn_module = True
    if dynamic is False:
        _raise_recompile_limit()
    for block in blocks:
        block.compile(backend=backend, dynamic=dynamic, options=COMPILE_MODES[mode] or None)
        block.__dict__[COMPILATION] = BlockCompilation(backend, dynamic, COMPILE_MODES[mode] or None)
    return model


def _raise_recompile_limit(limit: int = STATIC_RECOMPILE_LIMIT) -> None:
    """Let one compiled region hold ``limit`` shapes: past dynamo's limit it runs the remaining shapes eagerly."""
    import torch._dynamo.config

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)


def compilation_of(block) -> BlockCompilation | None:
    """How :func:`compile_blocks` compiled ``block`` (None when it did not, or the compilation was removed)."""
    return block.__dict__.get(COMPILATION) if is_compiled(block) else None


@contextlib.contextmanager
def static_shapes(model):
    """Inside, every block of ``model`` (a DARE model, possibly peft-wrapped) that :func:`compile_blocks` compiled
    with dynamic shapes calls a static compilation of itself instead (``dynamic=False``, same backend and options;
    made on first use and kept): one graph per input shape, shared by all blocks, with the constant-indexed kernels
    of the module docstring. For fixed-shape work such as the rollout engine's steps; outside, the dynamic
    compilation serves training as before (dynamo keeps the two apart by their settings). A model without
    dynamically compiled blocks is left as it is."""
    import torch

    from dare.models.loading import unwrap

    swapped = []
    try:
        for block in getattr(unwrap(model), "blocks", ()):
            compilation = compilation_of(block)
            if compilation is None or compilation.dynamic is False:
                continue
            if compilation.static_call is None:
                _raise_recompile_limit(STATIC_DECODE_RECOMPILE_LIMIT)
                compilation.static_call = torch.compile(block._call_impl, backend=compilation.backend,
                                                        dynamic=False, options=compilation.options)
            dynamic_call = block._compiled_call_impl
            swapped.append((block, dynamic_call))
            block._compiled_call_impl = _StaticFirst(compilation.static_call, dynamic_call,
                                                     _STATIC_SEEN.setdefault(type(block), set()))
        yield model
    finally:
        for block, dynamic_call in swapped:
            block._compiled_call_impl = dynamic_call


class _StaticFirst:
    """A block's call inside :func:`static_shapes`: the static compilation for the first :data:`STATIC_SHAPES`
    input shapes of its class (``seen``, shared by every block of the class, which share the graphs), the dynamic
    one after. Calls under ``torch.compiler.set_stance("force_eager")`` (the engine's allocation probe) run
    eagerly and take no place."""

    __slots__ = ("dynamic_call", "seen", "static_call")

    def __init__(self, static_call, dynamic_call, seen: set):
        self.static_call, self.dynamic_call, self.seen = static_call, dynamic_call, seen

    def __call__(self, *args, **kwargs):
        if _forced_eager():
            return self.dynamic_call(*args, **kwargs)
        shape = _input_shape(args, kwargs)
        if shape in self.seen:
            return self.static_call(*args, **kwargs)
        if len(self.seen) < STATIC_SHAPES:
            self.seen.add(shape)
            return self.static_call(*args, **kwargs)
        if len(self.seen) == STATIC_SHAPES:
            self.seen.add(None)  # noted once
            log.warning("compiled blocks: more than %d block input shapes decoded, so later ones use the dynamic "
                        "compilation (slower small kernels; dare.models.compile.STATIC_SHAPES)", STATIC_SHAPES)
        return self.dynamic_call(*args, **kwargs)


def _forced_eager() -> bool:
    """Whether ``torch.compiler.set_stance("force_eager")`` is in effect (False where torch does not say)."""
    import torch._dynamo.eval_frame as eval_frame

    stance = getattr(eval_frame, "_stance", None)
    return getattr(stance, "stance", None) == "force_eager"


def _input_shape(args, kwargs) -> tuple:
    """What a static compilation specialises a block call on, as a hashable value: each tensor's shape and dtype
    (nested in tuples and lists), a cache layer's key buffer, which arguments are None, other values' types, and
    the autocast and grad modes."""
    import torch

    def describe(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), value.dtype
        if isinstance(value, (tuple, list)):
            return tuple(describe(v) for v in value)
        keys = getattr(value, "keys", None)
        if isinstance(keys, torch.Tensor):  # a static cache layer: its buffer, written columns and attended length
            slots = getattr(value, "slots", None)
            written = None if slots is None else tuple(slots.shape)
            return "kv", tuple(keys.shape), written, getattr(value, "length", None)
        return None if value is None else type(value).__name__

    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    device = first.device.type if first is not None else "cpu"
    autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    return (describe(args), tuple(sorted((name, describe(v)) for name, v in kwargs.items())), autocast,
            torch.is_grad_enabled())


def compile_like(model, source) -> None:
    """Compile ``model``'s blocks as ``source``'s are (same backend, dynamic setting and options): for a copy that
    decodes in its place (the rollout engine's unsharded twin of an FSDP-sharded model, which :func:`static_shapes`
    then serves as it serves the model). Nothing when ``source``'s blocks are not compiled."""
    from dare.models.loading import unwrap

    compilation = next((compilation_of(b) for b in getattr(unwrap(source), "blocks", ())), None)
    if compilation is None:
        return
    if compilation.dynamic is False:
        _raise_recompile_limit()
    for block in unwrap(model).blocks:
        block.compile(backend=compilation.backend, dynamic=compilation.dynamic, options=compilation.options)
        block.__dict__[COMPILATION] = BlockCompilation(compilation.backend, compilation.dynamic, compilation.options)


def is_compiled(module) -> bool:
    """True when ``module`` was compiled in place by :func:`compile_blocks` (``nn.Module.compile``)."""
    return getattr(module, "_compiled_call_impl", None) is not None
