"""The RL workflow end to end: learning on a toy reward, the first-order direction of one update, the
LoRA-disabled reference, `dare train` of an RL recipe, exact resume inside a rollout cycle, config errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_helpers import TARGET, TargetFraction, policy, source
from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

from dare.data.tokenizer import build_byte_tokenizer
from dare.errors import ConfigError
from dare.trainer import Trainer, load_train_config

ROOT = Path(__file__).resolve().parents[1]
TARGET_ID = build_byte_tokenizer().convert_tokens_to_ids(TARGET)


def target_probability(model, src) -> float:
    """Mean probability of the target token over completion positions of the one-step (all-masked) input."""
    mb = src.batch(0)[0]
    noisy = mb["input_ids"].clone()
    noisy[mb["generated"]] = src.token_ids.mask
    with torch.no_grad():
        probs = torch.softmax(model(noisy, attention_mask=mb["attention_mask"]).logits.float(), -1)[..., TARGET_ID]
    return float(probs[mb["generated"]].mean())


def train(src, steps: int, lr: float, optimizer=torch.optim.Adam):
    model = src.policy
    optim = optimizer([p for p in model.parameters() if p.requires_grad], lr=lr)
    rewards = []
    for step in range(steps):
        micro = src.batch(step)
        if "rollout/reward" in src.step_metrics:
            rewards.append(src.step_metrics["rollout/reward"])
        totals = {}
        for mb in micro:
            for k, v in src.algorithm.totals(mb).items():
                totals[k] = totals.get(k, 0) + v
        optim.zero_grad()
        for mb in micro:
            src.algorithm.backward(model, mb, totals)
        optim.step()
    return rewards


@pytest.mark.parametrize("name", ["d1", "coupled_grpo"])
def test_rl_steps_increase_a_toy_reward(name):
    model = policy(seed=3)
    src = source(name, model, n_prompts=2, group=8, gen_length=8, steps=8, reward=TargetFraction(),
                 inner_steps=1, kl_coef=0.0, seed=1)
    rewards = train(src, steps=12, lr=1e-2)
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.15, rewards


def test_one_update_moves_towards_higher_expected_reward():
    """First order: one plain-gradient d1 step raises the probability of the rewarded token (the toy reward's
    expectation under the mean-field policy), and the same step with the reward negated lowers it."""
    from rollout_helpers import bias_token

    moves = []
    for sign in (1.0, -1.0):
        model = policy(seed=5)
        bias_token(model, TARGET_ID, 4.0)  # the target token shows up in rollouts (a hook: also in training)

        src = source("d1", model, n_prompts=2, group=8, reward=TargetFraction(sign), inner_steps=1, kl_coef=0.0, seed=2)
        before = target_probability(model, src)
        assert src.step_metrics["rollout/advantage_abs"] > 0
        train(src, steps=1, lr=0.5, optimizer=torch.optim.SGD)
        moves.append(target_probability(model, src) - before)
    assert moves[0] > 0 > moves[1], moves


def test_lora_disabled_reference_equals_the_base_model():
    from dare.models.lora import apply_lora
    from dare.trainer.workflow import Reference

    base = policy(seed=2)
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        want = base(ids).logits.clone()
    peft_model = apply_lora(base, r=4, alpha=8)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
        adapted = peft_model(ids).logits
        with Reference(peft_model).model() as ref:
            got = ref(ids).logits
    assert float((adapted - want).abs().max()) > 1e-3  # the adapter changes the policy
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert peft_model.training  # mode restored


def test_d1_with_lora_uses_the_adapter_disabled_reference():
    from dare.models.lora import apply_lora

    model = apply_lora(policy(seed=2), r=4, alpha=8)
    src = source("d1", model, inner_steps=2, kl_coef=0.04)
    assert src.reference.frozen is None
    src.batch(0)
    mb = src.batch(1)[0]  # the second inner step: the first has no old estimates (on-policy)
    torch.testing.assert_close(mb["ref_logp"], mb["old_logp"], atol=1e-6, rtol=0)  # LoRA B = 0 at init


def test_dare_train_runs_an_rl_recipe(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dare.cli", "train", str(ROOT / "configs/llada/d1_tiny.yaml"),
           f"trainer.output_dir={out}", "trainer.max_steps=3", "trainer.progress=false"]
    env = {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert "rollout/reward" in records[0] and "policy/kl" in records[1]
    assert (out / "rollouts.jsonl").is_file() and (out / "final" / "config.json").is_file()


def rl_config(tmp_path, *overrides):
    return load_train_config(ROOT / "configs/llada/d1_tiny.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.export=false",
        "trainer.batch_size=8", "trainer.micro_batch_size=4", *overrides])


def test_resume_inside_a_rollout_cycle_is_exact(tmp_path):
    full = Trainer(rl_config(tmp_path / "a", "trainer.max_steps=4"))
    full.train()
    first = Trainer(rl_config(tmp_path / "b", "trainer.max_steps=3", "trainer.save_every=3"))
    first.train()  # checkpoint at step 3: inside the cycle of steps 2-3 (mu = 2)
    resumed = Trainer(rl_config(tmp_path / "b", "trainer.max_steps=4"))
    resumed.train()
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    a_lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    b_lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    drop = lambda line: {k: v for k, v in json.loads(line).items() if not k.startswith("time") and "_s" not in k}
    assert [drop(x) for x in a_lines] == [drop(x) for x in b_lines]


def test_rl_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="multiple of rollout.group_size"):
        Trainer(rl_config(tmp_path, "trainer.batch_size=6"))
    with pytest.raises(ConfigError, match="temperature"):
        Trainer(rl_config(tmp_path, "rollout.sampler.temperature=0"))
    with pytest.raises(ConfigError, match="did you mean 'algorithm.kl_coef'"):
        rl_config(tmp_path, "algorithm.kl_coeff=0.1")
    with pytest.raises(ConfigError, match="rollout.reward"):
        Trainer(rl_config(tmp_path, "rollout.reward=null"))


RECIPES = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/*/*.yaml")
                 if p.parent.name != "lm_eval")  # configs/lm_eval holds lm-eval task files, not DARE recipes
TINY_RL = [r for r in RECIPES if r.endswith("_tiny.yaml") and "sft" not in r]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_validates(recipe):
    config = load_train_config(ROOT / recipe)
    assert config.algorithm.name in recipe


@pytest.mark.parametrize("recipe", TINY_RL)
def test_tiny_rl_recipes_run_a_step(recipe, tmp_path):
    from dare.trainer import run_training

    config = load_train_config(ROOT / recipe, [f"trainer.output_dir={tmp_path}", "trainer.max_steps=1",
                                               "trainer.progress=false", "trainer.export=false"])
    record = run_training(config)
    assert record["step"] == 1 and torch.isfinite(torch.tensor(record["loss"]))
    assert "rollout/reward" in record or "dpo/accuracy" in record


def test_first_inner_step_trains_on_policy_without_an_old_forward():
    """The first update of a rollout trains the policy that made the rollouts: RolloutSource runs no old forward
    for it (mu - 1 old passes per rollout, not mu), and its loss and gradients equal those with the old
    log-probs computed. The later inner steps keep their stored old log-probs."""
    from rl_helpers import backward_all

    from dare.trainer.workflow import attach_estimates

    model = policy(seed=2)
    src = source("d1", model, micro=4, inner_steps=3, kl_coef=0.04)
    algo, estimate, calls = src.algorithm, src.algorithm.estimate, []
    algo.estimate = lambda m, batch: (calls.append(m), estimate(m, batch))[1]
    micro = src.batch(0)
    assert len(micro) == 2
    assert sum(m is model for m in calls) == 2 * 2  # inner steps 1 and 2, two micro-batches each
    assert sum(m is src.reference.frozen for m in calls) == 3 * 2  # the reference: every inner step
    assert not any("old_logp" in mb.keys() for mb in micro)
    assert all("old_logp" in mb.keys() for k in (1, 2) for mb in src.batch(k))
    algo.estimate = estimate
    with_old = [attach_estimates(algo, mb.clone(), model, "old_") for mb in micro]
    loss, grads = backward_all(algo, model, micro)
    loss_old, grads_old = backward_all(algo, model, with_old)
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    assert abs(loss - loss_old) <= 1e-6 * max(1.0, abs(loss))
    assert grads.keys() == grads_old.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_old[name], atol=1e-7, rtol=1e-5, msg=name)


def test_batched_old_and_reference_estimates_equal_per_micro_batch_and_switch_modes_once():
    """prepare_micro_batches gives exactly the per-batch results while entering the reference context (peft's
    adapter switch, which walks every module) and the policy's eval mode once for all micro-batches."""
    from dare.models.lora import apply_lora
    from dare.trainer.workflow import Reference, prepare_micro_batch, prepare_micro_batches

    model = apply_lora(policy(seed=2), r=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)  # the policy differs from the reference
    src = source("d1", model, n_prompts=2, group=4, micro=2, inner_steps=2, kl_coef=0.04)
    rollouts = torch.cat(src.batch(0), 0).select(  # the rollout fields, without views or estimates
        "input_ids", "attention_mask", "prompt_mask", "generated", "completion_mask", "example_index",
        "rollout_index", "group_size", "advantages")
    chunks = [rollouts[i:i + 2] for i in range(0, 8, 2)]

    class Counting(Reference):
        entered = 0

        def model(self):
            Counting.entered += 1
            return super().model()

    modes = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    reference = Counting(model)
    copies = [c.clone() for _ in (5, 6) for c in chunks]
    batched = prepare_micro_batches(src.algorithm, copies, [5] * 4 + [6] * 4, model, reference)
    assert Counting.entered == 1 and model.training and not any(modes)
    singles = [prepare_micro_batch(src.algorithm, c.clone(), step, model, reference)
               for step in (5, 6) for c in chunks]
    assert Counting.entered == 1 + len(singles)
    for got, want in zip(batched, singles):
        for key in ("noisy_ids", "old_logp", "ref_logp"):
            torch.testing.assert_close(got[key], want[key], atol=0, rtol=0)
    assert float((batched[0]["old_logp"] - batched[0]["ref_logp"]).abs().max()) > 1e-4
    assert not torch.equal(batched[0]["noisy_ids"], batched[4]["noisy_ids"])  # each step its own prompt mask


def test_rollout_source_times_its_phases_and_generates_under_the_trainer_precision():
    entered = []

    import contextlib

    @contextlib.contextmanager
    def precision():
        entered.append(True)
        yield
        entered.pop()

    model = policy(seed=4)
    during = []
    model.register_forward_pre_hook(lambda module, args: during.append(bool(entered)))
    src = source("d1", model, n_prompts=2, group=4, gen_length=8, steps=8, inner_steps=2, kl_coef=0.04)
    src.precision = precision
    micro = src.batch(0)
    metrics = src.step_metrics
    assert during and all(during)  # rollout, old and reference forwards all ran inside precision()
    phases = [metrics[f"rollout/{k}_s"] for k in ("generate", "reward", "logprob")]
    assert all(t >= 0 for t in phases) and metrics["rollout/logprob_s"] > 0
    assert abs(sum(phases) - metrics["rollout/time_s"]) < 2e-3
    decoded = sum(int((mb["step_map"] >= 0).sum()) for mb in micro)
    assert metrics["rollout/decoded"] == decoded / 8 and metrics["rollout/nfe"] == 8  # one token per step


def test_trainer_accepts_a_built_model_and_a_source_factory(tmp_path):
    from rl_helpers import Varied
    from rl_helpers import prompts as rl_prompts

    from dare.models.loading import unwrap
    from dare.trainer.rl import RolloutSource

    model = policy(seed=6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    def factory(trainer):
        seen.append(trainer)
        cfg = trainer.config
        return RolloutSource(rl_prompts(4), policy=trainer.model, algorithm=trainer.algorithm,
                             tokenizer=build_byte_tokenizer(), reward=Varied(), config=cfg.rollout,
                             batch_size=cfg.trainer.batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
                             info=trainer.info, reference=trainer.reference)

    config = rl_config(tmp_path, "model.path=not-a-checkpoint", "lora.enabled=false", "algorithm.kl_coef=0.04")
    trainer = Trainer(config, model=model, source=factory)
    assert seen == [trainer] and trainer.source.policy is trainer.model and unwrap(trainer.model) is model
    frozen = trainer.reference.frozen  # no LoRA: a frozen copy of the given model, not a second load
    assert frozen is not model and not any(p.requires_grad for p in frozen.parameters())
    record = trainer.train_step(0)
    assert "rollout/logprob_s" in record and record["grad_norm"] > 0
    moved = any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert moved  # the given model is the one trained ...
    for k, v in frozen.state_dict().items():
        torch.testing.assert_close(v, before[k], atol=0, rtol=0)  # ... and the reference kept its weights
