"""Rollout health: ``RolloutOutput.confidence_map`` of the eager samplers, and the per-step health metrics of the
RL source (``rollout/tokens_per_forward``, ``commit_confidence``, ``eos_fraction``) in ``metrics.jsonl``."""

import json
from pathlib import Path

import pytest
import torch

from rl_helpers import policy, source
from rollout_helpers import bias_token, padded, sharp_model, single_thread, sprinkle_token  # noqa: F401

from dare.data.tokenizer import EOS_ID, MASK_ID
from dare.rollout import generate

ROOT = Path(__file__).resolve().parents[1]

# (family, sampler options): every eager loop (masked diffusion with and without cache, block diffusion with and
# without token editing), each with an early stop so that some positions stay undecoded
CASES = {
    "llada": ("llada", dict(sampler="llada", gen_length=8, block_length=4, steps=8)),
    "fastdllm_dual": ("llada", dict(sampler="fastdllm", gen_length=8, block_length=4, cache="dual", threshold=0.5)),
    "dream": ("dream", dict(sampler="fastdllm_dream", gen_length=8, block_length=4, threshold=0.5)),
    "sdar": ("sdar", dict(sampler="sdar", gen_length=8, block_length=4, block_steps=4, threshold=0.5)),
    "llada21_editing": ("sdar", dict(sampler="llada21", gen_length=8, block_length=4, threshold=0.5,
                                     editing_threshold=0.3)),
}


def tie_mask_with_top(model):
    """Give the mask token the largest logit of the other tokens (a hook on the LM head)."""
    def hook(module, inputs, output):
        output = output.clone()
        output[..., MASK_ID] = output.index_fill(-1, torch.tensor([MASK_ID]), float("-inf")).max(-1).values
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def rollout(case: str, mask: str | None = None, **options):
    """A greedy rollout of ``case``; ``mask``: None, ``"banned"`` (mask logit -inf) or ``"tied"`` (the mask logit
    equals the top logit of the other tokens)."""
    family, sampler = CASES[case]
    model = sharp_model(family, seed=2, scale=30.0)
    sprinkle_token(model, EOS_ID, rate=0.05)  # EOS at varying places: rows stop early, tails stay undecoded
    if mask == "banned":
        bias_token(model, MASK_ID, float("-inf"))
    elif mask == "tied":
        tie_mask_with_top(model)
    ids, attn = padded([5, 3, 7, 4], seed=1)
    return generate(model, ids, attn, temperature=0.0, **{**sampler, **options})


@pytest.mark.parametrize("case", list(CASES))
def test_confidence_map_is_zero_exactly_at_undecoded_positions(case):
    out = rollout(case)
    decoded = out.step_map >= 0
    assert out.confidence_map.dtype == torch.float32 and out.confidence_map.shape == out.step_map.shape
    assert bool((~decoded).any()) and bool(decoded.any())  # the case exercises both
    assert torch.equal(out.confidence_map != 0, decoded)


@pytest.mark.parametrize("case", list(CASES))
def test_prob_confidence_at_temperature_0_is_the_committed_tokens_probability(case):
    """``confidence='prob'``, ``T = 0``: the confidence is the committed token's probability and the log-prob is
    taken under the same distribution with the mask token removed (the sampling distribution never proposes it).
    So in fp32 ``confidence = exp(logprob) x (1 - p(mask))``: equal to ``exp(logprob)`` only where the mask token
    has probability 0. Checked both ways: with the mask logit at -inf the two are equal; with the mask logit tied
    to the committed (top) token's, ``p(mask) = confidence``, so ``confidence = e / (1 + e)``, ``e = exp(logprob)``.
    """
    banned = rollout(case, mask="banned")
    decoded = banned.step_map >= 0
    torch.testing.assert_close(banned.confidence_map[decoded], banned.logprobs[decoded].exp(), rtol=1e-5, atol=1e-7)

    tied = rollout(case, mask="tied")
    decoded = tied.step_map >= 0
    e = tied.logprobs[decoded].exp()
    torch.testing.assert_close(tied.confidence_map[decoded], e / (1 + e), rtol=1e-5, atol=1e-7)
    assert bool((tied.confidence_map[decoded] < 0.51).all())  # far below exp(logprob): not a probability of it


def test_llada21_confidence_map_describes_the_last_write():
    out = rollout("llada21_editing", record_trajectory=True)
    traj = out.trajectory
    writes = traj.transfers.sum(1)
    edited = writes > 1
    assert bool(edited.any())  # token editing rewrote some positions
    last = (traj.transfers * torch.arange(traj.transfers.shape[1])[None, :, None]).argmax(1)  # last write's step
    at_last = traj.confidences.gather(1, last[:, None]).squeeze(1)
    decoded = out.step_map >= 0
    torch.testing.assert_close(out.confidence_map[decoded], at_last[decoded])
    assert torch.equal(last[decoded], out.step_map[decoded])


def test_non_probability_confidences_are_recorded_as_the_decoders_score():
    out = rollout("llada", confidence="neg_entropy")
    decoded = out.step_map >= 0
    assert bool((out.confidence_map[decoded] < 0).all())  # negative entropy: a score, not a probability


def health_by_hand(outputs, stop_ids):
    """The health metrics recomputed row by row from the RolloutOutput fields."""
    decoded = steps = eos = rows = 0
    confidences = []
    for out in outputs:
        for b in range(out.completion.shape[0]):
            rows += 1
            committed = [j for j in range(out.completion.shape[1]) if out.step_map[b, j] >= 0]
            decoded += len(committed)
            steps += int(out.num_steps[b])
            eos += any(int(out.completion[b, j]) in stop_ids for j in committed)
            confidences += [float(out.confidence_map[b, j]) for j in committed if out.completion_mask[b, j]]
    return {"rollout/tokens_per_forward": decoded / steps, "rollout/eos_fraction": eos / rows,
            "rollout/commit_confidence": sum(confidences) / len(confidences)}


def test_rl_health_metrics_equal_the_values_computed_from_the_rollout_outputs():
    model = policy(seed=6)
    sprinkle_token(model, EOS_ID, rate=0.2)
    src = source("d1", model, n_prompts=2, group=4, gen_length=8, steps=4, inner_steps=1, kl_coef=0.0)
    src.config.chunk_size = 3  # several generation chunks (3 + 3 + 2 rows): the sums run over all of them
    captured = []
    generate_chunks = src._generate

    def keep(*args):
        captured.extend(generate_chunks(*args))
        return captured

    src._generate = keep
    src.batch(0)
    metrics = src.step_metrics
    assert len(captured) == 3
    expected = health_by_hand(captured, set(src.token_ids.stop_ids))
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9), key
    assert 0 < metrics["rollout/eos_fraction"] < 1  # some rows hit EOS, some did not
    assert 0 < metrics["rollout/commit_confidence"] < 1
    assert metrics["rollout/tokens_per_forward"] == pytest.approx(2.0)  # 8 tokens in 4 steps, early stops or not


def test_dare_train_writes_the_health_metrics_to_metrics_jsonl(tmp_path):
    from dare.cli import main

    assert main(["train", str(ROOT / "configs/llada/d1_tiny.yaml"), f"trainer.output_dir={tmp_path}",
                 "trainer.max_steps=1", "trainer.progress=false", "trainer.export=false", "trainer.batch_size=8",
                 "rollout.sampler.sampler=fastdllm", "rollout.sampler.block_length=4",
                 "rollout.sampler.threshold=0.5"]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= record["rollout/tokens_per_forward"] <= 4  # threshold decoding: at least one token per forward
    assert 0 < record["rollout/commit_confidence"] < 1
    assert 0 <= record["rollout/eos_fraction"] <= 1


@pytest.mark.parametrize("case", ["fastdllm_dual", "sdar"])
def test_confidence_map_of_a_row_does_not_depend_on_its_batch(case):
    family, sampler = CASES[case]
    model = sharp_model(family, seed=3, scale=30.0, dtype=torch.float64)  # float64: no argmax flips across shapes
    lengths = [5, 3, 7]
    ids, attn = padded(lengths, seed=4)
    options = dict(sampler, temperature=0.7, seed=5)
    batched = generate(model, ids, attn, example_ids=[10, 11, 12], **options)
    for row, n in enumerate(lengths):
        alone = generate(model, ids[row:row + 1, -n:], None, example_ids=[10 + row], **options)
        torch.testing.assert_close(batched.confidence_map[row], alone.confidence_map[0])
        assert torch.equal(batched.step_map[row], alone.step_map[0])


def test_rl_metrics_count_the_rollout_engines_recordings_and_fallbacks():
    """``rollout/engine_fallbacks`` makes a silent slowdown visible: generation calls that fell back to the eager
    loop (here the static engine of a model marked as not recordable, as after a failed CUDA-graph recording)."""
    from dare.rollout import engine

    model = policy(seed=6)
    src = source("d1", model, n_prompts=2, group=4, gen_length=8, steps=4, inner_steps=1, kl_coef=0.0)
    src.sampler = src.sampler.replace(engine="static")
    src.config.chunk_size = 3  # three generation calls
    src.batch(0)
    assert src.step_metrics["rollout/engine_fallbacks"] == 0
    assert src.step_metrics["rollout/graph_captures"] == 0  # no CUDA graphs on the CPU
    assert src.step_metrics["rollout/weight_refresh_s"] >= 0
    copies = engine.engine_stats(model).fused_bytes  # the fused q/k/v and gate/up copies of small steps
    assert copies > 0 and src.step_metrics["rollout/engine_copies_gib"] == pytest.approx(copies / 2 ** 30, rel=0.01)
    engine._UNCAPTURABLE.add(model)
    try:
        src.batch(1)
        assert src.step_metrics["rollout/engine_fallbacks"] == 3
    finally:
        engine.release(model)
    src.batch(2)
    assert src.step_metrics["rollout/engine_fallbacks"] == 0
    assert src.step_metrics["rollout/engine_copies_gib"] == pytest.approx(copies / 2 ** 30, rel=0.01)  # not summed
    engine.release(model)
    assert engine.engine_stats(model).fused_bytes == 0  # released copies are not reported
