"""d-TreeRPO, IGPO and DiPO through the real code on tiny models, and the rollout API they use (resuming /
inpainting a canvas): hand-built tree advantages, shared parent states, the self-distillation weights, IGPO's trigger
and answer-free hints, DiPO's step-normalised objective, micro-batch invariance, one update on a toy reward."""

import math

import pytest
import torch

from rl_helpers import TARGET, TargetFraction, Varied, algorithm, backward_all, policy, source, totals_of
from rollout_helpers import bias_token, single_thread  # noqa: F401  (autouse fixture)
from test_bd_rl import TOK, TARGET_ID, bd_source, replay_logprobs, rollout_logprobs, sdar

from dare.algorithms.dtreerpo import branch_points, tree_advantages
from dare.algorithms.igpo import hint_canvas, hint_source
from dare.trainer.prompts import PromptItem
from dare.errors import ConfigError
from dare.models import family_of
from dare.models.tiny import tiny_model
from dare.rewards import Reward, RewardResult
from dare.rollout import SamplerConfig, generate
from dare.trainer.config import RolloutConfig
from dare.trainer.rl import RolloutSource

TREE = {"branch_factor": 2, "levels": 2, "inner_steps": 1, "kl_coef": 0.0}


# --------------------------------------------------------------------------------------------- rollout API
def test_resumed_decoding_keeps_the_schedule_and_inpainted_tokens():
    model = tiny_model("llada", seed=0).eval()
    mask = family_of(model).token_ids(model.config).mask
    prompts = [[5, 6, 7], [8, 9]]
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=6, temperature=1.0, eos_early_stop=False)
    whole = generate(model, prompts, config=cfg)
    head = generate(model, prompts, config=cfg, step_range=(0, 2))
    assert int(head.step_map.max()) == 1 and bool((head.state(mask) == mask).any())
    tail = generate(model, prompts, config=cfg, canvas=head.state(mask), step_range=(2, None))
    assert torch.equal(tail.given, head.step_map >= 0)  # the first window's tokens are given, kept as they were
    assert torch.equal(tail.completion[tail.given], head.completion[head.step_map >= 0])
    joined = torch.where(tail.step_map >= 0, tail.step_map + 2, head.step_map)

    def per_step(step_map):
        return [[int((row == s).sum()) for s in range(6)] for row in step_map]

    assert per_step(joined) == per_step(whole.step_map)  # the resumed block re-plans its masks like one run
    canvas = torch.full((2, 8), mask)
    canvas[:, 2], canvas[0, 5] = 65, 66
    out = generate(model, prompts, config=cfg, canvas=canvas)
    assert int(out.completion[0, 5]) == 66 and bool((out.completion[:, 2] == 65).all())
    assert bool((out.step_map[out.given] == -1).all()) and bool(out.completion_mask[out.given].all())
    with pytest.raises(ConfigError, match="masked-diffusion"):
        generate(tiny_model("sdar", seed=0).eval(), prompts, sampler="sdar", gen_length=8, canvas=canvas)


# --------------------------------------------------------------------------------------------- d-TreeRPO
def test_tree_advantages_on_a_hand_built_tree():
    # 2 root branches x 2 leaves (T = 2, s = 2): leaves (1, 0 | 0, 0) -> root branches worth 0.5 and 0
    rewards, index = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.arange(4)
    adv, owner, values = tree_advantages(rewards, index, group_size=4, branch=2, levels=2)
    torch.testing.assert_close(values, torch.tensor([[0.5, 1.0], [0.5, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0], [0.5, -1.0], [-0.5, 0.0], [-0.5, 0.0]]))
    assert owner.tolist() == [[True, True], [False, True], [True, True], [False, True]]
    # three levels, one root branch (no siblings: the node's own value), two prompts, rows given in any order
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    perm = torch.tensor([5, 0, 7, 2, 1, 6, 3, 4])
    adv, owner, _ = tree_advantages(rewards[perm], perm, group_size=4, branch=2, levels=3)
    expected = torch.tensor([[0.75, -0.5, 1.0], [0.75, -0.5, -1.0], [0.75, 0.5, 0.0], [0.75, 0.5, 0.0],
                             [0.25, -0.5, 0.0], [0.25, -0.5, 0.0], [0.25, 0.5, -1.0], [0.25, 0.5, 1.0]])
    torch.testing.assert_close(adv, expected[perm])
    assert owner[perm.argsort()][:, 0].tolist() == [True, False, False, False] * 2


def test_tree_rollouts_share_parent_states_and_segments_replay_them():
    src = source("dtreerpo", n_prompts=2, group=4, gen_length=8, steps=4, **TREE)
    mb = src.batch(0)[0]
    gen = mb["generated"]
    steps = mb["step_map"]
    d1 = branch_points(4, 2)[1]
    ids = mb["input_ids"][gen].reshape(8, 8)
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):  # leaves of one level-0 node share its state exactly
        shared = steps[a] < d1
        assert torch.equal(shared, steps[b] < d1) and torch.equal(ids[a][shared], ids[b][shared])
    assert not torch.equal(ids[0], ids[1])  # siblings branch
    # segments: each decoded token of a node is trained once, on the node's first leaf
    select = mb["select"]
    assert select[:, 0].sum() == select[0::2, 0].sum() and bool((select.sum(1) <= 1).all())
    # a segment's log-prob is the parent state's forward, at temperature 1
    with torch.no_grad():
        got = src.algorithm.estimate(src.policy, mb)["logp"]
        for level in range(2):
            noisy = mb["noisy_ids"][:, level]
            assert bool((noisy[gen].reshape(8, 8)[steps >= branch_points(4, 2)[level]] == src.token_ids.mask).all())
            logits = src.policy(noisy, attention_mask=mb["attention_mask"]).logits.float()
            want = torch.log_softmax(logits, -1).gather(-1, mb["input_ids"][..., None]).squeeze(-1)
            torch.testing.assert_close(got[:, level][select[:, level]], want[select[:, level]], atol=1e-5, rtol=1e-5)


def test_self_distillation_schedule_and_weights():
    model = policy()
    algo = algorithm("dtreerpo", model, **TREE, distill_horizon=100)
    lam0, tau0 = algo.distill_schedule(0)
    lam, tau = algo.distill_schedule(100)
    assert lam0 == 0 and tau0 == 2.0 and math.isclose(lam, 3e-3) and tau == 1e-6
    src = source("dtreerpo", model, n_prompts=2, group=4, gen_length=8, steps=4, reward=Varied(), **TREE,
                 distill_horizon=1)
    mb = src.batch(1)[0]  # step 1 >= horizon: lambda = lambda_max
    weights, adv, select = mb["distill_weight"], mb["tree_advantages"], mb["select"]
    assert float(weights.sum()) > 0
    assert bool((weights[adv <= 0] == 0).all()) and bool((weights[~select] == 0).all())
    # in every sibling group and position, the q-weights of the positive siblings sum to lambda_max
    for level, size in ((0, 4), (1, 2)):
        for group in range(0, 8, size):
            total = weights[group:group + size, level].sum(0)
            assert bool(((total == 0) | torch.isclose(total, torch.tensor(3e-3))).all())


# --------------------------------------------------------------------------------------------- IGPO
class ContainsRun(Reward):
    """Correct when the completion holds ``aaaa`` (or the sample says the task is trivially solved)."""

    name = "contains_run"

    def score_one(self, completion, sample):
        ok = bool(sample.get("easy")) or "aaaa" in completion
        return RewardResult(reward=float(ok), correct=ok)


def igpo_source(model, reasoning: str, micro: int = 8, **options):
    samples = [{"answer": "zz", "reasoning": reasoning, "easy": True}, {"answer": "zz", "reasoning": reasoning}]
    items = [PromptItem(tuple(TOK(t).input_ids), s, i, t) for i, (t, s) in enumerate(zip(["q1", "q2"], samples))]
    algo = algorithm("igpo", model, inner_steps=1, kl_coef=0.0, free_tail=0, min_chunk=2, max_chunk=3, **options)
    sampler = SamplerConfig(gen_length=16, block_length=16, steps=8, temperature=1.0)
    return RolloutSource(items, policy=model, algorithm=algo, tokenizer=TOK, reward=ContainsRun(),
                         config=RolloutConfig(group_size=4, sampler=sampler), batch_size=8, micro_batch_size=micro)


def hint_runs(mb, row) -> list[str]:
    ids, given = mb["input_ids"][row][mb["generated"][row]], mb["given"][row][mb["generated"][row]]
    runs, current = [], []
    for token, hinted in zip(ids.tolist(), given.tolist()):
        if hinted:
            current.append(token)
        elif current:
            runs.append(TOK.decode(current))
            current = []
    return runs + ([TOK.decode(current)] if current else [])


def test_igpo_triggers_only_on_failed_groups_and_never_hints_the_answer():
    model = policy()
    reasoning = "aaaaaaaaaaaa so zz then zz"
    src = igpo_source(model, reasoning)
    mb = src.batch(0)[0]
    assert src.step_metrics["igpo/triggered"] == 0.5  # the easy group has correct rollouts, the other none
    assert not bool(mb["given"][:4].any()) and bool((mb["rewards"][:4] == 1).all())
    replaced = mb["given"][4:].any(-1)
    assert 0 < int(replaced.sum()) <= 4 and src.step_metrics["igpo/rescued"] == 0.5
    assert bool((mb["rewards"][4:][replaced] == 1).all())  # only correct re-rolls replace rollouts
    prefix = hint_source({"answer": "zz", "reasoning": reasoning}, "reasoning", "answer", "####")
    assert prefix == "aaaaaaaaaaaa so "
    for row in (4 + replaced.nonzero().squeeze(-1)).tolist():
        for run in hint_runs(mb, row):
            assert run in prefix and "zz" not in run  # hints are pieces of the reasoning before the answer
    assert float(backward_all(src.algorithm, model, [mb])[0]) != 0.0
    # no reasoning before the answer: nothing to inpaint, so the failed group stays without signal
    src = igpo_source(policy(), "zz first")
    mb = src.batch(0)[0]
    assert not bool(mb["given"].any()) and src.step_metrics["igpo/rescued"] == 0.0


def test_igpo_hints_and_hint_token_filter():
    assert hint_source({"answer": "Natalia sold 48 + 24 = 72 clips.\n#### 72"}, "answer", "answer", "####") == \
        "Natalia sold 48 + 24 = "
    import random

    tokens = list(range(100, 120))
    canvas = hint_canvas(tokens, 40, 0.5, 0, random.Random(0), min_chunk=4, max_chunk=4, free_tail=10)
    shown = canvas[canvas != 0].tolist()
    assert 0 < len(shown) < len(tokens) and shown == sorted(shown) and tokens[-4:] == shown[-4:]
    assert int((canvas[30:] != 0).sum()) == 0  # the free tail is never hinted
    algo = algorithm("igpo", policy(), hint_entropy_keep=0.25)
    completion = torch.ones(2, 10, dtype=torch.bool)
    given = torch.zeros(2, 10, dtype=torch.bool)
    given[0, 2:10] = True
    batch = {"completion_mask": completion, "given": given}
    entropy = torch.arange(20, dtype=torch.float32).reshape(2, 10)
    trained = algo.trained_mask(batch, entropy)
    assert trained[1].all() and trained[0].tolist() == [True, True] + [False] * 6 + [True, True]


# --------------------------------------------------------------------------------------------- DiPO
def test_dipo_rounds_replay_the_sampler_and_the_objective_is_step_normalised():
    src = bd_source("dipo", inner_steps=1, kl_coef=0.0)
    mb = src.batch(0)[0]
    select = mb["select"]
    trained = mb["completion_mask"]
    assert torch.equal(select.sum(1), trained.long())  # every trained token in exactly one round
    rows = select.any(1)
    torch.testing.assert_close(replay_logprobs(src, mb)[rows], rollout_logprobs(mb)[rows], atol=1e-4, rtol=1e-4)
    steps = [len({int(s) for s, t in zip(row, tr) if t}) for row, tr in
             zip(mb["step_map"], trained[mb["generated"]].reshape(trained.shape[0], -1))]
    assert mb["dipo_steps"].tolist() == steps
    loss, _ = backward_all(src.algorithm, src.policy, [mb])
    expected = -(mb["advantages"] * trained.sum(-1)).sum() / sum(steps)
    assert abs(loss - float(expected)) < 1e-6
    with pytest.raises(ConfigError, match="block-causal"):
        source("dipo")


@pytest.mark.parametrize("name", ["dtreerpo", "igpo", "dipo"])
def test_loss_and_gradient_do_not_depend_on_micro_batching(name):
    if name == "dipo":
        model = sdar(seed=4)
        sources = [bd_source(name, model, micro=m, inner_steps=1) for m in (8, 4)]
    elif name == "igpo":
        model = policy()
        sources = [igpo_source(model, "aaaaaaaaaaaa so zz", micro=m) for m in (8, 4)]
    else:
        # micro 4 keeps whole prompt groups; micro 2 splits the level-0 sibling group (2 root branches, owner rows 0
        # and 2 of a prompt) over two micro-batches; micro 1 (the default) puts every sibling in its own micro-batch:
        # the self-distillation targets and their (group, position) pair count must not change
        model = policy()
        sources = [source(name, model, micro=m, n_prompts=2, group=4, steps=4, **TREE, distill_horizon=1)
                   for m in (8, 4, 2, 1)]
    micro = [src.batch(1) for src in sources]
    loss_one, grads_one = backward_all(sources[0].algorithm, model, micro[0])
    assert math.isfinite(loss_one) and any(float(g.abs().max()) > 0 for g in grads_one.values())
    for src, batches in zip(sources[1:], micro[1:]):
        loss_two, grads_two = backward_all(src.algorithm, model, batches)
        assert abs(loss_one - loss_two) < 1e-6, (f"{len(batches)} micro-batches", loss_one, loss_two)
        for key in grads_one:
            torch.testing.assert_close(grads_one[key], grads_two[key], atol=1e-6, rtol=1e-4)
    if name == "dtreerpo":
        weights = [torch.cat([mb["distill_weight"] for mb in batches]) for batches in micro]
        pairs = [sum(float(mb["distill_pairs"].sum()) for mb in batches) for batches in micro]
        assert all(float(weights[0][:, level].sum()) > 0 for level in range(2))  # both levels distil
        for got, count in zip(weights[1:], pairs[1:]):
            torch.testing.assert_close(got, weights[0], atol=1e-7, rtol=1e-6)
            assert count == pairs[0] > 0


def target_probability(model, mb, mask_id) -> float:
    """Mean probability of the target token with the whole completion masked (the mean-field policy)."""
    from dare.algorithms.logprobs import denoising_logits, model_inputs

    noisy = mb["input_ids"].clone()
    noisy[mb["generated"]] = mask_id
    with torch.no_grad():
        logits = denoising_logits(model, noisy, mb["input_ids"], **model_inputs(mb))
    return float(torch.softmax(logits.float(), -1)[..., TARGET_ID][mb["generated"]].mean())


@pytest.mark.parametrize("name", ["dtreerpo", "igpo", "dipo"])
def test_one_update_moves_towards_higher_toy_reward(name):
    moves = []
    for sign in (1.0, -1.0):
        reward = TargetFraction(sign)
        if name == "dipo":
            model = sdar(seed=5)
            src = bd_source(name, model, group=8, reward=reward, inner_steps=1, seed=2)
        else:
            model = tiny_model("llada", seed=5).train()
            options = TREE if name == "dtreerpo" else {"inner_steps": 1, "kl_coef": 0.0}
            src = source(name, model, group=8 if name == "igpo" else 4, n_prompts=2, steps=4, reward=reward,
                         seed=2, **options)
        bias_token(model, TARGET_ID, 4.0)
        micro = src.batch(0)
        before = target_probability(model, micro[0], src.token_ids.mask)
        optim = torch.optim.SGD(model.parameters(), lr=0.5)
        totals = totals_of(src.algorithm, micro)
        optim.zero_grad()
        for mb in micro:
            src.algorithm.backward(model, mb, totals)
        optim.step()
        moves.append(target_probability(model, micro[0], src.token_ids.mask) - before)
    assert moves[0] > 0 > moves[1], moves
    assert TARGET == "a"
