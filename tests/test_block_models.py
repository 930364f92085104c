"""Block-diffusion families (SDAR, SDAR-MoE, LLaDA2): block-causal attention, cached decoding, reference parity,
tied embeddings, the LLaDA2 router, and the [noisy ; clean] training layout (algorithms.md 1.2)."""

import pytest
import torch
from conftest import BDLM_FAMILIES
from reference_models import REFERENCE_FORWARDS
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from dare.errors import ConfigError, InputError
from dare.models import KVCache, family_of
from dare.models.block_diffusion import block_diffusion_mask_mod, block_ids, two_copy_inputs
from dare.models.moe import released_state_dict
from dare.models.tiny import tiny_config, tiny_model, write_tiny_checkpoint

TOL = dict(atol=2e-5, rtol=1e-4)
MASK = 259
# LLaDA2's default block is 32; tests also run it at a short block so that short sequences span several blocks.
SHORT_BLOCK = {"sdar": 4, "sdar_moe": 4, "llada2": 4}


def randint(shape, seed, high=256):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def bdlm(family, seed=0, **overrides):
    """A tiny block-diffusion model; LLaDA2 gets non-zero expert biases so biased selection != unbiased weights."""
    model = tiny_model(family, seed=seed, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    for module in model.modules():
        if getattr(module, "expert_bias", None) is not None:
            module.expert_bias.copy_(torch.randn(module.expert_bias.shape, generator=gen) * 0.1)
    return model


def full(b, h, q, k):
    return q >= 0


def causal(b, h, q, k):
    return k <= q


# ---- family facts ----------------------------------------------------------------------------------------------


def test_specs_declare_block_causal_defaults():
    facts = {f: (family_of(tiny_config(f)[0]).attention, family_of(tiny_config(f)[0]).block_size) for f in BDLM_FAMILIES}
    assert facts == {"sdar": ("block_causal", 4), "sdar_moe": ("block_causal", 4), "llada2": ("block_causal", 32)}
    import dare

    assert (dare.get_family("sdar").mask_token_id, dare.get_family("sdar").eos_token_id) == (151669, 151643)
    assert (dare.get_family("llada2").mask_token_id, dare.get_family("llada2").eos_token_id) == (156895, 156892)
    assert dare.get_family("llada").block_size is None and dare.get_family("llada").attention == "full"
    assert tiny_model("sdar").block_size == 4 and tiny_model("sdar", block_size=8).block_size == 8  # config wins


@pytest.mark.parametrize("family", BDLM_FAMILIES)
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
def test_later_blocks_are_invisible_and_blocks_are_bidirectional(family, backend):
    model = bdlm(family, seed=1)
    bs = SHORT_BLOCK[family]
    ids = randint((1, 3 * bs + 2), seed=1)
    changed = ids.clone()
    changed[0, bs + 1] = (ids[0, bs + 1] + 1) % 256  # a token of block 1
    with torch.no_grad():
        a = model(ids, block_size=bs, attn_backend=backend).logits
        b = model(changed, block_size=bs, attn_backend=backend).logits
    # block 0 never sees block 1 (not bit-exact for MoE: expert batches change with the routing of other tokens)
    torch.testing.assert_close(a[0, :bs], b[0, :bs], atol=1e-6, rtol=0)
    diff = (a - b).abs().amax(-1)[0]
    assert bool((diff[bs:bs + 1] > 1e-4).all())  # an earlier token of the same block sees it (bidirectional)
    assert bool((diff[2 * bs:] > 1e-4).all())  # later blocks see it


@pytest.mark.parametrize("family", BDLM_FAMILIES)
def test_block_size_override_spans_full_and_causal(family):
    model = bdlm(family, seed=2)
    ids = randint((2, 9), seed=2)
    with torch.no_grad():
        one_block = model(ids, block_size=16).logits
        torch.testing.assert_close(one_block, model(ids, attention_rule=full).logits, atol=0, rtol=0)
        token_blocks = model(ids, block_size=1).logits
        torch.testing.assert_close(token_blocks, model(ids, attention_rule=causal).logits, **TOL)
        assert (one_block - token_blocks).abs().max() > 1e-3
    with pytest.raises(InputError, match="block_size must be a positive integer"):
        model(ids, block_size=0)
    with pytest.raises(InputError, match="not both"):
        model(ids, block_size=4, attention_rule=full)
    with pytest.raises(InputError, match="block_size applies to block-causal families"):
        tiny_model("llada")(ids, block_size=4)


# ---- reference parity ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, overrides, block_size",
    [
        ("sdar", {}, None),
        ("sdar", {"head_dim": 32}, None),  # q_proj out 128 != hidden 64, like SDAR-4B
        ("sdar", {"tie_word_embeddings": True}, None),
        ("sdar_moe", {}, None),
        ("llada2", {}, 4),
        ("llada2", {}, None),  # default block 32, sequences up to 37 tokens
    ],
)
def test_logits_match_independent_reference(family, overrides, block_size):
    model = bdlm(family, seed=5, **overrides)
    raw = model.config.to_dict()
    state = {k: v.detach() for k, v in released_state_dict(model).items()}
    lengths = [9, 4, 14] if block_size or family != "llada2" else [37, 20]
    seqs = [randint((n,), seed=10 + n) for n in lengths]
    seqs = [torch.where(torch.rand(len(s), generator=torch.Generator().manual_seed(3)) < 0.3, MASK, s) for s in seqs]
    width = max(lengths)
    ids = torch.full((len(seqs), width), 256)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):  # left padding; positions count real tokens, so blocks start at each prompt
        ids[i, width - len(s):], mask[i, width - len(s):] = s, 1
    kwargs = {} if block_size is None else {"block_size": block_size}
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, **kwargs).logits
    reference_block = block_size or model.block_size
    for i, s in enumerate(seqs):
        expected = REFERENCE_FORWARDS[family](state, raw, s, block_size=reference_block)
        assert expected.dtype == batched.dtype
        torch.testing.assert_close(batched[i, width - len(s):], expected, **TOL)


# ---- KV cache --------------------------------------------------------------------------------------------------


def test_cache_tracks_key_positions_per_mode():
    cache = KVCache(mode="append")
    assert torch.equal(cache.key_positions(torch.tensor([[0, 1, 2]])), torch.tensor([[0, 1, 2]]))
    cache.keys, cache.values = [torch.zeros(1, 1, 3, 2)], [torch.zeros(1, 1, 3, 2)]
    with pytest.raises(InputError, match="without recorded positions"):
        cache.key_positions(torch.tensor([[3]]))
    cache.store_positions(torch.tensor([[0, 1, 2]]))
    assert cache.key_positions(torch.tensor([[7, 8]])).tolist() == [[0, 1, 2, 7, 8]]
    cache.set_mode("read").store_positions(torch.tensor([[9, 9, 9, 9, 9]]))
    assert cache.positions.tolist() == [[0, 1, 2]]  # read mode records nothing
    cache.set_mode("replace", replace_start=1)
    assert cache.key_positions(torch.tensor([[5]])).tolist() == [[0, 5, 2]]
    with pytest.raises(InputError, match="exceed the cache length"):
        cache.key_positions(torch.tensor([[5, 6, 7]]))
    cache.positions = torch.tensor([[0, 1, 2], [3, 4, 5]])
    cache.keys, cache.values = [torch.zeros(2, 1, 3, 2)], [torch.zeros(2, 1, 3, 2)]
    assert cache.reorder(torch.tensor([1])).positions.tolist() == [[3, 4, 5]]
    assert cache.truncate(2).positions.tolist() == [[3, 4]]


def _decode_block_by_block(model, canvas, prompt_len, bs, backend="sdpa"):
    """SDAR-style decoding (models.md 7.4): prefill full prompt blocks, then per block: denoise steps that read the
    cache, then a commit that stores the block. Returns every step's cached logits and the full-recompute logits."""
    total = canvas.shape[1]
    pos = torch.arange(total)[None]
    cache = KVCache(mode="append")
    pairs = []
    prefill = prompt_len // bs * bs
    if prefill:
        model(canvas[:, :prefill], cache=cache, position_ids=pos[:, :prefill], attn_backend=backend)
    x = canvas.clone()
    for start in range(prefill, total, bs):
        end = start + bs
        for step in range(2):
            cached = model(x[:, start:end], cache=cache.set_mode("read"), position_ids=pos[:, start:end],
                           attn_backend=backend).logits
            recompute = model(x[:, :end], attn_backend=backend).logits[:, start:]  # the LLaDA2 reference way
            pairs.append((cached, recompute))
            still_masked = torch.nonzero(x[0, start:end] == MASK).flatten()
            if step == 0 and still_masked.numel():  # "decode" one token, so the next step sees a changed block
                x[0, start + int(still_masked[0])] = int(cached[0, int(still_masked[0])].argmax()) % 256
        model(x[:, start:end], cache=cache.set_mode("append"), position_ids=pos[:, start:end], attn_backend=backend)
        assert cache.seq_len == end and cache.positions[0, -1] == end - 1
    return pairs


@pytest.mark.parametrize("family", BDLM_FAMILIES)
@pytest.mark.parametrize("prompt_len", [8, 6, 3])  # a multiple of the block, a partial last block, shorter than a block
def test_cached_block_decoding_equals_full_recompute(family, prompt_len):
    model = bdlm(family, seed=3)
    bs = model.block_size if family != "llada2" else 8
    if family == "llada2":
        model.config.block_size = bs  # config value is the model's default block length
    total = -(-(prompt_len + 10) // bs) * bs
    canvas = torch.full((1, total), MASK)
    canvas[0, :prompt_len] = randint((prompt_len,), seed=prompt_len)
    with torch.no_grad():
        pairs = _decode_block_by_block(model, canvas, prompt_len, bs)
    assert len(pairs) == 2 * (total - prompt_len // bs * bs) // bs
    for cached, recompute in pairs:
        torch.testing.assert_close(cached, recompute, **TOL)


def test_cached_decoding_with_flex_backend():
    model = bdlm("sdar", seed=4)
    canvas = torch.full((1, 12), MASK)
    canvas[0, :5] = randint((5,), seed=4)
    with torch.no_grad():
        for cached, recompute in _decode_block_by_block(model, canvas, 5, 4, backend="flex"):
            torch.testing.assert_close(cached, recompute, **TOL)


@pytest.mark.parametrize("family", BDLM_FAMILIES)
def test_padded_batch_cached_decoding_equals_per_example(family):
    """Two prompts (5 and 9 tokens), block 4: the cache holds each row's full prompt blocks (row 0 left-padded), the
    query is each row's first decode block (prompt tail + masks) at that row's own positions."""
    model = bdlm(family, seed=6)
    bs = 4
    prompts = [randint((5,), seed=11), randint((9,), seed=12)]
    full_blocks = [p[: len(p) // bs * bs] for p in prompts]  # 4 and 8 tokens
    width = max(len(f) for f in full_blocks)
    prefix = torch.full((2, width), 256)
    key_mask = torch.zeros(2, width + bs, dtype=torch.long)
    prefix_pos = torch.zeros(2, width, dtype=torch.long)
    block = torch.full((2, bs), MASK)
    block_pos = torch.zeros(2, bs, dtype=torch.long)
    for i, (p, f) in enumerate(zip(prompts, full_blocks)):
        prefix[i, width - len(f):], key_mask[i, width - len(f):] = f, 1
        prefix_pos[i, width - len(f):] = torch.arange(len(f))
        tail = p[len(f):]
        block[i, : len(tail)] = tail
        block_pos[i] = torch.arange(len(f), len(f) + bs)
    with torch.no_grad():
        cache = KVCache(mode="append")
        model(prefix, attention_mask=key_mask[:, :width], cache=cache, position_ids=prefix_pos, block_size=bs)
        batched = model(block, attention_mask=key_mask, cache=cache.set_mode("read"), position_ids=block_pos,
                        block_size=bs).logits
        for i, f in enumerate(full_blocks):
            alone = model(torch.cat([f, block[i]])[None], block_size=bs).logits[0, len(f):]
            torch.testing.assert_close(batched[i], alone, **TOL)


# ---- packing, padding and backends with several blocks ---------------------------------------------------------


@pytest.mark.parametrize("family", BDLM_FAMILIES)
def test_packed_padded_and_backends_agree_with_short_blocks(family):
    model = bdlm(family, seed=7)
    seqs = [randint((n,), seed=20 + n) for n in (7, 3, 12)]
    cu = torch.tensor([0, 7, 10, 22])
    ids = torch.full((3, 12), 256)
    mask = torch.zeros(3, 12, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, 12 - len(s):], mask[i, 12 - len(s):] = s, 1
    with torch.no_grad():
        singles = [model(s[None], block_size=4).logits[0] for s in seqs]
        for backend in ("sdpa", "eager", "flex"):
            padded = model(ids, attention_mask=mask, attn_backend=backend, block_size=4).logits
            packed = model(torch.cat(seqs)[None], cu_seqlens=cu, attn_backend=backend, block_size=4).logits[0]
            for i, s in enumerate(seqs):
                torch.testing.assert_close(padded[i, 12 - len(s):], singles[i], **TOL)
                torch.testing.assert_close(packed[cu[i]:cu[i + 1]], singles[i], **TOL)


# ---- checkpoints -----------------------------------------------------------------------------------------------


def test_tied_embeddings_load_with_or_without_lm_head(tmp_path):
    path = write_tiny_checkpoint("sdar", tmp_path / "tied", seed=2, tie_word_embeddings=True)
    tensors = load_file(path / "model.safetensors")
    assert "lm_head.weight" not in tensors  # transformers saves the tied copy once
    model = AutoModel.from_pretrained(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = randint((1, 9), seed=1)
    with torch.no_grad():
        expected = model(ids).logits
    save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()}, path / "model.safetensors",
              metadata={"format": "pt"})
    with_head = AutoModel.from_pretrained(path)  # an identical copy of the tied matrix is accepted
    with torch.no_grad():
        torch.testing.assert_close(with_head(ids).logits, expected, atol=0, rtol=0)
    save_file({**tensors, "lm_head.weight": torch.randn_like(tensors["model.embed_tokens.weight"])},
              path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lm_head.weight differs from model.embed_tokens.weight"):
        AutoModel.from_pretrained(path)


@pytest.mark.parametrize(
    "family, key, value, message",
    [
        ("sdar", "use_sliding_window", True, "use_sliding_window=true is not supported"),
        ("sdar", "num_key_value_heads", 3, "not a multiple of num_key_value_heads=3"),
        ("sdar_moe", "num_experts_per_tok", 9, "num_experts_per_tok=9 must be in"),
        ("llada2", "n_group", 3, "num_experts=8 must split into n_group=3 groups"),
        ("llada2", "score_function", "softmax", "score_function='softmax' is not supported"),
        ("llada2", "rotary_dim", 16, "rotary_dim=16 disagrees"),
    ],
)
def test_block_family_config_errors(family, key, value, message):
    config, _ = tiny_config(family, **{key: value})
    with pytest.raises(ConfigError, match=message):
        family_of(config).model_class(config)


# ---- LLaDA2 router ---------------------------------------------------------------------------------------------


def test_llada2_router_selects_on_biased_scores_and_weighs_unbiased():
    config, _ = tiny_config("llada2", num_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2)
    from dare.models.llada2 import GroupLimitedRouter

    router = GroupLimitedRouter(config)
    router.weight.data.zero_()  # every sigmoid score is 0.5
    router.expert_bias.copy_(torch.tensor([0.0, 0.3, 0.15, 0.2]))
    chosen, weights = router(torch.randn(3, 64))
    # biased scores 0.5, 0.8, 0.65, 0.7: group {0,1} scores 1.3 < group {2,3} 1.35, so expert 1 (the best single
    # score) is excluded by the group limit and experts 3, 2 are chosen
    assert chosen.tolist() == [[3, 2]] * 3
    # weights use the unbiased scores 0.5 / (0.5 + 0.5), times routed_scaling_factor 2.5
    torch.testing.assert_close(weights, torch.full((3, 2), 1.25))


# ---- the [noisy ; clean] training layout -----------------------------------------------------------------------


def materialise(rule, batch, length):
    b = torch.arange(batch)[:, None, None]
    q = torch.arange(length)[None, :, None]
    k = torch.arange(length)[None, None, :]
    return rule(b, torch.zeros((), dtype=torch.long), q, k).expand(batch, length, length)


def test_two_copy_sanity_matrix_n4_block2():
    ids = torch.arange(4)[None]
    inputs = two_copy_inputs(ids, ids, 2)
    expected = torch.tensor([  # rows: queries z0..z3, x0..x3; columns: keys z0..z3, x0..x3 (written by hand)
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(materialise(inputs.attention_rule, 1, 8)[0], expected)
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert inputs.input_ids.shape == (1, 8) and inputs.noisy_length == 4


def test_two_copy_degenerate_block_sizes():
    n = 6
    ids = torch.arange(n)[None]
    one_block = materialise(two_copy_inputs(ids, ids, n).attention_rule, 1, 2 * n)[0]
    assert bool(one_block[:n, :n].all())  # B' = n: MDLM full attention inside the noisy half...
    assert not bool(one_block[:n, n:].any())  # ...and no noisy -> clean edges
    token_blocks = materialise(two_copy_inputs(ids, ids, 1).attention_rule, 1, 2 * n)[0]
    eye = torch.eye(n, dtype=torch.bool)
    assert torch.equal(token_blocks[:n, :n], eye)  # B' = 1: a noisy token sees only itself among the noisy...
    assert torch.equal(token_blocks[:n, n:], torch.ones(n, n, dtype=torch.bool).tril(-1))  # ...and clean tokens < i
    assert torch.equal(token_blocks[n:, n:], torch.ones(n, n, dtype=torch.bool).tril())  # clean half is causal (AR)
    assert not bool(token_blocks[n:, :n].any())  # never clean -> noisy


def test_block_ids_global_and_response_origin():
    pos = torch.arange(9)[None]
    assert block_ids(pos, 2).tolist() == [[0, 0, 1, 1, 2, 2, 3, 3, 4]]
    # prompt of 3 tokens: blocks 0,0,1; the response starts a fresh block 2
    response = block_ids(pos, 2, block_origin="response", prompt_lengths=torch.tensor([3]))
    assert response.tolist() == [[0, 0, 1, 2, 2, 3, 3, 4, 4]]
    with pytest.raises(InputError, match="needs prompt_lengths"):
        block_ids(pos, 2, block_origin="response")
    with pytest.raises(ConfigError, match="unknown block origin 'responce'.*did you mean 'response'"):
        block_ids(pos, 2, block_origin="responce")


def _noisy(clean, seed, rate=0.5):
    gen = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(clean.shape, generator=gen) < rate, MASK, clean)


@pytest.mark.parametrize("family", BDLM_FAMILIES)
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_two_copy_noisy_half_equals_block_causal_prefix_forward(family, backend):
    """The identity that makes the trick exact: noisy block b in the 2L forward == [x_<b ; z_b] block-causally."""
    model = bdlm(family, seed=8)
    bs, n = 4, 14
    clean = randint((1, n), seed=8)
    noisy = _noisy(clean, seed=9)
    inputs = two_copy_inputs(noisy, clean, bs)
    with torch.no_grad():
        logits = inputs.noisy_half(model(**inputs.model_kwargs(), attn_backend=backend).logits)
        for start in range(0, n, bs):
            end = min(start + bs, n)
            prefix = torch.cat([clean[:, :start], noisy[:, start:end]], dim=1)
            expected = model(prefix, block_size=bs, attn_backend=backend).logits[:, start:]
            torch.testing.assert_close(logits[:, start:end], expected, **TOL)


def test_two_copy_response_origin_matches_response_aligned_blocks():
    model = bdlm("sdar", seed=9)
    bs, prompt, n = 4, 6, 15
    clean = randint((1, n), seed=10)
    noisy = clean.clone()
    noisy[:, prompt:] = _noisy(clean[:, prompt:], seed=11)
    inputs = two_copy_inputs(noisy, clean, bs, block_origin="response", prompt_lengths=torch.tensor([prompt]))
    blocks = inputs.block_ids[0]
    assert blocks.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4]

    def block_causal(b, h, q, k):  # block-causal over the response-aligned blocks, written independently
        return blocks[k] <= blocks[q]

    with torch.no_grad():
        logits = inputs.noisy_half(model(**inputs.model_kwargs()).logits)
        for block in range(int(blocks.max()) + 1):
            idx = torch.nonzero(blocks == block).flatten()
            start, end = int(idx[0]), int(idx[-1]) + 1
            prefix = torch.cat([clean[:, :start], noisy[:, start:end]], dim=1)
            expected = model(prefix, attention_rule=block_causal).logits[:, start:]
            torch.testing.assert_close(logits[:, start:end], expected, **TOL)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_two_copy_padded_and_packed_equal_per_example(family):
    model = bdlm(family, seed=10)
    bs = 4
    cleans = [randint((n,), seed=30 + n) for n in (9, 5, 11)]
    noisies = [_noisy(c, seed=40 + i) for i, c in enumerate(cleans)]
    prompts = torch.tensor([3, 2, 5])
    with torch.no_grad():
        singles = []
        for c, z, p in zip(cleans, noisies, prompts):
            one = two_copy_inputs(z[None], c[None], bs, block_origin="response", prompt_lengths=p[None])
            singles.append(one.noisy_half(model(**one.model_kwargs()).logits)[0])
        width = 11
        pad_ids = torch.full((3, width), 256)
        pad_noisy = pad_ids.clone()
        mask = torch.zeros(3, width, dtype=torch.long)
        for i, (c, z) in enumerate(zip(cleans, noisies)):  # left padding
            pad_ids[i, width - len(c):], pad_noisy[i, width - len(c):], mask[i, width - len(c):] = c, z, 1
        padded = two_copy_inputs(pad_noisy, pad_ids, bs, attention_mask=mask, block_origin="response",
                                 prompt_lengths=prompts)
        for backend in ("sdpa", "flex"):
            out = padded.noisy_half(model(**padded.model_kwargs(), attn_backend=backend).logits)
            for i, c in enumerate(cleans):
                torch.testing.assert_close(out[i, width - len(c):], singles[i], **TOL)
        cu = torch.tensor([0, 9, 14, 25])
        packed = two_copy_inputs(torch.cat(noisies)[None], torch.cat(cleans)[None], bs, cu_seqlens=cu,
                                 block_origin="response", prompt_lengths=prompts)
        assert packed.position_ids[0, :9].tolist() == packed.position_ids[0, 25:34].tolist() == list(range(9))
        out = packed.noisy_half(model(**packed.model_kwargs()).logits)[0]
        for i in range(3):
            torch.testing.assert_close(out[cu[i]:cu[i + 1]], singles[i], **TOL)


def test_two_copy_trains_with_sdpa_and_rejects_bad_shapes():
    model = bdlm("sdar", seed=11).train()
    clean = randint((2, 8), seed=12)
    inputs = two_copy_inputs(_noisy(clean, seed=13), clean, 4)
    logits = inputs.noisy_half(model(**inputs.model_kwargs()).logits)
    logits.float().logsumexp(-1).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    with pytest.raises(InputError, match="noisy_ids and clean_ids"):
        two_copy_inputs(clean[:, :5], clean, 4)
    with pytest.raises(InputError, match="one entry per document"):
        two_copy_inputs(clean[:1], clean[:1], 4, cu_seqlens=torch.tensor([0, 3, 8]), block_origin="response",
                        prompt_lengths=torch.tensor([1]))
    with pytest.raises(InputError, match="single row"):
        two_copy_inputs(clean, clean, 4, cu_seqlens=torch.tensor([0, 8]))


def test_mask_mod_all_clean_is_block_causal():
    block = torch.tensor([[0, 0, 1, 1, 1, 2]])
    dense = materialise(block_diffusion_mask_mod(block, torch.ones_like(block, dtype=torch.bool)), 1, 6)[0]
    expected = block[0][None, :] <= block[0][:, None]
    assert torch.equal(dense, expected)


@pytest.mark.parametrize("family, count", [("sdar", 14), ("sdar_moe", 8), ("llada2", 4)])
def test_lora_targets_match_linear_layers(family, count):
    import re

    model = tiny_model(family)
    spec = family_of(model)
    names = [n for n, m in model.named_modules() if re.fullmatch(spec.lora_targets, n)]
    assert len(names) == count
    assert all(isinstance(model.get_submodule(n), torch.nn.Linear) for n in names)


def test_lora_wrapped_sdar_runs_the_two_copy_layout():
    from peft import LoraConfig, get_peft_model

    model = bdlm("sdar", seed=12)
    clean = randint((1, 8), seed=14)
    inputs = two_copy_inputs(_noisy(clean, seed=15), clean, 4)
    with torch.no_grad():
        base = model(**inputs.model_kwargs()).logits
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=family_of(model).lora_targets))
    assert family_of(peft_model).name == "sdar"
    with torch.no_grad():  # LoRA starts as the identity (B = 0)
        torch.testing.assert_close(peft_model(**inputs.model_kwargs()).logits, base, atol=0, rtol=0)
