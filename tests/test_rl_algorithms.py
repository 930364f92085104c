"""RL plug-ins through the real code on a tiny LLaDA: the sanity properties of algorithms.md per algorithm,
stored views shared by old / reference / current, invariance to micro-batching."""

import math

import pytest
import torch

from rl_helpers import (
    Constant, algorithm, assert_micro_batching_invariant, backward_all, micro_batching_runs, policy, source, totals_of,
)
from dare.algorithms.functional import bgpo_ratio, clipped_surrogate, kl_estimate, ratio_policy_loss
from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)
from test_bd_rl import bd_source

RL_NAMES = ["d1", "wd1", "coupled_grpo", "spg", "bgpo", "cj_grpo", "mdpo", "tracerl"]
SMALL = {"bgpo": {"mc_num": 3}, "spg": {"block_length": 4}, "mdpo": {"train_steps": 2},
         "tracerl": {"accuracy_filter": None, "truncated_reward": None}}


def nudge(model) -> None:
    """Move every parameter a little, in place (an update between two inner steps; a reference unlike the policy)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))


def direct_logp(model, batch, noisy, select, targets=None):
    targets = batch["input_ids"] if targets is None else targets
    logits = model(noisy, attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    return torch.where(select, logp, 0.0)


# --------------------------------------------------------------------------------------------- d1
def test_d1_views_and_one_step_logprobs_equal_a_direct_forward():
    src = source("d1", inner_steps=1, kl_coef=0.0, p_mask_prompt=0.5)
    mb = src.batch(0)[0]
    noisy, ids = mb["noisy_ids"], mb["input_ids"]
    mask_id = src.token_ids.mask
    assert bool((noisy[mb["generated"]] == mask_id).all())  # the whole completion is masked
    masked_prompt = (noisy == mask_id) & mb["prompt_mask"]
    assert 0 < int(masked_prompt.sum()) < int(mb["prompt_mask"].sum())  # some prompt tokens, p = 0.5
    untouched = ~mb["generated"] & ~masked_prompt
    assert torch.equal(noisy[untouched], ids[untouched])
    with torch.no_grad():
        got = src.algorithm.estimate(src.policy, mb)["logp"]
        want = direct_logp(src.policy, mb, noisy, mb["completion_mask"])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_d1_on_policy_loss_is_minus_length_weighted_advantage():
    src = source("d1", inner_steps=1, kl_coef=0.0)
    micro = src.batch(0)
    algo = src.algorithm
    assert not algo.needs.old_logprobs and not algo.needs.reference
    totals = totals_of(algo, micro)
    mb = micro[0]
    loss, metrics = algo.loss(mb, algo.estimate(src.policy, mb), totals)
    n = mb["completion_mask"].sum(-1).float()
    expected = -(mb["advantages"] * n).sum() / n.sum()
    assert abs(float(loss.detach()) - float(expected)) < 1e-6
    assert float(metrics["policy/clip_frac"]) == 0.0  # rho == 1 everywhere


def test_d1_token_logprob_does_not_depend_on_other_completion_tokens():
    src = source("d1", inner_steps=1, kl_coef=0.0, p_mask_prompt=0.0)
    mb = src.batch(0)[0]
    algo = src.algorithm
    with torch.no_grad():
        before = algo.estimate(src.policy, algo.corrupt(mb.clone(), 0))["logp"]
        changed = mb.clone()
        k = int(changed["generated"][0].nonzero()[0])
        changed["input_ids"][0, k] = (changed["input_ids"][0, k] + 1) % 256
        after = algo.estimate(src.policy, algo.corrupt(changed, 0))["logp"]
    others = changed["completion_mask"].clone()
    others[0, k] = False
    torch.testing.assert_close(before[others], after[others], atol=0, rtol=0)
    assert before[0, k] != after[0, k]


def test_old_reference_and_current_share_stored_views():
    src = source("d1", inner_steps=2, kl_coef=0.04, p_mask_prompt=0.3)
    algo = src.algorithm
    assert algo.needs.old_logprobs and algo.needs.reference
    first, second = src.batch(0)[0], src.batch(1)[0]
    assert not torch.equal(first["noisy_ids"], second["noisy_ids"])  # each inner step has its own mask
    assert "old_logp" not in first.keys()  # the first update trains the rollout policy: old = current, detached
    for mb in (first, second):
        with torch.no_grad():
            current = algo.estimate(src.policy, mb)["logp"]
        # policy unchanged since the rollout and reference == policy: identical inputs give identical values
        torch.testing.assert_close(mb["ref_logp"], current, atol=0, rtol=0)
    torch.testing.assert_close(second["old_logp"], current, atol=0, rtol=0)
    again = src.batch(1)[0]  # the cache serves the stored views again
    assert torch.equal(again["noisy_ids"], second["noisy_ids"])
    assert torch.equal(again["old_logp"], second["old_logp"])


# --------------------------------------------------------------------------------------------- coupled
def test_coupled_masks_are_complementary_fresh_and_on_policy_ratio_is_one():
    src = source("coupled_grpo", inner_steps=2, kl_coef=0.0)
    a, b = src.batch(0)[0], src.batch(1)[0]
    mask_id = src.token_ids.mask
    for mb in (a, b):
        gen = mb["generated"]
        z0, z1, z2 = (mb["noisy_ids"][:, v] == mask_id for v in range(3))
        assert torch.equal(z0, gen)
        assert not bool((z1 & z2).any()) and torch.equal(z1 | z2, gen)
        assert bool(((mb["t"] >= 0.2) & (mb["t"] <= 0.8)).all())
    with torch.no_grad():
        current = src.algorithm.estimate(src.policy, b)["logp"]
    assert "old_logp" not in a.keys()  # first update: on-policy, old = current detached
    torch.testing.assert_close(b["old_logp"], current, atol=0, rtol=0)
    assert not torch.equal(a["in_first"], b["in_first"])  # fresh masks per step
    on_policy = source("coupled_grpo", inner_steps=1, kl_coef=0.0)
    micro = on_policy.batch(0)
    totals = totals_of(on_policy.algorithm, micro)
    mb = micro[0]
    loss, metrics = on_policy.algorithm.loss(mb, on_policy.algorithm.estimate(on_policy.policy, mb), totals)
    n = mb["completion_mask"].sum(-1).float()
    assert abs(float(loss.detach()) + float((mb["advantages"] * n).sum() / n.sum())) < 1e-6
    assert float(metrics["policy/clip_frac"]) == 0.0


# --------------------------------------------------------------------------------------------- wd1
def test_wd1_equal_rewards_give_zero_loss_and_gradient():
    src = source("wd1", inner_steps=1, reward=Constant())
    micro = src.batch(0)
    assert float(micro[0]["wd1_weight"].abs().max()) == 0.0
    loss, grads = backward_all(src.algorithm, src.policy, micro)
    assert loss == 0.0
    assert all(float(g.abs().max()) == 0.0 for g in grads.values())


def test_wd1_weights_are_group_softmax_differences():
    src = source("wd1", inner_steps=1)
    mb = src.batch(0)[0]
    adv = mb["advantages"].reshape(-1, 4)
    expected = (torch.softmax(-adv, 1) - torch.softmax(adv, 1)).reshape(-1)
    torch.testing.assert_close(mb["wd1_weight"], expected)
    torch.testing.assert_close(mb["wd1_weight"].reshape(-1, 4).sum(1), torch.zeros(2), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------- SPG
def test_spg_degenerate_eubo_equals_elbo_and_zero_advantages_give_zero_loss():
    options = dict(num_t=1, block_length=8, min_t=1.0, max_t=1.0, p_mask_prompt=0.0, logp_estimation="eubo")
    src = source("spg", inner_steps=1, **options)
    mb = src.batch(0)[0]
    assert torch.equal(mb["masked"][:, 0] & mb["generated"], mb["generated"])  # whole completion masked
    algo = src.algorithm
    with torch.no_grad():
        logp = algo.estimate(src.policy, mb)["logp"]
    negative = mb.clone()
    negative["advantages"] = -negative["advantages"].abs() - 1  # every row takes the EUBO branch
    positive = mb.clone()
    positive["advantages"] = negative["advantages"].abs()
    torch.testing.assert_close(algo.sequence_estimates(negative, logp), algo.sequence_estimates(positive, logp),
                               atol=1e-5, rtol=1e-5)
    zero = mb.clone()
    zero["advantages"] = torch.zeros_like(zero["advantages"])
    loss, _ = algo.loss(zero, {"logp": logp}, totals_of(algo, [zero]))
    assert float(loss) == 0.0


def test_spg_block_views_follow_the_rules():
    src = source("spg", inner_steps=1, num_t=2, block_length=4, p_mask_prompt=0.0)
    mb = src.batch(0)[0]
    gen = mb["generated"]
    for row in range(mb.batch_size[0]):
        length = int(mb["completion_mask"][row].sum())
        for j in range(2):
            view = mb["masked"][row, j][gen[row]]
            assert not bool(mb["masked"][row, j][~gen[row]].any())  # no prompt masking with p = 0
            assert bool(view[length:].all())  # everything after the first EOS is masked
            chosen = int(view.to(torch.int8).argmax()) // 4  # earlier blocks clean: the first mask is in block b
            assert bool(view[(chosen + 1) * 4:].all())  # later blocks fully masked


# --------------------------------------------------------------------------------------------- BGPO
def test_bgpo_on_policy_gradient_is_the_elbo_policy_gradient_and_termwise_equals_joint():
    src = source("bgpo", inner_steps=1, mc_num=3)
    algo, model = src.algorithm, src.policy
    micro = src.batch(0)
    mb = micro[0]
    totals = totals_of(algo, micro)
    # per-term backward (the trainer's path)
    _, termwise = backward_all(algo, model, micro)
    # one joint backward of the summed loss
    model.zero_grad(set_to_none=True)
    joint_loss, _ = algo.loss(mb, algo.estimate(model, mb), totals)
    joint_loss.backward()
    joint = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # the ELBO policy gradient, token-mean over rollouts: -sum_i |y_i| A_i grad mean_k l_ik / sum_i |y_i|
    model.zero_grad(set_to_none=True)
    elbo = algo.estimate(model, mb)["elbo"].mean(1)
    n = mb["completion_mask"].sum(-1).float()
    (-(n * mb["advantages"] * elbo).sum() / n.sum()).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert float(mb["advantages"].abs().max()) > 0
    for name in reference:
        torch.testing.assert_close(termwise[name], joint[name], atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(termwise[name], reference[name], atol=1e-6, rtol=1e-4)
    assert abs(float(joint_loss.detach()) + float((n * mb["advantages"]).sum() / n.sum())) < 1e-5  # ratios are 1


def test_bgpo_loss_is_the_token_mean_over_rollouts():
    """yjyddq/DARE's compute_policy_loss_bgpo (verl agg_loss token-mean; algorithms.md §8 step 3) weighs each
    rollout's loss by its completion length: sum_i |y_i| l_i / sum_i |y_i|, not a plain mean over rollouts."""
    model = policy()
    src = source("bgpo", model, inner_steps=2, mc_num=3, gen_length=16, steps=8, micro=4)
    algo = src.algorithm
    src.batch(0)
    nudge(model)  # off-policy second update: the rollouts' per-term losses differ
    micro = src.batch(1)
    assert len(micro) == 2
    totals = totals_of(algo, micro)
    got, num, den, plain, lengths = 0.0, 0.0, 0.0, 0.0, []
    for mb in micro:
        with torch.no_grad():
            est = algo.estimate(model, mb)
            got += float(algo.loss(mb, est, totals)[0])
        adv, k = mb["advantages"].float(), est["elbo"].shape[1]
        per_row = sum(ratio_policy_loss(bgpo_ratio(est["elbo"][:, j], mb["old_elbo"][:, j], adv), adv, 0.2, 3.0)
                      for j in range(k)) / k
        n = mb["completion_mask"].sum(-1).float()
        num, den, plain = num + float((n * per_row).sum()), den + float(n.sum()), plain + float(per_row.sum())
        lengths += n.tolist()
    assert len(set(lengths)) > 1  # unequal completion lengths: the two aggregations differ
    want, plain = num / den, plain / len(lengths)
    assert abs(want - plain) > 1e-3
    assert abs(got - want) < 1e-6, (got, want, plain)


def test_bgpo_views_are_stratified_over_the_completion():
    src = source("bgpo", inner_steps=1, mc_num=4)
    mb = src.batch(0)[0]
    masked = mb["mask"]
    assert not bool((masked & ~mb["completion_mask"][:, None]).any())
    counts = masked.sum(-1)
    lengths = mb["completion_mask"].sum(-1, keepdim=True)
    assert bool(((counts >= 1) & (counts <= lengths)).all())
    torch.testing.assert_close(mb["p_mask"].amax(-1) * 0 + torch.where(masked, mb["p_mask"], 0).amax(-1),
                               counts / lengths, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------------------- MDPO
def test_mdpo_constant_rewards_give_zero_step_advantages():
    src = source("mdpo", inner_steps=1, train_steps=2, reward=Constant())
    mb = src.batch(0)[0]
    assert mb["advantages"].shape == (8, 2)
    assert float(mb["advantages"].abs().max()) == 0.0
    assert torch.equal(mb["step_rewards"], torch.ones_like(mb["step_rewards"]))


def test_mdpo_views_replay_selected_steps():
    src = source("mdpo", inner_steps=1, train_steps=2, kl_coef=0.0)
    mb = src.batch(0)[0]
    mask_id = src.token_ids.mask
    for k, s in enumerate(mb["mdpo_steps"][0].tolist()):
        state = mb["traj_states"][:, s]
        region = mb["generated"]
        assert torch.equal(mb["noisy_ids"][:, k][region].reshape(state.shape), state)
        sel = mb["select"][:, k]
        assert bool((mb["noisy_ids"][:, k][sel] == mask_id).all()) and bool(sel.any())
        with torch.no_grad():
            got = src.algorithm.estimate_term(src.policy, mb, k)["logp"]
            logits = src.policy(mb["noisy_ids"][:, k], attention_mask=mb["attention_mask"]).logits.float()
            logits = logits / mb["temperature"][:, None, None]
            want = torch.log_softmax(logits, -1).gather(-1, mb["targets"][:, k, :, None]).squeeze(-1)
        torch.testing.assert_close(got, torch.where(sel, want, 0.0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("confidence_weight", [True, False])
def test_mdpo_kl_is_weighted_like_the_surrogate(confidence_weight):
    """autonomousvision/mdpo compute_loss: (-min(rho A, clip(rho) A) * lambda + beta * kl) * confidence * mask /
    |mask|: the confidence weights the KL too (lambda does not)."""
    model = policy()
    src = source("mdpo", model, inner_steps=1, train_steps=2, kl_coef=0.02, gen_length=8, steps=4,
                 confidence_weight=confidence_weight)
    with torch.no_grad():  # reference != policy: the KL is non-zero
        for p in src.reference.frozen.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    micro = src.batch(0)
    algo = src.algorithm
    totals = totals_of(algo, micro)
    got, want, kl_part = 0.0, 0.0, 0.0
    for mb in micro:
        with torch.no_grad():
            est = algo.estimate(model, mb)
            got += float(algo.loss(mb, est, totals)[0])
        terms = est["logp"].shape[1]
        scale = float(totals["sequences"]) * terms
        for k in range(terms):
            logp, sel = est["logp"][:, k], mb["select"][:, k].float()
            count = sel.sum(-1, keepdim=True)
            lam = mb["generated"].sum(-1, keepdim=True).float() / (count + 1e-4)
            surrogate, _ = clipped_surrogate(logp, logp, mb["advantages"][:, k:k + 1].float(), 0.2)
            kl = kl_estimate(logp, mb["ref_logp"][:, k], "k2")
            c = mb["confidence"][:, k] if confidence_weight else torch.ones_like(logp)
            per_token = (surrogate * lam + 0.02 * kl) * c * sel / count.clamp(min=1)
            want += float(per_token.sum()) / scale
            kl_part += float((0.02 * kl * c * sel / count.clamp(min=1)).sum()) / scale
    assert kl_part > 1e-6
    assert abs(got - want) < 1e-6 + 1e-4 * abs(want), (got, want)


# --------------------------------------------------------------------------------------------- CJ-GRPO
def test_cj_grpo_steps_partition_the_completion():
    src = source("cj_grpo", inner_steps=1, kl_coef=0.0, steps=4)
    mb = src.batch(0)[0]
    per_token = mb["select"].sum(1)
    assert torch.equal(per_token, mb["completion_mask"].long())  # every completion token in exactly one U_s
    mask_id = src.token_ids.mask
    assert bool((mb["noisy_ids"][mb["select"]] == mask_id).all())  # U_s was masked in x_s


def test_cj_grpo_with_one_step_equals_d1_without_prompt_masking():
    model = policy()
    cj = source("cj_grpo", model, inner_steps=1, kl_coef=0.0, steps=1)
    d1 = source("d1", model, inner_steps=1, kl_coef=0.0, p_mask_prompt=0.0, steps=1)
    a, b = cj.batch(0), d1.batch(0)
    assert torch.equal(a[0]["input_ids"], b[0]["input_ids"])  # same rollouts
    assert a[0]["noisy_ids"].shape[1] == 1
    torch.testing.assert_close(a[0]["noisy_ids"][:, 0], b[0]["noisy_ids"], atol=0, rtol=0)
    loss_cj, grads_cj = backward_all(cj.algorithm, model, a)
    loss_d1, grads_d1 = backward_all(d1.algorithm, model, b)
    assert abs(loss_cj - loss_d1) < 1e-6
    for name in grads_d1:
        torch.testing.assert_close(grads_cj[name], grads_d1[name], atol=1e-7, rtol=1e-5)


# --------------------------------------------------------------------------------------------- all
@pytest.mark.parametrize("inner_steps", [1, 2])
@pytest.mark.parametrize("name", RL_NAMES)
def test_loss_and_gradient_do_not_depend_on_micro_batching(name, inner_steps):
    model = policy()
    options = {"inner_steps": inner_steps, **SMALL.get(name, {})}
    assert_micro_batching_invariant(micro_batching_runs(lambda m: source(name, model, micro=m, **options), model,
                                                        inner_steps))


@pytest.mark.parametrize("name", ["vrpo", "dpo"])
def test_preference_loss_and_gradient_do_not_depend_on_micro_batching(name):
    """1, 2 and 4 pairs per micro-batch (of 4), reference != policy."""
    import copy

    from dare.data.tokenizer import EOS_ID, PAD_ID, build_byte_tokenizer
    from dare.trainer.config import DataConfig
    from dare.trainer.preference import PairSource
    from dare.trainer.prompts import build_pairs
    from dare.trainer.workflow import Reference

    model = policy()
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    nudge(ref)
    pairs, _ = build_pairs(DataConfig(path="synthetic:reverse", num_examples=8, chat_template=False, max_length=64),
                           build_byte_tokenizer(), EOS_ID)
    runs = []
    for per_micro in (4, 2, 1):
        algo = algorithm(name, model, mc_num=2)
        src = PairSource(pairs, algorithm=algo, policy=model, reference=Reference(model, ref), batch_size=4,
                         micro_batch_size=per_micro, eos_id=EOS_ID, pad_id=PAD_ID)
        micro = src.batch(0)
        assert len(micro) == 4 // per_micro and all(mb.batch_size[0] == 2 * per_micro for mb in micro)
        runs.append((per_micro, *backward_all(algo, model, micro)))
    assert abs(runs[0][1] - math.log(2)) > 1e-3  # reference != policy
    assert_micro_batching_invariant(runs)


def test_vrpo_policy_equal_to_reference_gives_log_two(tmp_path):
    from dare.data.tokenizer import EOS_ID, PAD_ID, build_byte_tokenizer
    from dare.trainer.prompts import build_pairs
    from dare.trainer.config import DataConfig
    from dare.trainer.preference import PairSource
    from dare.trainer.workflow import Reference
    import copy

    model = policy()
    algo = algorithm("vrpo", model, mc_num=2)
    cfg = DataConfig(path="synthetic:reverse", num_examples=8, chat_template=False, max_length=64)
    pairs, _ = build_pairs(cfg, build_byte_tokenizer(), EOS_ID)
    src = PairSource(pairs, algorithm=algo, policy=model, reference=Reference(model, copy.deepcopy(model).eval()),
                     batch_size=4, micro_batch_size=2, eos_id=EOS_ID, pad_id=PAD_ID)
    micro = src.batch(0)
    assert len(micro) == 2 and all(mb.batch_size[0] == 4 for mb in micro)  # whole pairs per micro-batch
    mb = micro[0]
    assert torch.equal(mb["example_index"][0::2].amax(-1) + 1, mb["example_index"][1::2].amax(-1))
    totals = totals_of(algo, micro)
    loss = sum(float(algo.loss(m, algo.estimate(model, m), totals)[0].detach()) for m in micro)
    assert abs(loss - math.log(2)) < 1e-6
    # the DPO gradient at pi = ref: -(beta/2) mean_pairs (grad B(y_w) - grad B(y_l))
    model.zero_grad(set_to_none=True)
    for m in micro:
        algo.backward(model, m, totals)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    expected = 0
    for m in micro:
        e = algo.estimate(model, m)["elbo"]
        expected = expected - 0.5 * algo.config.beta * (e[0::2] - e[1::2]).sum() / 4
    expected.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, atol=1e-7, rtol=1e-4)


RATIO_SOURCES = {
    **{name: (lambda name=name: source(name, inner_steps=2, **SMALL.get(name, {})))
       for name in ["d1", "coupled_grpo", "bgpo", "cj_grpo", "mdpo", "tracerl"]},
    "dtreerpo": lambda: source("dtreerpo", n_prompts=2, group=4, gen_length=8, steps=4, branch_factor=2, levels=2,
                               inner_steps=2, kl_coef=0.0),
    "dipo": lambda: bd_source("dipo", inner_steps=2, kl_coef=0.0),
}


@pytest.mark.parametrize("name", sorted(RATIO_SOURCES))
def test_the_second_update_reads_the_stored_old_estimates(name):
    """At the second inner step the loss compares with the stored ``old_<key>`` (the policy that made the rollouts);
    without them it falls back to the current estimate detached, which is the loss with ``old_<key>`` set to it."""
    src = RATIO_SOURCES[name]()
    algo, model = src.algorithm, src.policy
    src.batch(0)
    nudge(model)  # an update between the two inner steps: old and current policies differ
    micro = src.batch(1)
    old_keys = [f"old_{key}" for key in algo.logprob_keys]
    assert all(key in mb.keys() for mb in micro for key in old_keys)
    assert any(float(mb["advantages"].abs().max()) > 0 for mb in micro)
    totals = totals_of(algo, micro)
    gaps = []
    with torch.no_grad():
        for mb in micro:
            est = algo.estimate(model, mb)
            stored = float(algo.loss(mb, est, totals)[0])
            on_policy = mb.clone()
            for key in old_keys:
                del on_policy[key]
            as_current = mb.clone()
            for key in algo.logprob_keys:
                as_current[f"old_{key}"] = est[key].detach().clone()
            fallback = float(algo.loss(on_policy, est, totals)[0])
            assert abs(fallback - float(algo.loss(as_current, est, totals)[0])) < 1e-6
            gaps.append(abs(stored - fallback))
    assert max(gaps) > 1e-4, gaps
