"""RL on block-diffusion LMs (algorithms.md §6, §8-§10) through the real code on tiny SDAR / LLaDA2: the replay rows
reproduce the sampler's own conditionals, the sanity properties of EBPO / TraceRL / CJ-GRPO / BGPO, invariance to
micro-batching, the first-order direction of one update, the value model in the trainer, config errors."""

import copy
import json
import math

import pytest
import torch

from rl_helpers import (
    TARGET, TargetFraction, Varied, algorithm, assert_micro_batching_invariant, backward_all, micro_batching_runs,
    totals_of,
)
from rollout_helpers import bias_token, single_thread  # noqa: F401  (autouse fixture)

from dare.algorithms.logprobs import denoising_logits, model_inputs
from dare.trainer.prompts import PromptItem
from dare.data.tokenizer import build_byte_tokenizer
from dare.errors import ConfigError
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig
from dare.trainer.config import RolloutConfig
from dare.trainer.rl import RolloutSource
from dare.trainer.workflow import Reference

TOK = build_byte_tokenizer()
TARGET_ID = TOK.convert_tokens_to_ids(TARGET)
TEXTS = ("abcdefgh", "wxyz")  # 8 and 4 tokens: with gen_length 8 every row ends on a block boundary (block 4)
BLOCK_RL = ["d1", "wd1", "coupled_grpo", "spg", "mdpo", "bgpo", "cj_grpo", "ebpo", "tracerl"]
SMALL = {"bgpo": {"mc_num": 2}, "ebpo": {"mc_num": 2}, "spg": {"block_length": 4}, "mdpo": {"train_steps": 2},
         "tracerl": {"accuracy_filter": None, "truncated_reward": None}}


def sdar(seed: int = 0):
    return tiny_model("sdar", seed=seed).train()


def bd_source(name, model=None, *, texts=TEXTS, group=4, micro=None, gen_length=8, block_steps=4, reward=None,
              seed=0, sampler="sdar", sampler_block=4, **options) -> RolloutSource:
    model = model if model is not None else sdar()
    algo = algorithm(name, model, seed=seed, **options)
    ref = Reference(model, copy.deepcopy(model).eval().requires_grad_(False)) if algo.needs.reference else None
    items = [PromptItem(tuple(TOK(t).input_ids), {"answer": t[::-1]}, i, t) for i, t in enumerate(texts)]
    config = SamplerConfig(sampler=sampler, gen_length=gen_length, block_length=sampler_block,
                           block_steps=block_steps, temperature=1.0)
    batch = len(texts) * group
    return RolloutSource(items, policy=model, algorithm=algo, tokenizer=TOK, reward=reward or Varied(),
                         config=RolloutConfig(group_size=group, sampler=config), batch_size=batch,
                         micro_batch_size=micro or batch, seed=seed, reference=ref)


def replay_logprobs(src, mb) -> torch.Tensor:
    """Per-token log-probs of the stored views under the sampler's distribution (T = 1, mask token excluded),
    each token from the view that selects it."""
    algo, model = src.algorithm, src.policy
    out = torch.zeros(mb["input_ids"].shape)
    with torch.no_grad():
        for k in range(mb["noisy_ids"].shape[1]):
            logits = denoising_logits(model, mb["noisy_ids"][:, k], mb["input_ids"], blocks=algo.blocks,
                                      **model_inputs(mb)).float()
            logits[..., src.token_ids.mask] = -math.inf
            logp = torch.log_softmax(logits, -1).gather(-1, mb["input_ids"][..., None]).squeeze(-1)
            select = mb["select"][:, k]
            out[select] = logp[select]
    return out


def rollout_logprobs(mb) -> torch.Tensor:
    out = torch.zeros(mb["input_ids"].shape)
    out[mb["generated"]] = mb["rollout_logprobs"].reshape(-1)
    return out


# --------------------------------------------------------------------------------------------- binding / errors
def test_block_options_are_bound_to_the_family_and_checked_against_the_sampler():
    src = bd_source("d1", inner_steps=1, kl_coef=0.0)
    assert src.algorithm.blocks.size == 4 and src.algorithm.blocks.origin == "global"
    with pytest.raises(ConfigError, match="block_length=4 differs from the training block length 8"):
        bd_source("d1", inner_steps=1, kl_coef=0.0, block_size=8)
    with pytest.raises(ConfigError, match="block-causal"):
        algorithm("ebpo", tiny_model("llada")).bind_model(tiny_model("llada"))
    with pytest.raises(ConfigError, match="block_size applies to block-causal"):
        algorithm("bgpo", tiny_model("llada"), block_size=4).bind_model(tiny_model("llada"))
    with pytest.raises(ConfigError, match="token editing"):
        model = tiny_model("llada2", block_size=4)
        bd_source("tracerl", model, sampler="llada21")


# --------------------------------------------------------------------------------------------- CJ-GRPO
def test_cj_block_parallel_replay_reproduces_the_sampler_conditionals():
    src = bd_source("cj_grpo", inner_steps=1, kl_coef=0.0, gen_length=8, block_steps=4)
    mb = src.batch(0)[0]
    assert not src.algorithm.needs.trajectory and "traj_states" not in mb.keys()  # read from block_step_map
    assert mb["noisy_ids"].shape[1] == 4  # one forward per local step, whatever the number of blocks
    assert torch.equal(mb["select"].sum(1), mb["completion_mask"].long())  # transitions partition the completion
    assert bool((mb["noisy_ids"][mb["select"]] == src.token_ids.mask).all())
    select = mb["select"].any(1)
    torch.testing.assert_close(replay_logprobs(src, mb)[select], rollout_logprobs(mb)[select], atol=2e-5, rtol=0)
    # tokens averaged per (sample, block, local step), transitions per sample: every sample has weight 1
    torch.testing.assert_close(mb["cj_weight"].sum((1, 2)), torch.ones(8))
    local = mb["block_step_map"]
    blocks = (torch.arange(8) + torch.tensor([8, 4]).repeat_interleave(4)[:, None]) // 4  # completion blocks
    row = 0
    comp = mb["completion_mask"][row][mb["generated"][row]]
    transitions = {(int(b), int(k)) for b, k, c in zip(blocks[row], local[row], comp) if c}
    weights = mb["cj_weight"][row][:, mb["generated"][row]]
    for b, k in transitions:
        tokens = (blocks[row] == b) & (local[row] == k) & comp
        torch.testing.assert_close(weights[k][tokens], torch.full((int(tokens.sum()),), 1 / (len(transitions) *
                                                                                             int(tokens.sum()))))


# --------------------------------------------------------------------------------------------- TraceRL
def test_shrink_and_rounds_per_block_by_hand():
    from dare.algorithms.functional import shrink_step_map, step_ranks

    steps = torch.tensor([[0, 0, 1, 2, 3, 5], [7, 6, 5, 4, -1, -1]])
    valid = steps >= 0
    blocks = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    # distinct ids per (row, block) grouped in runs of 2, each mapped to its run's last id
    assert shrink_step_map(steps, valid, 2, groups=blocks).tolist() == [[1, 1, 1, 3, 3, 5], [7, 7, 5, 5, -1, -1]]
    assert shrink_step_map(steps, valid, 1, groups=blocks).tolist() == steps.tolist()
    assert shrink_step_map(steps, valid, 9).tolist() == [[5] * 6, [7, 7, 7, 7, -1, -1]]  # one run per row
    # the round of a token: rank of its (shrunk) step among its block's distinct steps
    assert step_ranks(steps, valid, blocks).tolist() == [[0, 0, 1, 0, 1, 2], [1, 0, 1, 0, -1, -1]]


def test_tracerl_rows_cover_each_trainable_token_once_and_replay_the_sampler():
    src = bd_source("tracerl", accuracy_filter=None, truncated_reward=None, post_num=1)
    mb = src.batch(0)[0]
    steps = torch.full(mb["input_ids"].shape, -1)
    steps[mb["generated"]] = mb["step_map"].reshape(-1)
    after_eos = mb["generated"] & (steps >= 0) & ~mb["completion_mask"]
    first_after = after_eos & (after_eos.long().cumsum(-1) == 1)
    trainable = mb["completion_mask"] | first_after  # post_num = 1
    assert torch.equal(mb["select"].sum(1), trainable.long())  # every trainable token in exactly one row
    select = mb["select"].any(1)
    torch.testing.assert_close(replay_logprobs(src, mb)[select], rollout_logprobs(mb)[select], atol=2e-5, rtol=0)
    # round r holds, in every block, the block's r-th distinct step; earlier steps are visible, later ones masked
    for k in range(mb["noisy_ids"].shape[1]):
        visible = mb["generated"] & (mb["noisy_ids"][:, k] != src.token_ids.mask)
        for row in range(8):
            blocks = (mb["attention_mask"][row].cumsum(-1) - 1) // 4
            for b in blocks[mb["select"][row, k]].unique():
                in_block = blocks == b
                current = steps[row][mb["select"][row, k] & in_block].unique()
                assert current.numel() == 1
                assert bool((steps[row][visible[row] & in_block] < current).all())


def test_tracerl_full_attention_rows_replay_the_sampler():
    src = bd_source("tracerl", tiny_model("llada", seed=1).train(), sampler="llada", sampler_block=8, block_steps=None,
                    accuracy_filter=None, truncated_reward=None)
    mb = src.batch(0)[0]
    assert src.algorithm.blocks is None and src.algorithm.normalizer == "row"
    assert torch.equal(mb["select"].sum(1), mb["completion_mask"].long())
    select = mb["select"].any(1)
    torch.testing.assert_close(replay_logprobs(src, mb)[select], rollout_logprobs(mb)[select], atol=2e-5, rtol=0)


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_tracerl_single_round_is_the_d1_estimator_without_prompt_masking(family):
    model = tiny_model(family, seed=1).train()
    sampler = {} if family == "sdar" else {"sampler": "llada", "sampler_block": 8, "block_steps": None}
    options = dict(accuracy_filter=None, truncated_reward=None, shrink=100, inner_steps=1, kl_coef=0.0)
    trace = bd_source("tracerl", model, **sampler, **options)
    d1 = bd_source("d1", model, **sampler, inner_steps=1, kl_coef=0.0, p_mask_prompt=0.0)
    a, b = trace.batch(0)[0], d1.batch(0)[0]
    assert torch.equal(a["input_ids"], b["input_ids"])  # same rollouts
    rounds = a["noisy_ids"].shape[1]
    assert rounds == 1 and torch.equal(a["noisy_ids"][:, 0], b["noisy_ids"])  # all blocks fully masked
    with torch.no_grad():
        got = trace.algorithm.estimate(model, a)["logp"][:, 0]
        want = d1.algorithm.estimate(model, b)["logp"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_tracerl_value_model_gives_gae_advantages_and_trains():
    model = sdar(seed=2)
    src = bd_source("tracerl", model, accuracy_filter=None, truncated_reward=None, value_model=True, kl_coef=0.0,
                    value_clip=100.0)
    algo = src.algorithm
    aux = algo.auxiliary_models(lambda: copy.deepcopy(model))
    torch.nn.init.normal_(aux["value"].module.head.weight, std=0.5)  # non-trivial values
    mb = src.batch(0)[0]
    trainable = mb["select"].any(1)
    values, returns = mb["old_values"], mb["returns"]
    assert float(values[trainable].abs().min()) > 0
    # gamma = lambda = 1: A = R - V, and R is the score (placed on the last step) on every token
    torch.testing.assert_close(mb["token_advantages"][trainable], (returns - values)[trainable], atol=1e-5, rtol=0)
    torch.testing.assert_close(returns, torch.where(trainable, mb["advantages"][:, None], 0.0), atol=1e-6, rtol=0)
    # the values equal a direct forward of the value model on each token's row
    with torch.no_grad():
        direct = algo.rollout_values(mb)
    torch.testing.assert_close(direct[trainable], values[trainable], atol=1e-6, rtol=0)
    # joint training: policy and value gradients, the value loss falls under its own optimizer
    value = aux["value"].module
    optim = torch.optim.SGD(value.parameters(), lr=1.0)
    losses = []
    for _ in range(10):
        optim.zero_grad()
        metrics = algo.backward(model, mb, totals_of(algo, [mb]))
        losses.append(float(metrics["value/loss"]))
        optim.step()
    assert losses[-1] < 0.5 * losses[0], losses
    assert any(float(p.grad.abs().max()) > 0 for p in model.parameters() if p.grad is not None)


def test_tracerl_scores_truncation_and_accuracy_filter():
    from tensordict import TensorDict

    model = sdar()
    algo = algorithm("tracerl", model, accuracy_filter=[0.2, 0.8])
    algo.bind_model(model)
    eos = algo.token_ids.eos
    ids = torch.tensor([[1, 5, eos, 0], [1, 5, 6, 7], [1, eos, 0, 0], [1, 5, 6, eos]] + [[1, 5, 6, eos]] * 4)
    comp = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 1]] + [[0, 1, 1, 1]] * 4).bool()
    batch = TensorDict({"input_ids": ids, "completion_mask": comp,
                        "rewards": torch.tensor([1.0, 1, 0, 0, 1, 1, 1, 0.5]),
                        "correct": torch.tensor([1, 1, 0, 0, 1, 1, 1, 1]).bool()}, batch_size=[8])
    score, keep = algo.scores(batch, group_size=4)
    # row 1 never emitted a stop token: reward 0 and incorrect -> group 0 is [1, 0, 0, 0], accuracy 0.25: kept
    r = torch.tensor([1.0, 0, 0, 0])
    torch.testing.assert_close(score[:4], (r - r.mean()) / (r.std(unbiased=False) + 1e-4))
    # group 1 is all correct (accuracy 1 > 0.8): dropped although its rewards differ
    assert keep.tolist() == [True] * 4 + [False] * 4 and float(score[4:].abs().max()) > 0


def test_tracerl_truncation_margin_marks_long_stopped_rollouts_truncated():
    """Gen-Verse dLLM-RL reward/rl_reward.py: a response of >= max_gen_length - 5 tokens is incorrect even with EOS
    (algorithm.truncation_margin; 0 = only rollouts without a stop token)."""
    from tensordict import TensorDict

    model = sdar()
    gen = 8
    eos = algorithm("tracerl", model).token_ids.eos
    lengths = [gen - 3, 2, gen, 4, 3, 2, 5, 1]  # row 0: EOS at gen - 3; row 2: no stop token
    ids = torch.full((8, 2 + gen), 7)
    comp = torch.zeros(8, 2 + gen, dtype=torch.bool)
    for row, n in enumerate(lengths):
        comp[row, 2:2 + n] = True
        if row != 2:
            ids[row, 1 + n] = eos
    generated = torch.zeros_like(comp)
    generated[:, 2:] = True
    batch = TensorDict({"input_ids": ids, "completion_mask": comp, "generated": generated,
                        "rewards": torch.tensor([1.0, 1, 1, 0, 1, 0, 0, 0]),
                        "correct": torch.tensor([1, 1, 1, 0, 1, 0, 0, 0]).bool()}, batch_size=[8])
    truncated = {}
    for margin in (0, 5):
        algo = algorithm("tracerl", model, accuracy_filter=[0.0, 1.0], truncation_margin=margin)
        algo.bind_model(model)
        truncated[margin] = (~algo.stopped(batch)).tolist()
        rewards = algo.trained_rewards(batch)
        assert float(rewards[2]) == 0.0  # no stop token: truncated either way
        assert float(rewards[0]) == (1.0 if margin == 0 else 0.0)  # length gen - 3 >= gen - 5: truncated at 5
    assert truncated[0] == [False, False, True] + [False] * 5
    # margin 5: lengths >= 3 count as truncated (row 4 has length 3, row 6 length 5)
    assert truncated[5] == [n >= gen - 5 or row == 2 for row, n in enumerate(lengths)]
    score, _ = algo.scores(batch, group_size=4)
    r = torch.tensor([0.0, 1, 0, 0])  # group 0 after the margin-5 rule
    torch.testing.assert_close(score[:4], (r - r.mean()) / (r.std(unbiased=False) + 1e-4))
    with pytest.raises(ConfigError, match="truncation_margin must be >= 0"):
        algorithm("tracerl", model, truncation_margin=-1)


def test_tracerl_8b_recipe_uses_the_reference_truncation_margin():
    from pathlib import Path

    import yaml

    recipes = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*/tracerl_8b.yaml"))
    assert recipes
    for recipe in recipes:
        assert yaml.safe_load(recipe.read_text())["algorithm"]["truncation_margin"] == 5, recipe
    tiny = Path(__file__).resolve().parents[1] / "configs/sdar/tracerl_tiny.yaml"
    assert "truncation_margin" not in (yaml.safe_load(tiny.read_text())["algorithm"] or {})


# --------------------------------------------------------------------------------------------- EBPO
def test_ebpo_views_touch_every_block_with_stratified_levels():
    src = bd_source("ebpo", mc_num=4)
    mb = src.batch(0)[0]
    weight = mb["elbo_weight"]  # [R, N, S]: 1 / (N p_{n,b}) on the masked tokens, 0 elsewhere
    masked = weight != 0
    assert torch.equal(masked, mb["noisy_ids"] == src.algorithm.token_ids.mask)
    blocks = (mb["attention_mask"].cumsum(-1) - 1) // 4
    for row in range(8):
        comp = mb["completion_mask"][row]
        for b in blocks[row][comp].unique():
            in_block = comp & (blocks[row] == b)
            size = int(in_block.sum())
            counts = masked[row][:, in_block].sum(-1)  # [N]
            assert bool(((counts >= 1) & (counts <= size)).all())  # 1 <= m <= |b| in every view
            w = weight[row][:, in_block]
            want = (size / (4 * counts))[:, None].expand_as(w)  # 1 / (N m / |b|)
            torch.testing.assert_close(w[masked[row][:, in_block]], want[masked[row][:, in_block]])
        assert not bool((masked[row] & ~comp).any())
    # levels of one block are 1/N apart: with |b| = 4 and N = 4 the counts m = floor(4 t) + 1 take every value
    full = [(row, b) for row in range(8) for b in blocks[row][mb["completion_mask"][row]].unique().tolist()
            if int((mb["completion_mask"][row] & (blocks[row] == b)).sum()) == 4]
    assert full
    for row, b in full:
        counts = masked[row][:, mb["completion_mask"][row] & (blocks[row] == b)].sum(-1)
        assert sorted(counts.tolist()) == [1, 2, 3, 4]


def test_ebpo_on_policy_ratio_and_two_pass_gradient():
    model = sdar(seed=3)
    src = bd_source("ebpo", model, mc_num=3, kl_coef=0.1)  # reference = a frozen copy: KL 0 at the start
    algo = src.algorithm
    micro = src.batch(0)
    mb = micro[0]
    totals = totals_of(algo, micro)
    with torch.no_grad():
        elbo = algo.estimate(model, mb)["elbo"]
    proxy = elbo.clone().requires_grad_(True)
    loss, metrics = algo.loss(mb, {"elbo": proxy}, totals)
    (grad,) = torch.autograd.grad(loss, proxy)
    assert float(metrics["policy/log_ratio"]) == 0.0 and float(metrics["policy/clip_frac"]) == 0.0  # rho = 1
    torch.testing.assert_close(mb["ref_elbo"], elbo, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad, -mb["advantages"] / 8)  # g_i = -A_i / B (unclipped, KL gradient 0)
    assert float(mb["advantages"].abs().max()) > 0
    _, two_pass = backward_all(algo, model, micro)  # the trainer's path
    model.zero_grad(set_to_none=True)
    single, _ = algo.loss(mb, algo.estimate(model, mb), totals)  # one graph through all N views
    single.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(two_pass[name], p.grad, atol=1e-7, rtol=1e-5)
    # off-policy (stored old / reference ELBOs of other policies): still the exact gradient, clipping and KL included
    shifted = mb.clone()
    shifted["old_elbo"] = elbo + torch.linspace(-0.3, 0.3, 8)
    shifted["ref_elbo"] = elbo - 0.5
    _, two_pass = backward_all(algo, model, [shifted])
    model.zero_grad(set_to_none=True)
    single, metrics = algo.loss(shifted, algo.estimate(model, shifted), totals)
    single.backward()
    assert float(metrics["policy/clip_frac"]) > 0 and float(metrics["policy/kl"]) > 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(two_pass[name], p.grad, atol=1e-7, rtol=1e-5)


def test_ebpo_runs_on_llada2():
    model = tiny_model("llada2", seed=0, block_size=4).train()
    src = bd_source("ebpo", model, sampler="llada2", mc_num=2)
    loss, grads = backward_all(src.algorithm, model, src.batch(0))
    assert math.isfinite(loss) and any(float(g.abs().max()) > 0 for g in grads.values())


# --------------------------------------------------------------------------------------------- BGPO / d1
def test_bgpo_block_elbo_is_the_two_copy_elbo_over_the_valid_length():
    src = bd_source("bgpo", mc_num=2)
    algo, model = src.algorithm, src.policy
    mb = src.batch(0)[0]
    assert algo.normalizer == "valid"
    with torch.no_grad():
        got = algo.estimate_term(model, mb, 1)["elbo"]
        logits = denoising_logits(model, mb["noisy_ids"][:, 1], mb["input_ids"], blocks=algo.blocks,
                                  **model_inputs(mb)).float()
    logp = torch.log_softmax(logits, -1).gather(-1, mb["input_ids"][..., None]).squeeze(-1)
    masked = mb["mask"][:, 1]
    want = (torch.where(masked, logp, 0.0) / mb["p_mask"][:, 1]).sum(-1) / mb["completion_mask"].sum(-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_d1_block_logprob_depends_only_on_earlier_blocks():
    src = bd_source("d1", inner_steps=1, kl_coef=0.0, p_mask_prompt=0.0)
    algo, model = src.algorithm, src.policy
    mb = src.batch(0)[0]
    row, col = 5, 9  # completion blocks at columns 8..11 and 12..15 in every row
    changed = mb.clone()
    changed["input_ids"][row, col] = (changed["input_ids"][row, col] + 1) % 256
    with torch.no_grad():  # the one-step estimator at every generated position
        before = algo.logp(model, mb, algo.corrupt(mb.clone(), 0)["noisy_ids"], mb["generated"])[row]
        after = algo.logp(model, changed, algo.corrupt(changed.clone(), 0)["noisy_ids"], mb["generated"])[row]
    same_block = torch.zeros_like(before, dtype=torch.bool)
    same_block[8:12] = True
    same_block[col] = False
    torch.testing.assert_close(before[same_block], after[same_block], atol=0, rtol=0)  # its block is all masked
    assert before[col] != after[col]  # the target changed
    assert float((before[12:16] - after[12:16]).abs().min()) > 0  # later blocks see it in the clean copy
    # prompt masking reaches the context of every block (the clean copy), not only the block holding the prompt
    masked_prompt = mb.clone()
    masked_prompt["noisy_ids"] = algo.corrupt(mb.clone(), 0)["noisy_ids"]
    masked_prompt["noisy_ids"][row, 4:6] = src.token_ids.mask  # prompt tokens of row 5 (columns 4..7)
    with torch.no_grad():
        hidden_prompt = algo.logp(model, mb, masked_prompt["noisy_ids"], mb["generated"])[row]
    assert float((hidden_prompt[12:16] - before[12:16]).abs().min()) > 0


# --------------------------------------------------------------------------------------------- all
@pytest.mark.parametrize("inner_steps", [1, 2])
@pytest.mark.parametrize("name", BLOCK_RL)
def test_block_rl_does_not_depend_on_micro_batching(name, inner_steps):
    """Micro-batch sizes 8, 4, 2, 1 on the same rollouts; with inner_steps=2 the second update (stored old
    log-probs) after a fixed perturbation of the policy (off-policy ratios, KL to the old policy active)."""
    model = sdar(seed=4)
    options = {"inner_steps": inner_steps, **SMALL.get(name, {})}
    assert_micro_batching_invariant(micro_batching_runs(lambda m: bd_source(name, model, micro=m, **options), model,
                                                        inner_steps))


def target_probability(model, src) -> float:
    """Mean probability of the target token at completion positions, every block fully masked (given the clean
    earlier blocks): the mean-field policy's expected toy reward, up to the length normalisation."""
    mb = src.batch(0)[0]
    noisy = mb["input_ids"].clone()
    noisy[mb["generated"]] = src.token_ids.mask
    with torch.no_grad():
        logits = denoising_logits(model, noisy, mb["input_ids"], **model_inputs(mb))
        probs = torch.softmax(logits.float(), -1)[..., TARGET_ID]
    return float(probs[mb["generated"]].mean())


@pytest.mark.parametrize("name", ["ebpo", "tracerl"])
def test_one_block_rl_update_moves_towards_higher_expected_reward(name):
    moves = []
    for sign in (1.0, -1.0):
        model = sdar(seed=5)
        bias_token(model, TARGET_ID, 4.0)  # the target token shows up in rollouts (a hook: also in training)

        options = {"mc_num": 2} if name == "ebpo" else {"accuracy_filter": None, "truncated_reward": None}
        src = bd_source(name, model, group=8, reward=TargetFraction(sign), inner_steps=1, kl_coef=0.0, seed=2, **options)
        before = target_probability(model, src)
        assert src.step_metrics["rollout/advantage_abs"] > 0
        optim = torch.optim.SGD(model.parameters(), lr=0.5)
        micro = src.batch(0)
        totals = totals_of(src.algorithm, micro)
        optim.zero_grad()
        for mb in micro:
            src.algorithm.backward(model, mb, totals)
        optim.step()
        moves.append(target_probability(model, src) - before)
    assert moves[0] > 0 > moves[1], moves


# --------------------------------------------------------------------------------------------- trainer
def test_trainer_steps_checkpoints_and_exports_the_value_model(tmp_path, monkeypatch):
    from dare.rewards import REWARDS
    from dare.trainer import Trainer, load_train_config

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    monkeypatch.setitem(REWARDS, "test_varied", Varied)  # rewards that differ within a group

    def config(out, *extra):
        return load_train_config(root / "configs/sdar/tracerl_tiny.yaml", [
            f"trainer.output_dir={out}", "trainer.progress=false", "trainer.batch_size=8",
            "trainer.micro_batch_size=4", "rollout.group_size=4", "rollout.reward=test_varied", *extra])

    full = Trainer(config(tmp_path / "a", "trainer.max_steps=3", "trainer.export=true"))
    record = full.train()
    assert "value/grad_norm" in record and (tmp_path / "a" / "final" / "value.pt").is_file()
    head = torch.load(tmp_path / "a" / "final" / "value.pt")["head.weight"]
    assert float(head.abs().max()) > 0  # the value model was trained (its head starts at 0)
    first = Trainer(config(tmp_path / "b", "trainer.max_steps=2", "trainer.save_every=2", "trainer.export=false"))
    first.train()  # checkpoint at step 2, after the first rollout cycle (mu = 2)
    resumed = Trainer(config(tmp_path / "b", "trainer.max_steps=3", "trainer.export=false"))
    resumed.train()
    for (name, a), (_, b) in zip(full.algorithm.value.named_parameters(), resumed.algorithm.value.named_parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]


@pytest.mark.parametrize("name", ["d1", "bgpo", "ebpo", "cj_grpo", "tracerl"])
def test_tiny_sdar_recipe_runs_a_step_via_dare_train(name, tmp_path):
    from dare.cli import main

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    code = main(["train", str(root / f"configs/sdar/{name}_tiny.yaml"), f"trainer.output_dir={tmp_path}",
                 "trainer.max_steps=1", "trainer.progress=false", "trainer.export=false"])
    assert code == 0
    (record,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and math.isfinite(record["loss"]) and "rollout/reward" in record
