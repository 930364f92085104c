"""Dynamic sampling (rollout.dynamic_sampling): flat groups are never admitted while informative ones exist, the batch
size never changes, extra rounds are bounded and counted, and the admitted batch trains like any other."""

import pytest
import torch

from rl_helpers import Constant, algorithm, backward_all, policy
from rl_helpers import prompts as rl_prompts
from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

from dare.data.tokenizer import build_byte_tokenizer
from dare.errors import ConfigError
from dare.rewards import Reward, RewardResult
from dare.rollout import SamplerConfig
from dare.trainer.config import RolloutConfig
from dare.trainer.dynamic_sampling import admit, extra_prompts, flat_groups
from dare.trainer.rl import RolloutSource


class HalfFlat(Reward):
    """Constant reward on the prompts whose answer starts with an even digit, a varying one elsewhere."""

    name = "half_flat"

    def score_one(self, completion, sample):
        if int(sample["answer"][0]) % 2 == 0:
            return RewardResult(reward=1.0, correct=True)
        return RewardResult(reward=(sum(map(ord, completion)) % 11) / 10, correct=False)


def dynamic_source(reward, *, name="d1", prompts_per_step=2, group=4, rounds=4, n_prompts=12, dynamic=True,
                   micro=None, **options):
    model = policy(seed=7)
    items = [item for item in rl_prompts(n_prompts)]
    for item in items:  # answers "0p", "1p", ...: the digit decides flat or not
        item.sample["answer"] = item.text[::-1]
    sampler = SamplerConfig(gen_length=8, block_length=8, steps=4, temperature=1.0)
    config = RolloutConfig(group_size=group, sampler=sampler, dynamic_sampling=dynamic, dynamic_extra_rounds=rounds)
    batch = prompts_per_step * group
    return RolloutSource(items, policy=model, algorithm=algorithm(name, model, inner_steps=1, kl_coef=0.0, **options),
                         tokenizer=build_byte_tokenizer(), reward=reward, config=config, batch_size=batch,
                         micro_batch_size=micro or batch, seed=0)


def test_admit_takes_informative_groups_in_order_then_fills():
    flat = [torch.tensor([True, False, True]), torch.tensor([False, True, False])]
    assert admit(flat, 3) == ([(0, 1), (1, 0), (1, 2)], 0)
    assert admit(flat, 4) == ([(0, 0), (0, 1), (1, 0), (1, 2)], 1)  # one flat group fills the last slot
    assert admit([torch.tensor([True, True])], 2) == ([(0, 0), (0, 1)], 2)
    assert flat_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2).tolist() == [True, False]
    first = extra_prompts(10, {0, 1}, 4, seed=0, rollout=3, round_=1)
    assert first == extra_prompts(10, {0, 1}, 4, seed=0, rollout=3, round_=1) and not {0, 1} & set(first)
    assert first != extra_prompts(10, {0, 1}, 4, seed=0, rollout=3, round_=2)


def test_dynamic_sampling_never_admits_a_flat_group_and_keeps_the_batch_size():
    src = dynamic_source(HalfFlat(), micro=4)
    extra, widened = [], False
    for step in range(6):
        micro = src.batch(step)
        batch = torch.cat(micro, 0)
        metrics = src.step_metrics
        assert batch.batch_size[0] == 8 and [mb.batch_size[0] for mb in micro] == [4, 4]
        assert batch["rollout_index"].tolist() == list(range(8))
        assert not bool(flat_groups(batch["rewards"], 4).any())  # every admitted group carries a signal
        assert bool((batch["advantages"].reshape(2, 4).abs().sum(1) > 0).all())
        assert metrics["rollout/dynamic/filled"] == 0 and metrics["rollout/flat_groups"] == 0
        extra.append(metrics["rollout/dynamic/extra_rounds"])
        generated = 2 * (1 + extra[-1])  # groups generated over the rounds; 2 informative ones admitted
        assert 0 <= extra[-1] <= 4 and metrics["rollout/dynamic/dropped"] <= generated - 2
        assert (metrics["rollout/dynamic/dropped"] > 0) == (extra[-1] > 0)
        rows = batch["example_index"]
        assert torch.equal(rows.amax(-1), batch["rollout_index"])  # renumbered in the admitted order
        padding = ~batch["attention_mask"].bool()
        assert bool((batch["input_ids"][padding] == src.token_ids.pad).all())
        assert not bool((padding & (batch["prompt_mask"] | batch["generated"])).any())
        widened |= bool(padding.any())
    assert any(e > 0 for e in extra)  # the half-flat reward made some steps roll extra prompts
    assert widened  # admitted groups of prompts of different lengths were left-padded to one width
    loss, grads = backward_all(src.algorithm, src.policy, src.batch(5))
    assert any(float(g.abs().max()) > 0 for g in grads.values())


def test_dynamic_sampling_counts_drops_and_extra_rounds():
    plain = dynamic_source(HalfFlat(), dynamic=False)
    dynamic = dynamic_source(HalfFlat())
    for step in range(4):
        first = plain.batch(step)[0]
        flat0 = int(flat_groups(first["rewards"], 4).sum())
        dynamic.batch(step)
        metrics = dynamic.step_metrics
        # round 0 is the plain step's rollouts: same prompts, same streams, same rewards
        assert abs(metrics["rollout/dynamic/round0_reward"] - float(first["rewards"].mean())) < 1e-6
        assert (metrics["rollout/dynamic/extra_rounds"] > 0) == (flat0 > 0)
        assert metrics["rollout/dynamic/dropped"] >= flat0


def test_dynamic_sampling_fills_with_flat_groups_after_the_last_round():
    src = dynamic_source(Constant(), rounds=2)
    batch = torch.cat(src.batch(0), 0)
    metrics = src.step_metrics
    assert batch.batch_size[0] == 8
    assert metrics["rollout/dynamic/extra_rounds"] == 2 and metrics["rollout/dynamic/filled"] == 2
    assert metrics["rollout/dynamic/dropped"] == 3 * 2 - 2
    assert float(batch["advantages"].abs().max()) == 0.0


def test_dynamic_sampling_works_with_a_sequence_algorithm_and_trajectories():
    for name, options in (("gdpo", {"quadrature": "gauss-1"}), ("cj_grpo", {})):
        src = dynamic_source(HalfFlat(), name=name, **options)
        batch = torch.cat(src.batch(0), 0)
        assert batch.batch_size[0] == 8 and not bool(flat_groups(batch["rewards"], 4).any())
        backward_all(src.algorithm, src.policy, src.batch(0))


def test_dynamic_sampling_option_errors():
    with pytest.raises(ConfigError, match="dynamic_extra_rounds"):
        dynamic_source(HalfFlat(), rounds=-1)
