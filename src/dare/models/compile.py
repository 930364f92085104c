"""Regional ``torch.compile``: compile every transformer block, leave attention to its own kernels.

Each block is compiled in place (``nn.Module.compile``), so parameter names, checkpoints, LoRA and FSDP
wrapping are unchanged. Compilation stops at :func:`dare.models.base.cached_attend` (a graph break): the
attention kernels are already fused (flash / FlexAttention / varlen) and the attention layout changes every
batch, while the code around it - RMSNorm in fp32, RoPE, SwiGLU, residual adds - is where fusion pays.

Compilation is dynamic by default (sequence length, batch size and the block's layer index are symbolic), so
all blocks and all packed-row lengths share one graph per region: the first step compiles, later steps never
recompile. Parameter shapes stay static (``torch._dynamo.config.force_parameter_static_shapes``), so the
hidden size and the reductions over it are specialised.
"""

from __future__ import annotations

from dare.errors import ConfigError

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def compile_blocks(model, backend: str = "inductor", dynamic: bool | None = True):
    """Compile each block of ``model`` (a DARE model, possibly peft-wrapped) in place; returns ``model``.

    Args:
        backend: ``inductor`` (generated kernels; the fast one), ``aot_eager`` (graph capture and autograd
            tracing without code generation: checks correctness cheaply) or ``eager`` (capture only).
        dynamic: ``torch.compile``'s ``dynamic``: True (default) = symbolic lengths from the first compile; None =
            specialise on the first shapes and layer index, recompile once with symbolic ones when they change.
    """
    import torch._dynamo.config

    from dare.errors import unknown_choice
    from dare.models.loading import unwrap

    if backend not in COMPILE_BACKENDS:
        raise unknown_choice("compile backend", backend, COMPILE_BACKENDS)
    base = unwrap(model)
    blocks = getattr(base, "blocks", None)
    if blocks is None:
        raise ConfigError(f"{type(base).__name__} has no transformer blocks to compile")
    # Block modules carry their layer index as an int attribute; without this every block would be a separate
    # specialisation and, past the recompile limit (8), the remaining blocks would silently run eagerly.
    torch._dynamo.config.allow_unspec_int_on_nn_module = True
    for block in blocks:
        block.compile(backend=backend, dynamic=dynamic)
    return model


def is_compiled(module) -> bool:
    """True when ``module`` was compiled in place by :func:`compile_blocks` (``nn.Module.compile``)."""
    return getattr(module, "_compiled_call_impl", None) is not None
