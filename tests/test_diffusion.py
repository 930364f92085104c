"""Forward processes, per-example noise, MC-ELBO estimators and NELBO normalisations (pure tensor math)."""

import itertools

import pytest
import torch

from dare.diffusion import (
    ForwardProcess, block_index, corrupt, corrupt_complementary, corrupt_mc, example_generator, nelbo_totals,
    nelbo_weights, resolve_normalization, sequence_elbo, stratified_counts, stratified_levels,
)
from dare.errors import ConfigError

MASK = 99


def toy_batch():
    """Two padded rows: prompt of 3 / 2 tokens, responses of 6 / 4 tokens, row 1 right-padded by 3."""
    ids = torch.arange(1, 19).view(2, 9)
    maskable = torch.zeros(2, 9, dtype=torch.bool)
    maskable[0, 3:9] = True
    maskable[1, 2:6] = True
    example_index = torch.tensor([[10] * 9, [11] * 6 + [-1] * 3])
    return ids, maskable, example_index


def test_example_generator_is_a_pure_function_of_its_tuple():
    a = torch.rand(5, generator=example_generator(0, 3, 7, 1))
    b = torch.rand(5, generator=example_generator(0, 3, 7, 1))
    assert torch.equal(a, b)
    others = [(1, 3, 7, 1), (0, 4, 7, 1), (0, 3, 8, 1), (0, 3, 7, 2), (0, 3, 7, 1, 1)]
    for args in others:
        assert not torch.equal(a, torch.rand(5, generator=example_generator(*args)))


@pytest.mark.parametrize("schedule", ["continuous", "discrete"])
def test_prompt_and_padding_never_masked_and_p_mask_is_the_level(schedule):
    ids, maskable, ex = toy_batch()
    for step in range(20):
        c = corrupt(ids, maskable, ex, MASK, seed=0, step=step, process=ForwardProcess(schedule=schedule))
        assert not bool((c.mask & ~maskable).any())
        assert torch.equal(c.noisy_ids, torch.where(c.mask, torch.full_like(ids, MASK), ids))
        assert bool((c.p_mask[~maskable] == 1).all())
        for row in range(2):
            levels = c.p_mask[row][maskable[row]].unique()
            assert levels.numel() == 1 and 0 < float(levels) <= 1
            if schedule == "discrete":  # exactly l = t * L tokens, l in 1..L
                total = int(maskable[row].sum())
                assert int(c.mask[row].sum()) == round(float(levels) * total) >= 1


def test_corruption_is_independent_of_layout_and_batch_position():
    """The same example gets the same mask alone, padded next to another, or packed in one row."""
    ids, maskable, ex = toy_batch()
    full = corrupt(ids, maskable, ex, MASK, seed=3, step=5)
    alone = corrupt(ids[1:], maskable[1:], ex[1:], MASK, seed=3, step=5)
    assert torch.equal(alone.mask[0], full.mask[1]) and torch.equal(alone.p_mask[0], full.p_mask[1])
    keep = ex[1] >= 0
    packed_ids = torch.cat([ids[1][keep], ids[0]])[None]
    packed_m = torch.cat([maskable[1][keep], maskable[0]])[None]
    packed_ex = torch.cat([ex[1][keep], ex[0]])[None]
    packed = corrupt(packed_ids, packed_m, packed_ex, MASK, seed=3, step=5)
    n = int(keep.sum())
    assert torch.equal(packed.mask[0, :n], full.mask[1, keep]) and torch.equal(packed.mask[0, n:], full.mask[0])
    other_step = corrupt(ids, maskable, ex, MASK, seed=3, step=6)
    assert not torch.equal(other_step.p_mask, full.p_mask)


def test_fixed_t_one_masks_every_answer_token():
    ids, maskable, ex = toy_batch()
    c = corrupt(ids, maskable, ex, MASK, seed=0, step=0, process=ForwardProcess(t_low=1.0, t_high=1.0))
    assert torch.equal(c.mask, maskable)


def test_block_levels():
    maskable = torch.tensor([False, False, True, True, True, True, True])
    assert block_index(maskable, 2, "response").tolist() == [-1, -1, 0, 0, 1, 1, 2]
    assert block_index(maskable, 2, "global").tolist() == [0, 0, 1, 1, 2, 2, 3]
    ids = torch.arange(7)[None]
    process = ForwardProcess(block_size=2)
    c = corrupt(ids, maskable[None], torch.zeros_like(ids), MASK, seed=0, step=0, process=process)
    p = c.p_mask[0]
    assert p[2] == p[3] and p[4] == p[5] and len({float(p[2]), float(p[4]), float(p[6])}) == 3
    assert bool((p[:2] == 1).all())
    d = corrupt(ids, maskable[None], torch.zeros_like(ids), MASK, seed=0, step=0,
                process=ForwardProcess(schedule="discrete", block_size=2))
    for block in ([2, 3], [4, 5], [6]):
        count = int(d.mask[0, block].sum())
        assert count >= 1 and float(d.p_mask[0, block[0]]) == count / len(block)


def test_stratified_counts_cover_strata_and_are_marginally_uniform():
    for total, n in itertools.product([5, 7, 8, 9], [2, 3, 4]):  # 5 / 2, 9 / 2, ...: half-integer strides too
        for m in range(n):  # over k ~ U{1..T}, every l_m is uniform on 1..T
            assert sorted(stratified_counts(total, n, k)[m] for k in range(1, total + 1)) == list(range(1, total + 1))
    for k in range(1, 6):  # n = T: one count per value
        assert sorted(stratified_counts(5, 5, k)) == [1, 2, 3, 4, 5]
    levels = stratified_levels(4, 0.3, 0.0, 1.0)
    assert sorted((lv * 4) // 1 for lv in levels) == [0, 1, 2, 3]  # one level per quarter


def test_stratified_mc_corruptions():
    ids, maskable, ex = toy_batch()
    c = corrupt_mc(ids, maskable, ex, MASK, seed=0, step=0, n=6, process=ForwardProcess(schedule="discrete"),
                   stratified=True)
    assert c.mask.shape == (2, 6, 9)
    assert sorted(c.mask[0].sum(-1).tolist()) == [1, 2, 3, 4, 5, 6]  # T = 6 = n: every count once
    assert bool((c.mask & ~maskable[:, None]).sum() == 0)
    with pytest.raises(ConfigError):
        corrupt_mc(ids, maskable, ex, MASK, seed=0, step=0, n=2, process=ForwardProcess(block_size=2), stratified=True)


def test_complementary_masks_partition_the_answer():
    ids, maskable, ex = toy_batch()
    for step in range(10):
        a, b = corrupt_complementary(ids, maskable, ex, MASK, seed=0, step=step)
        assert torch.equal(a.mask | b.mask, maskable) and not bool((a.mask & b.mask).any())
        t = a.p_mask[maskable]
        assert torch.allclose(b.p_mask[maskable], 1 - t) and bool(((t >= 0.2) & (t <= 0.8)).all())


@pytest.mark.parametrize("kind", ["continuous", "discrete", "complementary"])
def test_inverse_t_estimator_is_unbiased_for_a_context_free_model(kind):
    """With log p(y_j | z) independent of z, E[sum_masked log p / p_mask] = sum_j log p_j (the exact NLL)."""
    gen = torch.Generator().manual_seed(0)
    L, N = 5, 3000
    logp_tok = -torch.rand(L, generator=gen) * 3
    ids = torch.arange(L + 2).repeat(N, 1)
    maskable = torch.tensor([[False, False] + [True] * L]).repeat(N, 1)
    ex = torch.arange(N)[:, None].expand(N, L + 2)  # N examples, each its own noise
    logp = torch.cat([torch.zeros(2), logp_tok])[None].expand(N, -1)
    if kind == "complementary":
        a, b = corrupt_complementary(ids, maskable, ex, MASK, seed=1, step=0)
        assert torch.equal(a.mask | b.mask, maskable)
        draws = (sequence_elbo(logp, a.mask, a.p_mask, ex)[1] + sequence_elbo(logp, b.mask, b.p_mask, ex)[1]) / 2
    else:
        c = corrupt(ids, maskable, ex, MASK, seed=1, step=0, process=ForwardProcess(schedule=kind))
        draws = sequence_elbo(logp, c.mask, c.p_mask, ex)[1]
    draws = draws.double()
    exact = float(logp_tok.sum())
    stderr = float(draws.std()) / N ** 0.5
    assert abs(float(draws.mean()) - exact) < 4 * stderr, (float(draws.mean()), exact, stderr)


def test_stratified_levels_keep_the_mean_and_reduce_variance():
    """Toy model whose log-probs depend on the masked fraction f: log p_j = a_j (1 + f).

    E[e | l] varies with l, so spreading the n levels over strata lowers the variance of the n-sample
    mean; both estimators have the same expectation sum_j a_j (1 + E f), E f = (L + 1) / (2L).
    """
    gen = torch.Generator().manual_seed(0)
    L, N, n = 6, 1500, 3
    a = -torch.rand(L, generator=gen) * 3
    ids = torch.arange(L + 1).repeat(N, 1)
    maskable = torch.tensor([[False] + [True] * L]).repeat(N, 1)
    ex = torch.arange(N)[:, None].expand(N, L + 1)
    process = ForwardProcess(schedule="discrete")
    estimates = {}
    for stratified in (False, True):
        c = corrupt_mc(ids, maskable, ex, MASK, seed=4, step=0, n=n, process=process, stratified=stratified)
        frac = c.mask.sum(-1, keepdim=True) / L  # [N, n, 1]
        logp = torch.cat([torch.zeros(1), a])[None, None] * (1 + frac)
        estimates[stratified] = sequence_elbo(logp, c.mask, c.p_mask, ex)[1].mean(-1).double()
    exact = float(a.sum()) * (1 + (L + 1) / (2 * L))
    for draws in estimates.values():
        assert abs(float(draws.mean()) - exact) < 4 * float(draws.std()) / N ** 0.5
    assert float(estimates[True].var()) < 0.8 * float(estimates[False].var())


def test_normalisations_match_hand_computation():
    ids, maskable, ex = toy_batch()
    c = corrupt(ids, maskable, ex, MASK, seed=0, step=0)
    totals = nelbo_totals(c.mask, maskable, ex)
    assert float(totals["sequences"]) == 2 and float(totals["answer_tokens"]) == 10
    assert float(totals["masked_tokens"]) == int(c.mask.sum())
    nll = torch.rand(2, 9)
    t = [float(c.p_mask[r][maskable[r]][0]) for r in range(2)]
    per_seq = [float((nll[r] * c.mask[r]).sum()) / t[r] for r in range(2)]
    lengths = [6, 4]
    expected = {
        "llada": sum(per_seq[r] / lengths[r] for r in range(2)) / 2,
        "d1": sum(per_seq) / 10,
        "batch": sum(per_seq) / 2,
        "masked": sum(per_seq) / int(c.mask.sum()),
    }
    for name, value in expected.items():
        w = nelbo_weights(c.mask, c.p_mask, maskable, ex, totals, name)
        assert abs(float((w * nll).sum()) - value) < 1e-5, name
    assert resolve_normalization("sequence") == "llada" and resolve_normalization("token") == "d1"
    unweighted = nelbo_weights(c.mask, c.p_mask, maskable, ex, totals, "masked", inverse_t=False)
    assert abs(float((unweighted * nll).sum()) - float((nll * c.mask).sum()) / int(c.mask.sum())) < 1e-5
    with pytest.raises(ConfigError, match="did you mean 'llada'"):
        resolve_normalization("lada")


def test_split_totals_sum_to_global_weights():
    """Weights from global totals do not depend on how the batch is split into micro-batches."""
    ids, maskable, ex = toy_batch()
    c = corrupt(ids, maskable, ex, MASK, seed=0, step=0)
    totals = nelbo_totals(c.mask, maskable, ex)
    parts = [nelbo_totals(c.mask[i:i + 1], maskable[i:i + 1], ex[i:i + 1]) for i in range(2)]
    for key in totals:
        assert float(sum(p[key] for p in parts)) == float(totals[key])
    for name in ("llada", "d1", "batch", "masked"):
        w = nelbo_weights(c.mask, c.p_mask, maskable, ex, totals, name)
        for i in range(2):
            wi = nelbo_weights(c.mask[i:i + 1], c.p_mask[i:i + 1], maskable[i:i + 1], ex[i:i + 1], totals, name)
            assert torch.equal(wi[0], w[i])


def test_forward_process_validation():
    for bad in (dict(schedule="discret"), dict(t_low=0.0), dict(t_low=0.9, t_high=0.5), dict(block_size=0)):
        with pytest.raises(ConfigError):
            ForwardProcess(**bad)
    with pytest.raises(ConfigError, match="did you mean 'discrete'"):
        ForwardProcess(schedule="discret")


def test_stratified_counts_formula():
    for total, n in itertools.product([1, 4, 9], [1, 2, 5]):
        for k in range(1, total + 1):
            counts = stratified_counts(total, n, k)
            assert counts[0] == k and all(1 <= c <= total for c in counts)
