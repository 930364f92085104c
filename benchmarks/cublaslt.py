"""cuBLASLt's ranked algorithm list for one bf16 projection, through ctypes (GPU; benchmark helper, not a DARE
dependency).

PyTorch runs each matmul on the first algorithm cuBLAS(Lt)'s heuristic proposes. The heuristic can return a ranked
list; :func:`plans` asks for up to ``count`` algorithms for ``y = x @ w.T`` (``x`` of shape ``[M, K]``, ``w`` of
shape ``[N, K]``, both row-major bf16, fp32 accumulation) and returns one :class:`Plan` per algorithm, which runs
the matmul on the current CUDA stream (so it can be recorded into a CUDA graph). ``matmul_variants.py --lt-algos
N`` times them against ``F.linear``.

In cuBLASLt's column-major terms the product is ``D[N, M] = op(A)[N, K] @ B[K, M]`` with ``A`` = ``w``'s memory
read as a ``K x N`` matrix and transposed, and ``B`` = ``x``'s memory as ``K x M``: PyTorch's own orientation.

Measured on an H100 (``benchmarks/RESULTS.md``, eighteenth session): the first algorithm is the fastest for almost
every 8B projection at 224-512 rows; Hopper's kernels report no tile / split-K attributes (labels show the waves).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_R_32F, _R_16BF = 0, 14  # cudaDataType_t
_DESC_TRANSA = 3  # cublasLtMatmulDescAttributes_t
_OP_T = 1  # cublasOperation_t
_PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
_CONFIG = {"id": 0, "tile": 1, "split_k": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
           "inner": 7, "cluster": 8}
"""cublasLtMatmulAlgoConfigAttributes_t values read into each plan's label."""
WORKSPACE_BYTES = 32 << 20
"""Workspace offered to every algorithm (split-K reductions need some)."""


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@functools.cache
def _library() -> ctypes.CDLL:
    """The libcublasLt PyTorch has loaded (found in this process's memory map after one cuBLAS call)."""
    a = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, a)  # loads cuBLAS, which loads cuBLASLt
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublasLt.so" in line}
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process: cannot enumerate cuBLASLt algorithms")
    lib = ctypes.CDLL(sorted(paths)[0])
    lib.cublasLtMatmul.argtypes = [ctypes.c_void_p] * 13 + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                               ctypes.c_int64]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                         ctypes.c_size_t]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_void_p,
                                                                          ctypes.c_void_p]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                         ctypes.c_size_t, ctypes.c_void_p]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cublasStatus_t {status}")


@functools.cache
def _handle() -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


@dataclass
class Plan:
    """One cuBLASLt algorithm for one ``(M, N, K)``: ``plan(x, w, out)`` writes ``x @ w.T`` into ``out``."""

    rank: int
    """Position in the heuristic's ranking (0: the one cuBLASLt would run)."""
    label: str
    """The algorithm's configuration: id, tile, split-K, stages, cluster shape, waves."""
    _algo: _Algo
    _descs: tuple
    _workspace: torch.Tensor

    def __call__(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        op, a, b, c = self._descs
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = _library().cublasLtMatmul(
            _handle(), op, ctypes.byref(alpha), ctypes.c_void_p(w.data_ptr()), a, ctypes.c_void_p(x.data_ptr()), b,
            ctypes.byref(beta), ctypes.c_void_p(out.data_ptr()), c, ctypes.c_void_p(out.data_ptr()), c,
            ctypes.byref(self._algo), ctypes.c_void_p(self._workspace.data_ptr()), WORKSPACE_BYTES,
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        _check(status, f"cublasLtMatmul ({self.label})")
        return out


def plans(rows: int, out_features: int, in_features: int, count: int = 16) -> list[Plan]:
    """Up to ``count`` cuBLASLt algorithms, best-ranked first, for ``[rows, in] @ [out, in].T`` in bf16."""
    lib = _library()
    op = ctypes.c_void_p()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(op), _COMPUTE_32F, _R_32F), "cublasLtMatmulDescCreate")
    trans = ctypes.c_int32(_OP_T)
    _check(lib.cublasLtMatmulDescSetAttribute(op, _DESC_TRANSA, ctypes.byref(trans), 4), "set TRANSA")
    layouts = []
    for r, c_, ld in ((in_features, out_features, in_features), (in_features, rows, in_features),
                      (out_features, rows, out_features)):
        layout = ctypes.c_void_p()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), _R_16BF, r, c_, ld), "cublasLtMatrixLayoutCreate")
        layouts.append(layout)
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    limit = ctypes.c_uint64(WORKSPACE_BYTES)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(limit), 8),
           "set MAX_WORKSPACE_BYTES")
    results = (_Heuristic * count)()
    found = ctypes.c_int(0)
    a, b, c = layouts
    _check(lib.cublasLtMatmulAlgoGetHeuristic(_handle(), op, a, b, c, c, pref, count, results, ctypes.byref(found)),
           "cublasLtMatmulAlgoGetHeuristic")
    lib.cublasLtMatmulPreferenceDestroy(pref)
    descs = _Descriptors(op, a, b, c)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    return [Plan(i, _label(results[i]), results[i].algo, descs, workspace)
            for i in range(found.value) if results[i].state == 0]


class _Descriptors(tuple):
    """The matmul descriptor and the three matrix layouts one shape's plans share, destroyed with the last plan."""

    def __new__(cls, op, *layouts):
        return super().__new__(cls, (op, *layouts))

    def __del__(self):
        try:
            lib = _library()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees everything anyway
            return
        lib.cublasLtMatmulDescDestroy(self[0])
        for layout in self[1:]:
            lib.cublasLtMatrixLayoutDestroy(layout)


def _label(result: _Heuristic) -> str:
    lib = _library()
    parts = []
    for name, attr in _CONFIG.items():
        value, written = ctypes.c_uint64(0), ctypes.c_size_t(0)
        status = lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(result.algo), attr, ctypes.byref(value), 8,
                                                         ctypes.byref(written))
        if status == 0 and value.value:
            parts.append(f"{name}={value.value}")
    return " ".join(parts) + f" waves={result.waves:.2f}"
