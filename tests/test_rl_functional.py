"""Sanity properties of the RL / preference math (algorithms.md, sections cited per test)."""

import math

import pytest
import torch

from dare.algorithms import functional as RF
from dare.errors import ConfigError, InputError


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    torch.testing.assert_close(RF.group_advantages(r, 3, "mean"), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]))
    loo = RF.group_advantages(r, 3, "loo")
    torch.testing.assert_close(loo, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    z = RF.group_advantages(r, 3, "zscore", eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0]).std()
    torch.testing.assert_close(z[:3], (r[:3] - 1 / 3) / std)
    assert torch.all(z[3:] == 0)  # zero-variance group -> zero advantage, not NaN
    pop = RF.group_advantages(r, 3, "zscore", eps=0.0, unbiased_std=False)
    torch.testing.assert_close(pop[:3], (r[:3] - 1 / 3) / torch.tensor([1.0, 0.0, 0.0]).std(unbiased=False))
    with pytest.raises(InputError):
        RF.group_advantages(r, 4)
    with pytest.raises(ConfigError, match="unknown advantage mode"):
        RF.group_advantages(r, 3, "zscor")


def test_mdpo_constant_reward_and_jump_bonus():  # §5 sanity
    c = 0.7
    r = torch.full((1, 5), c)
    raw_expected = torch.tensor([2 * c + 1] + [c + 1] * 4)
    # reproduce Â before normalisation through a group of identical copies: normalised advantages are 0
    adv = RF.mdpo_step_advantages(r.repeat(4, 1), group_size=4)
    assert torch.all(adv == 0)
    # raw advantages: compare through a 2-group where the second trajectory is all-zero
    pair = torch.cat([r, torch.zeros(1, 5)])
    a = RF.mdpo_step_advantages(pair, 2, eps=0.0)
    raw_zero = torch.tensor([1.0] * 5)
    diff = raw_expected - raw_zero
    torch.testing.assert_close(a[0], (diff / 2) / torch.stack([raw_expected, raw_zero]).std(0))
    jump = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    other = torch.zeros(1, 4)
    a = RF.mdpo_step_advantages(torch.cat([jump, other]), 2)
    assert a[0].argmax() == 2 or a[0, 1] > 0  # the step that becomes correct (or the one before it) is favoured
    assert a[0, 2] > a[0, 3]  # the jump bonus lands at the step where the answer becomes correct


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0, -0.5, -30.0])
    ref = torch.tensor([-1.0, -1.0, -3.0, 0.0])
    d = ref - logp
    torch.testing.assert_close(RF.kl_estimate(logp, ref, "k1"), logp - ref)
    torch.testing.assert_close(RF.kl_estimate(logp, ref, "k2"), 0.5 * d**2)
    k3 = RF.kl_estimate(logp, ref, "k3")
    assert torch.isfinite(k3).all() and (k3 >= 0).all() and k3[0] == 0
    x = torch.tensor([-1.3], requires_grad=True)
    RF.kl_estimate(x, x.detach(), "k3").sum().backward()
    assert x.grad.abs().item() < 1e-7  # k3 has zero gradient at pi = pi_ref


def test_clipped_surrogate_on_policy_and_clipping():  # §0.3
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = torch.tensor([[2.0], [-1.0]])
    loss, clipped = RF.clipped_surrogate(logp, logp.detach(), adv, 0.2)
    torch.testing.assert_close(loss, -adv.expand(2, 2))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -adv.expand(2, 2))  # rho = 1: gradient -A grad log pi
    assert not clipped.any()
    old = torch.tensor([[-1.5, -2.0]])
    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)  # rho = e^0.5 > 1.2
    loss, clipped = RF.clipped_surrogate(new, old, torch.tensor([[1.0]]), 0.2)
    assert clipped[0, 0] and not clipped[0, 1]
    torch.testing.assert_close(loss[0, 0], torch.tensor(-1.2))
    loss.sum().backward()
    assert new.grad[0, 0] == 0  # clipped token gives no gradient
    # dual clip caps the loss of a very large ratio with negative advantage at -c A
    loss, _ = RF.clipped_surrogate(torch.tensor([[0.0]]), torch.tensor([[-5.0]]), torch.tensor([[-1.0]]), 0.2, dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[3.0]]))


def test_d1_loss_value_with_one_iteration():  # §3.1 sanity (b)
    torch.manual_seed(0)
    logp = torch.randn(4, 6)
    comp = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0], [1, 0, 0, 0, 0, 0]])
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    loss, _ = RF.clipped_surrogate(logp, logp, adv[:, None], 0.5)
    value = RF.masked_mean(loss, comp)
    n = comp.sum(1).float()
    torch.testing.assert_close(value, -(adv * n).sum() / n.sum())


def test_wd1_equal_rewards_zero_loss_and_gradient():  # §3.2 sanity
    s = torch.randn(6, requires_grad=True)
    adv = RF.group_advantages(torch.ones(6), 3, "mean")
    loss = RF.wd1_loss(s, adv, 3)
    loss.backward()
    assert loss.item() == 0 and torch.all(s.grad == 0)
    s.grad = None
    RF.wd1_loss(s, torch.tensor([1.0, 0.0, -1.0, 0.0, 0.0, 0.0]), 3).backward()
    assert s.grad[0] < 0 < s.grad[2]  # raise the likelihood of the better sample


def test_coupled_complementary_expectation():  # §4: E[l_hat | t] = 1.5 log pi for a context-free model
    gen = torch.Generator().manual_seed(0)
    log_pi = -torch.rand(1, 8, generator=gen) * 3
    t = 0.3
    draws = []
    for _ in range(4000):
        u = torch.rand(1, 8, generator=gen)
        in_a = u < t
        assert torch.all(in_a ^ (u > t))  # complementary masks partition the completion (ties have measure 0)
        draws.append(RF.coupled_logp(log_pi, log_pi, log_pi, in_a, t))
    mean = torch.stack(draws).mean(0)
    torch.testing.assert_close(mean, 1.5 * log_pi, atol=0.05, rtol=0.03)
    weights = torch.stack(draws) / log_pi
    assert weights.min() >= 1.125 - 1e-5 and weights.max() <= 3 + 1e-5


def test_spg_eubo_equals_elbo_in_degenerate_case():  # §7 sanity
    torch.manual_seed(1)
    logp = -torch.rand(3, 1, 5) * 2
    masked = torch.ones(3, 1, 5, dtype=torch.bool)
    comp = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]])
    elbo = RF.spg_elbo(logp, masked, comp)
    expected = (logp[:, 0] * comp).sum(1) / comp.sum(1)
    torch.testing.assert_close(elbo, expected)
    for beta in (1.0, 1.5, 2.0):
        torch.testing.assert_close(RF.spg_eubo(logp, masked, comp, beta), expected)
    assert RF.spg_loss(elbo, torch.zeros(3), comp.sum(1)).item() == 0


def test_bgpo_bounds_and_on_policy_gradient():  # §8 sanity
    torch.manual_seed(3)
    delta = torch.linspace(-3, 3, 41)
    assert torch.all(1 + delta <= torch.exp(delta) + 1e-6)
    terms = torch.randn(5, 8)  # K=8 MC terms for 5 samples
    assert torch.all(torch.exp(terms).mean(1) >= torch.exp(terms.mean(1)) - 1e-6)
    for a in (1.0, -1.0):
        theta = torch.randn(8, requires_grad=True)
        old = theta.detach().clone()
        adv = torch.tensor(a)
        ratio = RF.bgpo_ratio(theta, old, adv)
        torch.testing.assert_close(ratio, torch.ones(8))
        (adv * ratio.mean()).backward()
        g_bound = theta.grad.clone()
        theta.grad = None
        (adv * torch.exp((theta - old).mean())).backward()
        torch.testing.assert_close(g_bound, theta.grad)
    assert torch.isfinite(RF.bgpo_ratio(torch.tensor([-5.0]), torch.tensor([0.0]), torch.tensor([1.0]))).all()


def test_bgpo_per_term_backward_equals_averaged_loss():  # linearity: constant memory in K
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(6, 4)
    adv = torch.tensor(0.7)
    terms = x @ w
    loss_all = RF.ratio_policy_loss(RF.bgpo_ratio(terms, terms.detach(), adv), adv).mean()
    g_all = torch.autograd.grad(loss_all, w)[0]
    g_sum = torch.zeros(4)
    for k in range(6):
        term = x[k] @ w
        g_sum += torch.autograd.grad(RF.ratio_policy_loss(RF.bgpo_ratio(term, term.detach(), adv), adv) / 6, w)[0]
    torch.testing.assert_close(g_all, g_sum)


def test_ebpo_on_policy_gradient():  # §9 sanity: rho = 1 and dL/dE_i = -A_i / B
    elbo = torch.randn(4, requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.0])
    loss = RF.ebpo_sequence_loss(elbo, elbo.detach(), adv)
    torch.testing.assert_close(loss, -adv.mean())
    loss.backward()
    torch.testing.assert_close(elbo.grad, -adv / 4)


def test_dpo_shared_noise_is_log2_and_gradient():  # §2 sanity
    w = torch.randn(3, requires_grad=True)
    chosen, rejected = w[0] * 2, w[1] - w[2]
    loss = RF.dpo_loss(chosen[None], rejected[None], chosen.detach()[None], rejected.detach()[None], beta=0.2)
    torch.testing.assert_close(loss, torch.tensor(math.log(2.0)))
    loss.backward()
    expected = -(0.2 / 2) * (torch.tensor([2.0, 0.0, 0.0]) - torch.tensor([0.0, 1.0, -1.0]))
    torch.testing.assert_close(w.grad, expected)


def test_tracerl_advantages_equal_return_minus_value():  # §10 sanity
    torch.manual_seed(4)
    steps = torch.tensor([0, 0, 1, 2, 2, 2, 3, -1])
    r = torch.zeros(8)
    r[6] = 1.0  # reward on the tokens of the last step
    v = torch.rand(8)
    adv, ret = RF.tracerl_token_advantages(r, v, steps, gamma=1.0, lam=1.0)
    valid = steps >= 0
    torch.testing.assert_close(adv[valid], (ret - v)[valid])
    assert torch.all(ret[valid] == 1.0)
    adv0, _ = RF.tracerl_token_advantages(r, v, steps, gamma=1.0, lam=0.0)
    v_star = torch.stack([v[steps == k].mean() for k in range(4)])
    next_v = torch.cat([v_star[1:], torch.zeros(1)])
    torch.testing.assert_close(adv0[valid], (r - v)[valid] + next_v[steps[valid]])


def test_shrink_and_partition():  # §10 shrinkage, §6 partition
    step_map = torch.tensor([[0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 2, 4]])
    valid = torch.ones_like(step_map)
    shrunk = RF.shrink_step_map(step_map, valid, 2)
    assert shrunk[0].tolist() == [1, 1, 3, 3, 5, 5]
    assert RF.shrink_step_map(step_map, valid, 10).unique(dim=1).shape[1] == 1  # s >= #steps -> one group
    blocks = RF.shrink_step_map(step_map, valid, 2, block_size=3)
    assert blocks[0].tolist() == [1, 1, 2, 4, 4, 5]
    comp = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    parts = RF.step_partition(step_map, comp)
    cover = torch.stack(parts).sum(0)
    assert torch.equal(cover, comp)  # every valid token lies in exactly one U_s
