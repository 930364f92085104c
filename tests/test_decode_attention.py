"""The split-KV decoding attention kernels (dare.models.decode_attention) against a float64 reference.

The kernels are Triton; without a GPU they run in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess
because the interpreter is chosen when the kernels are defined; float16, which NumPy can represent). Skipped where
Triton is not installed (the CPU-only CI); ``tests/test_gpu.py`` runs them compiled, in bfloat16, and inside the
rollout engine.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from dare.errors import ConfigError
from dare.models.decode_attention import BLOCK_N, num_splits, routes

CHECK = textwrap.dedent("""
    import torch
    from dare.models.decode_attention import decode_attention

    torch.manual_seed(0)
    # (batch, query heads, KV heads, queries, keys, head size, processors, mask shape, keys per tile)
    cases = [(2, 8, 2, 4, 100, 64, 8, "query", 64),    # GQA 4, two key slices merged, the last one partial
             (3, 4, 4, 5, 130, 128, 1, "query", 64),   # no GQA, one slice (normalised in the first kernel)
             (1, 32, 8, 2, 200, 64, 64, "keys", 64),   # four slices, a [B, 1, 1, K] key mask
             (2, 4, 1, 3, 70, 64, 4, "one", 64),       # rows that see a single key
             (2, 4, 4, 6, 90, 64, 2, "none", 32),      # no mask (every key), smaller tiles, two slices
             (1, 8, 2, 3, 150, 64, 1, "query", 128)]   # one slice of larger tiles, the last one partial
    worst = 0.0
    for b, h, hkv, n, keys, d, processors, kind, block_n in cases:
        q = torch.randn(b, h, n, d).half()
        cache = torch.randn(2, b, hkv, keys + 9, d).half()
        k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]  # strided views of a longer cache, as in decoding
        if kind == "keys":
            mask = torch.rand(b, 1, 1, keys) < 0.5
        else:
            mask = torch.rand(b, 1, n, keys) < (0.6 if kind == "query" else 0.0)
        mask[..., keys // 2] = True
        if kind == "none":
            mask[...] = True
        out = decode_attention(q, k, v, None if kind == "none" else mask, d ** -0.5, processors=processors,
                               block_n=block_n)
        groups = h // hkv
        kk, vv = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
        scores = (q.double() @ kk.transpose(-1, -2) * d ** -0.5).masked_fill(~mask, float("-inf"))
        expected = scores.softmax(-1) @ vv
        assert out.shape == q.shape and out.dtype == q.dtype
        assert out.transpose(1, 2).is_contiguous()  # [B, Q, H, D] memory: the attention output reshapes for free
        worst = max(worst, (out.double() - expected).abs().max().item())
    print("max error", worst)
    assert worst < 2e-3, worst
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernels_equal_a_float64_reference_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def test_key_slices_fill_two_waves_and_stay_whole_tiles():
    assert num_splits(programs=512, keys=388, processors=132) == 1  # SDAR B=64: enough programs already
    assert num_splits(programs=8, keys=388, processors=132) == -(-388 // BLOCK_N)  # B=1: one tile per slice
    assert num_splits(programs=8, keys=4096, processors=132, block_n=64) == 33
    assert num_splits(programs=1, keys=10, processors=132) == 1


def test_masked_calls_are_routed_by_default_and_unmasked_ones_only_when_asked():
    assert routes("auto", masked=True) and not routes("auto", masked=False)
    assert routes("triton", masked=True) and routes("triton", masked=False)
    assert not routes("sdpa", masked=True) and not routes("sdpa", masked=False)


def test_never_used_off_cuda_and_a_misspelt_setting_is_a_one_line_error(monkeypatch):
    import torch

    from dare.models.decode_attention import applies

    q, k = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16), torch.zeros(1, 1, 10, 64, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 2, 10, dtype=torch.bool)
    for choice in ("triton", "auto", None):
        if choice is None:
            monkeypatch.delenv("DARE_DECODE_ATTENTION", raising=False)
        else:
            monkeypatch.setenv("DARE_DECODE_ATTENTION", choice)
        assert not applies(q, k, mask) and not applies(q, k, None)  # CPU tensors
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "trition")
    with pytest.raises(ConfigError, match="DARE_DECODE_ATTENTION must be one of auto, triton, sdpa"):
        applies(q, k, mask)


def test_a_kernel_failure_under_auto_falls_back_to_sdpa_with_one_warning(monkeypatch, caplog):
    import torch

    from dare.models import decode_attention as kernels

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas fatal: unsupported GPU\nmore detail")

    monkeypatch.setattr(kernels, "decode_attention", broken)
    monkeypatch.setattr(kernels, "_FAILED", False)
    monkeypatch.delenv("DARE_DECODE_ATTENTION", raising=False)
    q, k = torch.zeros(1, 4, 2, 64), torch.zeros(1, 1, 10, 64)
    with caplog.at_level("WARNING", logger="dare.models"):
        assert kernels.attend_or_none(q, k, k, None, 0.125) is None
    assert kernels._FAILED and "using SDPA" in caplog.text and "ptxas fatal: unsupported GPU" in caplog.text
    assert "more detail" not in caplog.text  # one line
    # every later call goes to SDPA (a stand-in for CUDA tensors on a Hopper GPU, which would otherwise qualify)
    monkeypatch.setattr(kernels, "triton", object())
    monkeypatch.setattr(kernels, "_generation", lambda device: 9)
    cuda_q, cuda_k = (SimpleNamespace(is_cuda=True, requires_grad=False, device=None, dtype=torch.bfloat16,
                                      shape=shape) for shape in ((1, 4, 2, 64), (1, 1, 10, 64)))
    mask = torch.ones(1, 1, 2, 10, dtype=torch.bool)
    assert not kernels.applies(cuda_q, cuda_k, mask)
    monkeypatch.setattr(kernels, "_FAILED", False)
    assert kernels.applies(cuda_q, cuda_k, mask)
    monkeypatch.setattr(kernels, "_FAILED", True)
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "triton")  # asked for explicitly: the error is the user's to see
    with pytest.raises(RuntimeError, match="ptxas"):
        kernels.attend_or_none(q, k, k, None, 0.125)
    monkeypatch.setattr(kernels, "decode_attention", lambda *a, **kw: (_ for _ in ()).throw(torch.OutOfMemoryError()))
    monkeypatch.delenv("DARE_DECODE_ATTENTION")
    with pytest.raises(torch.OutOfMemoryError):
        kernels.attend_or_none(q, k, k, None, 0.125)
