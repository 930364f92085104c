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
where every new length would compile again.
"""

from __future__ import annotations

from dare.errors import ConfigError

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
    if dynamic is False:  # past the limit dynamo would silently run the remaining shapes eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, STATIC_RECOMPILE_LIMIT)
    for block in blocks:
        block.compile(backend=backend, dynamic=dynamic, options=COMPILE_MODES[mode] or None)
    return model


def is_compiled(module) -> bool:
    """True when ``module`` was compiled in place by :func:`compile_blocks` (``nn.Module.compile``)."""
    return getattr(module, "_compiled_call_impl", None) is not None
