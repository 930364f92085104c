"""Sampler kernels: schedules, filters, sampling distributions (chi-square), confidences, selection rules."""

import math

import pytest
import torch
from rollout_helpers import single_thread  # noqa: F401  (fixture)
from scipy.stats import chisquare

from dare.rollout import (
    filter_logits,
    linear_quota,
    linear_schedule,
    propose,
    select_dynamic,
    select_factor,
    select_quota,
    select_threshold,
    timestep_quota,
)
from dare.rollout.rng import derive_seed, example_generators

# ------------------------------------------------------------------------------------------ schedules


def run_schedule(fn, n, steps, **kw):
    """Quotas of one row through a block, committing exactly the quota each step."""
    remaining, out = n, []
    for i in range(steps):
        k = int(fn(torch.tensor([i]), torch.tensor([n]), torch.tensor([remaining]), steps, **kw))
        out.append(k)
        remaining -= k
    return out, remaining


def test_linear_schedule_is_llada_front_loaded():
    assert linear_schedule(torch.tensor([10, 3, 8]), 4).tolist() == [[3, 3, 2, 2], [1, 1, 1, 0], [2, 2, 2, 2]]
    for n in range(1, 40):
        for steps in range(1, n + 1):
            quotas, left = run_schedule(linear_quota, n, steps)
            assert left == 0 and sum(quotas) == n and min(quotas) >= 1  # every step commits >= 1 token
            assert quotas == linear_schedule(torch.tensor([n]), steps)[0].tolist()


def test_timestep_schedule_matches_dream_formula():
    n, steps, eps = 16, 16, 1e-3
    quotas, left = run_schedule(timestep_quota, n, steps, eps=eps)
    assert left == 0 and sum(quotas) == n
    ts = torch.linspace(1, eps, steps + 1)
    assert quotas[0] == int(n * (1 - ts[1] / ts[0])) == 0  # Dream's first step commits nothing here
    quotas, left = run_schedule(timestep_quota, 32, 4, eps=eps)
    assert left == 0 and quotas[-1] > 0 and sum(quotas) == 32


# ------------------------------------------------------------------------------------------ filters


def test_top_p_keeps_the_token_crossing_the_threshold():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda p: torch.isfinite(filter_logits(logits, top_p=p))[0].nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.4) == [0]
    assert kept(0.5) == [0, 1]  # cumulative 0.5 is not > 0.5, so the next token is kept too (Dream)
    assert kept(0.7) == [0, 1]
    assert kept(0.85) == [0, 1, 2]
    assert kept(1.0) == [0, 1, 2, 3]


def test_top_k_and_temperature():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    out = filter_logits(logits, temperature=2.0, top_k=2)
    assert torch.equal(torch.isfinite(out), torch.tensor([[False, True, False, True]]))
    assert torch.allclose(out[0, [1, 3]], torch.tensor([2.0, 1.5]))
    assert torch.equal(filter_logits(logits, top_k=0), logits)


# ------------------------------------------------------------------------------------------ sampling


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.3, -0.5, -1.0])


def expected_probs(temperature, top_k=None, top_p=None):
    z = LOGITS / temperature
    keep = torch.isfinite(filter_logits(LOGITS[None], temperature, top_p, top_k))[0]
    return torch.softmax(z.masked_fill(~keep, float("-inf")), -1)


@pytest.mark.parametrize("source", ["logits", "sampling"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.6, None, None), (1.7, 3, None),
                                                     (1.0, None, 0.8), (0.8, 4, 0.9)])
def test_sample_frequencies_match_softmax(temperature, top_k, top_p, source):
    rows, width = 2, 3000
    logits = LOGITS.expand(rows, width, -1).clone()
    eligible = torch.ones(rows, width, dtype=torch.bool)
    gens = example_generators(derive_seed(7, int(temperature * 10)), range(rows), "cpu")
    prop = propose(logits, eligible, temperature=temperature, top_k=top_k, top_p=top_p, confidence_source=source,
                   generators=gens)
    probs = expected_probs(temperature, top_k, top_p)
    counts = torch.bincount(prop.tokens.flatten(), minlength=len(LOGITS)).double()
    support = probs > 0
    assert counts[~support].sum() == 0  # filtered tokens are never drawn
    expected = probs[support].double() / probs[support].double().sum() * counts.sum()
    stat = chisquare(counts[support].numpy(), expected.numpy())
    assert stat.pvalue > 1e-3, (counts, probs * rows * width)
    # reported log-prob = log of the sampling probability of the drawn token
    torch.testing.assert_close(prop.logprob, torch.log(probs)[prop.tokens])


def test_rows_draw_from_their_own_generator():
    logits = torch.randn(3, 5, 50)
    eligible = torch.ones(3, 5, dtype=torch.bool)
    eligible[1] = False  # a row without candidates draws nothing
    gens = example_generators(0, [4, 5, 6], "cpu")
    both = propose(logits, eligible, temperature=1.0, generators=gens).tokens
    alone = propose(logits[2:], eligible[2:], temperature=1.0, generators=example_generators(0, [6], "cpu")).tokens
    assert torch.equal(both[2], alone[0])
    assert derive_seed(0, 1) != derive_seed(1, 0)


def test_zero_temperature_is_argmax_with_t1_logprob():
    logits = torch.randn(2, 4, 30)
    eligible = torch.tensor([[True, True, False, True], [False, True, True, True]])
    for source in ("logits", "sampling"):
        prop = propose(logits, eligible, temperature=0.0, top_k=5, confidence_source=source)
        assert torch.equal(prop.tokens, logits.argmax(-1))
        keep = torch.isfinite(filter_logits(logits, top_k=5))
        expected = torch.log_softmax(logits.masked_fill(~keep, float("-inf")), -1).max(-1).values
        torch.testing.assert_close(prop.logprob, expected.masked_fill(~eligible, 0))
        assert torch.isinf(prop.confidence[~eligible]).all()


def test_confidence_functions():
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]]]))
    eligible = torch.ones(1, 2, dtype=torch.bool)
    prob = propose(logits, eligible, confidence="prob").confidence
    margin = propose(logits, eligible, confidence="margin").confidence
    negent = propose(logits, eligible, confidence="neg_entropy").confidence
    torch.testing.assert_close(prob, torch.tensor([[0.6, 0.4]]))
    torch.testing.assert_close(margin, torch.tensor([[0.3, 0.05]]))
    ent = lambda ps: sum(p * math.log(p + 1e-10) for p in ps)  # noqa: E731
    torch.testing.assert_close(negent, torch.tensor([[ent([0.6, 0.3, 0.1]), ent([0.4, 0.35, 0.25])]]))
    rand = propose(logits, eligible, confidence="random", generators=example_generators(0, [0], "cpu")).confidence
    assert ((rand >= 0) & (rand < 1)).all()
    # "sampling" confidences use the tempered, filtered distribution; "logits" the raw one
    hot = propose(logits, eligible, temperature=0.0, top_k=1, confidence_source="sampling").confidence
    torch.testing.assert_close(hot, torch.ones(1, 2))


# ------------------------------------------------------------------------------------------ selection


CONF = torch.tensor([[0.2, 0.9, 0.5, 0.7, 0.1], [0.3, 0.2, 0.95, 0.6, 0.4]])
ELIG = torch.tensor([[True, True, True, True, False], [True, True, False, True, True]])


def picked(mask):
    return [row.nonzero().flatten().tolist() for row in mask]


def test_quota_per_row_k():
    conf = CONF.masked_fill(~ELIG, float("-inf"))
    assert picked(select_quota(conf, ELIG, torch.tensor([2, 3]))) == [[1, 3], [0, 3, 4]]
    # k larger than the candidates: only candidates are committed
    assert picked(select_quota(conf, ELIG, torch.tensor([9, 0]))) == [[0, 1, 2, 3], []]
    # ties go to the leftmost position
    tie = torch.tensor([[0.5, 0.5, 0.5]])
    assert picked(select_quota(tie, torch.ones(1, 3, dtype=torch.bool), torch.tensor([2]))) == [[0, 1]]


def test_threshold_keeps_top1():
    conf = CONF.masked_fill(~ELIG, float("-inf"))
    assert picked(select_threshold(conf, ELIG, 0.65)) == [[1, 3], [3]]  # row 1: 0.95 is not a candidate
    assert picked(select_threshold(conf, ELIG, 0.99)) == [[1], [3]]  # nothing passes: the top-1 still does
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert picked(select_threshold(torch.full((1, 3), float("-inf")), none, 0.5)) == [[]]


def test_factor_rule_by_hand():
    conf = torch.tensor([[0.95, 0.8, 0.7, 0.1], [0.95, 0.9, 0.1, float("-inf")], [0.3, 0.2, 0.1, 0.05]])
    elig = torch.isfinite(conf)
    # thresholds 1 - f/(n+1) for f=1: n=2: 0.667, n=3: 0.75, n=4: 0.8
    assert picked(select_factor(conf, elig, 1.0)) == [[0, 1], [0, 1], [0]]
    # dInfer quirk: when the first failure is the last rank N, all N are committed (row 1)
    assert picked(select_factor(conf, elig, 1.0, last_rank_quirk=True)) == [[0, 1], [0, 1, 2], [0]]
    # a larger factor accepts more: f=3, n=2: 0.0, n=3: 0.25, n=4: 0.4
    assert picked(select_factor(conf, elig, 3.0)) == [[0, 1, 2], [0, 1], [0, 1]]


def test_dynamic_threshold_with_fallback():
    conf = CONF.masked_fill(~ELIG, float("-inf"))
    assert picked(select_dynamic(conf, ELIG, 0.45, torch.tensor([2, 1]))) == [[1, 2, 3], [3]]
    assert picked(select_dynamic(conf, ELIG, 0.85, torch.tensor([2, 2]))) == [[1, 3], [3, 4]]  # fallback top-k


class _CudaLike:
    """A stand-in first argument that routes :class:`CudaCompiled` to its compiled path on a CPU machine."""

    is_cuda = True


def test_compiled_sampling_falls_back_on_compiler_errors_but_not_on_out_of_memory():
    from dare.rollout.engine.compiled import CudaCompiled

    def eager(x):
        return "eager"

    def compiler_bug(x):
        raise RuntimeError("inductor: cannot generate code")

    def out_of_memory(x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    wrapped = CudaCompiled(eager)
    wrapped.enabled, wrapped.compiled = True, out_of_memory
    with pytest.raises(torch.OutOfMemoryError):
        wrapped(_CudaLike())
    assert wrapped.enabled  # still compiled next time
    wrapped.compiled = compiler_bug
    assert wrapped(_CudaLike()) == "eager"
    assert not wrapped.enabled
