"""Block-diffusion rollout (SDAR, LLaDA2.0, LLaDA2.1) against literal transcriptions of the reference loops, the
exactness of the block KV cache, batching invariance, output invariants, token editing and early stop.

The transcriptions follow JetAstra/SDAR ``generate.py::block_diffusion_generate`` (prefill, per-block denoising
with ``store_kv=False``, commit forward with ``store_kv=True``; the HF ``DynamicCache`` emulated with
``KVCache`` modes ``append``/``read``), LLaDA2.0's ``generate`` and LLaDA2.1's ``generate`` (full recompute of
the prefix at every step) line by line, batch size 1, so that they share no code with ``dare.rollout``. At
``T = 0`` they use LLaDA2's greedy branch (``probs = softmax(logits)``, ``x0 = argmax``, ``p = probs[x0]``); SDAR's
script has no greedy branch. Stop checks take a list of ids (SDAR's ``stopping_criteria_idx``; LLaDA2 checks its
single ``eos_id``). The tiny models never propose the mask token (its logit is -inf), which DARE's samplers
exclude by construction.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rollout_helpers import bias_token, padded, prompts, sharp_model, single_thread, sprinkle_token  # noqa: F401

from dare.cli import main
from dare.errors import ConfigError
from dare.models import KVCache
from dare.rollout import (
    SamplerConfig,
    filter_logits,
    generate,
    select_edits,
    select_entropy_bounded,
    select_leftmost,
)

MASK, EOS, PAD, EOT = 259, 258, 256, 263
STOPS = (EOS, EOT)
ROOT = Path(__file__).resolve().parents[1]
CUTLASS_LIBRARY = ROOT / "benchmarks" / "cutlass" / "libdare_gemm.so"


def block_model(family="sdar", seed=1, dtype=torch.float32, scale=50.0, **overrides):
    """A tiny block-causal model with spread-out confidences, non-zero LLaDA2 expert biases, and the mask token
    never predicted."""
    model = sharp_model(family, seed=seed, scale=scale, dtype=dtype, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    for module in model.modules():
        if getattr(module, "expert_bias", None) is not None:
            module.expert_bias.copy_(torch.randn(module.expert_bias.shape, generator=gen) * 0.1)
    bias_token(model, MASK, float("-inf"))
    return model


def prompt_tensor(length, seed=0):
    return torch.tensor([prompts([length], seed=seed)[0]])


def greedy(logits):
    """LLaDA2's T = 0 branch of ``_sample_with_temperature_topk_topp``."""
    probs = F.softmax(logits, dim=-1)
    token = torch.argmax(probs, dim=-1, keepdim=True)
    return token.squeeze(-1), torch.gather(probs, -1, token).squeeze(-1)


def get_num_transfer_tokens(block_length, steps):
    base, remainder = block_length // steps, block_length % steps
    num = torch.zeros(steps, dtype=torch.int64) + base
    num[:remainder] += 1
    return num


# ------------------------------------------------------------------------------------------ SDAR reference


@torch.no_grad()
def ref_sdar_generate(model, prompt, mask_id, gen_length=128, block_length=8, denoising_steps=8,
                      remasking_strategy="low_confidence_dynamic", confidence_threshold=0.85,
                      stopping_criteria_idx=None):
    stats = {"denoise": 0, "commit": 0, "quirk": False}
    cache = KVCache(mode="append")

    def forward(ids, pos, store_kv):
        cache.set_mode("append" if store_kv else "read")
        return model(ids, position_ids=pos, cache=cache, block_size=block_length).logits

    prompt_length = prompt.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    position_ids = torch.arange(total_length).unsqueeze(0)
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = prompt
    prefill_blocks = prompt_length // block_length
    prefill_length = prefill_blocks * block_length
    if prefill_length > 0:
        forward(x[:, :prefill_length], position_ids[:, :prefill_length], True)
    num_transfer_tokens = get_num_transfer_tokens(block_length, denoising_steps)
    for num_block in range(prefill_blocks, num_blocks):
        cur_x = x[:, num_block * block_length:(num_block + 1) * block_length].clone()
        cur_position_ids = position_ids[:, num_block * block_length:(num_block + 1) * block_length]
        for step in range(denoising_steps + 1):
            mask_index = cur_x == mask_id
            if mask_index.sum() == 0:
                forward(cur_x, cur_position_ids, True)
                stats["commit"] += 1
                break
            logits = forward(cur_x, cur_position_ids, False)
            stats["denoise"] += 1
            x0, x0_p = greedy(logits)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            k = int(num_transfer_tokens[step])
            if remasking_strategy == "sequential":
                for j in range(cur_x.shape[0]):
                    first_mask_index = mask_index[j].nonzero(as_tuple=True)[0].min().item()
                    transfer_index[j, first_mask_index:first_mask_index + k] = True
            elif remasking_strategy == "low_confidence_static":
                confidence = torch.where(mask_index, x0_p, -torch.inf)
                for j in range(confidence.shape[0]):
                    stats["quirk"] |= k > int(mask_index[j].sum())
                    _, idx = torch.topk(confidence[j], k)
                    transfer_index[j, idx] = True
            elif remasking_strategy == "low_confidence_dynamic":
                confidence = torch.where(mask_index, x0_p, -torch.inf)
                for j in range(confidence.shape[0]):
                    high_conf_mask = confidence[j] > confidence_threshold
                    if high_conf_mask.sum() >= k:
                        transfer_index[j] = high_conf_mask
                    else:
                        stats["quirk"] |= k > int(mask_index[j].sum())
                        _, idx = torch.topk(confidence[j], k)
                        transfer_index[j, idx] = True
            cur_x[transfer_index] = x0[transfer_index]
        x[:, num_block * block_length:(num_block + 1) * block_length] = cur_x
        if stopping_criteria_idx is not None and any(s in x[:, prompt_length:] for s in stopping_criteria_idx):
            break
    return x, stats


STRATEGIES = {"low_confidence_static": "quota", "low_confidence_dynamic": "dynamic", "sequential": "sequential"}
SDAR_CASES = [  # (strategy, block_length, steps, gen_length)
    ("low_confidence_dynamic", 4, 4, 12),
    ("low_confidence_dynamic", 4, 4, 10),   # the last block runs past gen_length
    ("low_confidence_static", 4, 4, 12),
    ("sequential", 4, 4, 12),
    ("low_confidence_static", 8, 4, 16),    # two tokens per step
]


@pytest.mark.parametrize("strategy,block,steps,gen", SDAR_CASES)
def test_sdar_matches_reference(strategy, block, steps, gen):
    """Prompt lengths a multiple of the block, with a remainder, shorter than a block; T = 0; no stop."""
    model = block_model("sdar", seed=1)
    lengths = (8, 6, 2, 12) if block == 8 else (8, 5, 3, 11)  # block 8 / 2 per step: even masks avoid the quirk
    for length in lengths:
        prompt = prompt_tensor(length, seed=length)
        ref, stats = ref_sdar_generate(model, prompt, MASK, gen_length=gen, block_length=block, denoising_steps=steps,
                                       remasking_strategy=strategy, confidence_threshold=0.9)
        assert not stats["quirk"]
        out = generate(model, prompt, None, sampler="sdar", gen_length=gen, block_length=block, block_steps=steps,
                       decoder=strategy, threshold=0.9, eos_early_stop=False)
        assert torch.equal(out.completion[0], ref[0, length:length + gen]), (strategy, length)
        assert out.nfe == stats["denoise"]  # DARE fuses the commit forwards into the next block's first step
        assert (out.step_map >= 0).all()


def test_sdar_stop_matches_reference_and_unpadded_rows():
    """Stop ids: the row ends after the block holding its first stop token; the decoded positions and the
    forward count equal the reference's; a left-padded batch gives every row its unpadded result."""
    model = block_model("sdar", seed=2)
    sprinkle_token(model, EOS, rate=0.08)
    lengths = (5, 8, 3, 10)
    texts = prompts(lengths, seed=7)
    batch = generate(model, texts, sampler="sdar", gen_length=24, threshold=0.9)
    stopped = 0
    for row, text in enumerate(texts):
        ref, stats = ref_sdar_generate(model, torch.tensor([text]), MASK, gen_length=24, block_length=4,
                                       denoising_steps=4, confidence_threshold=0.9, stopping_criteria_idx=STOPS)
        ref_completion = ref[0, len(text):len(text) + 24]
        decoded = ref_completion != MASK
        stopped += int(not decoded.all())
        alone = generate(model, [text], sampler="sdar", gen_length=24, threshold=0.9)
        assert torch.equal(alone.step_map[0] >= 0, decoded)
        assert torch.equal(alone.completion[0][decoded], ref_completion[decoded])
        assert alone.nfe == stats["denoise"]
        assert torch.equal(batch.completion[row], alone.completion[0])
        assert torch.equal(batch.step_map[row], alone.step_map[0])
    assert stopped >= 2  # the stop rule was exercised


def test_sdar_unclamped_topk_quirk_is_not_reproduced():
    """With fewer steps than the block length SDAR's ``topk(conf, k_step)`` can exceed the masks left and then
    re-samples decoded (or prompt-tail) tokens; DARE clamps the count: every completion position is written once
    and each block takes at most ``block_steps`` steps."""
    model = block_model("sdar", seed=1)
    prompt = prompt_tensor(5, seed=3)  # 1 prompt token in the first decode block, 3 masks, k_step = 2
    _, stats = ref_sdar_generate(model, prompt, MASK, gen_length=11, block_length=4, denoising_steps=2,
                                 remasking_strategy="low_confidence_static")
    assert stats["quirk"]
    out = generate(model, prompt, None, sampler="sdar", gen_length=11, block_steps=2, decoder="quota",
                   eos_early_stop=False, record_trajectory=True)
    assert (out.trajectory.transfers.sum(1) == 1).all()
    assert out.block_step_map.max() <= 1 and out.nfe == 6  # 3 blocks x 2 steps


# ------------------------------------------------------------------------------------------ LLaDA2 references


@torch.no_grad()
def ref_llada2_generate(model, inputs, block_length=32, steps=32, gen_length=2048, minimal_topk=1,
                        threshold=0.95, eos_ids=STOPS, mask_id=MASK):
    steps = min(steps, gen_length // minimal_topk)
    prompt_length = inputs.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    position_ids = torch.arange(total_length).unsqueeze(0)
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = inputs.clone()
    prefill_blocks = prompt_length // block_length
    schedule = get_num_transfer_tokens(block_length, steps)
    eos = torch.tensor(eos_ids)
    nfe = 0
    for num_block in range(prefill_blocks, num_blocks):
        current_window_end = (num_block + 1) * block_length
        cur_x = x[:, :current_window_end]
        cur_position_ids = position_ids[:, :current_window_end]
        for step in range(steps):
            active_block_mask = cur_x[:, -block_length:] == mask_id
            if active_block_mask.sum() == 0:
                break
            logits = model(cur_x, position_ids=cur_position_ids, block_size=block_length).logits
            nfe += 1
            x0, x0_p = greedy(logits[:, -block_length:, :])
            num_to_transfer = schedule[step].item()
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            confidence = torch.where(active_block_mask, x0_p, -torch.inf)
            high_conf_mask = confidence[0] > threshold
            if high_conf_mask.sum().item() >= num_to_transfer:
                transfer_index[0] = high_conf_mask
            else:
                _, idx = torch.topk(confidence[0], k=min(num_to_transfer, active_block_mask.sum().item()))
                transfer_index[0, idx] = True
            if transfer_index.any():
                cur_x[:, -block_length:][transfer_index] = x0[transfer_index]
        x[:, :current_window_end] = cur_x
        if torch.isin(x[0, prompt_length:current_window_end], eos).any():
            break
    return _ref_llada2_output(x, prompt_length, gen_length, eos), nfe


def _ref_llada2_output(x, prompt_length, gen_length, eos):
    generated_answer = x[:, :prompt_length + gen_length]
    eos_positions = torch.isin(generated_answer[0][prompt_length:], eos).nonzero(as_tuple=True)[0]
    first_eos_position = eos_positions[0].item() if len(eos_positions) > 0 else gen_length
    return generated_answer[:, prompt_length:prompt_length + first_eos_position + 1]


@torch.no_grad()
def ref_llada21_generate(model, inputs, block_length=32, steps=32, gen_length=2048, minimal_topk=1, threshold=0.95,
                         editing_threshold=0.9, max_post_steps=16, eos_early_stop=False, eos_ids=STOPS,
                         mask_id=MASK, num_to_transfer=1):
    steps = min(steps, gen_length // minimal_topk)
    prompt_length = inputs.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    position_ids = torch.arange(total_length).unsqueeze(0)
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = inputs.clone()
    prefill_blocks = prompt_length // block_length
    eos = torch.tensor(eos_ids)
    stats = {"nfe": 0, "edits": 0}
    for num_block in range(prefill_blocks, num_blocks):
        current_window_end = (num_block + 1) * block_length
        cur_x = x[:, :current_window_end]
        cur_position_ids = position_ids[:, :current_window_end]
        block_start_pos = num_block * block_length
        post_steps = 0
        while True:
            old_block_tokens = cur_x[:, -block_length:].clone()
            active_block_mask = cur_x[:, -block_length:] == mask_id
            if not torch.any(active_block_mask):
                post_steps += 1
            if post_steps > max_post_steps:
                break
            prompt_mask_in_block = torch.zeros(block_length, dtype=torch.bool)
            if block_start_pos < prompt_length:
                prompt_mask_in_block[:min(prompt_length - block_start_pos, block_length)] = True
            logits = model(cur_x, position_ids=cur_position_ids, block_size=block_length).logits
            stats["nfe"] += 1
            x0, x0_p = greedy(logits[:, -block_length:, :])
            mask_transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            if active_block_mask.sum() > 0:
                mask_confidence = torch.where(active_block_mask, x0_p, -torch.inf)
                high_conf_mask = (mask_confidence[0] > threshold) & active_block_mask[0]
                if high_conf_mask.sum().item() >= num_to_transfer:
                    mask_transfer_index[0] = high_conf_mask
                else:
                    _, idx = torch.topk(mask_confidence[0], k=min(num_to_transfer, active_block_mask.sum().item()))
                    mask_transfer_index[0, idx] = True
            editable_positions = ~active_block_mask & ~prompt_mask_in_block[None, :]
            editing_confidence = torch.where(editable_positions, x0_p, -torch.inf)
            high_conf_editing = (editing_confidence[0] > editing_threshold) & editable_positions[0]
            editing_transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            editing_transfer_index[0] = high_conf_editing & (x0[0] != old_block_tokens[0])
            stats["edits"] += int(editing_transfer_index.sum())
            final_transfer_index = mask_transfer_index | editing_transfer_index
            if final_transfer_index.any():
                cur_x[:, -block_length:][final_transfer_index] = x0[final_transfer_index]
            if active_block_mask.sum() == 0 and not editing_transfer_index.any():
                break
        x[:, :current_window_end] = cur_x
        if eos_early_stop:
            generated_part = x[0, prompt_length:current_window_end]
            if (generated_part == mask_id).sum() == 0 and torch.isin(generated_part, eos).any():
                break
    return _ref_llada2_output(x, prompt_length, gen_length, eos), stats


def kept(out, row=0):
    """The completion up to the first stop token (what LLaDA2's generate returns)."""
    return out.completion[row][out.completion_mask[row]]


# steps <= gen_length: LLaDA2 clamps steps to gen_length // minimal_topk, DARE does not (see the README)
@pytest.mark.parametrize("block,steps,threshold", [(8, 8, 0.95), (8, 4, 0.6), (32, 16, 0.95)])
def test_llada2_matches_reference_with_and_without_cache(block, steps, threshold):
    model = block_model("llada2", seed=3)
    sprinkle_token(model, EOS, rate=0.04)
    for length in (8, 5, 3, 13):
        prompt = prompt_tensor(length, seed=20 + length)
        ref, nfe = ref_llada2_generate(model, prompt, block_length=block, steps=steps, gen_length=24,
                                       threshold=threshold)
        for cache in ("block", "none"):
            out = generate(model, prompt, None, sampler="llada2", gen_length=24, block_length=block, block_steps=steps,
                           threshold=threshold, cache=cache)
            assert torch.equal(kept(out), ref[0]), (length, cache)
            assert out.nfe == nfe


def test_llada21_quality_mode_matches_reference():
    """M2T + T2T editing at T = 0: tokens and forward count equal the reference (edits happen)."""
    model = block_model("llada2", seed=4)
    edits = 0
    for length in (8, 5, 3):
        prompt = prompt_tensor(length, seed=30 + length)
        ref, stats = ref_llada21_generate(model, prompt, block_length=8, gen_length=20, threshold=0.7,
                                          editing_threshold=0.5, max_post_steps=3, eos_early_stop=True)
        edits += stats["edits"]
        for cache in ("block", "none"):
            out = generate(model, prompt, None, sampler="llada21", gen_length=20, block_length=8, max_post_steps=3,
                           cache=cache)
            assert torch.equal(kept(out), ref[0]), (length, cache)
            assert out.nfe == stats["nfe"]
    assert edits > 0


def test_llada21_speed_mode_equals_llada2_path():
    """Editing disabled: LLaDA2.1 is LLaDA2.0 with one token per step as fallback. DARE's speed mode skips the
    reference's final edit-only forward of every block (it cannot change anything): same tokens, one forward
    per block fewer."""
    model = block_model("llada2", seed=5)
    ids, mask = padded([6, 9, 4], seed=5)
    speed = generate(model, ids, mask, sampler="llada21_speed", gen_length=16, block_length=8, eos_early_stop=False)
    llada2 = generate(model, ids, mask, sampler="llada2", gen_length=16, block_length=8, threshold=0.5,
                      eos_early_stop=False)
    off = generate(model, ids, mask, sampler="llada21", gen_length=16, block_length=8, threshold=0.5,
                   editing_threshold=0.0, eos_early_stop=False)
    for other in (llada2, off):
        assert torch.equal(speed.completion, other.completion) and torch.equal(speed.step_map, other.step_map)
        assert speed.nfe == other.nfe
    prompt = ids[1:2]  # 9 tokens: blocks 1 and 2 decoded
    ref, stats = ref_llada21_generate(model, prompt, block_length=8, gen_length=16, threshold=0.5,
                                      editing_threshold=1.0)
    alone = generate(model, prompt, None, sampler="llada21_speed", gen_length=16, block_length=8, eos_early_stop=False)
    assert torch.equal(alone.completion[0], ref[0]) and stats["nfe"] == alone.nfe + 3  # 3 decode blocks


def test_editing_rewrites_a_committed_token_the_model_disagrees_with():
    """A model that proposes A at masks, B (p ~ 1) where it sees A, and B where it sees B: the block is first
    filled with A, the verification forward edits every A to B, the next forward edits nothing and ends the
    block. Without editing the block keeps A."""
    A, B = 65, 66
    model = block_model("llada2", seed=6)

    def hook(module, args, kwargs, output):
        ids = args[0]
        target = torch.where((ids == A) | (ids == B), B, A)
        logits = torch.full_like(output.logits, -10.0)
        output.logits = logits.scatter(-1, target[..., None], 10.0)
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    prompt = prompt_tensor(5, seed=1)
    base = dict(gen_length=11, block_length=8, full_logits=True, record_trajectory=True, eos_early_stop=False)
    out = generate(model, prompt, None, sampler="llada21", **base)
    assert (out.completion == B).all()
    assert out.nfe == 3 * 2  # per block (2 blocks): fill with A, edit to B, verify (no edit)
    traj = out.trajectory
    assert (traj.states[0, 1, :3] == A).all() and (traj.predictions[0, 1, :3] == B).all()
    assert traj.transfers[0, 1, :3].all() and (traj.confidences[0, 1, :3] > 0.5).all()
    assert out.step_map[0, :3].tolist() == [1, 1, 1] and out.block_step_map[0, :3].tolist() == [1, 1, 1]
    plain = generate(model, prompt, None, sampler="llada21_speed", **base)
    assert (plain.completion == A).all() and plain.nfe == 2  # one fill per block, no verification forward
    # the kernel: only editable positions whose proposal differs, above the threshold
    edits = select_edits(torch.tensor([[0.9, 0.9, 0.4, 0.9]]), torch.tensor([[True, True, True, False]]),
                         torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 5, 6, 7]]), 0.5)
    assert edits.tolist() == [[False, True, False, False]]


# ------------------------------------------------------------------------------------------ cache exactness


EXACT_CASES = [  # (family, sampler, overrides)
    ("sdar", "sdar", dict(temperature=0.0)),
    ("sdar", "sdar", dict(temperature=0.9, decoder="quota", block_length=8, block_steps=4)),
    ("sdar_moe", "sdar", dict(temperature=0.8, top_k=20, top_p=0.9)),
    ("llada2", "llada2", dict(temperature=0.7, block_length=8, threshold=0.6)),
    ("llada2", "llada21", dict(temperature=0.0, block_length=8, max_post_steps=4)),
]


@pytest.mark.parametrize("family,sampler,overrides", EXACT_CASES)
def test_block_cache_equals_full_recompute(family, sampler, overrides):
    """fp32: the cached sampler commits exactly the tokens of the full-recompute mode, at the same steps, with
    the same log-probs and the same number of forwards (left padding, several prompt lengths)."""
    model = block_model(family, seed=7)
    sprinkle_token(model, EOS, rate=0.03)
    ids, mask = padded([7, 4, 12], seed=8)
    config = SamplerConfig(sampler=sampler, gen_length=18, **overrides)
    cached = generate(model, ids, mask, config.replace(cache="block"))
    full = generate(model, ids, mask, config.replace(cache="none"))
    assert torch.equal(cached.completion, full.completion) and torch.equal(cached.step_map, full.step_map)
    assert torch.equal(cached.num_steps, full.num_steps) and cached.nfe == full.nfe
    torch.testing.assert_close(cached.logprobs, full.logprobs, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ batching


BATCH_CASES = [
    ("sdar", dict(sampler="sdar", temperature=0.0)),
    ("sdar", dict(sampler="sdar", temperature=1.0, top_k=30)),
    ("sdar", dict(sampler="sdar", temperature=0.8, decoder="sequential", block_length=8, block_steps=4)),
    ("llada2", dict(sampler="llada21", temperature=0.6, block_length=8, max_post_steps=2)),
]


@pytest.mark.parametrize("family,overrides", BATCH_CASES)
def test_batched_equals_per_example(family, overrides):
    """Left padding, prompt lengths with different block remainders, per-example seeds, rows stopping in
    different blocks: each row of the batch is decoded exactly as alone (float64 so that batch-shape rounding
    cannot flip a choice)."""
    model = block_model(family, seed=9, dtype=torch.float64)
    sprinkle_token(model, EOS, rate=0.05)
    texts = prompts([5, 9, 3, 8, 12], seed=4)
    ids = [7, 3, 11, 5, 2]
    config = SamplerConfig(gen_length=14, **overrides)
    batch = generate(model, texts, config=config, example_ids=ids)
    for row, (text, example) in enumerate(zip(texts, ids)):
        alone = generate(model, [text], config=config, example_ids=[example])
        for field in ("completion", "step_map", "block_step_map", "completion_mask"):
            assert torch.equal(getattr(batch, field)[row], getattr(alone, field)[0]), field
        assert batch.num_steps[row] == alone.num_steps[0]
        torch.testing.assert_close(batch.logprobs[row], alone.logprobs[0])
    assert batch.nfe >= int(batch.num_steps.max())


def test_seed_and_example_id_drive_sampling():
    model = block_model("sdar", seed=2)
    texts = prompts([6, 6], seed=1)
    config = SamplerConfig(sampler="sdar", gen_length=12, temperature=1.0, eos_early_stop=False)
    a = generate(model, texts, config=config)
    assert torch.equal(a.completion, generate(model, texts, config=config).completion)
    assert not torch.equal(a.completion, generate(model, texts, config=config.replace(seed=1)).completion)
    assert torch.equal(a.completion[0], generate(model, texts, config=config, example_ids=[0, 5]).completion[0])


# ------------------------------------------------------------------------------------------ invariants


def test_step_map_logprobs_and_trajectory():
    """T > 0, static schedule (block 4, 2 steps: 2 tokens per step). Blocks are decoded in order, each row's
    steps are numbered consecutively, the block step map restarts at every block, the trajectory replays the
    rollout, and the log-probs are those of the tempered distribution at the recorded states (a full forward
    of prompt + state, which the cache must agree with)."""
    model = block_model("sdar", seed=3)
    T = 0.8
    lengths = [5, 9, 13]  # remainder 1 and gen 11: the last block ends at gen_length (no overflow position)
    ids, mask = padded(lengths, seed=6)
    out = generate(model, ids, mask, sampler="sdar", gen_length=11, block_steps=2, decoder="quota", temperature=T,
                   record_trajectory=True, eos_early_stop=False)
    assert (out.step_map >= 0).all() and out.nfe == 6
    # completion positions 0-2 are block 0 (3 masks: 2 + 1), then blocks of 4 (2 + 2)
    for row in out.step_map:
        assert torch.bincount(row).tolist() == [2, 1, 2, 2, 2, 2]
        assert row[:3].max() < row[3:7].min() and row[3:7].max() < row[7:].min()
    first = torch.tensor([0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4])
    assert torch.equal(out.block_step_map, out.step_map - first)
    assert out.num_steps.tolist() == [6, 6, 6]
    traj = out.trajectory
    assert traj.states.shape == (3, 6, 11) and traj.step_mask.all() and (traj.states[:, 0] == MASK).all()
    assert torch.equal(traj.transfers, out.step_map[:, None, :] == torch.arange(6)[None, :, None])
    for s in range(5):
        replay = torch.where(traj.transfers[:, s], traj.predictions[:, s], traj.states[:, s])
        assert torch.equal(replay, traj.states[:, s + 1])
    with torch.no_grad():
        for row, length in enumerate(lengths):
            prompt = ids[row, -length:]
            for s in range(6):
                seq = torch.cat([prompt, traj.states[row, s]])[None]
                logits = model(seq, block_size=4).logits[0, length:]
                cand = traj.candidates[row, s]
                conf = torch.softmax(logits / T, -1).gather(-1, traj.predictions[row, s, :, None])[:, 0]
                torch.testing.assert_close(traj.confidences[row, s][cand], conf[cand])
                logp = torch.log_softmax(logits / T, -1).gather(-1, out.completion[row, :, None])[:, 0]
                sel = traj.transfers[row, s]
                torch.testing.assert_close(out.logprobs[row][sel], logp[sel])
    td = out.to_tensordict()
    assert td["block_step_map"].shape == (3, 11) and td["trajectory", "states"].shape == (3, 6, 11)


def test_dynamic_decoding_commits_at_least_the_schedule_and_early_stop_saves_forwards():
    model = block_model("sdar", seed=4)
    sprinkle_token(model, EOS, rate=0.06)
    ids, mask = padded([5, 9, 3, 7], seed=4)
    cfg = SamplerConfig(sampler="sdar", gen_length=32, block_length=8, block_steps=4, threshold=0.5,
                        temperature=0.0, record_trajectory=True)
    early = generate(model, ids, mask, cfg)
    full = generate(model, ids, mask, cfg.replace(eos_early_stop=False))
    per_step = full.trajectory.transfers.sum(-1)
    assert (per_step[full.trajectory.step_mask] >= 1).all()
    assert (per_step > 2).any()  # some steps commit more than the scheduled 2
    assert torch.equal(early.completion_mask, full.completion_mask)
    keep = early.completion_mask
    assert torch.equal(early.completion[keep], full.completion[keep])
    assert torch.equal(early.step_map[keep], full.step_map[keep])
    undecoded = early.step_map < 0
    assert undecoded.any() and early.nfe < full.nfe
    assert (early.completion[undecoded] == PAD).all() and (early.logprobs[undecoded] == 0).all()
    for row, length in enumerate([5, 9, 3, 7]):
        stops = torch.isin(early.completion[row], torch.tensor(STOPS)).nonzero()
        end = int(stops[0]) + 1 if len(stops) else 32
        assert early.completion_mask[row].tolist() == [True] * end + [False] * (32 - end)
        # decoding ends with the block holding the first stop (the block grid counts the prompt)
        block_end = -(-(length + end) // 8) * 8 - length
        assert (early.step_map[row] >= 0).tolist() == [True] * min(block_end, 32) + [False] * (32 - min(block_end, 32))


def test_kernels_sequential_entropy_bounded_and_filter_order():
    eligible = torch.tensor([[False, True, True, False, True]])
    assert select_leftmost(eligible, torch.tensor([2])).tolist() == [[False, True, True, False, False]]
    # entropies 0.1, 0.3, 0.05 at the eligible positions: cumulative 0.05, 0.15, 0.45 -> two below 0.35
    neg_entropy = torch.tensor([[-9.0, -0.1, -0.3, -9.0, -0.05]])
    assert select_entropy_bounded(neg_entropy, eligible, 0.35).tolist() == [[False, True, False, False, True]]
    assert select_entropy_bounded(neg_entropy, eligible, 0.01).tolist() == [[False, False, False, False, True]]
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # top-p 0.5 keeps {0.4, 0.3} (the token crossing 0.5 stays), then top-k 2 keeps both; top-k 2 first keeps
    # {0.4, 0.3}, renormalised to {0.57, 0.43}, then top-p 0.5 keeps only the first
    assert torch.isfinite(filter_logits(logits, top_p=0.5, top_k=2)).sum() == 2
    assert torch.isfinite(filter_logits(logits, top_p=0.5, top_k=2, top_k_first=True)).sum() == 1


def test_entropy_bounded_decoder_runs_and_commits_low_entropy_first():
    model = block_model("sdar", seed=5)
    # prompt 6 + 14 generated = 5 blocks of 4: no position past gen_length (a step committing only such a
    # position has no transfer inside the completion)
    out = generate(model, prompts([6], seed=2), sampler="sdar", gen_length=14, decoder="entropy_bounded",
                   entropy_bound=0.5, eos_early_stop=False, record_trajectory=True)
    assert (out.step_map >= 0).all()
    traj = out.trajectory
    for s in range(int(out.num_steps[0])):
        cand, chosen = traj.candidates[0, s], traj.transfers[0, s]
        assert chosen.any() and (chosen <= cand).all()
        if (cand & ~chosen).any():  # committed positions have lower entropy (higher neg-entropy) than the rest
            assert traj.confidences[0, s][chosen].min() >= traj.confidences[0, s][cand & ~chosen].max()


# ------------------------------------------------------------------------------------------ errors, CLI, benchmark


def test_config_errors():
    sdar = block_model("sdar")
    llada = sharp_model("llada")
    ids, mask = padded([4, 6], seed=1)
    cases = [
        (sdar, dict(sampler="sdar", steps=8), "steps does not apply to sampler 'sdar'"),
        (sdar, dict(sampler="sdar", cache="dual"), "unknown cache 'dual'"),
        (sdar, dict(sampler="sdar", block_steps=5), "block_steps must be in [1, block_length=4]"),
        (sdar, dict(sampler="llada21", editing_threshold=1.5), "editing_threshold must be in [0, 1)"),
        (sdar, dict(sampler="llada21", confidence="margin"), "confidence must be 'prob'"),
        (sdar, dict(sampler="sdar", decoder="entropy_bounded", confidence="prob"), "must be 'neg_entropy'"),
        (sdar, dict(sampler="llada"), "sampler 'llada' decodes full models; sdar is block-causal: use sdar"),
        (llada, dict(sampler="sdar"), "sampler 'sdar' decodes block-causal models; llada is full"),
        (llada, dict(sampler="llada", block_steps=4), "block_steps does not apply to sampler 'llada'"),
        (llada, dict(sampler="llada", cache="block"), "unknown cache 'block'"),
    ]
    for model, overrides, message in cases:
        with pytest.raises(ConfigError) as err:
            generate(model, ids, mask, gen_length=8, **overrides)
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    resolved = SamplerConfig(sampler="sdar", decoder="low_confidence_static").resolved()
    assert (resolved.decoder, resolved.block_steps, resolved.cache, resolved.top_k_first) == ("quota", 4, "block", True)


def test_generate_cli_with_block_samplers(capsys):
    code = main(["generate", "--model", "tiny:sdar", "--prompt", "Hi", "--prompt", "What is 2+2?", "--sampler",
                 "sdar", "--gen-length", "10", "--block-steps", "2", "-o", "eos_early_stop=false", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["cache"] == "block" and result["config"]["block_steps"] == 2
    assert all(len(r["tokens"]) <= 10 for r in result["results"]) and result["nfe"] >= 2
    assert main(["generate", "--model", "tiny:llada2", "--prompt", "Hi", "--gen-length", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sampler"] == "llada2" and result["compile_blocks"] is False  # the family's default sampler


def test_generate_cli_compiles_the_blocks_when_asked(capsys, compiled_models):
    args = ["generate", "--model", "tiny:sdar", "--prompt", "Hi", "--gen-length", "8", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--compile-blocks"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert len(compiled_models) == 1 and compiled["compile_blocks"] is True
    assert compiled["results"][0]["tokens"] == plain["results"][0]["tokens"]


def _benchmark(script: str):
    """The module of ``benchmarks/SCRIPT.py``, loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"{script}_benchmark", ROOT / "benchmarks" / f"{script}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_benchmark_tiny_smoke(tmp_path, capsys):
    bench = _benchmark("bd_rollout")
    out = tmp_path / "bd.json"
    assert bench.main(["--tiny", "--batch", "2", "--gen", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    runs = {(r["decoder"], r["cache"]): r for r in json.loads(out.read_text())["results"]}
    assert set(runs) == {(d, c) for d in ("static", "dynamic") for c in ("block", "none")}
    for decoder in ("static", "dynamic"):
        cached, full = runs[decoder, "block"], runs[decoder, "none"]
        assert cached["nfe"] == full["nfe"] and cached["tokens"] == full["tokens"] == 32
        assert cached["same_tokens"] is True
    assert "x recompute" in printed


def test_benchmark_times_each_value_of_a_switch_side_by_side(tmp_path, capsys, monkeypatch):
    """``--switch NAME=V1,V2``: one record per value for every non-eager engine, the variable set during that
    value's runs only (the records' kernel settings show it) and restored afterwards."""
    import os

    bench = _benchmark("bd_rollout")
    monkeypatch.delenv("DARE_FUSE_CACHE_WRITES", raising=False)
    out = tmp_path / "records.json"
    assert bench.main(["--tiny", "--batch", "2", "--gen", "8", "--decoders", "static", "--caches", "block",
                       "--engines", "eager", "static", "--switch", "DARE_FUSE_CACHE_WRITES=0,1",
                       "--records", str(out)]) == 0
    assert "DARE_FUSE_CACHE_WRITES" not in os.environ
    written = json.loads(out.read_text())
    records = {r["engine"]: r for r in written["records"]}
    assert set(records) == {"eager", "static[DARE_FUSE_CACHE_WRITES=0]", "static[DARE_FUSE_CACHE_WRITES=1]"}
    for record in records.values():  # each record keeps the run's own denominators when appended elsewhere
        assert (record["run_peak_flops"], record["run_bandwidth"]) == (written["peak_flops"], written["bandwidth"])
    assert records["static[DARE_FUSE_CACHE_WRITES=0]"]["kernels"]["cache_writes_in_blocks"] is False
    assert records["static[DARE_FUSE_CACHE_WRITES=1]"]["kernels"]["cache_writes_in_blocks"] is True
    off, on = records["static[DARE_FUSE_CACHE_WRITES=0]"], records["static[DARE_FUSE_CACHE_WRITES=1]"]
    assert (off["nfe"], off["tokens"], off["same_tokens_as_eager"]) == (on["nfe"], on["tokens"], on["same_tokens_as_eager"])
    assert "static[DARE_FUSE_CACHE_WRITES=1] tok/s" in capsys.readouterr().out  # side by side in the table


def test_benchmark_times_each_rollout_weights_value_side_by_side(tmp_path):
    """``--weights model fp8``: one record per value for every non-eager engine, labelled by the value, with the
    token agreement against the eager run and the copies' refresh time."""
    bench = _benchmark("bd_rollout")
    out = tmp_path / "records.json"
    assert bench.main(["--tiny", "--batch", "2", "--gen", "8", "--decoders", "static", "--caches", "block",
                       "--engines", "eager", "static", "--weights", "model", "fp8", "--confident-fraction", "0",
                       "--records", str(out)]) == 0
    records = {r["engine"]: r for r in json.loads(out.read_text())["records"]}
    assert set(records) == {"eager", "static", "static[fp8]"}
    assert (records["static"]["weights"], records["static[fp8]"]["weights"]) == ("model", "fp8")
    assert records["static"]["token_agreement"] == 1.0 and records["static"]["same_tokens_as_eager"]  # fp32
    assert 0.0 <= records["static[fp8]"]["token_agreement"] <= 1.0
    assert records["static[fp8]"]["copies_refresh_s"] > 0.0  # FP8 copies are made at every call


@pytest.mark.parametrize("script,argv,message", [
    ("bd_rollout", ["--tiny", "--engines", "graph"], "graph engine records CUDA graphs; on cpu"),
    ("bd_rollout", ["--tiny", "--compile-mode", "max-autotune-no-cudagraphs"], "--compile-mode applies to compiled blocks"),
    ("bd_rollout", ["--tiny", "--switch", "FUSE=0,1"], "--switch takes NAME=V1,V2 with a DARE_* environment variable"),
    ("bd_rollout", ["--tiny", "--switch", "DARE_FUSE_CACHE_WRITES="], "--switch takes NAME=V1,V2"),
    ("bd_rollout", ["--tiny", "--engines", "eager", "--switch", "DARE_FUSE_CACHE_WRITES=0,1"], "add --engines static or graph"),
    ("engine_profile", ["--libraries", "cublas"], "--libraries and several --batch sizes apply to --gemm-only"),
    ("engine_profile", ["--gemm-only", "--max-blocks", "2"], "--max-blocks takes a count >= 0"),
    ("engine_profile", ["--max-blocks", "-1"], "--max-blocks takes a count >= 0"),
    ("engine_profile", ["--gemm-only", "--libraries", "mkl"], "invalid choice: 'mkl'"),
    ("engine_profile", ["--family", "sdar", "--cache", "dual"], "--cache chooses LLaDA's Fast-dLLM cache"),
    ("engine_profile", ["--gemm-only", "--timeline"], "--timeline and --kernels-json split a profiled decode"),
    ("engine_profile", ["--gemm-only", "--kernels-json", "k.json"], "--timeline and --kernels-json split a profiled"),
    ("engine_profile", ["--kernels-json", "/no/such/folder/k.json"], "--kernels-json: no folder /no/such/folder"),
    ("conditional_steps", ["--steps", "0"], "--rows, --layers, --steps and --reps take counts >= 1"),
    ("attention_shapes", ["--keys", "192", "256", "--valid", "136"], "--valid takes one count per --keys width"),
    ("attention_shapes", ["--keys", "192", "--valid", "200"], "each in 1..width"),
    ("bd_rollout", ["--tiny", "--engines", "eager", "--weights", "fp8"], "--weights applies to the static/graph engines"),
    ("rollout", ["--tiny", "--lora-rank", "0"], "--lora-rank must be >= 1"),
    ("engine_profile", ["--gemm-only", "--weights", "fp8"], "--compile, --cache and --weights apply to the profiled"),
    ("matmul_variants", ["--rows", "0"], "--rows and --rounds take counts >= 1"),
    ("matmul_variants", ["--split-k", "1"], "--split-k slice counts >= 2"),
    ("matmul_variants", ["--lt-algos", "-1"], "--lt-algos a count >= 0"),
    ("swiglu_gemm", ["--rows", "0"], "--rows, --layers, --rounds and --top take counts >= 1"),
    ("swiglu_gemm", ["--configs", "1x1x1"], "--configs: no such configuration; known: 128x128x64s3w8g8"),
    pytest.param("matmul_variants", ["--quack"], "--quack needs the quack-kernels package",
                 marks=pytest.mark.skipif(importlib.util.find_spec("quack") is not None, reason="quack is installed")),
    pytest.param("matmul_variants", ["--cutlass"], "--cutlass needs libdare_gemm.so: build it with",
                 marks=pytest.mark.skipif(CUTLASS_LIBRARY.exists(), reason="the CUTLASS library is built")),
    pytest.param("rollout", ["--tiny", "--cutlass-narrow"], "--cutlass-narrow needs libdare_gemm.so",
                 marks=pytest.mark.skipif(CUTLASS_LIBRARY.exists(), reason="the CUTLASS library is built")),
    pytest.param("attention_fa4", [], "needs a CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")),
])
def test_benchmark_refuses_options_it_would_ignore_in_one_line(script, argv, message, capsys):
    bench = _benchmark(script)
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_attention_fa4_counts_flops_and_tabulates_each_shape(capsys):
    """attention_fa4.py: 4 B H Q K d FLOPs forward, 3.5x that with the backward; one table line per shape, a failed
    implementation shown as such, FA4 / SDPA from their times."""
    bench = _benchmark("attention_fa4")
    assert bench.SHAPES["llada_b16_dual_window"].flops() == 4 * 16 * 32 * 32 * 384 * 128
    assert bench.SHAPES["bgpo_update_390"].flops() == 3.5 * 4 * 4 * 32 * 780 * 780 * 128
    bench.print_table([{"shape": "x", "impl": "sdpa", "us": 40.0}, {"shape": "x", "impl": "sdpa_flash", "error": "E"},
                       {"shape": "x", "impl": "fa4", "us": 30.0, "tflops": 100.0, "max_abs_diff": 0.004}])
    assert capsys.readouterr().out.splitlines()[-1] == "| x | 40.0 | failed | 30.0 | 100 | 0.75 | 0.004 |"


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn is installed")
def test_attention_fa4_names_the_missing_package_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        _benchmark("attention_fa4").load_fa4()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "flash-attn-4 is not importable" in err and "pip install --pre flash-attn-4" in err


def test_timeline_splits_kernel_time_by_kind_and_idle_time_by_gap_length():
    bench = _benchmark("engine_profile")
    # two forwards of kernels (name, start us, end us): a 2 us and a 1 us gap inside steps, a 100 us host wait
    kernels = [("nvjet_sm90_gemm", 0, 10000), ("triton_poi_fused_add", 10002, 13002), ("_partial_kernel", 13002, 18002),
               ("nvjet_sm90_gemm", 18102, 28102), ("cudnn_generated_fort_native_sdpa", 28103, 32103)]
    lines = bench.timeline_report(kernels, forwards=2).splitlines()
    by_kind = {line.split()[0]: float(line.split()[1]) for line in lines[1:6]}
    assert by_kind == pytest.approx({"matmul": 10.0, "attention": 4.5, "generated": 1.5, "gaps<=20us": 0.0015,
                                     "host": 0.05}, abs=1e-3)
    assert "span 16.052 ms per forward" in lines[0]
    assert "span 32.103 ms per phase" in bench.timeline_report(kernels, forwards=1, unit="phase").splitlines()[0]
    assert any("100.0 us" in line and "_partial_kernel -> nvjet_sm90_gemm" in line for line in lines)
    assert bench.kernel_kind("void cublasLt::splitKreduce_kernel<32>") == "matmul"
    assert bench.kernel_kind("void at::native::vectorized_elementwise_kernel<4>") == "other"
    assert bench.kernel_kind("Memcpy DtoD (Device -> Device)") == bench.kernel_kind("Memset (Unknown)") == "copy"


@pytest.mark.parametrize("family, expected", [("llada", {"attn_out", "ff_out"}), ("sdar", {"o_proj", "down_proj"})])
def test_cutlass_routing_selects_each_layers_narrow_projections_and_not_the_lm_head(family, expected):
    import sys

    from dare.models.tiny import tiny_model

    sys.path.insert(0, str(ROOT / "benchmarks"))  # by its own name, as the scripts import it (one op registration)
    import cutlass_gemm
    model = tiny_model(family)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    chosen = [name for name in linears if re.search(cutlass_gemm.NARROW_PROJECTIONS, name)]
    hidden = model.get_input_embeddings().weight.shape[1]
    assert len(chosen) == 2 * model.config.num_hidden_layers
    assert {name.rsplit(".", 1)[1] for name in chosen} == expected
    assert all(linears[name].out_features == hidden for name in chosen)
    assert model.get_output_embeddings() is None or all(linears[n] is not model.get_output_embeddings() for n in chosen)
    with pytest.raises(ValueError, match="persistent configuration"):
        cutlass_gemm.route_narrow_projections(model, variant="coop_128x128_c1_sk")
    assert "pp_64x128_c1_p" in cutlass_gemm.variant_names()
    assert len(set(cutlass_gemm.variant_names())) == len(cutlass_gemm.variant_names()) == 16


def test_every_cutlass_variant_has_its_own_build_guard_in_order():
    """build.sh compiles variant i of dare_gemm.cu with -DDARE_ONLY=i for i < the number of DARE_VARIANT lines: a
    guard numbered out of order would drop one variant from the library and build another twice."""
    import re

    lines = (ROOT / "benchmarks" / "cutlass" / "dare_gemm.cu").read_text().splitlines()
    variants = [i for i, line in enumerate(lines) if line.startswith("DARE_VARIANT(")]
    guards = [re.fullmatch(r"#if !defined\(DARE_ONLY\) \|\| DARE_ONLY == (\d+)", lines[i - 1]) for i in variants]
    assert all(guards), "each DARE_VARIANT line follows its DARE_ONLY guard"
    assert [int(g.group(1)) for g in guards] == list(range(len(variants)))
    assert all(lines[i + 1] == "#endif" for i in variants)
    names = [re.match(r"DARE_VARIANT\((\w+),", lines[i]).group(1) for i in variants]
    assert len(set(names)) == len(names)


def test_small_kernels_fused_step_formulations_compute_the_same_tensors():
    """small_kernels.py times three formulations of a block's RoPE + cache writes to pick the fastest; each must
    give the models' q and cache contents exactly, so that one could replace another without changing a token."""
    bench = _benchmark("small_kernels")
    from dare.models.layers import rope_angles

    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 6, 3 * bench.HEADS * bench.HEAD_DIM, generator=gen)
    delta = torch.randn(qkv.shape, generator=gen)
    cos, sin = rope_angles(torch.arange(4, 10).expand(2, 6), bench.HEAD_DIM, 500000.0)
    results = {}
    for name, step in bench.FUSED_STEPS.items():
        kc, vc = torch.zeros(2, bench.HEADS, 12, bench.HEAD_DIM), torch.zeros(2, bench.HEADS, 12, bench.HEAD_DIM)
        results[name] = (step(qkv, delta, cos, sin, kc, vc, torch.arange(4, 10)).contiguous(), kc, vc)
    q, keys, values = results["cat"]
    assert keys[:, :, 4:10].abs().sum() > 0 and keys[:, :, :4].abs().sum() == 0  # written at the slots only
    for name in ("roll", "untransposed"):
        assert all(torch.equal(a, b) for a, b in zip(results[name], results["cat"])), name
    assert torch.equal(results["q only"][0], q) and torch.equal(results["writes only"][2], values)
    unrotated = results["writes only"][0].transpose(1, 2)
    assert unrotated.shape == q.shape and not torch.allclose(unrotated, q)  # RoPE did something
