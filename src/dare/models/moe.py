"""Routed experts as grouped matmuls: one :class:`ExpertBank` per MoE layer, no Python loop over experts.

The routers stay in the family modules (they differ); every family hands the bank the chosen experts
``[T, k]`` of its ``T`` tokens and gets back the expert outputs ``[T, k, D]`` to weight and sum itself.

Storage: the ``E`` SwiGLU experts are stacked, ``gate_up_proj [E, 2I, D]`` (gate rows first, then up) and
``down_proj [E, D, I]`` (``nn.Linear`` layout per expert). Released checkpoints name them per expert
(``experts.N.{gate,up,down}_proj.weight``): :func:`register_expert_checkpoint_names` makes transformers'
``from_pretrained`` stack them on load and ``save_pretrained`` split them on save, the
``load_state_dict`` pre-hook accepts either naming, and :func:`released_state_dict` gives the per-expert view.

Computation (``ExpertBank.backend``; ``auto`` picks the first that applies):

* ``grouped_mm`` - rows sorted by expert, one ``grouped_mm`` (``torch.nn.functional.grouped_mm``, else
  ``torch._grouped_mm``) for gate+up and one for down. CPU: fp32/bf16; CUDA: bf16/fp16 on SM80+; under
  ``torch.compile``: bf16 only. Widths and pointers must be 16-byte aligned.
* ``padded_bmm`` - the batched fallback for anything else (fp64, odd widths): rows scattered into
  ``[E, max_rows, D]``, two ``bmm`` calls.
* ``loop`` - the reference loop over experts; tests and ``benchmarks/moe.py`` only.

Expert parallelism (:mod:`dare.distributed.expert_parallel`) gives a bank the slice of experts its rank owns
and an ``expert_group``; rows then travel to the owning rank and back with ``all_to_all_single``
(:func:`dispatch_and_combine`).
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dare.errors import ConfigError

EXPERT_BACKENDS = ("auto", "grouped_mm", "padded_bmm", "loop")
_PER_EXPERT = re.compile(r"^(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm_applies(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the grouped GEMM kernel takes these operands (dtype, device, 16-byte aligned widths and pointers)."""
    if _grouped_mm_fn() is None:
        return False
    if x.device.type == "cuda":
        ok_dtype = x.dtype in (torch.bfloat16, torch.float16) and torch.cuda.get_device_capability(x.device) >= (8, 0)
    elif x.device.type == "cpu":
        ok_dtype = x.dtype in (torch.float32, torch.bfloat16)
    else:
        return False
    size = x.element_size()
    widths = [x.shape[-1]] + [d for w in weights for d in w.shape[-2:]]
    if torch.compiler.is_compiling():  # the traced kernel takes bf16 only; fake tensors have no data pointer
        return x.dtype == torch.bfloat16 and ok_dtype and all(d * size % 16 == 0 for d in widths)
    pointers = [x.data_ptr()] + [w.data_ptr() for w in weights]
    return ok_dtype and all(d * size % 16 == 0 for d in widths) and all(p % 16 == 0 for p in pointers)


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``x [N, K]`` (rows grouped by expert, group ``e`` ends at ``offsets[e]``) times ``weight[e].T`` -> ``[N, M]``."""
    if x.shape[0] == 0:  # no rows at all (e.g. an expert-parallel rank that received none)
        return x.new_zeros(0, weight.shape[1]) + 0 * weight.sum()
    return _grouped_mm_fn()(x, weight.transpose(-2, -1), offs=offsets)


def _padded_linear(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor, slot: torch.Tensor,
                   capacity: int) -> torch.Tensor:
    """Batched fallback: scatter rows into ``[E, capacity, K]``, one ``bmm`` against ``weight [E, M, K]``, gather."""
    padded = x.new_zeros(weight.shape[0], capacity, x.shape[-1])
    padded = padded.index_put((expert, slot), x)
    return torch.bmm(padded, weight.transpose(-2, -1))[expert, slot]


def expert_counts(flat: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Rows per expert of the flat expert ids ``flat``, as ``int64 [n_experts]``: a scatter-add, no host sync
    (CUDA ``bincount`` reads the largest id back to the host, which a recorded CUDA graph cannot do)."""
    return torch.zeros(n_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's experts: the local shard of an expert-parallel DTensor, else the tensor itself."""
    return param.to_local() if hasattr(param, "to_local") else param


class ExpertBank(nn.Module):
    """``E`` SwiGLU experts stacked for grouped matmuls (module path ``...mlp.experts``)."""

    def __init__(self, n_experts: int, hidden: int, inner: int):
        super().__init__()
        self.num_experts, self.hidden, self.inner = n_experts, hidden, inner
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, inner))
        self.backend = "auto"
        self.first_expert = 0  # global id of local expert 0 (expert parallelism)
        self.expert_group = None  # process group of the ranks sharing this layer's experts
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(_stack_per_expert_keys, with_module=True)

    def reset_parameters(self, std: float = 0.02) -> None:
        nn.init.normal_(self.gate_up_proj, std=std)
        nn.init.normal_(self.down_proj, std=std)

    @property
    def num_local_experts(self) -> int:
        return _local(self.gate_up_proj).shape[0]

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden}, inner={self.inner}, backend={self.backend}"

    # ---- forward -------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """``x [T, D]``, ``chosen [T, k]`` expert ids -> outputs ``[T, k, D]`` (output of expert ``chosen[t, j]``).

        Computed in the autocast dtype inside autocast, else in ``x``'s dtype.
        """
        tokens, k = chosen.shape
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        x = x.to(dtype)
        if self.backend == "loop":
            return self._loop(x, chosen)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        rows = x.index_select(0, order // k)  # [T*k, D] grouped by expert
        counts = expert_counts(flat, self.num_experts)
        if self.expert_group is None:
            out_sorted = self._experts(rows, counts, dtype)
        else:
            out_sorted = dispatch_and_combine(self, rows, counts, dtype)
        out = out_sorted.new_empty(tokens, k, out_sorted.shape[-1])  # returned as is, not as a view: FSDP2
        out.view(-1, out.shape[-1]).index_copy_(0, order, out_sorted)  # warns about modules that return views
        return out

    def _experts(self, rows: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """SwiGLU of the local experts on ``rows`` grouped by local expert (``counts[e]`` rows each)."""
        gate_up, down = _local(self.gate_up_proj).to(dtype), _local(self.down_proj).to(dtype)
        backend = self.backend
        if backend == "auto":
            backend = "grouped_mm" if grouped_mm_applies(rows, gate_up, down) else "padded_bmm"
        if backend == "grouped_mm":
            offsets = counts.cumsum(0).to(torch.int32)
            gate, up = _grouped_linear(rows, gate_up, offsets).chunk(2, dim=-1)
            return _grouped_linear(F.silu(gate) * up, down, offsets)
        if backend != "padded_bmm":
            raise ConfigError(f"unknown expert backend '{backend}' (choices: {', '.join(EXPERT_BACKENDS)})")
        expert = torch.repeat_interleave(torch.arange(len(counts), device=rows.device), counts)
        starts = counts.cumsum(0) - counts
        slot = torch.arange(rows.shape[0], device=rows.device) - starts[expert]
        capacity = int(counts.max()) if rows.shape[0] else 0
        gate, up = _padded_linear(rows, gate_up, expert, slot, capacity).chunk(2, dim=-1)
        return _padded_linear(F.silu(gate) * up, down, expert, slot, capacity)

    def _loop(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Reference: one gather + three matmuls per expert (what the families did before the grouped path)."""
        if self.expert_group is not None:
            raise ConfigError("the 'loop' expert backend does not support expert parallelism")
        out = x.new_zeros(*chosen.shape, x.shape[-1])
        # unbind once: its backward stacks the per-expert gradients in one buffer, like separate parameters
        gate_ups, downs = self.gate_up_proj.to(x.dtype).unbind(0), self.down_proj.to(x.dtype).unbind(0)
        for e in range(self.num_experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel():
                gate, up = F.linear(x[rows], gate_ups[e]).chunk(2, dim=-1)
                out[rows, slot] = F.linear(F.silu(gate) * up, downs[e])
        return out


def _stack_per_expert_keys(module: ExpertBank, state_dict, prefix, local_metadata, strict, missing, unexpected,
                           errors) -> None:
    """``load_state_dict`` with released names (``experts.N.gate_proj.weight`` ...): stack them in place."""
    found: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in state_dict if k.startswith(prefix)]:
        match = _PER_EXPERT.match(key[len(prefix):])
        if match:
            found.setdefault(match.group(2), {})[int(match.group(1))] = state_dict.pop(key)
    if not found:
        return
    experts = range(module.first_expert, module.first_expert + module.num_local_experts)
    if all(set(experts) <= set(found.get(name, {})) for name in ("gate_proj", "up_proj", "down_proj")):
        gate = torch.stack([found["gate_proj"][e] for e in experts])
        up = torch.stack([found["up_proj"][e] for e in experts])
        state_dict[prefix + "gate_up_proj"] = torch.cat([gate, up], dim=1)
        state_dict[prefix + "down_proj"] = torch.stack([found["down_proj"][e] for e in experts])
    else:  # leave them as unexpected keys: strict loading names them
        for name, tensors in found.items():
            state_dict.update({f"{prefix}{e}.{name}.weight": t for e, t in tensors.items()})


def per_expert_tensors(prefix: str, gate_up: torch.Tensor, down: torch.Tensor, first_expert: int = 0) -> dict:
    """Released names of a stacked bank: ``{prefix}N.{gate,up,down}_proj.weight``."""
    gate, up = gate_up.chunk(2, dim=1)
    out = {}
    for i in range(gate_up.shape[0]):
        e = first_expert + i
        out.update({f"{prefix}{e}.gate_proj.weight": gate[i], f"{prefix}{e}.up_proj.weight": up[i],
                    f"{prefix}{e}.down_proj.weight": down[i]})
    return out


def released_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` under the released checkpoint names (stacked experts split per expert, as views)."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, ExpertBank):
            prefix = f"{name}." if name else ""
            gate_up, down = state.pop(prefix + "gate_up_proj"), state.pop(prefix + "down_proj")
            state.update(per_expert_tensors(prefix, gate_up, down, module.first_expert))
    return state


def register_expert_checkpoint_names(model_class: type) -> None:
    """transformers' load/save conversion between per-expert checkpoint tensors and the stacked bank, keyed by
    the class name and by the config's ``model_type`` (FSDP2 renames the class of a sharded model)."""
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

    for key in (model_class.__name__, model_class.config_class.model_type):
        register_checkpoint_conversion_mapping(key, [
            WeightConverter(
                source_patterns=["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
                target_patterns="mlp.experts.gate_up_proj",
                operations=[MergeModulelist(dim=0), Concatenate(dim=1)],
            ),
            WeightConverter(
                source_patterns="mlp.experts.*.down_proj.weight",
                target_patterns="mlp.experts.down_proj",
                operations=[MergeModulelist(dim=0)],
            ),
        ], overwrite=True)


def set_expert_backend(model: nn.Module, backend: str) -> int:
    """Set the computation of every :class:`ExpertBank` in ``model``; returns how many banks were set."""
    if backend not in EXPERT_BACKENDS:
        from dare.errors import unknown_choice

        raise unknown_choice("expert backend", backend, EXPERT_BACKENDS)
    banks = [m for m in model.modules() if isinstance(m, ExpertBank)]
    for bank in banks:
        bank.backend = backend
    return len(banks)


def _all_to_all(rows: torch.Tensor, send: list[int], receive: list[int], group) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` of ``rows`` (``send[i]`` rows go to rank ``i``): torch's functional
    collective where it has one (``torch.distributed.nn.functional``'s is deprecated and warns on every call)."""
    try:
        from torch.distributed._functional_collectives import all_to_all_single_autograd
    except ImportError:  # older torch
        from torch.distributed.nn.functional import all_to_all_single

        out = rows.new_empty(sum(receive), *rows.shape[1:])
        return all_to_all_single(out, rows.contiguous(), receive, send, group=group)
    from torch.distributed._functional_collectives import wait_tensor

    return wait_tensor(all_to_all_single_autograd(rows.contiguous(), list(receive), list(send), group))


def dispatch_and_combine(bank, rows: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Expert outputs of ``rows`` (grouped by global expert, ``counts[e]`` rows each), computed on the owners."""
    group = bank.expert_group
    size, local = dist.get_world_size(group), bank.num_local_experts
    send_counts = counts.view(size, local)  # [destination rank, its local expert]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts.contiguous(), group=group)  # [source rank, my local expert]
    send, receive = send_counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    received = _all_to_all(rows, send, receive, group)  # ordered by source rank, then local expert
    local_ids = torch.arange(local, device=rows.device).repeat(size).repeat_interleave(recv_counts.reshape(-1))
    order = local_ids.argsort(stable=True)
    outputs = bank._experts(received.index_select(0, order), recv_counts.sum(0), dtype)
    outputs = torch.empty_like(outputs).index_copy(0, order, outputs)
    return _all_to_all(outputs, receive, send, group)
