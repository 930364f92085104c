"""Shared helpers of the RL tests: tiny policies, toy rewards, rollout sources built without a Trainer."""

import copy
import math

import torch

from dare.algorithms import get_algorithm, resolve_algorithm_config
from dare.trainer.prompts import PromptItem
from dare.data.tokenizer import build_byte_tokenizer
from dare.models import family_of
from dare.models.tiny import tiny_model
from dare.rewards import Reward, RewardResult
from dare.rollout import SamplerConfig
from dare.trainer.config import RolloutConfig
from dare.trainer.rl import RolloutSource
from dare.trainer.workflow import Reference

TARGET = "a"


class TargetFraction(Reward):
    """Toy reward: the fraction of characters of the completion equal to ``TARGET``, times ``sign`` (-1 rewards
    avoiding the target)."""

    name = "target_fraction"

    def __init__(self, sign: float = 1.0):
        self.sign = sign

    def score_one(self, completion, sample):
        frac = completion.count(TARGET) / max(len(completion), 1)
        return RewardResult(reward=self.sign * frac, correct=frac > 0.5, partial=frac)


class Varied(Reward):
    """A reward that differs between almost any two completions (so advantages are non-zero)."""

    name = "varied"

    def score_one(self, completion, sample):
        return RewardResult(reward=(sum(map(ord, completion)) % 11) / 10, correct=False)


class Constant(Reward):
    name = "constant"

    def score_one(self, completion, sample):
        return RewardResult(reward=1.0, correct=True)


def policy(seed: int = 0, **overrides):
    return tiny_model("llada", seed=seed, **overrides).train()


def algorithm(name: str, model, seed: int = 0, **options):
    config = resolve_algorithm_config({"name": name, **options})
    return get_algorithm(name)(config, token_ids=family_of(model).token_ids(model.config), seed=seed)


def prompts(n: int = 2):
    tok = build_byte_tokenizer()
    texts = ["reverse abc", "hi", "copy de", "xyz!"][:n] if n <= 4 else [f"p{i}" for i in range(n)]
    return [PromptItem(tuple(tok(t).input_ids), {"answer": t[::-1]}, i, t) for i, t in enumerate(texts)]


def source(name: str, model=None, *, n_prompts: int = 2, group: int = 4, micro: int | None = None,
           gen_length: int = 8, steps: int = 4, reward=None, reference: bool = False, seed: int = 0,
           temperature: float = 1.0, sampler_block: int | None = None, weights: str = "model",
           **options) -> RolloutSource:
    model = model if model is not None else policy()
    algo = algorithm(name, model, seed=seed, **options)
    ref = None
    if algo.needs.reference or reference:
        if hasattr(model, "disable_adapter"):
            ref = Reference(model)
        else:
            frozen = copy.deepcopy(model).eval().requires_grad_(False)
            ref = Reference(model, frozen)
    sampler = SamplerConfig(gen_length=gen_length, block_length=sampler_block or gen_length, steps=steps,
                            temperature=temperature, weights=weights)
    config = RolloutConfig(group_size=group, sampler=sampler, reward=None)
    batch = n_prompts * group
    return RolloutSource(prompts(n_prompts), policy=model, algorithm=algo, tokenizer=build_byte_tokenizer(),
                         reward=reward or Varied(), config=config, batch_size=batch,
                         micro_batch_size=micro or batch, seed=seed, reference=ref)


def totals_of(algo, micro):
    out = {}
    for mb in micro:
        for k, v in algo.totals(mb).items():
            out[k] = out.get(k, 0) + torch.as_tensor(v, dtype=torch.float64)
    return out


def backward_all(algo, model, micro):
    """The trainer's accumulation: global totals, one ``backward`` per micro-batch; returns (loss, grads)."""
    model.zero_grad(set_to_none=True)
    totals = totals_of(algo, micro)
    loss = 0.0
    for mb in micro:
        metrics = algo.backward(model, mb, totals)
        loss += float(metrics["loss"])
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss, grads


MICRO = (8, 4, 2, 1)  # group size 4: micro-batches 2 and 1 split groups


def micro_batching_runs(make_source, model, inner_steps: int):
    """``(micro, loss, grads)`` of every micro-batch size in MICRO on the same rollouts: the first update, or with
    ``inner_steps=2`` the second one (stored old log-probs) after a fixed perturbation of the policy (off-policy:
    ratios != 1, the KL to the old policy active)."""
    sources = [make_source(m) for m in MICRO]
    batches = [src.batch(0) for src in sources]
    if inner_steps > 1:
        batches = [src.batch(1) for src in sources]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))
    return [(m, *backward_all(src.algorithm, model, b)) for m, src, b in zip(MICRO, sources, batches)]


def assert_micro_batching_invariant(runs):
    _, loss_one, grads_one = runs[0]
    assert math.isfinite(loss_one)
    assert any(float(g.abs().max()) > 0 for g in grads_one.values())
    for micro, loss, grads in runs[1:]:
        assert abs(loss_one - loss) < 1e-5, (micro, loss_one, loss)
        for key in grads_one:
            torch.testing.assert_close(grads_one[key], grads[key], atol=1e-6, rtol=1e-4,
                                       msg=lambda m, micro=micro, key=key: f"micro {micro}, {key}: {m}")
