"""The static rollout engine (``engine="static"``, what CUDA graphs record) against the eager samplers.

Greedy decoding: tokens, log-probs, step maps (block step maps, confidences, trajectories) and forward counts equal
the eager loops for every sampler, cache and decoder, with padded batches and early EOS stops. Sampling (T > 0):
the engine's counter-based streams are batch-invariant, honour temperature/top-k, and draw from softmax.
"""

import logging

import pytest
import torch

from dare.errors import ConfigError
from dare.models.spec import family_of
from dare.rollout import SamplerConfig, generate
from dare.rollout.engine import BATCH_BUCKETS, bucket, engine_stats, resolve_engine
from dare.rollout.engine.noise import gumbel_argmax, position_hash, row_keys, uniform, vocabulary_salts
from rollout_helpers import padded, sharp_model, single_thread, sprinkle_token, unmix32  # noqa: F401

MDLM_CASES = [
    ("llada", dict(cache="none", decoder="quota")),
    ("llada", dict(cache="none", decoder="quota", steps=16)),
    ("fastdllm", dict(cache="prefix", decoder="threshold", threshold=0.3)),
    ("fastdllm", dict(cache="dual", decoder="threshold", threshold=0.3)),
    ("fastdllm", dict(cache="dual", decoder="factor")),
    ("fastdllm", dict(cache="prefix", decoder="quota", refresh_every=3)),
    ("fastdllm", dict(cache="dual", decoder="dynamic", steps=16)),
    ("fastdllm", dict(cache="none", decoder="entropy_bounded")),
    ("llada", dict(cache="dual", decoder="sequential", steps=16, confidence="margin")),
]
DREAM_CASES = [
    ("dream", dict(cache="none")),
    ("dream", dict(cache="none", confidence="margin", top_k=20)),
    ("fastdllm_dream", dict(cache="dual", decoder="threshold", threshold=0.3)),
    ("fastdllm_dream", dict(cache="prefix", decoder="threshold", top_p=0.9)),
]
BLOCK_CASES = [
    ("sdar", "sdar", dict(cache="block")),
    ("sdar", "sdar", dict(cache="none", decoder="quota", block_steps=2)),
    ("sdar", "sdar", dict(cache="block", decoder="entropy_bounded")),
    ("sdar", "sdar", dict(cache="block", decoder="sequential")),
    ("llada2", "llada2", dict(cache="block")),
    ("llada2", "llada21", dict(cache="block")),
    ("llada2", "llada21", dict(cache="none")),
    ("llada2", "llada21_speed", dict(cache="block")),
]


def assert_same(eager, static, block: bool = False):
    assert torch.equal(eager.completion, static.completion)
    assert torch.equal(eager.step_map, static.step_map)
    assert torch.equal(eager.num_steps, static.num_steps)
    assert torch.equal(eager.completion_mask, static.completion_mask)
    assert torch.equal(eager.sequences, static.sequences)
    assert torch.equal(eager.attention_mask, static.attention_mask)
    assert eager.nfe == static.nfe
    torch.testing.assert_close(eager.logprobs, static.logprobs, atol=2e-5, rtol=0)
    if block:
        assert torch.equal(eager.block_step_map, static.block_step_map)
    assert torch.equal(static.confidence_map != 0, static.step_map >= 0) or bool((static.step_map < 0).any())


def assert_same_trajectory(eager, static):
    for name, value in eager.trajectory.to_dict().items():
        other = getattr(static.trajectory, name)
        if value.dtype.is_floating_point:
            torch.testing.assert_close(value, other, atol=2e-5, rtol=0, msg=name)
        else:
            assert torch.equal(value, other), name


def decode_both(model, ids, mask, config, **resume):
    return (generate(model, ids, mask, config, engine="eager", **resume),
            generate(model, ids, mask, config, engine="static", **resume))


@pytest.mark.parametrize("sampler,overrides", MDLM_CASES + DREAM_CASES)
def test_masked_diffusion_static_equals_eager(sampler, overrides):
    family = "dream" if "dream" in sampler else "llada"
    model = sharp_model(family)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler=sampler, gen_length=32, block_length=8 if "dream" not in sampler or
                           overrides.get("cache") != "none" else None, **overrides)
    eager, static = decode_both(model, ids, mask, config)
    assert_same(eager, static)
    if "threshold" in overrides:  # the parallel decoder committed several tokens in some step
        assert eager.nfe < 32


@pytest.mark.parametrize("family,sampler,overrides", BLOCK_CASES)
def test_block_diffusion_static_equals_eager(family, sampler, overrides):
    model = sharp_model(family)
    ids, mask = padded([11, 4, 17])
    config = SamplerConfig(sampler=sampler, gen_length=20, block_length=8, **overrides)
    eager, static = decode_both(model, ids, mask, config)
    assert_same(eager, static, block=True)


@pytest.mark.parametrize("family,sampler,overrides,dtype,shift", [
    ("sdar", "sdar", dict(cache="block"), torch.float32, 30.0),
    ("llada", "llada", dict(cache="none", decoder="quota"), torch.float32, 30.0),
    ("llada", "fastdllm", dict(cache="dual", decoder="quota"), torch.float32, 30.0),
    ("dream", "dream", dict(cache="none"), torch.float32, 30.0),
    ("llada", "llada", dict(cache="none", decoder="quota"), torch.bfloat16, 0.0),
    ("dream", "dream", dict(cache="none"), torch.bfloat16, 0.0),
])
def test_confident_models_static_equals_eager(family, sampler, overrides, dtype, shift):
    """Confidences as the eager samplers compute them, for very confident float32 models (LM head x150, logits
    shifted by +30) whose confidences sit within a few float32 ulps of each other: ``exp(x - logsumexp)`` reordered
    them (LLaDA rows took other step maps). bf16 models: the eager softmax rounds confidences to bf16, where nearly
    equal ones tie and the leftmost commits first; float32 confidences ordered them otherwise."""
    model = sharp_model(family, scale=150.0 if dtype == torch.float32 else 50.0, dtype=dtype)
    hook = model.get_output_embeddings().register_forward_hook(lambda module, inputs, out: out + shift)
    ids, mask = padded([9, 14, 5, 11, 7, 12])
    block = dict(block_length=8) if family != "dream" else {}
    config = SamplerConfig(sampler=sampler, gen_length=24 if family == "sdar" else 32, **block, **overrides)
    eager, static = decode_both(model, ids, mask, config)
    hook.remove()
    assert torch.equal(eager.step_map, static.step_map)
    assert torch.equal(eager.completion, static.completion)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_tokens_of_a_sampling_source_are_the_first_most_probable_in_the_softmax_dtype(dtype):
    """At ``T = 0`` with ``confidence_source="sampling"`` the eager samplers (Dream's reference) take the argmax of
    the softmax in the model's dtype: bf16 rounds the probabilities of nearly equal logits to one value and the
    first index wins. The static step does the same (it took the larger logit, at the higher index)."""
    from dare.rollout.engine.sampling import _propose_ops, confidence_rounding
    from dare.rollout.kernels import propose

    gen = torch.Generator().manual_seed(0)
    rows, vocab = 4000, 64
    logits = (torch.randn(rows, 1, vocab, generator=gen) * 0.3).to(dtype)
    low = logits.float().amax(-1, keepdim=True).to(dtype)
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    step = torch.where(low > 0, 1, -1).to(bits)
    logits[..., 10:11] = low
    logits[..., 20:21] = (low.view(bits) + step).view(dtype)  # the next representable value above
    eligible = torch.ones(rows, 1, dtype=torch.bool)
    eager = propose(logits, eligible, temperature=0.0, confidence="prob", confidence_source="sampling",
                    banned=(vocab - 1,), confidence_dtype="model")
    tokens, score, _ = _propose_ops(
        logits, eligible, row_keys([0] * rows, "cpu"), torch.zeros(rows, dtype=torch.long),
        torch.zeros(1, dtype=torch.long), None, banned=vocab - 1, temperature=0.0, top_p=None, top_k=None,
        top_k_first=False, confidence_source="sampling", confidence="prob",
        rounding=dtype)
    assert confidence_rounding("model", logits) == (None if dtype == torch.float16 else dtype)
    assert torch.equal(eager.tokens, tokens)
    assert torch.equal(eager.confidence.float(), score)
    if dtype == torch.bfloat16:
        assert (tokens == 10).float().mean() > 0.1  # the rounded tie is common at these logit sizes


def spy_attended_columns(monkeypatch) -> list[tuple[int, int]]:
    """Record ``(attended columns, cache width)`` of every static cache write: by each block into its own layer
    (the default) or by the cache (``DARE_FUSE_CACHE_WRITES=0``, and the probe that allocates the layers)."""
    from dare.models.cache import StaticLayerKV
    from dare.rollout.engine.forward import StaticKVCache

    seen, update, store = [], StaticKVCache.update, StaticLayerKV.store

    def by_the_cache(self, layer, key, value):
        keys, values = update(self, layer, key, value)
        seen.append((keys.shape[2], self.width))
        return keys, values

    def by_the_block(self, key, value):
        keys, values = store(self, key, value)
        seen.append((keys.shape[2], self.keys.shape[2]))
        return keys, values

    monkeypatch.setattr(StaticKVCache, "update", by_the_cache)
    monkeypatch.setattr(StaticLayerKV, "store", by_the_block)
    return seen


@pytest.mark.parametrize("family,sampler,overrides", [c for c in BLOCK_CASES if c[2].get("cache") == "block"])
def test_block_cache_steps_attend_over_their_bucket_of_columns_only(family, sampler, overrides, monkeypatch):
    """With buckets of one block, each step attends over the columns up to its block's end (fewer than the canvas
    for every block but the last) and decodes exactly what the eager loop does."""
    from dare.rollout.engine import block as block_engine

    monkeypatch.setattr(block_engine, "KV_BUCKET", 8)
    seen = spy_attended_columns(monkeypatch)
    model = sharp_model(family)
    ids, mask = padded([11, 4, 17])
    config = SamplerConfig(sampler=sampler, gen_length=20, block_length=8, **overrides)
    eager, static = decode_both(model, ids, mask, config)
    assert_same(eager, static, block=True)
    width = seen[0][1]
    lengths = sorted({length for length, _ in seen})  # one bucket per decoded block: consecutive block ends
    assert len(lengths) > 1 and lengths[0] < width and lengths[-1] <= width
    assert all(n % 8 == 0 for n in lengths) and all(b - a == 8 for a, b in zip(lengths, lengths[1:]))


def test_a_long_generation_records_at_most_the_bucket_limit(monkeypatch):
    from dare.rollout.engine import block as block_engine

    monkeypatch.setattr(block_engine, "KV_BUCKET", 4)
    attended = spy_attended_columns(monkeypatch)
    model = sharp_model("sdar")
    ids, mask = padded([11, 4, 17])
    config = SamplerConfig(sampler="sdar", cache="block", gen_length=96, block_length=4, eos_early_stop=False)
    eager, static = decode_both(model, ids, mask, config)
    assert_same(eager, static, block=True)
    seen = {length for length, _ in attended}
    assert 2 < len(seen) <= block_engine.MAX_KV_BUCKETS + 1  # 24 blocks, one bucket per ~3 of them


def test_static_decoding_builds_no_autograd_graph():
    """Like the eager loops, the static steps run without autograd even when the caller has gradients on (an
    autograd graph kept every layer's activations alive: 40 GB of graph memory at batch 16 on LLaDA-8B)."""
    model = sharp_model("llada")
    assert torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
    ids, mask = padded([9, 14])
    out = generate(model, ids, mask, SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8),
                   engine="static")
    assert not out.logprobs.requires_grad and not out.confidence_map.requires_grad


@pytest.mark.parametrize("family,sampler", [("llada", "fastdllm"), ("sdar", "sdar")])
def test_a_reused_static_state_follows_each_calls_max_blocks(family, sampler):
    """States are reused across calls whose settings differ only in host-loop fields: a one-block warm-up
    (``max_blocks=1``) must not cap the next call of the same shapes (it once decoded one block in RL)."""
    model = sharp_model(family)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler=sampler, gen_length=32, block_length=8)
    one = generate(model, ids, mask, config.replace(max_blocks=1), engine="static")
    full = generate(model, ids, mask, config, engine="static")
    eager = generate(model, ids, mask, config, engine="eager")
    assert int((one.step_map >= 0).sum(-1).max()) <= 8 < int((full.step_map >= 0).sum(-1).max())
    assert_same(eager, full, block=family != "llada")


@pytest.mark.parametrize("family,sampler", [("llada", "fastdllm"), ("sdar", "sdar"), ("llada2", "llada21")])
def test_early_eos_stop_static_equals_eager(family, sampler):
    model = sharp_model(family)
    eos = model.token_ids.eos
    handle = sprinkle_token(model, eos, rate=0.08)
    try:
        ids, mask = padded([6, 13, 9, 3], seed=3)
        config = SamplerConfig(sampler=sampler, gen_length=32, block_length=8, cache=None)
        eager, static = decode_both(model, ids, mask, config)
    finally:
        handle.remove()
    assert bool((eager.step_map < 0).any()), "the EOS hook should stop some row early"
    assert_same(eager, static, block=family != "llada")


@pytest.mark.parametrize("family,sampler,overrides", [("llada", "llada", {}), ("sdar", "sdar", {}),
                                                      ("sdar", "sdar", dict(decoder="quota", block_steps=3))])
def test_trajectory_static_equals_eager(family, sampler, overrides):
    model = sharp_model(family)
    ids, mask = padded([7, 12])
    config = SamplerConfig(sampler=sampler, gen_length=16, block_length=8, record_trajectory=True, **overrides)
    assert_same_trajectory(*decode_both(model, ids, mask, config))


def test_confidence_map_is_the_committed_probability():
    model = sharp_model("llada")
    ids, mask = padded([8, 8])
    out = generate(model, ids, mask, SamplerConfig(sampler="llada", gen_length=16, block_length=8), engine="static")
    decoded = out.step_map >= 0
    assert bool(decoded.all())
    # greedy, confidence 'prob' from the raw logits: the committed token's probability = exp(log-prob at T=1)
    torch.testing.assert_close(out.confidence_map, out.logprobs.exp(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family,sampler", [("llada", "fastdllm"), ("dream", "dream"), ("sdar", "sdar")])
def test_sampling_is_batch_invariant(family, sampler):
    model = sharp_model(family)  # (a flat model makes near-tied entropies whose ranking float noise can flip)
    ids, mask = padded([5, 11, 8])
    config = SamplerConfig(sampler=sampler, gen_length=16, block_length=8, temperature=1.0, top_p=0.95, seed=7)
    batched = generate(model, ids, mask, config, engine="static", example_ids=[10, 11, 12])
    for row in range(3):
        single = generate(model, ids[row:row + 1, mask[row].argmax():], None, config, engine="static",
                          example_ids=[10 + row])
        assert torch.equal(single.completion[0], batched.completion[row])
        torch.testing.assert_close(single.logprobs[0], batched.logprobs[row], atol=2e-5, rtol=0)
    other_seed = generate(model, ids, mask, config.replace(seed=8), engine="static", example_ids=[10, 11, 12])
    assert not torch.equal(other_seed.completion, batched.completion)


def test_temperature_and_top_k_are_honoured():
    model = sharp_model("llada", scale=5.0)
    ids, mask = padded([6, 9])
    base = SamplerConfig(sampler="llada", gen_length=16, block_length=8)
    greedy = generate(model, ids, mask, base, engine="static")
    top1 = generate(model, ids, mask, base.replace(temperature=1.5, top_k=1), engine="static")
    assert torch.equal(greedy.completion, top1.completion)  # top-k 1 leaves the argmax only
    hot = generate(model, ids, mask, base.replace(temperature=1.5), engine="static")
    assert not torch.equal(greedy.completion, hot.completion)
    assert bool((hot.logprobs[hot.step_map >= 0] < 0).all())


def test_gumbel_noise_samples_the_softmax():
    torch.manual_seed(0)
    scores = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    rows, positions = 64, 256
    keys = row_keys(list(range(rows)), "cpu")
    base = position_hash(keys, torch.zeros(rows, dtype=torch.long), torch.arange(positions), stream=1)
    draws = gumbel_argmax(scores.expand(rows, positions, 4), base).flatten()
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    expected = scores.exp()
    n = draws.numel()
    chi2 = float(((freq - expected) ** 2 / expected).sum() * n)
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom, p = 0.001
    # the counter advances the stream; another step gives other draws
    base2 = position_hash(keys, torch.ones(rows, dtype=torch.long), torch.arange(positions), stream=1)
    assert not torch.equal(base, base2)


@pytest.mark.parametrize("temperature", [1e-5, 1e-7, 1e-9])
def test_tiny_temperatures_break_exact_ties_by_the_noise(temperature):
    """Two exactly tied top logits at a tiny temperature are each drawn about half the time. Added to
    ``logit / T`` (~4e8 at T = 1e-7), float32 dropped the noise's low bits: the keys tied and the lower id won
    (every draw at T <= 1e-7, ~3/4 of them at 1e-5)."""
    rows, positions = 16, 128
    logits = torch.full((rows, positions, 8), 30.0)
    logits[..., 2] = logits[..., 5] = 40.0
    base = position_hash(row_keys(list(range(rows)), "cpu"), torch.zeros(rows, dtype=torch.long),
                         torch.arange(positions), stream=1)
    draws = gumbel_argmax(logits / temperature, base).flatten()
    assert set(draws.unique().tolist()) == {2, 5}
    share = float((draws == 2).float().mean())
    assert abs(share - 0.5) < 4 * 0.5 / draws.numel() ** 0.5, share  # 4 standard deviations


def test_a_noise_collision_between_two_positions_does_not_repeat_step_after_step():
    """Two positions whose hashes before the step counter differ by ``d`` (small) collide at steps ``(c, c ^ d)``.
    With the counter XORed in raw, that collision came back at every such pair of steps (256 of 256 here): the two
    positions drew the same noise for a whole generation. Mixed first, it is as rare as any other collision."""
    keys = row_keys([7], "cpu")
    positions = torch.arange(1 << 16)
    before = position_hash(keys, torch.zeros(1, dtype=torch.long), positions, stream=1)[0]
    inner = torch.tensor([unmix32(h) for h in before.tolist()])  # the hash each position has before the counter
    order = torch.argsort(inner >> 8)
    near = ((inner[order] >> 8)[1:] == (inner[order] >> 8)[:-1]).nonzero()[0, 0]
    p1, p2 = order[near], order[near + 1]
    d = int(inner[p1] ^ inner[p2])
    assert 0 < d < 256
    steps = torch.arange(256)
    first = position_hash(keys.expand(256, 2), steps, p1.view(1), stream=1)[:, 0]
    second = position_hash(keys.expand(256, 2), steps ^ d, p2.view(1), stream=1)[:, 0]
    assert int((first == second).sum()) <= 1


def test_the_largest_hash_draws_neither_a_removed_nor_an_improbable_token():
    """Uniforms stay strictly inside (0, 1) in float32, so every Gumbel noise is finite. (With 24 bits the largest
    hash rounded to u = 1.0: its noise was +inf, so that entry was drawn whatever its probability, and a removed
    entry's -inf score became NaN, which argmax picks: about 1 position in 110 at a 152k vocabulary.)"""
    u = uniform(torch.tensor([0, 2**32 - 1]))
    assert u.tolist() == [2.0**-24, 1 - 2.0**-24] and bool(((u > 0) & (u < 1)).all())
    vocab = 64
    salts = vocabulary_salts(vocab, "cpu")
    scores = torch.zeros(2, 1, vocab)
    scores[0, 0, 3] = float("-inf")  # removed (the mask id, or outside a top-p nucleus)
    scores[1, 0, 5] = -40.0          # probability ~e^-44
    base = torch.tensor([[unmix32(2**32 - 1) ^ int(salts[3])], [unmix32(2**32 - 1) ^ int(salts[5])]])
    draws = gumbel_argmax(scores, base, salts).flatten().tolist()
    assert draws[0] != 3 and draws[1] != 5, draws


def test_engine_errors_and_fallback(caplog):
    with pytest.raises(ConfigError, match="unknown engine 'graf' \\(did you mean 'graph'"):
        SamplerConfig(sampler="llada", engine="graf").resolved()
    with pytest.raises(ConfigError, match="needs CUDA"):
        resolve_engine("graph", torch.device("cpu"))
    assert resolve_engine("auto", torch.device("cpu")) == "eager"
    assert resolve_engine("auto", torch.device("cuda")) == "graph"
    assert bucket(3) == 4 and bucket(BATCH_BUCKETS[-1] + 1) is None
    model = sharp_model("llada")
    ids, mask = padded([4] * (BATCH_BUCKETS[-1] + 1))
    config = SamplerConfig(sampler="llada", gen_length=8, block_length=8, steps=2)
    before = engine_stats(model).fallbacks
    with caplog.at_level(logging.WARNING, logger="dare.rollout"):  # above the largest bucket: chunks, not eager
        out = generate(model, ids, mask, config, engine="static")
    assert "falls back to eager" not in caplog.text and engine_stats(model).fallbacks == before
    assert out.completion.shape == (BATCH_BUCKETS[-1] + 1, 8)


@pytest.mark.parametrize("family,overrides", [
    ("llada", dict(sampler="fastdllm", cache="dual", decoder="threshold", threshold=0.3, temperature=1.0)),
    ("sdar", dict(sampler="sdar", cache="block", temperature=1.0)),
])
def test_a_batch_above_the_largest_bucket_decodes_in_chunks_as_one_batch(family, overrides, monkeypatch):
    """Rows keep their own random streams (``example_ids``), so chunks of the largest bucket decode what one batch
    decodes: tokens, log-probs, step maps, trajectories; ``nfe`` is the largest chunk's; nothing falls back to
    eager."""
    from dare.rollout import engine

    model = sharp_model(family)
    ids, mask = padded([5, 9, 3, 7, 6, 4])
    config = SamplerConfig(gen_length=16, block_length=8, seed=3, record_trajectory=True, **overrides)
    whole = generate(model, ids, mask, config, engine="static")
    monkeypatch.setattr(engine, "BATCH_BUCKETS", (1, 2, 4))  # 6 rows: chunks of 4 and 2
    before = engine_stats(model).fallbacks
    chunked = generate(model, ids, mask, config, engine="static")
    assert engine_stats(model).fallbacks == before
    assert torch.equal(chunked.completion, whole.completion) and torch.equal(chunked.step_map, whole.step_map)
    assert torch.equal(chunked.sequences, whole.sequences)
    assert torch.equal(chunked.attention_mask, whole.attention_mask)
    torch.testing.assert_close(chunked.logprobs, whole.logprobs, atol=1e-6, rtol=0)
    first = generate(model, ids[:4], mask[:4], config, engine="static")
    second = generate(model, ids[4:], mask[4:], config, engine="static", example_ids=[4, 5])
    assert chunked.nfe == max(first.nfe, second.nfe)
    # trajectories padded to the longest chunk's steps as one recording pads its rows
    if first.trajectory.step_mask.shape[1] != second.trajectory.step_mask.shape[1]:
        assert chunked.trajectory.step_mask.shape == whole.trajectory.step_mask.shape
    for name, value in chunked.trajectory.to_dict().items():
        assert torch.equal(value, getattr(whole.trajectory, name)), name


RESUME_CASES = [
    ("llada", dict(cache="none", decoder="quota", steps=12)),
    ("fastdllm", dict(cache="dual", decoder="quota", steps=12)),
    ("fastdllm", dict(cache="prefix", decoder="threshold", threshold=0.3)),
    ("fastdllm", dict(cache="dual", decoder="dynamic", steps=12)),
    ("fastdllm", dict(cache="none", decoder="quota", steps=12, eos_early_stop=True)),
    ("dream", dict(cache="none", steps=12)),
]


@pytest.mark.parametrize("sampler,overrides", RESUME_CASES)
def test_resumed_and_inpainted_decoding_static_equals_eager(sampler, overrides):
    """canvas / step_range (IGPO's hints, d-TreeRPO's branches) through the static engine: the same tokens, step
    maps, log-probs, given masks and forward counts as the eager loop - a stop inside a block, a start inside a
    block (its remaining masks re-planned over its remaining steps), given tokens, padded prompts."""
    family = "dream" if "dream" in sampler else "llada"
    model = sharp_model(family)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler=sampler, gen_length=24, block_length=None if sampler == "dream" else 8,
                           **{"eos_early_stop": False, **overrides})
    tok = family_of(model).token_ids(model.config)
    head = decode_both(model, ids, mask, config, step_range=(0, 5))  # stops inside the second block
    assert_same(*head)
    assert int(head[1].num_steps.max()) <= 5
    state = head[0].state(tok.mask)
    tail = decode_both(model, ids, mask, config, canvas=state, step_range=(5, None))  # resumes inside it
    assert_same(*tail)
    assert torch.equal(tail[0].given, tail[1].given) and torch.equal(tail[1].given, head[0].step_map >= 0)
    window = decode_both(model, ids, mask, config, canvas=state, step_range=(5, 9))
    assert_same(*window)
    canvas = torch.full((3, 24), tok.mask)
    canvas[:, 3], canvas[0, 12], canvas[2, 20] = 65, 66, 67  # inpainted hints
    hinted = decode_both(model, ids, mask, config, canvas=canvas)
    assert_same(*hinted)
    assert torch.equal(hinted[1].given, canvas != tok.mask) and int(hinted[1].completion[0, 12]) == 66
    plain = generate(model, ids, mask, config, engine="static")  # a plain call after resumed ones: its own state
    assert torch.equal(plain.completion, generate(model, ids, mask, config, engine="eager").completion)
    assert plain.given is None


def test_resumed_decoding_trajectories_static_equal_eager():
    model = sharp_model("llada")
    ids, mask = padded([7, 12])
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8, steps=8,
                           record_trajectory=True, eos_early_stop=False)
    head = generate(model, ids, mask, config, engine="eager", step_range=(0, 3))
    mask_id = family_of(model).token_ids(model.config).mask
    for resume in (dict(step_range=(0, 3)), dict(canvas=head.state(mask_id), step_range=(3, None))):
        assert_same_trajectory(*decode_both(model, ids, mask, config, **resume))


def test_resumed_decodings_share_one_state_and_record_per_first_block_budget(monkeypatch):
    """Every start and stop of one shape reuses one resumable state (kept apart from the plain decodes'); only the
    first block's remaining-step budget selects other recorded steps."""
    from dare.rollout import engine
    from dare.rollout.engine.graphs import StepRunner

    keys, real = [], StepRunner.run
    monkeypatch.setattr(StepRunner, "run", lambda runner, key, fn: (keys.append(key), real(runner, key, fn))[1])
    model = sharp_model("llada")
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=24, block_length=8, steps=12,
                           eos_early_stop=False)
    generate(model, ids, mask, config, engine="static")
    for start, stop in ((0, 3), (3, None), (5, 7), (4, None)):
        generate(model, ids, mask, config, engine="static", step_range=(start, stop))
    assert len(engine._STATES[model]) == 2  # the plain state and one resumable state
    # 4 steps per block: start 3 leaves block 0 one step, start 5 leaves block 1 three; start 4 is a block start
    assert {key[1] for key in keys if key[0] == "full" and len(key) == 2} == {1, 3}
    assert {key[2] for key in keys if key[0] == "window" and len(key) == 3} == {1, 3}


def test_shapes_beyond_the_kept_states_are_counted_and_warned_about_once(monkeypatch, caplog):
    """At most KEEP_STATES decode states live per model; a shape that comes back after being dropped is recorded
    again, which a run with more shapes in rotation pays at every rollout: counted, and one warning says so."""
    from dare.rollout import engine

    monkeypatch.setattr(engine, "KEEP_STATES", 2)
    model = sharp_model("llada")
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8)
    batches = [padded(lengths) for lengths in ([9, 4], [12, 5], [15, 6])]  # three prompt widths: three states
    stats = engine_stats(model)
    with caplog.at_level(logging.WARNING, logger="dare"):
        for ids, mask in batches[:2] * 2:  # two shapes in rotation: both kept
            generate(model, ids, mask, config, engine="static")
        assert (stats.evictions, stats.returns) == (0, 0) and "recorded again" not in caplog.text
        for ids, mask in batches * 2:  # three shapes in rotation over two slots: every call makes a state
            generate(model, ids, mask, config, engine="static")
    assert len(engine._STATES[model]) == 2
    assert stats.evictions == 4 and stats.returns == 3
    assert caplog.text.count("shapes dropped earlier are recorded again") == 1
    engine.release(model)
    generate(model, *batches[0], config, engine="static")  # a released model starts afresh: nothing returns
    assert stats.returns == 3


def test_refresh_weights_keeps_graphs_for_in_place_updates_only():
    from dare.rollout.engine import refresh_weights

    model = sharp_model("llada")
    refresh_weights(model)  # first sight records the addresses
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # an optimizer step: in place
    assert not refresh_weights(model)
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # a moved parameter
    before = engine_stats(model).recaptures
    assert refresh_weights(model)
    assert engine_stats(model).recaptures == before + 1


def test_a_graph_pool_is_shared_only_while_one_of_its_graphs_lives():
    """The CUDA allocator refuses (an internal assert) to record into a pool whose graphs are all gone while one of
    its blocks is still held: seen on an H200 when a benchmark released a model's steps and recorded them again,
    which sent every later rollout of that model to the eager loop. A pool without live graphs is replaced."""
    from dare.rollout.engine.graphs import GraphPool

    class Graph:
        pass

    handles = iter(range(100))
    pool = GraphPool(new_handle=lambda: next(handles))
    first = pool.for_recording()
    graphs = [Graph(), Graph()]
    pool.add(graphs[0])
    pool.add(graphs[1])
    assert pool.for_recording() == first  # bucket after bucket, one pool
    graphs.pop()
    assert pool.for_recording() == first  # one graph still lives
    graphs.clear()
    second = pool.for_recording()
    assert second != first
    pool.add(Graph())  # dies at once: a failed or dropped recording leaves no live graph
    assert pool.for_recording() not in (first, second)


def test_release_lets_a_model_that_fell_back_record_again():
    from dare.rollout import engine

    model = sharp_model("llada")
    ids, mask = padded([4, 6])
    config = SamplerConfig(sampler="llada", gen_length=8, block_length=8, steps=2)
    engine._UNCAPTURABLE.add(model)  # as after a failed recording
    before = engine_stats(model).fallbacks
    generate(model, ids, mask, config, engine="static")
    assert engine_stats(model).fallbacks == before + 1
    engine.release(model)
    generate(model, ids, mask, config, engine="static")
    assert engine_stats(model).fallbacks == before + 1


@pytest.mark.parametrize("error,freed", [(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                          True), (RuntimeError("operation not permitted when stream is capturing"),
                                                  False)])
def test_a_graph_step_that_runs_out_of_memory_frees_what_the_engine_holds(error, freed, monkeypatch, caplog):
    """Out of device memory while recording or replaying: the fallback to eager frees the engine's recorded steps
    and projection copies, so the eager loop and the training step get that memory back (any other recording
    failure keeps them). ``run_static`` with ``engine='graph'`` runs its steps eagerly on the CPU."""
    from dare.rollout import engine
    from dare.rollout.engine.fused import _FUSED
    from dare.rollout.engine.mdlm import MdlmState
    from dare.rollout.registry import get_sampler

    model = sharp_model("llada")
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, sampler="fastdllm", cache="dual").resolved()
    sampler = get_sampler("fastdllm")
    small = SamplerConfig(gen_length=8, block_length=8, sampler="fastdllm", cache="dual").resolved()
    assert engine.run_static(sampler, model, ids, mask, small, example_ids=[0, 1, 2], engine="graph") is not None
    assert engine_stats(model).fused_bytes > 0 and len(engine._STATES[model]) == 1

    def fail(self, progress=False):
        raise error

    monkeypatch.setattr(MdlmState, "decode", fail)
    with caplog.at_level(logging.WARNING, logger="dare.rollout"):
        assert engine.run_static(sampler, model, ids, mask, config, example_ids=[0, 1, 2], engine="graph") is None
    assert ("ran out of device memory" in caplog.text) is freed and "falls back to eager" in caplog.text
    assert (engine_stats(model).fused_bytes == 0) is freed and (model in _FUSED) is not freed
    assert (len(engine._STATES[model]) == 0) is freed  # the earlier call's state too
    engine.release(model)


def test_a_lora_model_keeps_its_steps_per_adapter_state():
    """Steps recorded with the adapter on must never replay for a call inside peft's disable_adapter (on CUDA a
    replay would silently decode with the adapter): the engine keeps one state per adapter state, and each call
    decodes as the eager loop does with the adapter on or off."""
    from dare.models.lora import apply_lora
    from dare.rollout import engine

    model = apply_lora(sharp_model("llada"), r=4, alpha=8)
    with torch.no_grad():  # peft starts B at zero: make the adapter change the logits
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8)
    on = decode_both(model, ids, mask, config)
    with model.disable_adapter():
        off = decode_both(model, ids, mask, config)
        off_state = engine.adapter_state(model)
    assert_same(*on)
    assert_same(*off)
    assert not torch.equal(on[0].completion, off[0].completion)  # the adapter changes the decode
    assert off_state != engine.adapter_state(model) and engine.adapter_state(sharp_model("llada")) == ()
    assert len(engine._STATES[model.get_base_model()]) == 2  # one state per adapter state


def test_a_non_numeric_setting_is_a_one_line_error():
    with pytest.raises(ConfigError, match="threshold must be a number; got 'a'"):
        SamplerConfig(sampler="fastdllm", threshold="a").resolved()
    with pytest.raises(ConfigError, match="gen_length must be a number"):
        SamplerConfig(sampler="llada", gen_length="long").resolved()


@pytest.mark.parametrize("field, value, message", [
    ("steps", 4.0, "steps must be a whole number; got 4.0"),  # was a TypeError in torch after the model loaded
    ("max_post_steps", 2.5, "max_post_steps must be a whole number; got 2.5"),  # was decoded and recorded as 2.5
    ("top_k", True, "top_k must be a number; got True"),
    ("threshold", True, "threshold must be a number; got True"),  # bool is an int in Python: was taken as 1
    ("temperature", False, "temperature must be a number; got False"),
])
def test_a_fraction_for_a_whole_number_or_a_switch_for_a_number_is_a_one_line_error(field, value, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        SamplerConfig.from_dict({"sampler": "fastdllm", field: value}).check_values()


@pytest.mark.parametrize("family,sampler,overrides", [
    ("llada", "fastdllm", dict(cache="dual", decoder="threshold", threshold=0.3)),
    ("llada", "fastdllm", dict(cache="prefix", decoder="quota", refresh_every=3)),
    ("dream", "fastdllm_dream", dict(cache="dual", decoder="threshold", threshold=0.3)),
    ("sdar", "sdar", dict(cache="block")),
    ("llada2", "llada21", dict(cache="block")),
])
def test_blocks_write_their_own_cache_layer_when_asked(family, sampler, overrides, monkeypatch):
    """``DARE_FUSE_CACHE_WRITES=1``: a one-column probe allocates the buffers before the first forward (one write per
    layer through the cache), then every block writes its own layer (``StaticLayerKV``); the decode is unchanged."""
    from dare.rollout.engine.forward import StaticKVCache

    calls = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", switch)
        seen, update = [], StaticKVCache.update

        def spy(self, layer, key, value, seen=seen, update=update):
            seen.append(layer)
            return update(self, layer, key, value)

        monkeypatch.setattr(StaticKVCache, "update", spy)
        model = sharp_model(family)
        ids, mask = padded([11, 4, 17])
        block = 8
        config = SamplerConfig(sampler=sampler, gen_length=24, block_length=block, **overrides)
        eager, static = decode_both(model, ids, mask, config)
        assert_same(eager, static, block=family in ("sdar", "llada2"))
        monkeypatch.setattr(StaticKVCache, "update", update)
        calls[switch] = (len(seen), len(model.blocks), static.nfe)
    (old, layers, nfe), (new, _, _) = calls["0"], calls["1"]
    assert old >= layers * nfe > layers  # the cache wrote every layer of every forward
    assert new == layers  # the probe's writes only


@pytest.mark.parametrize("switch", ["DARE_FUSE_CACHE_WRITES", "DARE_COMPILE_SAMPLING", "DARE_FUSE_PROJECTIONS",
                                    "DARE_PROPOSAL_KERNEL", "DARE_TOP_P_KERNEL", "DARE_STATIC_COMPILE"])
def test_a_misspelt_kernel_switch_is_a_one_line_error(switch, monkeypatch):
    from dare.rollout.engine import kernel_settings

    monkeypatch.setenv(switch, "yes")
    with pytest.raises(ConfigError, match=f"{switch} must be 0 or 1, got 'yes'"):
        kernel_settings()
    monkeypatch.setenv(switch, "0")
    settings = kernel_settings()
    assert not settings[{"DARE_FUSE_CACHE_WRITES": "cache_writes_in_blocks", "DARE_COMPILE_SAMPLING": "compile_sampling",
                         "DARE_FUSE_PROJECTIONS": "fuse_max_rows", "DARE_PROPOSAL_KERNEL": "proposal_kernel",
                         "DARE_TOP_P_KERNEL": "top_p_kernel", "DARE_STATIC_COMPILE": "static_compile"}[switch]]


@pytest.mark.parametrize("dtype,head_dim,wide", [(torch.bfloat16, 8, torch.int64), (torch.float16, 6, torch.int32),
                                                 (torch.float32, 3, None), (torch.float32, 4, torch.int64)])
def test_cache_writes_move_whole_rows_as_wide_elements_with_the_same_bytes(dtype, head_dim, wide, monkeypatch):
    from dare.models.cache import copy_rows

    cache = torch.zeros(2, 3, 10, head_dim, dtype=dtype)
    rows = torch.randn(2, 5, 3, head_dim).to(dtype).transpose(1, 2)  # a [B, L, H, d] projection seen as [B, H, L, d]
    slots = torch.tensor([7, 1, 4, 2, 9])
    expected = cache.clone().index_copy_(2, slots, rows)
    copied, index_copy = [], torch.Tensor.index_copy_

    def spy(self, *args):
        copied.append(self.dtype)
        return index_copy(self, *args)

    monkeypatch.setattr(torch.Tensor, "index_copy_", spy)
    copy_rows(cache, slots, rows)
    assert torch.equal(cache, expected)
    assert copied == [wide or dtype]
    # a source that cannot be viewed wider (an odd offset into its storage) is copied as is
    odd = torch.randn(2, 3, 5, head_dim + 1).to(dtype)[..., 1:]
    copy_rows(cache, slots, odd)
    assert torch.equal(cache, expected.index_copy_(2, slots, odd)) and copied[-1] == dtype


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2", "llada_moe"])
@pytest.mark.parametrize("layer_writes", [False, True])
def test_the_last_block_runs_only_the_rows_whose_logits_are_read(family, layer_writes):
    from dare.models.tiny import tiny_model
    from dare.rollout.engine.forward import StaticKVCache, static_hidden

    model = tiny_model(family, seed=0).eval()
    ids = torch.randint(0, 200, (2, 12))
    positions = torch.arange(12).expand(2, 12)
    block_size = model.block_size if model.family.attention == "block_causal" else None
    keep = torch.tensor([4, 5, 6, 7])
    shapes = []
    model.blocks[-1].register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape[:2])))
    caches = {}
    with torch.no_grad():
        for name, rows in (("all", None), ("kept", keep)):
            caches[name] = StaticKVCache(len(model.blocks), 12)
            hidden = static_hidden(model, ids, positions, key_mask=None, cache=caches[name], slots=torch.arange(12),
                                   key_positions=positions, block_size=block_size, keep=rows, layer_writes=layer_writes)
            caches[name + "_hidden"] = hidden
    steps = [shape for shape in shapes if shape[1] != 1]  # without the one-column probe that allocates layer buffers
    assert steps == [(2, 12), (2, 4)]  # the last block's output: every row, then the kept rows only
    torch.testing.assert_close(caches["kept_hidden"], caches["all_hidden"].index_select(1, keep), atol=1e-5, rtol=1e-5)
    for stored, reference in zip(caches["kept"].keys + caches["kept"].values, caches["all"].keys + caches["all"].values):
        torch.testing.assert_close(stored, reference, atol=1e-6, rtol=0)  # every row's keys/values, every layer


@pytest.mark.parametrize("family,sampler,overrides", [("llada", "fastdllm", dict(cache="dual")),
                                                      ("sdar", "sdar", dict(cache="block"))])
def test_progress_shows_a_bar_of_blocks_and_changes_nothing_else(family, sampler, overrides, capsys, monkeypatch):
    """``progress=True`` is honoured by the static engine (a bar of blocks, advanced once per block on the host),
    not ignored; the decode is the same with and without it."""
    import dare.rollout.progress as progress

    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "0")  # stderr is no terminal: a plain line at every advance
    model = sharp_model(family)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(sampler=sampler, gen_length=16, block_length=4 if family == "sdar" else 8, **overrides)
    quiet = generate(model, ids, mask, config, engine="static")
    assert "decoding" not in capsys.readouterr().err
    shown = generate(model, ids, mask, config, engine="static", progress=True)
    assert "decoding:" in capsys.readouterr().err
    assert torch.equal(quiet.completion, shown.completion) and quiet.nfe == shown.nfe

    bars = []
    real = progress.progress_bar

    def recording_bar(total, enabled, unit="tok"):
        bar = real(total, enabled, unit)
        bars.append((total, unit, bar))
        bar.update = bars.append  # every advance of the bar, in order
        return bar

    monkeypatch.setattr(progress, "progress_bar", recording_bar)
    generate(model, ids, mask, config, engine="static", progress=True)
    total, unit, _ = bars[0]  # SDAR: a prompt that ends inside a block adds one (16 / 4 + 1)
    assert unit == "block" and total == 16 // config.block_length + (family == "sdar") and bars[1:] == [1] * total


FIXED_BLOCK_CASES = [dict(decoder="quota"), dict(decoder="quota", block_steps=3),
                     dict(decoder="quota", num_to_transfer=3), dict(decoder="sequential", block_steps=4)]


def spy_host_reads(monkeypatch) -> tuple[list[int], list[int]]:
    """The blocks a static block decode begins, and the block during which each of its host flag reads happens."""
    from dare.rollout.engine.block import BlockState
    from dare.rollout.engine.graphs import HostFlag

    begun, reads, current, begin, read = [], [], [-1], BlockState.begin_block, HostFlag.read

    def begin_block(self, k):
        current[0] = k
        begun.append(k)
        return begin(self, k)

    def counted(self, value):
        reads.append(current[0])
        return read(self, value)

    monkeypatch.setattr(BlockState, "begin_block", begin_block)
    monkeypatch.setattr(HostFlag, "read", counted)
    return begun, reads


@pytest.mark.parametrize("eos_early_stop", [False, True])
@pytest.mark.parametrize("overrides", FIXED_BLOCK_CASES)
def test_fixed_count_block_decoders_read_no_flag_inside_later_blocks(overrides, eos_early_stop, monkeypatch):
    """A fixed-count decoder's later blocks queue their scheduled steps back to back (the host waits on no flag
    between them) and decode exactly what the eager loop does; with EOS stops one read per block remains."""
    model = sharp_model("sdar")
    ids, mask = padded([11, 4, 17])
    config = SamplerConfig(sampler="sdar", gen_length=32, block_length=8, cache="block",
                           eos_early_stop=eos_early_stop, **overrides)
    eager = generate(model, ids, mask, config, engine="eager")
    blocks, reads = spy_host_reads(monkeypatch)
    static = generate(model, ids, mask, config, engine="static")
    assert_same(eager, static, block=True)
    assert blocks == list(range(len(blocks))) and len(blocks) > 2
    assert reads.count(0) > 1  # the first block may hold a prompt tail: read after each step
    for k in blocks[1:-1]:
        assert reads.count(k) == (1 if eos_early_stop else 0), (k, reads)
    assert reads.count(blocks[-1]) == (1 if eos_early_stop else 0) + 1  # + the plan check after the decode


def test_a_schedule_that_leaves_masks_after_its_planned_steps_is_an_error(monkeypatch):
    """If a block's planned steps ever left masks (a schedule that does not flush), the decode says so instead of
    returning unfinished blocks."""
    from dare.rollout.engine.block import BlockState

    monkeypatch.setattr(BlockState, "planned_steps", lambda self, k: None if k == 0 else 1)
    model = sharp_model("sdar")
    ids, mask = padded([11, 4])
    config = SamplerConfig(sampler="sdar", gen_length=32, block_length=8, cache="block", decoder="quota")
    with pytest.raises(RuntimeError, match="still had masks after its scheduled steps"):
        generate(model, ids, mask, config, engine="static")
