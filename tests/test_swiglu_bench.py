"""benchmarks/swiglu_gemm.py's Triton kernel (gate and up projections in one matmul, SwiGLU in the epilogue)
against the separate computation, in Triton's interpreter (a subprocess: the interpreter is chosen when the kernel
is defined). Skipped where Triton is not installed (the CPU-only CI); the GPU run compares it to cuBLAS bit for bit
and times it (benchmarks/RESULTS.md, thirteenth session)."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = textwrap.dedent(f"""
    import importlib.util, torch
    spec = importlib.util.spec_from_file_location("swiglu_gemm", {str(ROOT / "benchmarks" / "swiglu_gemm.py")!r})
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    Config = bench.Config
    torch.manual_seed(0)
    configs = [Config(32, 32, 32),                                         # one program per tile
               Config(32, 32, 16, persistent=True),                        # 3 programs walking the tiles
               Config(64, 64, 32, persistent=True, group_m=2)]             # grouped order, a partial row tile
    for rows in (5, 64, 130):
        x = torch.randn(rows, 96)                 # K = 96: three or six inner slices
        weight = torch.randn(2 * 128, 96) * 0.1   # N = 128 gate and 128 up rows
        expected = bench.swiglu_reference(x, weight)
        for config in configs:
            assert bench.supported(x, weight, config)
            out = bench.swiglu_linear(x, weight, config, programs=3)
            assert out.shape == (rows, 128), out.shape
            err = (out - expected).abs().max().item()
            assert err < 1e-4, (rows, config.label(), err)
    odd = torch.randn(2 * 100, 96)
    assert not bench.supported(torch.randn(4, 96), odd, Config(32, 64, 32))  # a gate tile would reach the up rows
    assert not bench.supported(torch.randn(4, 95), torch.randn(256, 95))      # inner size: no 16-byte TMA stride
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_fused_swiglu_kernel_equals_the_separate_computation_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
