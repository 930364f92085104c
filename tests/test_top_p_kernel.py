"""The sort-free top-p filter (dare.rollout.engine.top_p_kernel) against the sorted cumulative sum.

The kernel is Triton; without a GPU it runs in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess because
the interpreter is chosen when the kernels are defined). Skipped where Triton is not installed (the CPU-only CI);
``tests/test_gpu.py`` runs it compiled at real vocabularies.
"""

import importlib.util
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dare.rollout.engine import sampling, top_p_kernel

CHECK = textwrap.dedent("""
    import torch
    from dare.rollout.engine import sampling, top_p_kernel
    from dare.rollout.engine.top_p_kernel import top_p_filter
    from dare.rollout.kernels import top_p_sorted

    def stable_reference(x, p):  # the sorted filter with ties in index order (torch promises no order otherwise)
        s, idx = torch.sort(x, dim=-1, descending=True, stable=True)
        remove = torch.cumsum(torch.softmax(s, -1), -1) > p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        return x.masked_fill(torch.zeros_like(remove).scatter(-1, idx, remove), float("-inf"))

    def scores(logits, t):
        return logits.float() / t if t > 0 else logits.float()

    torch.manual_seed(0)
    # (rows, vocabulary, top_p, dtype, processors): slicings of 1 to 5 slices, continuous and bf16-tied values
    for rows, v, p, dtype, procs in [(3, 3000, 0.9, torch.float32, 8), (2, 5000, 0.5, torch.float32, 64),
                                     (4, 2100, 0.99, torch.float32, 1), (2, 3000, 0.3, torch.bfloat16, 8),
                                     (2, 3000, 0.95, torch.bfloat16, 2), (1, 4100, 0.05, torch.float32, 16)]:
        x = (torch.randn(rows, v) * 2).to(dtype).float()
        x[0, 5] = float("-inf")                                  # a removed entry (the banned id) stays out
        got = top_p_filter(x, p, processors=procs)
        want = stable_reference(x, p)
        assert torch.equal(got, want), (rows, v, p, dtype, torch.isfinite(got).sum(-1), torch.isfinite(want).sum(-1))
        if dtype == torch.float32:                               # no ties: the sorted filter itself agrees
            assert torch.equal(got, top_p_sorted(x, p))

    # ties at the threshold, across two slices (columns 1018-1029; slices of 1024): the lowest indices are kept
    x = torch.full((2, 3000), -12.0)
    x[:, :10] = 0.0
    x[:, 1018:1030] = -1.0
    x[1, 2000] = float("-inf")
    z = torch.softmax(x[0], -1)
    top, tie = z[:10].sum().item(), z[1018].item()
    for p, kept in ((top + 6.5 * tie, 7), (top + 0.2 * tie, 1), (top + 11.9 * tie, 12), (0.2, 0)):
        got = top_p_filter(x, p, processors=4)
        assert torch.equal(got, stable_reference(x, p)), p
        ties = torch.isfinite(got[0, 1018:1030]).nonzero().flatten().tolist()
        assert ties == list(range(kept)), (p, ties)

    # the value bins' two extremes: thresholds below the 15 bins (the open bottom bin's tokens go to the radix
    # passes) and every token in the top bin
    import triton.language as tl
    for width in (0.05, 1000.0):
        top_p_kernel._WIDTH = tl.constexpr(width)
        for p, dtype, t in ((0.9, torch.float32, 0.0), (0.95, torch.bfloat16, 0.5)):
            logits = (torch.randn(3, 3000) * 2).to(dtype)
            want = stable_reference(scores(logits, t), p)
            assert torch.equal(top_p_filter(logits, p, temperature=t, processors=4), want), (width, p)
            drawn, source, _, _ = top_p_kernel._nucleus(logits, p, t, 11, pair=True, processors=4)
            assert torch.equal(source, want), (width, p)
    top_p_kernel._WIDTH = tl.constexpr(top_p_kernel.BIN_WIDTH)

    # a window view of wider logits, a row without a finite entry (unchanged), and 3-d input
    wide = torch.randn(2, 5, 2500) * 3
    window = wide[:, 1:-1]
    window[1, 2] = float("-inf")
    got = top_p_filter(window, 0.8, processors=8)
    assert got.shape == window.shape and torch.equal(got, stable_reference(window, 0.8))

    # bf16 / float16 logits divided by the temperature inside the kernel (bf16: 16-bit keys, half the passes), with
    # the banned column removed, and the drawn / source pair sharing their passes
    for rows, v, p, dtype, procs, t in [(2, 3000, 0.3, torch.bfloat16, 8, 0.7), (3, 3000, 0.95, torch.bfloat16, 2, 1.0),
                                        (2, 2100, 0.9, torch.float16, 1, 1.3), (2, 3000, 0.6, torch.float32, 4, 0.9)]:
        logits = (torch.randn(rows, v) * 2).to(dtype)
        logits[0, 5] = float("-inf")
        got = top_p_filter(logits, p, temperature=t, processors=procs)
        assert torch.equal(got, stable_reference(scores(logits, t), p))
        choice = scores(logits, t).clone()
        choice[..., 11] = float("-inf")
        want = stable_reference(choice, p)
        assert torch.equal(top_p_filter(logits, p, temperature=t, banned=11, processors=procs), want), (dtype, p)
        drawn, source, own, _ = top_p_kernel._nucleus(logits, p, t, 11, pair=True, processors=procs)
        assert torch.equal(drawn, want) and torch.equal(source, stable_reference(scores(logits, t), p)), (dtype, p)
        assert own.sum() < rows, own  # a light banned token: most rows' drawn filter comes from the shared passes

    # a banned token heavy enough to move the boundary, above every other token, tied with the top, or the only
    # finite entry: those rows take their own passes, with the same result as a separate filter
    logits = (torch.randn(9, 3000) * 2).bfloat16()
    logits[0, 11], logits[1, 11], logits[2, 11], logits[3, 11] = 9.0, 30.0, logits[2].max(), -20.0  # 3: light
    logits[4:] = -12.0
    logits[4:6] = float("-inf")
    logits[4, 11] = 1.0                              # the banned token is the only finite entry
    logits[6, :4], logits[6, 11], logits[6, 100] = 0.0, 0.5, 1.0  # banned kept (not first), ahead of four ties
    logits[7, :2], logits[7, [5, 11, 20, 30]] = 1.0, 0.0  # banned tied with three tokens at the threshold
    logits[8, :4], logits[8, 11] = 0.0, -0.3         # banned removed, just behind four equal tokens
    choice = logits.float().clone()
    choice[..., 11] = float("-inf")
    # 0.86: row 6's drawn nucleus keeps a fourth token the source's loses (the banned token ahead of the boundary);
    # 0.77: row 7's keeps column 20 (the banned token among the ties); 0.65: row 8's loses the fourth token the
    # source's keeps (the banned token behind it)
    for p, moved in ((0.3, []), (0.65, [8]), (0.77, [7]), (0.86, [6]), (0.9, [])):
        drawn, source, own, _ = top_p_kernel._nucleus(logits, p, 0.0, 11, pair=True, processors=4)
        assert torch.equal(drawn, stable_reference(choice, p))
        assert torch.equal(source, stable_reference(logits.float(), p))
        assert own[:3].tolist() == [1, 1, 1] and own[3] == 0 and own[5] == 0, (p, own)
        assert all(own[r] == 1 for r in moved), (p, own)
        kept = torch.isfinite(source) & (torch.arange(3000) != 11)
        assert all(not torch.equal(kept[r], torch.isfinite(drawn[r])) for r in moved), p  # the boundary moved
    assert torch.isinf(drawn[4]).all() and torch.isinf(drawn[5]).all()

    # the static engine's proposals route their filters through it: one call for the drawn and the source
    # distributions, the same tokens as the sorted filter
    from dare.rollout.engine.noise import vocabulary_salts
    for dtype in (torch.float32, torch.bfloat16):
        logits, eligible = (torch.randn(2, 4, 3000) * 3).to(dtype), torch.ones(2, 4, dtype=torch.bool)
        keys, counters, positions = torch.randint(0, 2**32, (2, 2)), torch.arange(2), torch.arange(4)
        args = (logits, eligible, keys, counters, positions, vocabulary_salts(3000, "cpu"))
        settings = dict(banned=7, temperature=0.9, top_p=0.7, top_k=None, top_k_first=False,
                        confidence_source="sampling", confidence="prob")
        serves = top_p_kernel.serves
        top_p_kernel.serves = lambda scores: False
        want = sampling._propose_ops(*args, **settings)
        calls = []
        top_p_kernel.serves = lambda scores: calls.append(scores.dtype) or True
        got = sampling._propose_ops(*args, **settings)
        assert calls == [dtype] and torch.equal(got[0], want[0]), calls  # one call, on the model's logits
        assert (got[1] - want[1]).abs().max() < 1e-5 and (got[2] - want[2]).abs().max() < 1e-5
        calls.clear()
        random = sampling._propose_ops(*args, **dict(settings, confidence="random"))
        assert len(calls) == 1 and torch.equal(random[0], got[0])
        calls.clear()
        both = sampling._propose_ops(*args, **dict(settings, top_k=50))  # with top-k: float32 scores, two calls
        assert calls == [torch.float32, torch.float32], calls
        top_p_kernel.serves = serves
    print("ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernel_equals_the_sorted_filter_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", CHECK], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


def test_cpu_tensors_and_the_switch_keep_the_sorted_filter(monkeypatch):
    assert not top_p_kernel.serves(torch.zeros(2, 100))
    monkeypatch.setenv("DARE_TOP_P_KERNEL", "0")
    assert not top_p_kernel.kernel_enabled()
    monkeypatch.setenv("DARE_TOP_P_KERNEL", "1")
    assert top_p_kernel.kernel_enabled()


def test_slices_are_whole_tiles():
    from dare.rollout.engine.proposal_kernel import BLOCK, MAX_SLICES, slicing

    cpu = torch.device("cpu")
    assert slicing(rows=512, vocab=152064, processors=132, device=cpu) == (2, 76800)
    assert slicing(rows=1, vocab=152064, processors=132, device=cpu) == (50, 3072)  # 64 wanted, whole tiles
    assert slicing(rows=1, vocab=3 * BLOCK - 5, processors=132, device=cpu) == (3, BLOCK)
    assert slicing(rows=1, vocab=10 ** 6, processors=132, device=cpu)[0] <= MAX_SLICES
    assert BLOCK % top_p_kernel.RADIX_BLOCK == 0  # the histogram passes tile every slice exactly


def test_a_failing_kernel_warns_once_and_leaves_the_sorted_filter(monkeypatch, caplog):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(top_p_kernel, "serves", lambda scores: True)
    monkeypatch.setattr(top_p_kernel, "top_p_filter", broken)
    monkeypatch.setattr(top_p_kernel, "top_p_filter_pair", broken)
    monkeypatch.setattr(sampling, "_TOP_P_FAILED", False)
    torch.manual_seed(0)
    x = torch.randn(3, 500)
    with caplog.at_level(logging.WARNING, logger="dare.rollout"):
        first = sampling._top_p_filter(x, 0.8)
        second = sampling._top_p_filter(x, 0.8)
    from dare.rollout.kernels import top_p_sorted

    assert torch.equal(first, top_p_sorted(x, 0.8)) and torch.equal(second, first)
    assert calls == [1]
    logits = torch.randn(2, 3, 500).bfloat16()  # the pair of a step filtered by top-p alone: sorted filters too
    choice = logits.float().masked_fill(torch.arange(500) == 7, float("-inf"))
    drawn, source = sampling._nucleus_filters(logits, top_p=0.8, temperature=0.7, banned=7, want_source=True)
    assert torch.equal(drawn, top_p_sorted(choice / 0.7, 0.8))
    assert torch.equal(source, top_p_sorted(logits.float() / 0.7, 0.8))
    assert calls == [1]
    warnings = [r.getMessage() for r in caplog.records if "top-p kernel" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
