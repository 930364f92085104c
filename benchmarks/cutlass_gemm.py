"""DARE's hand-instantiated CUTLASS Hopper GEMMs (``benchmarks/cutlass/dare_gemm.cu``) through ctypes (GPU;
benchmark helper, not a DARE dependency).

Build the library first (no GPU needed; the compiler and CUTLASS's headers come from PyPI wheels)::

    bash benchmarks/cutlass/build.sh

:func:`plans` returns one :class:`Plan` per kernel configuration and decomposition that can run ``y = x @ w.T`` for
``x`` of shape ``[M, K]`` and ``w`` of shape ``[N, K]`` (bf16, row-major, fp32 accumulation). A plan runs on the
current CUDA stream, so it can be recorded into a CUDA graph. ``matmul_variants.py --cutlass`` times them against
``F.linear``; ``rollout.py`` / ``bd_rollout.py --cutlass-narrow`` run whole rollouts with
:func:`route_narrow_projections`.

Measured on an H100 (``benchmarks/RESULTS.md``, nineteenth session): the 64 x 128 ping-pong kernel beats cuBLAS on
the 4096-wide outputs at 256 rows (the down projection also at 224), cuBLAS wins the wide ones, and whole rollouts
gain under 1 %.
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent / "cutlass"
LIBRARY = HERE / "libdare_gemm.so"
DECOMPOSITIONS = {"heur": (0, 1), "dp": (1, 1), "split2": (2, 2), "split4": (2, 4), "streamk": (3, 1)}
"""Stream-K scheduler decompositions tried per stream-K variant: name -> (DecompositionMode, splits)."""


def missing_library(option: str) -> str | None:
    """The one-line error of a benchmark ``option`` that needs the library while it is not built, else None."""
    if LIBRARY.exists():
        return None
    return f"{option} needs {LIBRARY.name}: build it with `bash benchmarks/cutlass/build.sh` (no GPU needed)"


def variant_names() -> list[str]:
    """The configurations the library exports, in source order (``DARE_VARIANT(name, ...)`` lines)."""
    return re.findall(r"^DARE_VARIANT\((\w+),", (HERE / "dare_gemm.cu").read_text(), flags=re.M)


@functools.cache
def _library() -> ctypes.CDLL:
    if not LIBRARY.exists():
        raise FileNotFoundError(f"{LIBRARY} is missing: build it with `bash benchmarks/cutlass/build.sh`")
    lib = ctypes.CDLL(str(LIBRARY))
    for name in variant_names():
        getattr(lib, f"dare_gemm_{name}_workspace").restype = ctypes.c_longlong
        getattr(lib, f"dare_gemm_{name}_workspace").argtypes = [ctypes.c_int] * 6
        getattr(lib, f"dare_gemm_{name}").argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [
            ctypes.c_void_p] + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    return lib


@dataclass
class Plan:
    """One kernel configuration and decomposition: ``plan(x, w, out)`` writes ``x @ w.T``. A workspace is sized for
    one ``(M, N, K)`` (:func:`plans`); a plan without one serves any shape (:func:`persistent_plan`)."""

    label: str
    """``<variant>`` or ``<variant>/<decomposition>`` for the stream-K variants."""
    _run: object
    _decomposition: tuple[int, int]
    _sm_count: int
    _workspace: torch.Tensor | None
    """Device memory of the call's workspace (None: the configuration needs none)."""

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        (m, k), n = x.shape, w.shape[0]
        workspace = None if self._workspace is None else self._workspace.data_ptr()
        status = self._run(x.data_ptr(), w.data_ptr(), out.data_ptr(), m, n, k, workspace, *self._decomposition,
                           self._sm_count, torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(f"CUTLASS GEMM {self.label} failed with status {status} at M={m} N={n} K={k}")
        return out


@functools.cache
def persistent_plan(variant: str) -> Plan:
    """The plan of a persistent configuration: it needs no workspace, so one plan serves every shape."""
    if variant not in variant_names() or variant.endswith("_sk"):
        raise ValueError(f"variant must be a persistent configuration of {variant_names()}, got {variant!r}")
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 0
    return Plan(variant, getattr(_library(), f"dare_gemm_{variant}"), (0, 1), sm_count, None)


def plans(rows: int, out_features: int, in_features: int) -> list[Plan]:
    """Every configuration (and stream-K decomposition) of the library that can run this shape."""
    lib = _library()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    found = []
    for name in variant_names():
        decompositions = DECOMPOSITIONS if name.endswith("_sk") else {"": (0, 1)}
        for tag, (mode, splits) in decompositions.items():
            size = getattr(lib, f"dare_gemm_{name}_workspace")(rows, out_features, in_features, mode, splits,
                                                               sm_count)
            if size < 0:
                continue
            workspace = torch.zeros(max(size, 1), dtype=torch.uint8, device="cuda")
            found.append(Plan(f"{name}/{tag}" if tag else name, getattr(lib, f"dare_gemm_{name}"), (mode, splits),
                              sm_count, workspace))
    return found


NARROW_PROJECTIONS = r"\.(blocks|layers)\.\d+\..*(o_proj|down_proj|attn_out|ff_out)$"
"""Qualified names of the projections back to the hidden size (attention output, MLP down) in DARE's models."""


@torch.library.custom_op("dare_bench::cutlass_linear", mutates_args=())
def cutlass_linear(x: torch.Tensor, weight: torch.Tensor, variant: str) -> torch.Tensor:
    """``F.linear(x, weight)`` by one persistent (workspace-free) configuration of the library."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    if rows.data_ptr() % 16:
        rows = rows.clone()
    out = torch.empty(rows.shape[0], weight.shape[0], device=x.device, dtype=x.dtype)
    return persistent_plan(variant)(rows, weight, out).view(*x.shape[:-1], weight.shape[0])


@cutlass_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, variant: str) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def route_narrow_projections(model: torch.nn.Module, variant: str = "pp_64x128_c1_p",
                             rows: tuple[int, int] = (193, 256)) -> int:
    """Runs every bias-free attention-output and MLP-down projection of ``model`` (:data:`NARROW_PROJECTIONS`) through
    ``variant`` when the call's row count lies in ``rows`` (inclusive; the window measured), through ``F.linear``
    otherwise; returns how many projections were routed. ``matmul_variants.py --cutlass`` measured the 64 x 128
    ping-pong kernel 7-14 % under cuBLAS for these 4096-wide outputs at 256 rows (H100; down also at 224), and no
    faster at 512; in whole rollouts (``rollout.py`` / ``bd_rollout.py --cutlass-narrow``) that came to under 1 %."""
    persistent_plan(variant)  # a bad variant or a missing library fails here, not inside a compiled region
    routed = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module.bias is None and re.search(NARROW_PROJECTIONS, name):
            def forward(x, module=module):
                if (x.is_cuda and x.dtype == torch.bfloat16 == module.weight.dtype
                        and rows[0] <= x.numel() // x.shape[-1] <= rows[1]):
                    return cutlass_linear(x, module.weight, variant)
                return torch.nn.functional.linear(x, module.weight)
            module.forward = forward
            routed += 1
    return routed
