"""The rollout loop: batching invariance, cache equivalences, step map / log-prob / trajectory invariants,
early stop, errors.

Invariance tests use float64 tiny models so that the ~1e-7 differences between batch shapes of an fp32 model
can never flip an argmax; the reference tests (test_rollout_reference.py) use fp32.
"""

import pytest
import torch
from rollout_helpers import bias_token, padded, prompts, sharp_model, single_thread, sprinkle_token  # noqa: F401

from dare.errors import ConfigError, InputError
from dare.rollout import SamplerConfig, generate

MASK, EOS, PAD = 259, 258, 256
F64 = torch.float64


def model_for(sampler: str, dtype=F64, **overrides):
    family = "dream" if "dream" in sampler else "llada"
    return sharp_model(family, seed=2, scale=30.0, dtype=dtype, **overrides)


# ------------------------------------------------------------------------------------------ batching

BATCH_CASES = [  # (sampler, overrides)
    ("llada", dict(temperature=0.0)),
    ("llada", dict(temperature=0.8, confidence="random")),
    ("dream", dict(temperature=0.7, top_k=5)),
    ("dream", dict(temperature=0.0, confidence="topk_margin", top_p=0.9)),
    ("fastdllm", dict(temperature=0.8, cache="prefix")),
    ("fastdllm", dict(temperature=0.0, cache="dual", decoder="factor", factor=2.0)),
    ("fastdllm_dream", dict(temperature=0.9, cache="dual", decoder="dynamic", threshold=0.5)),
]


def check_batch_invariance(model, config):
    sprinkle_token(model, EOS, rate=0.05)
    texts = prompts([5, 9, 3, 7], seed=4)
    ids = [7, 3, 11, 5]
    batch = generate(model, texts, config=config, example_ids=ids)
    for row, (text, example) in enumerate(zip(texts, ids)):
        alone = generate(model, [text], config=config, example_ids=[example])
        assert torch.equal(batch.completion[row], alone.completion[0])
        assert torch.equal(batch.step_map[row], alone.step_map[0])
        assert torch.equal(batch.completion_mask[row], alone.completion_mask[0])
        assert batch.num_steps[row] == alone.num_steps[0]
        torch.testing.assert_close(batch.logprobs[row], alone.logprobs[0])
    assert batch.nfe >= int(batch.num_steps.max())


@pytest.mark.parametrize("sampler,overrides", BATCH_CASES)
def test_batched_equals_per_example(sampler, overrides):
    """Left padding, mixed lengths, per-example seeds, rows stopping at different times: every row of the
    batch is decoded exactly as it would be alone."""
    config = SamplerConfig(sampler=sampler, gen_length=16, block_length=8, steps=16, **overrides)
    check_batch_invariance(model_for(sampler), config)


def test_llada_moe_batched_equals_per_example():
    model = sharp_model("llada_moe", seed=2, scale=30.0, dtype=F64)
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8, temperature=0.9)
    check_batch_invariance(model, config)


def test_seed_and_example_id_drive_sampling():
    model = model_for("llada")
    texts = prompts([6, 6], seed=1)
    config = SamplerConfig(gen_length=16, block_length=16, steps=16, temperature=1.0, eos_early_stop=False)
    a = generate(model, texts, config=config)
    assert torch.equal(a.completion, generate(model, texts, config=config).completion)  # reproducible
    assert not torch.equal(a.completion, generate(model, texts, config=config.replace(seed=1)).completion)
    swapped = generate(model, texts, config=config, example_ids=[1, 0])
    assert not torch.equal(a.completion[0], swapped.completion[0])


def test_list_prompts_equal_padded_tensor():
    model = model_for("llada")
    texts = prompts([4, 8], seed=2)
    ids, mask = padded([4, 8], seed=2)
    a = generate(model, texts, gen_length=8, block_length=8, steps=8)
    b = generate(model, ids, mask, gen_length=8, block_length=8, steps=8)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.attention_mask, b.attention_mask)
    assert a.prompt_length == 8 and a.attention_mask[0, :4].sum() == 0


# ------------------------------------------------------------------------------------------ caches


def same_rollout(a, b) -> bool:
    return torch.equal(a.completion, b.completion) and torch.equal(a.step_map, b.step_map) and a.nfe == b.nfe


@pytest.mark.parametrize("sampler", ["fastdllm", "fastdllm_dream"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_exact_cases(sampler, cache):
    """Cached decoding equals full recomputation whenever the cached keys/values are those a full forward
    would compute:
    * a one-layer model: first-layer keys/values depend only on (token, position), and cached positions do
      not change while they are cached (prefix: finished blocks; dual: the masked suffix);
    * ``refresh_every=1``: every forward recomputes the whole canvas;
    * one step per block (quota decoding with ``steps = num_blocks``): the block-start refresh is the only
      forward of each block.
    Checked at T > 0 with the Dream shift (window from ``start - 1``) and left padding."""
    ids, mask = padded([6, 9, 4], seed=3)
    base = dict(sampler=sampler, gen_length=24, block_length=8, temperature=0.8, eos_early_stop=False)
    layer_key = "num_hidden_layers" if "dream" in sampler else "n_layers"
    one_layer = model_for(sampler, **{layer_key: 1})
    two_layer = model_for(sampler)
    for decoder, steps in (("quota", 24), ("threshold", 24)):
        cfg = SamplerConfig(decoder=decoder, steps=steps, threshold=0.6, **base)
        assert same_rollout(generate(one_layer, ids, mask, cfg.replace(cache=cache)),
                            generate(one_layer, ids, mask, cfg.replace(cache="none")))
        assert same_rollout(generate(two_layer, ids, mask, cfg.replace(cache=cache, refresh_every=1)),
                            generate(two_layer, ids, mask, cfg.replace(cache="none")))
    cfg = SamplerConfig(decoder="quota", steps=3, **base)
    assert same_rollout(generate(two_layer, ids, mask, cfg.replace(cache=cache)),
                        generate(two_layer, ids, mask, cfg.replace(cache="none")))


@pytest.mark.parametrize("layers,exact", [(1, True), (2, False)])
def test_prompt_only_prefix_cache_is_exact_only_for_one_layer(layers, exact):
    """Why ``block_length == gen_length`` with a prefix cache (only the prompt cached, the prompt never
    changes) is *not* exact: with bidirectional attention the prompt's keys/values from layer 2 on depend on
    the generated positions, which change as tokens are committed. Layer-1 keys/values depend only on
    (token, position), so a one-layer model is exact."""
    from dare.models import KVCache

    model = sharp_model("llada", seed=2, scale=30.0, dtype=F64, n_layers=layers)
    prompt = torch.tensor([prompts([6], seed=9)[0]])
    state0 = torch.cat([prompt, torch.full((1, 10), MASK)], dim=1)
    state1 = state0.clone()
    state1[0, 6:9] = torch.tensor([65, 66, 67])  # three tokens committed since the cache was filled
    pos = torch.arange(16)[None]
    with torch.no_grad():
        cache = KVCache(mode="append")
        model(state0, cache=cache, position_ids=pos)
        cache.truncate(6).set_mode("read")
        cached = model(state1[:, 6:], cache=cache, position_ids=pos[:, 6:]).logits
        fresh = model(state1).logits[:, 6:]
    diff = (cached - fresh).abs().max().item()
    assert (diff < 1e-10) if exact else (diff > 1e-4), diff


@pytest.mark.parametrize("sampler,bound", [("fastdllm", 0.85), ("fastdllm_dream", 0.5)])
def test_cache_agreement_is_documented(sampler, bound):
    """Elsewhere caches are approximate (Fast-dLLM). On 2-layer fp32 tiny models with greedy decoding the
    measured token agreement with ``cache=none`` is ~0.96 (LLaDA) and ~0.70-0.82 (Dream) for both caches:
    random weights give near-ties that small key/value staleness flips, so real models agree more. The
    bound is generous; the step count is unchanged for quota decoding."""
    model = model_for(sampler, dtype=torch.float32)
    ids, mask = padded([6, 9, 4, 8, 5, 7], seed=3)
    cfg = SamplerConfig(sampler=sampler, gen_length=32, block_length=8, steps=32, decoder="quota",
                        eos_early_stop=False)
    full = generate(model, ids, mask, cfg.replace(cache="none"))
    for cache in ("prefix", "dual"):
        out = generate(model, ids, mask, cfg.replace(cache=cache))
        agreement = (out.completion == full.completion).float().mean().item()
        assert agreement >= bound, (cache, agreement)
        assert out.nfe == full.nfe == 32


# ------------------------------------------------------------------------------------------ invariants


def test_step_map_logprobs_and_trajectory():
    """LLaDA, T > 0, 2 blocks of 8, 4 steps per block: every position is committed exactly once, 2 per
    step, in its block's steps; the trajectory replays the rollout; the log-probs are those of the model's
    tempered distribution at the recorded states."""
    model = model_for("llada")
    ids, mask = padded([5, 8], seed=6)
    T = 0.7
    out = generate(model, ids, mask, SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=T,
                                                   record_trajectory=True, eos_early_stop=False))
    assert out.nfe == 8 and out.num_steps.tolist() == [8, 8]
    assert (out.step_map >= 0).all() and out.completion_mask.all() or (out.completion == EOS).any()
    for row in out.step_map:
        assert torch.bincount(row, minlength=8).tolist() == [2] * 8  # schedule: 8 masks / 4 steps per block
        assert row[:8].max() < 4 <= row[8:].min()  # block 0 in steps 0-3, block 1 in steps 4-7
    traj = out.trajectory
    assert traj.states.shape == (2, 8, 16) and traj.step_mask.all()
    assert (traj.states[:, 0] == MASK).all()
    steps = torch.arange(8)[None, :, None]
    assert torch.equal(traj.transfers, out.step_map[:, None, :] == steps)
    assert (traj.transfers.sum(1) == 1).all()  # the committed sets partition the completion
    for s in range(7):
        replay = torch.where(traj.transfers[:, s], traj.predictions[:, s], traj.states[:, s])
        assert torch.equal(replay, traj.states[:, s + 1])
    final = torch.where(traj.transfers[:, 7], traj.predictions[:, 7], traj.states[:, 7])
    assert torch.equal(final, out.completion)
    with torch.no_grad():  # log-probs recomputed from the recorded states
        for s in range(8):
            canvas = torch.cat([ids, traj.states[:, s]], dim=1)
            logits = model(canvas, attention_mask=out.attention_mask).logits[:, ids.shape[1]:]
            conf = torch.softmax(logits, -1).gather(-1, traj.predictions[:, s, :, None])[..., 0]
            cand = traj.candidates[:, s]
            torch.testing.assert_close(traj.confidences[:, s][cand], conf[cand].float())
            logits[..., MASK] = float("-inf")  # the mask token is never proposed
            logp = torch.log_softmax(logits.float() / T, -1).gather(-1, out.completion[..., None])[..., 0]
            sel = traj.transfers[:, s]
            torch.testing.assert_close(out.logprobs[sel], logp[sel])
            torch.testing.assert_close(traj.logprobs[:, s][sel], logp[sel])
    td = out.to_tensordict()
    assert td.batch_size == torch.Size([2]) and td["trajectory", "states"].shape == (2, 8, 16)


@pytest.mark.parametrize("decoder", ["threshold", "factor", "dynamic"])
def test_parallel_decoders_commit_at_least_one_token_per_step(decoder):
    model = model_for("fastdllm")
    ids, mask = padded([5, 8, 6], seed=7)
    out = generate(model, ids, mask, SamplerConfig(sampler="fastdllm", decoder=decoder, threshold=0.5, factor=1.5,
                                                   gen_length=32, block_length=8, steps=16, cache="none",
                                                   temperature=0.5, eos_early_stop=False, record_trajectory=True))
    per_step = out.trajectory.transfers.sum(-1)  # [B, S]
    assert (per_step[out.trajectory.step_mask] >= 1).all()
    assert (per_step[~out.trajectory.step_mask] == 0).all()
    assert out.num_steps.tolist() == [len(row.unique()) for row in out.step_map]
    assert out.nfe == int(out.num_steps.max()) and out.nfe < 32  # several tokens in some steps
    if decoder == "dynamic":  # at least the scheduled 2 tokens per step (8 masks per block / 4 steps)
        assert (per_step[out.trajectory.step_mask] >= 2).all()


def test_early_stop_keeps_completions_and_saves_forwards():
    model = model_for("llada")
    sprinkle_token(model, EOS, rate=0.05)
    ids, mask = padded([5, 9, 3, 7], seed=4)
    cfg = SamplerConfig(gen_length=32, block_length=8, steps=32, temperature=0.0)
    early = generate(model, ids, mask, cfg)
    full = generate(model, ids, mask, cfg.replace(eos_early_stop=False))
    assert torch.equal(early.completion_mask, full.completion_mask)
    keep = early.completion_mask
    assert torch.equal(early.completion[keep], full.completion[keep])
    assert torch.equal(early.step_map[keep], full.step_map[keep])
    undecoded = early.step_map < 0
    assert undecoded.any() and early.nfe < full.nfe
    assert (early.completion[undecoded] == PAD).all() and (early.logprobs[undecoded] == 0).all()
    for row in range(4):  # the mask covers exactly up to the first stop token
        stops = (early.completion[row] == EOS).nonzero()
        end = int(stops[0]) + 1 if len(stops) else 32
        assert early.completion_mask[row].tolist() == [True] * end + [False] * (32 - end)


def test_mask_token_is_never_proposed_and_eos_can_be_suppressed():
    model = model_for("fastdllm")
    bias_token(model, MASK, 100.0)  # the model "wants" to output the mask token everywhere
    sprinkle_token(model, EOS, rate=0.2)
    ids, mask = padded([5, 6], seed=8)
    for decoder in ("threshold", "quota"):
        out = generate(model, ids, mask, sampler="fastdllm", decoder=decoder, gen_length=16, block_length=8,
                       steps=16, suppress_eos=True, eos_early_stop=False)
        assert not (out.completion == MASK).any() and not (out.completion == EOS).any()
        assert (out.step_map >= 0).all()


# ------------------------------------------------------------------------------------------ errors


def test_a_filter_that_greedy_logits_decoding_never_reads_is_warned(caplog, monkeypatch):
    """top_p / top_k at temperature 0 change nothing where tokens and confidences come from the raw logits (llada:
    the same tokens, one warning each); Dream's confidences come from the filtered distribution: no warning there."""
    import dare.rollout.config as config_module

    monkeypatch.setattr(config_module, "_WARNED", set())
    model = model_for("llada")
    ids, mask = padded([4, 6], seed=1)
    base = dict(sampler="llada", gen_length=8, block_length=8, steps=8)
    with caplog.at_level("WARNING", logger="dare.rollout"):
        plain = generate(model, ids, mask, SamplerConfig(**base))
        filtered = generate(model, ids, mask, SamplerConfig(**base, top_p=0.5, top_k=3))
        assert torch.equal(filtered.completion, plain.completion)
        SamplerConfig(**base, top_p=0.5, temperature=1.0).resolved()  # read when sampling
        SamplerConfig(sampler="dream", top_p=0.5).resolved()  # read by Dream's confidence at temperature 0
    warnings = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert warnings == [f"warning: ignoring {key}: at temperature 0 sampler 'llada' takes the argmax of the raw "
                        f"logits, which {key.split('=')[0]} does not change; set a temperature > 0 to sample with it"
                        for key in ("top_p=0.5", "top_k=3")]


def test_a_setting_the_decoder_does_not_read_is_warned_once_and_not_applied(caplog, monkeypatch):
    """``threshold`` with the quota decoder (or ``factor`` / the factor quirk with another rule) decodes exactly as
    without it, says so once per process, and the resolved config records it as unset; a preset's value for a
    rule the user replaced is dropped silently (the user never gave it)."""
    import dare.rollout.config as config_module

    monkeypatch.setattr(config_module, "_WARNED", set())
    model = model_for("llada")
    ids, mask = padded([4, 6], seed=1)
    base = dict(sampler="llada", decoder="quota", gen_length=16, block_length=8, steps=16)
    with caplog.at_level("WARNING", logger="dare.rollout"):
        plain = generate(model, ids, mask, SamplerConfig(**base))
        for _ in range(2):
            ignored = generate(model, ids, mask, SamplerConfig(**base, threshold=0.35))
            assert torch.equal(ignored.completion, plain.completion)
    warnings = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert warnings == ["warning: ignoring threshold=0.35: only the 'threshold' and 'dynamic' decoders read it, "
                        "this rollout uses decoder 'quota'"]
    assert SamplerConfig(**base, threshold=0.35).resolved().threshold is None
    caplog.clear()
    with caplog.at_level("WARNING", logger="dare.rollout"):
        resolved = SamplerConfig(sampler="fastdllm", factor=1.5, factor_last_rank_quirk=True).resolved()
        assert (resolved.decoder, resolved.factor, resolved.threshold) == ("factor", 1.5, None)  # factor picks it
        quirk = SamplerConfig(sampler="fastdllm", factor_last_rank_quirk=True).resolved()
        assert (quirk.decoder, quirk.threshold, quirk.factor_last_rank_quirk) == ("threshold", 0.9, False)
        sdar = SamplerConfig(sampler="sdar", decoder="quota").resolved()  # the preset's threshold 0.9 is dropped
        assert sdar.threshold is None and sdar.resolved() == sdar
    assert [r.getMessage() for r in caplog.records] == [
        "warning: ignoring factor_last_rank_quirk=True: only the 'factor' decoder reads it, this rollout uses "
        "decoder 'threshold'"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="dare.rollout"):  # confidence-committing rules never read a schedule
        for config in (SamplerConfig(sampler="fastdllm", gen_length=16, steps=4),
                       SamplerConfig(sampler="llada", decoder="factor", schedule="timestep"),
                       SamplerConfig(sampler="fastdllm", gen_length=16, steps=16, schedule="linear")):  # the defaults
            config.resolved().resolved()
    assert [r.getMessage() for r in caplog.records] == [
        "warning: ignoring steps=4: only the 'quota', 'dynamic' and 'sequential' decoders read it, this rollout uses "
        "decoder 'threshold'",
        "warning: ignoring schedule=timestep: only the 'quota', 'dynamic' and 'sequential' decoders read it, this "
        "rollout uses decoder 'factor'"]


def test_decoding_past_the_models_context_length_is_warned_once(caplog, monkeypatch):
    import dare.rollout.config as config_module

    monkeypatch.setattr(config_module, "_WARNED", set())
    model = sharp_model("llada", seed=2, scale=30.0, dtype=F64, max_sequence_length=16)
    ids, mask = padded([4, 6], seed=1)
    with caplog.at_level("WARNING", logger="dare.rollout"):
        generate(model, ids, mask, SamplerConfig(gen_length=8, block_length=8, steps=8))  # 6 + 8 fit in 16
        assert not caplog.records
        for _ in range(2):
            generate(model, ids, mask, SamplerConfig(gen_length=16, block_length=8, steps=16))
    assert [r.getMessage() for r in caplog.records] == [
        "warning: prompt (6 tokens) + gen_length (16) = 22 positions, beyond the model's configured context length "
        "16: quality past it is untested"]


def test_a_model_in_train_mode_decodes_as_in_eval_mode_and_stays_in_train_mode():
    """LoRA dropout (which peft allows) used to reach direct generate calls: other tokens at every call."""
    from dare.models.lora import apply_lora

    policy = apply_lora(model_for("llada"), r=4, alpha=8, dropout=0.5)
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5, generator=torch.Generator().manual_seed(0))
    ids, mask = padded([4, 6], seed=1)
    config = SamplerConfig(gen_length=8, block_length=8, steps=8)
    policy.eval()
    reference = generate(policy, ids, mask, config).completion
    policy.train()
    for _ in range(2):
        assert torch.equal(generate(policy, ids, mask, config).completion, reference)
    assert policy.training and all(m.training for m in policy.modules())


def test_prompt_dtypes_and_unmasked_padding(caplog, monkeypatch):
    import dare.rollout.config as config_module

    monkeypatch.setattr(config_module, "_WARNED", set())
    model = model_for("llada")
    ids, mask = padded([4, 6], seed=1)
    config = SamplerConfig(gen_length=8, block_length=8, steps=8)
    reference = generate(model, ids, mask, config).completion
    assert torch.equal(generate(model, ids.int(), mask, config).completion, reference)  # int32, e.g. from numpy
    with pytest.raises(InputError, match=r"^prompts must hold integer token ids; got a torch.float32 tensor$"):
        generate(model, ids.float(), mask, config)
    with caplog.at_level("WARNING", logger="dare.rollout"):
        generate(model, ids[1:], None, config)  # the longest row: no padding, no warning
        assert not caplog.records
        for _ in range(2):
            generate(model, ids, None, config)  # row 0 starts with two pad ids
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: prompt rows start with the pad id {PAD} but no attention_mask was given: the padding is attended "
        "as text; pass the tokenizer's attention_mask (or a list of id lists, padded for you)"]


def test_config_and_input_errors():
    model = model_for("llada", dtype=torch.float32)
    ids, mask = padded([4, 6], seed=1)
    with pytest.raises(ConfigError, match="unknown sampler 'lada' \\(did you mean 'llada'\\?\\)"):
        generate(model, ids, mask, sampler="lada")
    with pytest.raises(ConfigError, match="block_length \\(5\\) must divide gen_length \\(16\\)"):
        generate(model, ids, mask, gen_length=16, block_length=5)
    with pytest.raises(ConfigError, match="unless given, block_length is the llada preset's: set it to a divisor of "
                                          "40 \\(e.g. 8\\), or gen_length to a multiple of 32$"):
        generate(model, ids, mask, gen_length=40)  # the preset's 32
    with pytest.raises(ConfigError, match="steps \\(7\\) must be a multiple of the number of blocks"):
        generate(model, ids, mask, gen_length=16, block_length=8, steps=7)
    with pytest.raises(ConfigError, match="unknown sampler option 'temprature' \\(did you mean 'temperature'\\?\\)"):
        SamplerConfig.from_dict({"temprature": 1.0})
    with pytest.raises(ConfigError, match="unknown cache 'duall'"):
        generate(model, ids, mask, cache="duall")
    with pytest.raises(ConfigError, match="top_p must be in"):
        generate(model, ids, mask, top_p=1.5)
    bad = ids.clone()
    bad[1, -1] = MASK
    with pytest.raises(InputError, match="prompts contain the mask token"):
        generate(model, bad, mask)
    with pytest.raises(InputError, match="left-padded"):
        generate(model, ids, mask.flip(-1))
    with pytest.raises(InputError, match="example_ids has 1 entries for 2 prompts"):
        generate(model, ids, mask, example_ids=[0])
    # a preset block longer than the generation becomes one block
    assert generate(model, ids, mask, gen_length=16, eos_early_stop=False).nfe == 16
    # steps need not divide for threshold decoding (it runs until each block is filled)
    assert generate(model, ids, mask, gen_length=16, block_length=8, steps=7, decoder="threshold").nfe >= 2


def test_a_model_whose_weights_were_never_loaded_is_a_one_line_error():
    """Before: 'Tensor.item() cannot be called on meta tensors' from inside the first forward."""
    from dare.models.tiny import tiny_model

    model = tiny_model("llada").to("meta")
    with pytest.raises(InputError, match="the model's weights are on the meta device \\(never loaded\\)"):
        generate(model, [[5, 6, 7]], gen_length=8, block_length=8, steps=8)


# ------------------------------------------------------------------------------------------ registry

def test_a_sampler_registered_with_few_defaults_takes_the_rest_from_its_loops_base(monkeypatch):
    """The README's minimal registration: defaults it leaves out are ``llada``'s (masked-diffusion loop) or
    ``sdar``'s (block loop), so it decodes as that preset with the given fields."""
    from dare.rollout import SAMPLERS, Sampler, block, register_sampler
    from dare.rollout.engine.block import BlockState

    for name in ("few", "few_block"):
        monkeypatch.setitem(SAMPLERS, name, None)
    register_sampler(Sampler("few", "llada with blocks of 4", {"decoder": "quota", "block_length": 4}))
    model = model_for("llada")
    ids, mask = padded([5, 3])
    mine = generate(model, ids, mask, SamplerConfig(sampler="few", gen_length=8))
    builtin = generate(model, ids, mask, SamplerConfig(sampler="llada", gen_length=8, block_length=4))
    assert torch.equal(mine.completion, builtin.completion) and mine.nfe == builtin.nfe
    register_sampler(Sampler("few_block", "sdar with threshold 0.5", {"threshold": 0.5}, run=block.denoise_blocks,
                             finalize=block.finalize_config, check=block.check_config, static_state=BlockState,
                             attention="block_causal"))
    model = sharp_model("sdar", seed=2, scale=30.0, dtype=F64)
    mine = generate(model, ids, mask, SamplerConfig(sampler="few_block", gen_length=8))
    builtin = generate(model, ids, mask, SamplerConfig(sampler="sdar", gen_length=8, threshold=0.5))
    assert torch.equal(mine.completion, builtin.completion)


def test_a_sampler_with_its_own_run_decodes_it_never_the_builtin_loop_on_a_static_engine(monkeypatch):
    """Before: a missing static_state was filled with the masked-diffusion twin, so engine static (and auto on CUDA,
    where it is graph) silently decoded the stock LLaDA loop in place of the sampler's own run."""
    from dare.rollout import SAMPLERS, Sampler, block, mdlm, register_sampler
    from dare.rollout.engine.block import BlockState
    from dare.rollout.samplers import decoding_engine

    calls = []

    def my_run(model, input_ids, attention_mask, config, **kwargs):
        calls.append(config.engine)
        return mdlm.denoise_mdlm(model, input_ids, attention_mask, config, **kwargs)

    for name in ("own_run", "block_loop"):
        monkeypatch.setitem(SAMPLERS, name, None)
    mine = register_sampler(Sampler("own_run", "llada through a run of its own", {"block_length": 4}, run=my_run))
    assert mine.static_state is None
    assert register_sampler(Sampler("block_loop", "sdar's loop", run=block.denoise_blocks,
                                    attention="block_causal")).static_state is BlockState  # the loop's own twin
    model = model_for("llada")
    ids, mask = padded([5, 3])
    config = SamplerConfig(sampler="own_run", gen_length=8, steps=8)
    out = generate(model, ids, mask, config)  # auto: eager on the CPU
    builtin = generate(model, ids, mask, config.replace(sampler="llada", block_length=4))
    assert calls == ["auto"] and torch.equal(out.completion, builtin.completion)
    with pytest.raises(ConfigError) as err:
        generate(model, ids, mask, config.replace(engine="static"))
    assert str(err.value) == ("sampler 'own_run' decodes with its own run and has no static_state (the fixed-shape "
                              "twin the static engine steps): set engine 'eager' or 'auto'")
    assert calls == ["auto"]
    assert decoding_engine(config, torch.device("cuda")) == "eager"  # auto is graph on CUDA, but not for this one
    with pytest.raises(ConfigError, match="^weights 'fp8' decodes on the static engines, and sampler 'own_run' has no "):
        decoding_engine(config.replace(weights="fp8"), torch.device("cpu"))


def test_a_misspelt_or_mistyped_default_is_refused_when_the_sampler_registers():
    """Before: the file imported fine and choosing the sampler failed with a TypeError in SamplerConfig."""
    from dare.rollout import SAMPLERS, Sampler, register_sampler

    with pytest.raises(ValueError, match=r"^sampler 'badblk': its defaults: unknown sampler option 'block_lenght' "
                                         r"\(did you mean 'block_length'\?\)$"):
        register_sampler(Sampler("badblk", "bad", {"block_lenght": 4}))
    with pytest.raises(ValueError, match="^sampler 'badblk': its defaults: steps must be a whole number; got 4.0$"):
        register_sampler(Sampler("badblk", "bad", {"steps": 4.0}))
    assert "badblk" not in SAMPLERS


def test_a_registered_preset_runs_the_masked_diffusion_loop_by_default(monkeypatch):
    """A new sampler is one ``register_sampler`` call: hooks it leaves out are the masked-diffusion loop's, and it
    decodes as the built-in it copies does, on the eager and the static engine."""
    from dare.rollout import SAMPLERS, Sampler, get_sampler, mdlm, register_sampler
    from dare.rollout.engine.mdlm import MdlmState

    monkeypatch.setitem(SAMPLERS, "my_llada", None)  # restored (removed) after the test
    registered = register_sampler(Sampler("my_llada", "LLaDA's preset under another name",
                                          dict(get_sampler("llada").defaults)))
    assert get_sampler("my_llada") is registered
    assert (registered.run, registered.finalize, registered.check, registered.static_state) == (
        mdlm.denoise_mdlm, mdlm.finalize_config, mdlm.check_config, MdlmState)
    model = model_for("llada")
    ids, mask = padded([5, 3])
    for engine in ("eager", "static"):
        config = SamplerConfig(gen_length=8, block_length=4, steps=8, engine=engine)
        mine = generate(model, ids, mask, config, sampler="my_llada")
        builtin = generate(model, ids, mask, config, sampler="llada")
        assert torch.equal(mine.completion, builtin.completion)
        assert torch.equal(mine.step_map, builtin.step_map)
