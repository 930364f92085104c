"""The one-pass proposal kernel (dare.rollout.engine.proposal_kernel) against the tensor ops it replaces.

The kernel is Triton; without a GPU it runs in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess because
the interpreter is chosen when the kernels are defined). Skipped where Triton is not installed (the CPU-only CI);
``tests/test_gpu.py`` runs it compiled at LLaDA's vocabulary and inside the rollout engine.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dare.rollout import SamplerConfig
from dare.rollout.engine import proposal_kernel
from dare.rollout.engine.proposal_kernel import BLOCK, MAX_SLICES, num_slices, settings_served

CHECK = textwrap.dedent("""
    import torch
    from dare.rollout.engine.noise import vocabulary_salts
    from dare.rollout.engine.proposal_kernel import propose_fused
    from dare.rollout.engine.sampling import _propose_ops

    torch.manual_seed(0)
    # (batch, window, vocabulary, dtype, temperature, confidence source, confidence, processors)
    cases = [(2, 3, 3000, torch.float32, 0.0, "logits", "prob", 8),        # three slices, the last one partial
             (1, 4, 5000, torch.float16, 0.0, "sampling", "prob", 64),     # five slices of one tile each
             (3, 2, 2500, torch.float32, 0.7, "logits", "prob", 16),       # Gumbel-max, unscaled confidence
             (2, 5, 4100, torch.float32, 1.3, "sampling", "prob", 4),      # Gumbel-max, scaled confidence
             (2, 2, 3000, torch.float32, 0.9, "sampling", "random", 8),    # the random confidence stream
             (1, 3, 2100, torch.float32, 0.0, "logits", "random", 1),      # one slice
             (2, 3, 3000, torch.float32, 0.0, "logits", "neg_entropy", 8),  # entropy: a second read of the slices
             (2, 4, 4100, torch.float16, 0.8, "sampling", "neg_entropy", 4)]  # ... of the tempered distribution
    worst = 0.0
    for b, w, v, dtype, temperature, source, confidence, processors in cases:
        logits = (torch.randn(b, w + 2, v) * 3).to(dtype)[:, 1:-1]  # a window of wider logits, as engines pass
        logits[0, 0, 7] = 50.0                             # the banned id would win the argmax here
        logits[..., 1000] = logits[..., 1001] = 40.0       # a tie across lanes: the first column wins
        logits[0, 0, 100] = logits[0, 0, 100 + 1024] = 47.0  # ... within a lane (one tile apart)
        logits[0, -1, 2047] = logits[0, -1, 2048] = 45.0   # ... across tiles and slices
        logits[-1, 1] = float("-inf")                      # no finite logit: argmax answers column 0
        eligible = torch.rand(b, w) < 0.7
        eligible[-1, 1] = False                            # (its confidence would be NaN either way)
        keys = torch.randint(0, 2**32, (b, 2))
        counters = torch.randint(0, 50, (b,))
        positions = torch.arange(w) + 10 if b % 2 else torch.randint(0, 100, (b, w))
        salts = vocabulary_salts(v, "cpu") if temperature > 0 else None
        want = _propose_ops(logits, eligible, keys, counters, positions, salts, banned=7, temperature=temperature,
                            top_p=None, top_k=None, top_k_first=False, confidence_source=source,
                            confidence=confidence)
        for procs in (processors, 2 * processors + 1):     # other slicings: the same proposals
            got = propose_fused(logits, eligible, banned=7, temperature=temperature, confidence_source=source,
                                confidence=confidence, keys=keys, counters=counters, positions=positions,
                                processors=procs)
            assert torch.equal(got[0], want[0]), (got[0], want[0])
            assert torch.equal(got[1] == float("-inf"), ~eligible) and torch.equal(got[2][~eligible], want[2][~eligible])
            if temperature == 0:
                first = torch.full((b, w), 1000)
                first[0, 0], first[0, -1], first[-1, 1] = 100, 2047, 0
                assert torch.equal(got[0], first)  # the first of tied maxima, never the banned 7
            seen = eligible
            worst = max(worst, (got[1][seen] - want[1][seen]).abs().max().item(),
                        (got[2][seen] - want[2][seen]).abs().max().item())
    print("max error", worst)
    assert 0 < worst < 1e-5 or worst == 0, worst

    # neg_entropy of spread distributions (the planted ties above make every entropy ~log 2, blind to the
    # 1e-10 inside Dream's log(p + 1e-10))
    for temperature, source, dtype in ((0.0, "logits", torch.float32), (0.8, "sampling", torch.float16)):
        logits = (torch.randn(2, 5, 3000) * 3).to(dtype)
        eligible = torch.ones(2, 5, dtype=torch.bool)
        keys, counters, positions = torch.randint(0, 2**32, (2, 2)), torch.arange(2), torch.arange(5)
        salts = vocabulary_salts(3000, "cpu") if temperature > 0 else None
        want = _propose_ops(logits, eligible, keys, counters, positions, salts, banned=7, temperature=temperature,
                            top_p=None, top_k=None, top_k_first=False, confidence_source=source,
                            confidence="neg_entropy")
        got = propose_fused(logits, eligible, banned=7, temperature=temperature, confidence_source=source,
                            confidence="neg_entropy", keys=keys, counters=counters, positions=positions, processors=8)
        error = (got[1] - want[1]).abs().max().item()
        print("neg_entropy error", error)
        assert error < 1e-5 and (want[1] < -1).all(), (error, want[1])

    # top-p: the proposal kernel reads the nuclei of the top-p kernel (nucleus_cuts) instead of filtered copies;
    # the reference is the tensor ops on the top-p kernel's own filters (the same ties kept: lowest columns; the
    # nuclei themselves are checked against a stable sort in tests/test_top_p_kernel.py)
    from dare.rollout.engine import top_p_kernel
    from dare.rollout.engine.top_p_kernel import nucleus_cuts
    from dare.rollout.engine.proposal_kernel import filters_source

    top_p_kernel.serves = lambda scores: True  # the ops' filters: the kernel's, in the interpreter
    worst = 0.0
    for b, w, v, dtype, t, source, confidence, p, procs in [
            (2, 3, 3000, torch.bfloat16, 1.0, "sampling", "neg_entropy", 0.95, 8),
            (2, 4, 3000, torch.bfloat16, 0.7, "sampling", "prob", 0.9, 4),
            (1, 3, 2500, torch.float32, 1.3, "sampling", "prob", 0.8, 16),
            (2, 2, 3000, torch.bfloat16, 0.0, "sampling", "prob", 0.6, 8),
            (2, 3, 3000, torch.float16, 0.9, "logits", "prob", 0.9, 8),
            (2, 2, 3000, torch.bfloat16, 0.8, "sampling", "random", 0.9, 2),
            (2, 3, 3000, torch.float32, 0.0, "sampling", "neg_entropy", 0.7, 8)]:
        logits = (torch.randn(b, w, v) * 2).to(dtype)
        logits[0, 0, 7] = logits[0, 0].float().max() + 3   # the banned id above all: the drawn nucleus's own passes
        logits[-1, -1, :40] = 20.0                          # 40 tied maxima with all the mass: a tie cut
        eligible = torch.rand(b, w) < 0.8
        keys, counters = torch.randint(0, 2**32, (b, 2)), torch.randint(0, 50, (b,))
        positions = torch.randint(0, 100, (b, w))
        salts = vocabulary_salts(v, "cpu") if t > 0 else None
        settings = dict(banned=7, temperature=t, top_k=None, top_k_first=False, confidence_source=source,
                        confidence=confidence)
        want = _propose_ops(logits, eligible, keys, counters, positions, salts, top_p=p, **settings)
        plain = _propose_ops(logits, eligible, keys, counters, positions, salts, top_p=None, **settings)
        cuts = nucleus_cuts(logits, p, banned=7, temperature=t, want_source=filters_source(source, confidence),
                            processors=procs)
        got = propose_fused(logits, eligible, banned=7, temperature=t, confidence_source=source,
                            confidence=confidence, keys=keys, counters=counters, positions=positions,
                            processors=procs, cuts=cuts)
        assert torch.equal(got[0], want[0]), (dtype, t, got[0], want[0])
        assert torch.equal(got[1] == float("-inf"), ~eligible) and (got[2][~eligible] == 0).all()
        seen = eligible
        worst = max(worst, (got[1][seen] - want[1][seen]).abs().max().item(),
                    (got[2][seen] - want[2][seen]).abs().max().item())
        assert not torch.allclose(want[2][seen], plain[2][seen])  # the filter changed the log-probabilities
    print("top-p max error", worst)
    assert worst < 1e-5, worst

    # confidences in the model's dtype (rounding=bf16, as the engine asks for bf16 logits): rounded as the eager
    # softmax rounds them, and greedy tokens of a sampling source the first of the rounded most probable (the top
    # two logits of every position planted at adjacent values near 0, the larger one later: rounded, they tie)
    for dtype in (torch.bfloat16,):  # (fp16: Dream's log(p + 1e-10) is NaN where p = 0, the epsilon underflows)
        bits = torch.int16
        for t, source, confidence, p in [(0.0, "sampling", "prob", None), (0.0, "sampling", "neg_entropy", None),
                                         (0.0, "sampling", "prob", 0.9), (0.0, "logits", "prob", None),
                                         (0.8, "sampling", "prob", None), (0.8, "sampling", "neg_entropy", 0.9)]:
            logits = (torch.randn(3, 4, 3000) * 0.3 - 3).to(dtype)  # the rest well below the planted pair
            low = (torch.rand(3, 4, 1) * 0.015 + 0.005).to(dtype)   # near 0: adjacent values, a tiny gap
            logits[..., 500:501] = low
            logits[..., 2600:2601] = (low.view(bits) + torch.where(low > 0, 1, -1).to(bits)).view(dtype)
            logits[0, 0, 7] = 9.0                                # the banned id above all
            eligible = torch.ones(3, 4, dtype=torch.bool)
            keys, counters, positions = torch.randint(0, 2**32, (3, 2)), torch.arange(3), torch.arange(4)
            salts = vocabulary_salts(3000, "cpu") if t > 0 else None
            settings = dict(banned=7, temperature=t, top_k=None, top_k_first=False, confidence_source=source,
                            confidence=confidence, rounding=dtype)
            want = _propose_ops(logits, eligible, keys, counters, positions, salts, top_p=p, **settings)
            cuts = None if p is None else nucleus_cuts(logits, p, banned=7, temperature=t, processors=8,
                                                        want_source=filters_source(source, confidence))
            got = propose_fused(logits, eligible, banned=7, temperature=t, confidence_source=source,
                                confidence=confidence, keys=keys, counters=counters, positions=positions,
                                processors=8, cuts=cuts, rounding=dtype)
            assert torch.equal(got[0], want[0]), (dtype, t, source, p, got[0], want[0])
            if t == 0 and source == "sampling" and dtype == torch.bfloat16:
                assert (want[0] == 500).any()  # a rounded tie took the first of the two
            same = (got[1] == want[1]).float().mean().item()
            relative = ((got[1] - want[1]).abs() / want[1].abs().clamp_min(1e-30)).max().item()
            assert same >= 0.9 and relative <= 2 ** -7, (dtype, t, source, confidence, same, relative)
            assert torch.equal(got[1].to(dtype).float(), got[1])  # values of the model's dtype
    print("rounded confidences: same tokens")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernel_equals_the_tensor_ops_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", CHECK], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


FORCED = textwrap.dedent("""
    import torch
    from dare.rollout.engine import top_p_kernel
    from dare.rollout.engine.noise import row_keys, vocabulary_salts
    from dare.rollout.engine.proposal_kernel import propose_fused
    from dare.rollout.engine.sampling import _propose_ops
    from dare.rollout.engine.top_p_kernel import nucleus_cuts

    top_p_kernel.serves = lambda scores: True  # the ops' filters: the kernel's, in the interpreter
    torch.manual_seed(0)
    logits = torch.randn(2, 1, 3000) * 2
    logits[1, 0, 5] = -40.0                   # row 1's largest uniform lands on an improbable token
    keys, counters = row_keys([11, 12], "cpu"), torch.tensor(COUNTERS)  # row 0's on the banned id 7
    positions, eligible = torch.tensor([[4], [9]]), torch.ones(2, 1, dtype=torch.bool)
    for top_p in (None, 0.9):
        settings = dict(banned=7, temperature=1.0, confidence_source="sampling", confidence="prob")
        want = _propose_ops(logits, eligible, keys, counters, positions, vocabulary_salts(3000, "cpu"),
                            top_p=top_p, top_k=None, top_k_first=False, **settings)
        cuts = None if top_p is None else nucleus_cuts(logits, top_p, banned=7, temperature=1.0, processors=4)
        got = propose_fused(logits, eligible, keys=keys, counters=counters, positions=positions, processors=4,
                            cuts=cuts, **settings)
        tokens = got[0].flatten().tolist()
        assert tokens[0] != 7 and tokens[1] != 5, (top_p, tokens)
        assert torch.equal(got[0], want[0]), (top_p, got[0], want[0])
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_largest_uniform_draws_no_banned_or_improbable_token_in_the_interpreter():
    """The kernel's uniforms are :func:`dare.rollout.engine.noise.uniform`'s, strictly below 1: a position whose
    largest hash falls on the banned id, or on a token of probability ~e^-44 (with and without a top-p nucleus),
    draws what the tensor ops draw, and not that token."""
    from dare.rollout.engine.noise import GOLDEN, MASK32, STREAM_SAMPLE, row_keys
    from rollout_helpers import counters_hashing_to, unmix32

    targets = [unmix32(MASK32) ^ (column * GOLDEN & MASK32) for column in (7, 5)]  # h(column) = 2^32 - 1
    counters = counters_hashing_to(row_keys([11, 12], "cpu"), torch.tensor([[4], [9]]), STREAM_SAMPLE, targets)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = FORCED.replace("COUNTERS", repr(counters.tolist()))
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


TIES = textwrap.dedent("""
    import torch
    from dare.rollout.engine.noise import row_keys, vocabulary_salts
    from dare.rollout.engine.proposal_kernel import propose_fused
    from dare.rollout.engine.sampling import _propose_ops

    b, w, v = 1, 16, 3000
    keys, counters = row_keys([3], "cpu"), torch.zeros(b, dtype=torch.long)
    positions, eligible = torch.arange(w), torch.ones(b, w, dtype=torch.bool)
    firsts = []
    for first, second in ((1000, 1001), (100, 100 + 1024), (100, 2900)):  # lanes, a lane's tiles, slices apart
        logits = torch.full((b, w, v), 30.0)
        logits[..., first] = logits[..., second] = 40.0
        settings = dict(banned=7, temperature=1e-7, confidence_source="logits", confidence="prob")
        got = propose_fused(logits, eligible, keys=keys, counters=counters, positions=positions, processors=64,
                            **settings)[0]  # three slices of one tile
        want = _propose_ops(logits, eligible, keys, counters, positions, vocabulary_salts(v, "cpu"),
                            top_p=None, top_k=None, top_k_first=False, **settings)[0]
        assert torch.equal(got, want), (first, second, got, want)
        assert set(got.unique().tolist()) == {first, second}, (first, second, got)
        firsts.append(got == first)
    share = float(torch.cat(firsts).float().mean())
    assert abs(share - 0.5) < 4 * 0.5 / (3 * w) ** 0.5, share  # 4 standard deviations
    print("ties drawn evenly")
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_tiny_temperatures_break_exact_ties_by_the_noise_in_the_interpreter():
    """Two exactly tied top logits (lanes apart, a lane's tiles apart, slices apart) at T = 1e-7 are each drawn
    about half the time, as by the tensor ops; the kernel kept ``logit / T + noise`` (4e8 plus noise, the noise's
    low bits lost) and the first column won every draw. (Small: the interpreter runs reductions' combines in
    Python.)"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", TIES], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "ties drawn evenly" in run.stdout, run.stdout + run.stderr


def test_slices_fill_the_gpu_with_whole_tiles():
    assert num_slices(positions=512, vocab=126464, processors=132) == 2  # LLaDA B=16 dual: 1024 programs
    assert num_slices(positions=32, vocab=126464, processors=132) == 17  # B=1: 544 programs
    assert num_slices(positions=1, vocab=126464, processors=132) == MAX_SLICES
    assert num_slices(positions=1, vocab=3 * BLOCK - 5, processors=132) == 3  # never a slice without a tile
    assert num_slices(positions=4, vocab=10, processors=8) == 1


def test_only_the_settings_it_computes_are_routed_to_it():
    def served(**settings):
        return settings_served(SamplerConfig(sampler="llada", **settings).resolved(), vocab=1000)

    assert served(temperature=0.0) and served(temperature=0.9) and served(temperature=0.9, confidence="random")
    assert served(temperature=0.9, top_k=1000) and served(temperature=0.9, top_p=1.0)  # filters that keep all
    assert not served(temperature=0.9, top_k=50) and not served(temperature=0.9, top_k=50, top_p=0.95)
    assert served(temperature=0.9, top_p=0.95)  # with the top-p kernel's nuclei (propose_static checks it runs)
    assert served(confidence="neg_entropy") and served(confidence="neg_entropy", temperature=0.2)
    assert not served(confidence="margin")
    config = SamplerConfig(sampler="llada").resolved()
    assert not proposal_kernel.serves(config, torch.zeros(1, 2, 1000))  # CPU tensors: the tensor ops


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("DARE_PROPOSAL_KERNEL", "0")
    assert not proposal_kernel.kernel_enabled()
    monkeypatch.setenv("DARE_PROPOSAL_KERNEL", "1")
    assert proposal_kernel.kernel_enabled()


def test_a_failing_kernel_warns_once_and_leaves_the_tensor_ops(monkeypatch, caplog):
    """A kernel that cannot run (an old Triton, an unsupported GPU) must not end a rollout: the step warns once,
    uses the compiled tensor ops' numbers, and never tries the kernel again in this process."""
    from dare.rollout.engine import noise, sampling

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("PTX .version 9.9 does not support .target sm_00\nmore detail")

    monkeypatch.setattr(proposal_kernel, "serves", lambda config, logits: True)
    monkeypatch.setattr(proposal_kernel, "propose_fused", broken)
    monkeypatch.setattr(sampling, "_KERNEL_FAILED", False)
    torch.manual_seed(0)
    logits, eligible = torch.randn(2, 3, 50), torch.rand(2, 3) < 0.7
    config = SamplerConfig(sampler="llada", temperature=0.8).resolved()
    args = dict(config=config, banned=7, keys=noise.row_keys([1, 2], "cpu"), counters=torch.arange(2),
                positions=torch.arange(3)[None].expand(2, 3))
    with caplog.at_level("WARNING", logger="dare.rollout"):
        first = sampling.propose_static(logits, eligible, **args)
        second = sampling.propose_static(logits, eligible, **args)
    assert len(calls) == 1 and sampling._KERNEL_FAILED
    warnings = [r.getMessage() for r in caplog.records if "proposal kernel" in r.getMessage()]
    assert warnings == ["proposal kernel unavailable, using compiled tensor ops: PTX .version 9.9 does not support "
                        ".target sm_00"]
    want = sampling._propose_ops(logits, eligible, args["keys"], args["counters"], args["positions"],
                                 noise.vocabulary_salts(50, "cpu"), banned=7, temperature=0.8, top_p=None, top_k=None,
                                 top_k_first=False, confidence_source=config.confidence_source,
                                 confidence=config.confidence)
    for got in (first, second):
        assert torch.equal(got.tokens, want[0]) and torch.equal(got.confidence, want[1])


def test_top_p_steps_hand_the_top_p_kernels_nuclei_to_the_proposal_kernel(monkeypatch):
    """A step with top-p (no top-k) asks the top-p kernel for the nuclei (the source's too when the confidence
    reads the filtered distribution) and gives them to the proposal kernel; without a usable top-p kernel it keeps
    the tensor ops and their filters."""
    from dare.rollout.engine import sampling, top_p_kernel

    calls = []
    b, w, v = 2, 3, 50
    done = (torch.zeros(b, w, dtype=torch.long), torch.zeros(b, w), torch.zeros(b, w))

    def cuts(logits, top_p, **settings):
        calls.append(("cuts", top_p, settings["want_source"], settings["temperature"]))
        return "nuclei"

    def fused(logits, eligible, **settings):
        calls.append(("fused", settings["cuts"]))
        return done

    monkeypatch.setattr(proposal_kernel, "serves", lambda config, logits: True)
    monkeypatch.setattr(top_p_kernel, "serves", lambda logits: True)
    monkeypatch.setattr(top_p_kernel, "nucleus_cuts", cuts)
    monkeypatch.setattr(proposal_kernel, "propose_fused", fused)
    monkeypatch.setattr(sampling, "_KERNEL_FAILED", False)
    monkeypatch.setattr(sampling, "_TOP_P_FAILED", False)
    logits, eligible = torch.randn(b, w, v), torch.ones(b, w, dtype=torch.bool)
    args = dict(banned=7, keys=torch.zeros(b, 2, dtype=torch.long), counters=torch.zeros(b, dtype=torch.long),
                positions=torch.arange(w).expand(b, w))
    nuclei = [("fused", "nuclei")]
    for settings, want in ((dict(top_p=0.95, confidence="neg_entropy", confidence_source="sampling"),
                            [("cuts", 0.95, True, 1.0)] + nuclei),
                           (dict(top_p=0.95, confidence="prob", confidence_source="logits"),  # raw logits' confidence
                            [("cuts", 0.95, False, 1.0)] + nuclei),
                           (dict(top_p=0.9, confidence="random"), [("cuts", 0.9, False, 1.0)] + nuclei),
                           (dict(top_p=None), [("fused", None)])):
        calls.clear()
        config = SamplerConfig(sampler="llada", temperature=1.0, **settings).resolved()
        sampling.propose_static(logits, eligible, config=config, **args)
        assert calls == want, (settings, calls)
    calls.clear()
    monkeypatch.setattr(top_p_kernel, "serves", lambda logits: False)  # DARE_TOP_P_KERNEL=0: the tensor ops
    config = SamplerConfig(sampler="llada", temperature=1.0, top_p=0.9).resolved()
    proposal = sampling.propose_static(logits, eligible, config=config, **args)
    assert calls == [] and proposal.tokens.shape == (b, w)
