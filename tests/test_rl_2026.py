"""JustGRPO, ESPO and GDPO through the real code on a tiny LLaDA: the sanity properties of each objective, stored
views shared by old / reference / current, invariance to micro-batching, learning on a toy reward."""

import copy
import math

import pytest
import torch

from rl_helpers import TargetFraction, backward_all, policy, source, totals_of
from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

from dare.errors import ConfigError

NAMES = ["justgrpo", "espo", "gdpo"]
SMALL = {"justgrpo": {"sampler_block": 1, "steps": 8, "positions_per_forward": 3},
         "espo": {"mc_num": 2, "kl_coef": 0.0}, "gdpo": {"quadrature": "gauss-2"}}


def perturbed(model, seed: int = 0, scale: float = 0.05):
    """A copy of ``model`` with every trainable weight moved a little (an updated policy)."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


# --------------------------------------------------------------------------------------------- JustGRPO
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_justgrpo_logprob_is_the_sum_of_the_samplers_per_step_logprobs(family):
    from rollout_helpers import sprinkle_token

    from dare.data.tokenizer import EOS_ID
    from dare.models.tiny import tiny_model

    model = tiny_model(family, seed=1).train()  # Dream: position i - 1 predicts token i (the family's shift)
    sprinkle_token(model, EOS_ID, rate=0.15)  # EOS at varying places (a head hook: rollout and training alike)
    src = source("justgrpo", model, sampler_block=1, steps=8, temperature=0.7, positions_per_forward=3)
    mb = src.batch(0)[0]
    gen = mb["generated"]
    rows = gen.shape[0]
    completion = mb["completion_mask"][gen].reshape(rows, -1)
    step_map = mb["step_map"]
    decoded = step_map >= 0
    order = torch.arange(step_map.shape[1]).expand_as(step_map)
    assert torch.equal(step_map[decoded], order[decoded])  # left to right: position j committed at step j
    assert bool((completion.sum(-1) < 8).any())  # some rows stopped early (EOS within the completion)
    with torch.no_grad():
        logp = src.algorithm.estimate(src.policy, mb)["logp"][gen].reshape(rows, -1)
    sampler = mb["rollout_logprobs"] * completion
    torch.testing.assert_close(logp, sampler, atol=1e-5, rtol=1e-5)  # every conditional, temperature included
    torch.testing.assert_close(logp.sum(-1), sampler.sum(-1), atol=1e-4, rtol=1e-5)
    assert float(logp[completion.bool()].max()) < 0


def left_to_right_views(batch, positions, mask_id):
    """Reference views, every row x every column: ``(noisy_ids [R, C, S], select [R, C, S])``; view ``c`` masks every
    generated column ``>= positions[c]`` and selects ``positions[c]`` where it is in the completion."""
    ids, generated = batch["input_ids"], batch["generated"]
    column = torch.arange(ids.shape[1], device=ids.device)
    target = positions.to(ids.device)[None, :, None]
    masked = generated[:, None, :] & (column[None, None, :] >= target)
    noisy = torch.where(masked, torch.full_like(ids, mask_id)[:, None], ids[:, None])
    select = (column[None, None, :] == target) & batch["completion_mask"][:, None, :]
    return noisy, select


def test_justgrpo_views_mask_the_future_and_chunking_does_not_change_the_gradient():
    from dare.algorithms.justgrpo import pair_views

    model = policy(seed=1)
    one = source("justgrpo", model, sampler_block=1, steps=8, positions_per_forward=1)
    three = source("justgrpo", model, sampler_block=1, steps=8, positions_per_forward=3)
    mb = one.batch(0)[0]
    columns = mb["generated"][0].nonzero().squeeze(-1)
    rows = mb["input_ids"].shape[0]
    for col in columns.tolist():
        noisy, select = pair_views(mb["input_ids"], mb["generated"], torch.full((rows,), col), one.token_ids.mask)
        masked = noisy == one.token_ids.mask
        assert torch.equal(masked, mb["generated"] & (torch.arange(mb["input_ids"].shape[1]) >= col))
        assert torch.equal(select.nonzero()[:, 1].unique(), torch.tensor([col]))
    micro = one.batch(0)
    loss_one, grads_one = backward_all(one.algorithm, model, micro)
    loss_three, grads_three = backward_all(three.algorithm, model, three.batch(0))
    # on-policy: rho = 1, loss = -sum_i A_i n_i / (G * #informative rollouts)
    adv, n = mb["advantages"], mb["completion_mask"].sum(-1).float()
    informative = int((adv != 0).sum())
    assert informative > 0
    assert abs(loss_one + float((adv * n).sum()) / (8 * informative)) < 1e-6
    assert abs(loss_one - loss_three) < 1e-6
    for name in grads_one:
        torch.testing.assert_close(grads_one[name], grads_three[name], atol=1e-7, rtol=1e-5)


def _eos_policy():
    from rollout_helpers import sprinkle_token

    from dare.data.tokenizer import EOS_ID

    model = policy(seed=1)
    sprinkle_token(model, EOS_ID, rate=0.15)  # completions of varying length (views after EOS have no term)
    return model


def test_justgrpo_pair_views_equal_one_view_at_a_time_exactly():
    model = _eos_policy()
    src = source("justgrpo", model, sampler_block=1, steps=8, temperature=0.7, positions_per_forward=3)
    algo, mb = src.algorithm, src.batch(0)[0]
    assert bool((mb["completion_mask"].sum(-1) < 8).any())
    columns = mb["generated"][0].nonzero().squeeze(-1)
    mask, banned = src.token_ids.mask, (src.token_ids.mask,)
    with torch.no_grad():
        fast = algo.estimate(model, mb)["logp"]
        noisy, select = left_to_right_views(mb, columns, mask)  # every row x every view, one forward
        every = algo.logp(model, mb, noisy, select, temperature=mb["temperature"], banned=banned).sum(1)
        single = torch.zeros_like(fast)
        for r in range(mb.shape[0]):
            for c in range(columns.numel()):
                if bool(select[r, c].any()):
                    row = mb[r:r + 1]
                    single[r] += algo.logp(model, row, noisy[r:r + 1, c], select[r:r + 1, c],
                                           temperature=row["temperature"], banned=banned)[0]
    completion = mb["completion_mask"]
    assert bool((single[completion] < 0).all()) and not bool(single[~completion].any())
    torch.testing.assert_close(fast, single, atol=0, rtol=0)  # exact in fp32
    torch.testing.assert_close(every, single, atol=0, rtol=0)


def test_justgrpo_skipping_zero_advantage_rollouts_keeps_the_gradient_and_forwards_fewer_views():
    model = _eos_policy()
    kept = source("justgrpo", model, sampler_block=1, steps=8, inner_steps=2, positions_per_forward=3,
                  skip_zero_advantage=False)
    fast = source("justgrpo", model, sampler_block=1, steps=8, inner_steps=2, positions_per_forward=3)
    micro = kept.batch(0)
    mb = micro[0]
    adv, completion = mb["advantages"], mb["completion_mask"]
    assert bool((adv == 0).any()) and bool((adv != 0).any())
    rows = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: rows.append(args[0].shape[0]),
                                       with_kwargs=True)
    loss_kept, grads_kept = backward_all(kept.algorithm, model, micro)
    forwarded_kept, rows[:] = sum(rows), []
    loss_fast, grads_fast = backward_all(fast.algorithm, model, micro)
    forwarded_fast = sum(rows)
    hook.remove()
    assert len(rows) == 3  # ceil(8 / 3) forwards either way

    def views(scored):  # one view per scored position up to the first EOS (an empty chunk still runs one)
        per_chunk = [scored[:, cols].sum() for cols in fast.algorithm.chunks(mb)]
        return sum(max(1, int(n)) for n in per_chunk)

    assert forwarded_kept == views(completion) < int(mb["generated"].sum())  # the old path: every row x column
    assert forwarded_fast == views(completion & (adv != 0)[:, None]) < forwarded_kept
    assert abs(loss_fast - loss_kept) < 1e-7
    assert grads_fast.keys() == grads_kept.keys()
    for name in grads_kept:
        torch.testing.assert_close(grads_fast[name], grads_kept[name], atol=1e-7, rtol=1e-5)
    mb["advantages"] = torch.zeros_like(adv)  # no rollout carries a gradient: one empty view per chunk
    rows[:] = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: rows.append(args[0].shape[0]),
                                       with_kwargs=True)
    loss_none, grads_none = backward_all(fast.algorithm, model, [mb])
    hook.remove()
    assert rows == [1, 1, 1] and loss_none == 0.0
    assert grads_none.keys() == grads_kept.keys()  # every parameter still joins the backward
    assert all(not bool(g.any()) for g in grads_none.values())


def test_justgrpo_old_logprobs_are_the_samplers_and_cost_no_forward():
    model = policy(seed=1)
    src = source("justgrpo", model, sampler_block=1, steps=8, inner_steps=2, positions_per_forward=8)
    algo = src.algorithm
    assert not algo.needs.old_logprobs and algo.inner_steps == 2
    micro = src.batch(0)
    mb = micro[0]
    assert "old_logp" not in mb.keys()
    with torch.no_grad():
        logp = algo.estimate(model, mb)["logp"]
        old = algo.old_logp(mb, logp)
        loss, metrics = algo.loss(mb, {"logp": logp}, totals_of(algo, micro))
    torch.testing.assert_close(old, torch.where(mb["completion_mask"], logp, old), atol=1e-5, rtol=1e-5)
    adv, n = mb["advantages"], mb["completion_mask"].sum(-1).float()
    assert abs(float(loss) + float((adv * n).sum()) / (8 * int((adv != 0).sum()))) < 1e-5  # ratio 1 at step 0
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_justgrpo_kl_term_is_normalised_over_every_rollout():
    """With kl_coef > 0 every completion token carries a KL term, so the KL part is normalised by L_pad x #rollouts
    (normalize = generation): it does not depend on how many rollouts have a non-zero advantage (the policy-gradient
    part keeps L_pad x #informative)."""
    from rl_helpers import algorithm

    from dare.algorithms.functional import kl_estimate

    model = policy(seed=1)
    src = source("justgrpo", model, sampler_block=1, steps=8, kl_coef=0.01)
    algo, mb = src.algorithm, src.batch(0)[0]
    plain = algorithm("justgrpo", model, kl_coef=0.0)
    assert "ref_logp" in mb.keys()
    with torch.no_grad():
        logp = algo.estimate(perturbed(model), mb)["logp"]  # a moved policy: KL to the reference > 0
    adv = mb["advantages"]
    assert bool((adv != 0).all())
    partial = adv.clone()
    partial[:4] = 0.0  # one group with equal rewards
    kl_parts = []
    for advantages in (adv, partial, torch.zeros_like(adv)):
        batch = mb.clone()
        batch["advantages"] = advantages
        totals = totals_of(algo, [batch])
        with torch.no_grad():
            loss, metrics = algo.loss(batch, {"logp": logp}, totals)
            pg, _ = plain.loss(batch, {"logp": logp}, totals)
        kl_parts.append(float(loss - pg))
        assert math.isclose(float(metrics["policy/kl"]) * 0.01, kl_parts[-1], rel_tol=1e-4)
    completion = mb["completion_mask"]
    kl = kl_estimate(logp, mb["ref_logp"], algo.config.kl_estimator)[completion].sum()
    expected = 0.01 * float(kl) / (8 * mb.shape[0])  # L_pad x #rollouts
    assert expected > 0
    for part in kl_parts:
        assert math.isclose(part, expected, rel_tol=1e-4), (kl_parts, expected)


def test_justgrpo_rejects_parallel_decoding_and_block_causal_families():
    from dare.models.tiny import tiny_model

    with pytest.raises(ConfigError, match="block_length=1"):
        source("justgrpo", sampler_block=4)
    for weights in ("merged", "fp8"):  # its old log-probs are the sampler's: they must come from the policy's weights
        with pytest.raises(ConfigError, match="justgrpo takes the old policy's log-probs from the sampler"):
            source("justgrpo", sampler_block=1, steps=8, weights=weights)
    with pytest.raises(ConfigError, match="justgrpo' needs a full model family"):
        source("justgrpo", tiny_model("sdar", seed=0), sampler_block=1, steps=8)
    for name in ("espo", "gdpo"):
        with pytest.raises(ConfigError, match=f"{name}' needs a full model family"):
            source(name, tiny_model("sdar", seed=0), gen_length=8)


# --------------------------------------------------------------------------------------------- ESPO
def test_espo_views_are_complementary_stratified_and_weighted():
    src = source("espo", inner_steps=1, mc_num=2, kl_coef=0.0)
    mb = src.batch(0)[0]
    mask_id, gen = src.token_ids.mask, mb["generated"]
    total = int(gen[0].sum())  # scope = generation: T = 8
    masked = mb["noisy_ids"] == mask_id
    weight = mb["elbo_weight"]
    for m in range(2):
        first, second = masked[:, 2 * m], masked[:, 2 * m + 1]
        assert not bool((first & second).any()) and torch.equal(first | second, gen)
        counts = first.sum(-1)
        expected = torch.where(first, (total + 1) / counts[:, None].clamp(min=1) / 4, 0.0)
        torch.testing.assert_close(weight[:, 2 * m], expected)
        comp = torch.where(second, (total + 1) / (total - counts[:, None]).clamp(min=1) / 4, 0.0)
        torch.testing.assert_close(weight[:, 2 * m + 1], comp)
    gap = (masked[:, 2].sum(-1) - masked[:, 0].sum(-1)) % (total + 1)
    assert bool(((gap == 4) | (gap == 5)).all())  # the two counts are (T + 1) / 2 apart (stratified)


@pytest.mark.parametrize("total", [5, 8, 9, 256])
@pytest.mark.parametrize("n", [2, 3])
def test_espo_stratified_counts_are_each_uniform(total, n):
    """Exact enumeration over the offset k ~ U{0..T}: every sample's mask count is uniform on {0..T} (the ELBO weights
    (T + 1) / x assume it), and the samples sit a fixed stride apart (stratified). Python's round-half-to-even on
    k + m (T + 1) / n gave sample m >= 1 counts of one parity only when (T + 1) / n is a half-integer (n = 2,
    T even)."""
    from dare.algorithms.espo import espo_counts

    counts = [espo_counts(total, n, k) for k in range(total + 1)]
    for m in range(n):
        assert sorted(c[m] for c in counts) == list(range(total + 1)), m
        gaps = {(c[m] - c[0]) % (total + 1) for c in counts}
        assert len(gaps) == 1 and abs(gaps.pop() - m * (total + 1) / n) <= 0.5


@pytest.mark.parametrize("n,total,reduce_var", [(1, 5, True), (2, 8, True), (2, 8, False), (2, 5, False)])
def test_espo_weights_are_unbiased_per_token(n, total, reduce_var):
    """E[weight of token j] = 1 over the corruption: the ELBO is unbiased for sum_j log p on a context-free model, for
    the whole estimate and for each of the ``n`` samples. On a toy context-dependent model (``log p(y_j | z) = -(masks
    in z) / T``) each half of each sample has the ELBO's expectation, i.e. its mask count is uniform on {0..T}."""
    from tensordict import TensorDict

    from dare.algorithms.espo import espo_views

    rows, width, mask_id = 4000, total + 2, 9
    ids = torch.ones(rows, width, dtype=torch.long)
    scope = torch.zeros(rows, width, dtype=torch.bool)
    scope[:, 2:] = True
    batch = TensorDict({"input_ids": ids, "rollout_index": torch.arange(rows)}, batch_size=[rows])
    noisy, weight = espo_views(batch, scope, mask_id, n=n, reduce_var=reduce_var, seed=0, step=0)
    halves = 2 if reduce_var else 1
    per_token = weight.sum(1).mean(0)
    torch.testing.assert_close(per_token[2:], torch.ones(total), atol=0.05, rtol=0)
    assert float(per_token[:2].abs().max()) == 0.0
    views = weight * (n * halves)  # each view's own weights (the estimate averages the n x halves views)
    per_sample = views.reshape(rows, n, halves, width).mean(2)[..., 2:].mean((0, 2))  # [n], token-averaged
    torch.testing.assert_close(per_sample, torch.ones(n), atol=0.03, rtol=0)
    # toy context-dependent model: view v scores -(masks in v) / T per masked token; exact: x ~ U{0..T} masks
    masks = (noisy == mask_id).sum(-1).float()  # [rows, V]
    value = (views * (-masks / total)[..., None]).sum(-1).mean(0)  # [V]
    exact = sum((total + 1) / x * x * (-x / total) for x in range(1, total + 1)) / (total + 1)
    torch.testing.assert_close(value, torch.full_like(value, exact), atol=0.04 * abs(exact), rtol=0)


def test_espo_ratio_is_exp_of_the_elbo_difference_under_shared_corruptions():
    model = policy(seed=2)
    src = source("espo", model, inner_steps=2, mc_num=2, kl_coef=0.01)
    algo = src.algorithm
    assert algo.needs.old_logprobs and algo.needs.reference
    src.batch(0)
    mb = src.batch(1)[0]  # the second inner step, whose old ELBOs are stored (the first's are the current ones)
    with torch.no_grad():
        again = algo.estimate(model, mb)["elbo"]
    torch.testing.assert_close(mb["old_elbo"], again, atol=0, rtol=0)  # same views: identical ELBO
    torch.testing.assert_close(mb["ref_elbo"], again, atol=0, rtol=0)
    new = perturbed(model)
    with torch.no_grad():
        elbo = algo.estimate(new, mb)["elbo"]
        loss, metrics = algo.loss(mb, {"elbo": elbo}, totals_of(algo, [mb]))
    length, adv = 8.0, mb["advantages"]
    ratio = torch.exp((elbo - mb["old_elbo"]) / length)
    assert float((ratio - 1).abs().max()) > 1e-3  # the policy moved
    clipped = ratio.clamp(0.8, 1.2)
    kl = 0.5 * (elbo - mb["ref_elbo"]) ** 2 / length
    expected = (torch.maximum(-adv * ratio, -adv * clipped) + 0.01 * kl).mean()
    assert abs(float(loss) - float(expected)) < 1e-6
    assert abs(float(metrics["policy/log_ratio"]) - float(torch.log(ratio).mean())) < 1e-6


# --------------------------------------------------------------------------------------------- GDPO
@pytest.mark.parametrize("rule", ["gauss-1", "gauss-2", "gauss-3", "gauss-4", "gauss-5", "simpson"])
def test_gdpo_quadrature_rules_integrate_polynomials_exactly(rule):
    from dare.algorithms.gdpo import QUADRATURES

    nodes, weights = QUADRATURES[rule]
    assert abs(sum(weights) - 1) < 1e-12 and all(0 < t <= 1 for t in nodes)
    degree = 2 * len(nodes) - 1 if rule.startswith("gauss") else 0  # Simpson off t = 0: constants only
    for k in range(degree + 1):
        assert abs(sum(w * t ** k for t, w in zip(nodes, weights)) - 1 / (k + 1)) < 1e-12, k
    if rule.startswith("gauss"):  # and not beyond (the rule has exactly that order)
        k = degree + 1
        assert abs(sum(w * t ** k for t, w in zip(nodes, weights)) - 1 / (k + 1)) > 1e-6


def test_gdpo_elbo_is_the_quadrature_of_masked_logprobs():
    from dare.algorithms.gdpo import QUADRATURES

    src = source("gdpo", inner_steps=1, quadrature="gauss-3", mc_num=2)
    mb, algo = src.batch(0)[0], src.algorithm
    nodes, weights = QUADRATURES["gauss-3"]
    scope = mb["completion_mask"]
    masked = mb["noisy_ids"] == src.token_ids.mask
    assert masked.shape[1] == 6 and not bool((masked & ~scope[:, None]).any())
    total = scope.sum(-1)
    elbo = torch.zeros(mb.batch_size[0])
    with torch.no_grad():
        for v in range(6):
            t, w = nodes[v // 2], weights[v // 2]
            want = torch.clamp(torch.floor(t * total.double()), min=1).long().minimum(total)
            assert torch.equal(masked[:, v].sum(-1), want)  # exactly floor(t T) (>= 1) tokens per view
            logits = src.policy(mb["noisy_ids"][:, v], attention_mask=mb["attention_mask"]).logits.float()
            logp = torch.log_softmax(logits, -1).gather(-1, mb["input_ids"][..., None]).squeeze(-1)
            elbo += (w / (t * 2)) * torch.where(masked[:, v], logp, 0.0).sum(-1)
        got = algo.estimate(src.policy, mb)["elbo"]
    torch.testing.assert_close(got, elbo, atol=1e-4, rtol=1e-5)
    assert bool((got < 0).all())


def test_gdpo_two_pass_gradient_is_the_sequence_policy_gradient():
    model = policy(seed=4)
    src = source("gdpo", model, inner_steps=1, quadrature="gauss-2")
    algo, micro = src.algorithm, src.batch(0)
    mb = micro[0]
    loss, two_pass = backward_all(algo, model, micro)
    model.zero_grad(set_to_none=True)
    joint, _ = algo.loss(mb, algo.estimate(model, mb), totals_of(algo, micro))
    joint.backward()
    autograd = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)  # on-policy: d/dtheta of -(1/B) sum_i A_i E_i / L_i
    length = mb["completion_mask"].sum(-1).float()
    (-(mb["advantages"] * algo.estimate(model, mb)["elbo"] / length).sum() / mb.batch_size[0]).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert abs(loss + float(mb["advantages"].mean())) < 1e-6  # rho = 1
    assert float(mb["advantages"].abs().max()) > 0
    for name in reference:
        torch.testing.assert_close(two_pass[name], autograd[name], atol=1e-7, rtol=1e-4)
        torch.testing.assert_close(two_pass[name], reference[name], atol=1e-7, rtol=1e-4)


# --------------------------------------------------------------------------------------------- all
@pytest.mark.parametrize("name", ["espo", "gdpo"])
def test_views_do_not_depend_on_the_left_padding(name):
    """A rollout's masks are drawn over its own scope positions: a wider micro-batch (another rank's or another
    micro-batch's prompt width) leaves them unchanged."""
    from dare.trainer.dynamic_sampling import left_pad_columns

    src = source(name, inner_steps=1, **SMALL[name])
    mb, algo = src.batch(0)[0], src.algorithm
    rollout = mb.select(*[k for k in mb.keys() if k not in ("noisy_ids", "elbo_weight", "ref_elbo", "old_elbo")])
    wide = algo.corrupt(left_pad_columns(rollout.clone(), mb["input_ids"].shape[1] + 3, src.token_ids.pad), 0)
    torch.testing.assert_close(wide["elbo_weight"][..., 3:], mb["elbo_weight"], atol=0, rtol=0)
    assert torch.equal(wide["noisy_ids"][..., 3:], mb["noisy_ids"])
    assert float(mb["elbo_weight"].abs().sum()) > 0


@pytest.mark.parametrize("name", NAMES)
def test_loss_and_gradient_do_not_depend_on_micro_batching(name):
    model = policy()
    options = {"inner_steps": 1, **SMALL[name]}
    one = source(name, model, micro=8, **options)
    two = source(name, model, micro=4, **options)
    loss_one, grads_one = backward_all(one.algorithm, model, one.batch(0))
    loss_two, grads_two = backward_all(two.algorithm, model, two.batch(0))
    assert math.isfinite(loss_one) and abs(loss_one - loss_two) < 1e-5
    assert any(float(g.abs().max()) > 0 for g in grads_one.values())
    for key in grads_one:
        torch.testing.assert_close(grads_one[key], grads_two[key], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_rl_steps_increase_a_toy_reward(name):
    from rollout_helpers import bias_token
    from test_rl_workflow import TARGET_ID, train

    model = policy(seed=3)
    bias_token(model, TARGET_ID, 2.0)  # the target shows up in some rollouts: the reward varies from the start
    options = {"justgrpo": {"sampler_block": 1, "positions_per_forward": 8}, "espo": {"kl_coef": 0.0},
               "gdpo": {}}[name]
    src = source(name, model, n_prompts=2, group=8, gen_length=8, steps=8, reward=TargetFraction(),
                 inner_steps=1, seed=1, **options)
    rewards = train(src, steps=12, lr=1e-2)
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.3, rewards


def test_demo_runs_justgrpo_left_to_right_and_offers_the_new_algorithms(tmp_path):
    from dare.demo import DemoConfig, demo_algorithms
    from dare.demo.pipeline import rl_recipe
    from dare.demo.task import write_task

    assert {"justgrpo", "espo", "gdpo"} <= set(demo_algorithms())
    data = write_task(tmp_path, digits=3, train_size=4, validation_size=2, test_size=2, seed=0)
    sampler = rl_recipe(DemoConfig(algorithm="justgrpo", digits=3), "m", data, tmp_path)["rollout"]["sampler"]
    assert sampler["block_length"] == 1 and sampler["steps"] == sampler["gen_length"]
    other = rl_recipe(DemoConfig(algorithm="gdpo", digits=3), "m", data, tmp_path)["rollout"]["sampler"]
    assert other["block_length"] == other["gen_length"]
