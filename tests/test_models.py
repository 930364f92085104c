"""Model families: strict checkpoints, batching/padding/packing invariance, reference parity, Dream shift.

Block-diffusion specifics (block-causal masks, cached decoding, the two-copy layout) are in test_block_models.py.
"""

import json

import pytest
import torch
from conftest import ALL_FAMILIES, MDLM_FAMILIES
from reference_models import REFERENCE_FORWARDS
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

import dare
from dare.errors import ConfigError, InputError
from dare.models import KVCache, family_of
from dare.models.moe import released_state_dict
from dare.models.tiny import tiny_config, tiny_model

TOL = dict(atol=2e-5, rtol=1e-4)


def random_seqs(lengths, vocab=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def pad(seqs, side, pad_id=256):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, sl], mask[i, sl] = s, 1
    return ids, mask


def real_slice(seq_len, width, side):
    return slice(width - seq_len, width) if side == "left" else slice(0, seq_len)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_special_id_of_a_tiny_model_is_a_token_of_its_byte_vocabulary(family):
    """Tiny LLaDA used to take the released checkpoint's bos id (126080) in a 264-token vocabulary."""
    from dare.data.tokenizer import BOS_ID

    config, _ = tiny_config(family)
    ids = family_of(tiny_model(family)).token_ids(config)
    assert ids.bos == BOS_ID
    assert all(0 <= i < config.vocab_size for i in (ids.mask, ids.eos, ids.pad, ids.eot, ids.bos)), ids


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_strict_round_trip(family, tiny_dirs):
    path = tiny_dirs[family]
    model = AutoModel.from_pretrained(path)
    again = AutoModelForCausalLM.from_pretrained(path)
    assert type(model) is family_of(model).model_class
    saved = load_file(path / "model.safetensors")
    state = released_state_dict(model)  # stacked experts under their per-expert checkpoint names
    assert set(saved) == set(state)
    for key, value in saved.items():
        assert torch.equal(value, state[key]), key
    ids = torch.randint(0, 256, (2, 11))
    torch.testing.assert_close(model(ids).logits, again(ids).logits, atol=0, rtol=0)


def test_llada_moe_released_model_type_dispatches(tiny_dirs):
    raw = json.loads((tiny_dirs["llada_moe"] / "config.json").read_text())
    assert raw["model_type"] == "llada"  # like the released checkpoint
    config = AutoConfig.from_pretrained(tiny_dirs["llada_moe"])
    assert type(config).__name__ == "LLaDAMoEConfig"


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_strict_load_rejects_missing_and_unexpected(family, tiny_dirs, tmp_path):
    src = tiny_dirs[family]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    tensors = load_file(src / "model.safetensors")
    dropped = sorted(tensors)[3]
    save_file({k: v for k, v in tensors.items() if k != dropped}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="missing keys"):
        AutoModel.from_pretrained(tmp_path)
    save_file({**tensors, "model.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="unexpected keys"):
        AutoModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_single(family, side):
    model = tiny_model(family, seed=2)
    seqs = random_seqs([6, 13, 9, 1])
    ids, mask = pad(seqs, side)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for i, s in enumerate(seqs):
            single = model(s[None]).logits[0]
            torch.testing.assert_close(batched[i, real_slice(len(s), ids.shape[1], side)], single, **TOL)


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
def test_packed_equals_padded(family, backend):
    model = tiny_model(family, seed=3)
    seqs = random_seqs([7, 3, 12], seed=1)
    ids, mask = pad(seqs, "right")
    cu = torch.tensor([0, 7, 10, 22])
    with torch.no_grad():
        padded = model(ids, attention_mask=mask, attn_backend=backend).logits
        packed = model(torch.cat(seqs)[None], cu_seqlens=cu, attn_backend=backend).logits[0]
    for i, s in enumerate(seqs):
        torch.testing.assert_close(packed[cu[i]:cu[i + 1]], padded[i, : len(s)], **TOL)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_backends_agree_on_padded_batch(family):
    model = tiny_model(family, seed=4)
    ids, mask = pad(random_seqs([5, 10, 8], seed=2), "left")
    with torch.no_grad():
        outs = {b: model(ids, attention_mask=mask, attn_backend=b).logits for b in ("sdpa", "eager", "flex")}
    real = mask.bool()
    for b in ("eager", "flex"):
        torch.testing.assert_close(outs[b][real], outs["sdpa"][real], **TOL)


@pytest.mark.parametrize("family", MDLM_FAMILIES)
def test_logits_match_independent_reference(family):
    overrides = {"n_kv_heads": 2} if family == "llada" else {}
    if family == "llada_moe":
        overrides = {"moe_router_enable_expert_bias": True}
    model = tiny_model(family, seed=5, **overrides)
    if family == "llada_moe":  # a non-zero expert bias, so biased routing differs from unbiased weights
        for module in model.modules():
            if getattr(module, "expert_bias", None) is not None:
                module.expert_bias.copy_(torch.randn_like(module.expert_bias) * 0.05)
    raw = model.config.to_dict()
    state = {k: v.detach() for k, v in released_state_dict(model).items()}
    seqs = random_seqs([9, 4, 14], seed=3)
    ids, mask = pad(seqs, "left")
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
    for i, s in enumerate(seqs):
        expected = REFERENCE_FORWARDS[family](state, raw, s)
        torch.testing.assert_close(batched[i, ids.shape[1] - len(s):], expected, **TOL)


def test_dream_shift_semantics():
    model = tiny_model("dream", seed=6)
    spec = family_of(model)
    assert spec.logit_shift == 1 and dare.get_family("llada").logit_shift == 0
    seqs = random_seqs([5, 8], seed=4)
    with torch.no_grad():
        raw = model(seqs[0][None]).logits
        aligned = model.denoise(seqs[0][None])
    torch.testing.assert_close(aligned[:, 1:], raw[:, :-1], atol=0, rtol=0)  # token i predicted by output i-1
    torch.testing.assert_close(aligned[:, 0], raw[:, 0], atol=0, rtol=0)  # position 0 reuses its own output
    cu = torch.tensor([0, 5, 13])
    with torch.no_grad():
        packed = model.denoise(torch.cat(seqs)[None], cu_seqlens=cu)
        for i, s in enumerate(seqs):  # the shift restarts in every packed document
            single = model.denoise(s[None])[0]
            torch.testing.assert_close(packed[0, cu[i]:cu[i + 1]], single, **TOL)
    llada = tiny_model("llada")
    ids = seqs[0][None]
    with torch.no_grad():
        torch.testing.assert_close(llada.denoise(ids), llada(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_prefix_cache_is_exact_with_full_context_keys(family):
    """Suffix queries against cached full-context prefix K/V reproduce the full forward exactly."""
    model = tiny_model(family, seed=7)
    ids = random_seqs([16], seed=5)[0][None]
    pos = torch.arange(16)[None]
    with torch.no_grad():
        full = model(ids).logits
        cache = KVCache(mode="append")
        model(ids, cache=cache, position_ids=pos)
        cache.truncate(10).set_mode("read")
        suffix = model(ids[:, 10:], cache=cache, position_ids=pos[:, 10:]).logits
        torch.testing.assert_close(suffix, full[:, 10:], **TOL)
        assert cache.seq_len == 10  # read mode stores nothing
        dual = KVCache(mode="append")
        model(ids, cache=dual, position_ids=pos)
        dual.set_mode("replace", replace_start=4)
        block = model(ids[:, 4:8], cache=dual, position_ids=pos[:, 4:8]).logits
        torch.testing.assert_close(block, full[:, 4:8], **TOL)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_gradient_checkpointing_same_gradients(family):
    model = tiny_model(family, seed=8).train()
    ids = random_seqs([12], seed=6)[0][None]

    def grads():
        model.zero_grad()
        model(ids).logits.float().logsumexp(-1).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = grads()
    model.gradient_checkpointing_enable()
    checkpointed = grads()
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_bfloat16_forward_is_close_to_fp32(family):
    model = tiny_model(family, seed=9)
    ids = random_seqs([10], seed=7)[0][None]
    with torch.no_grad():
        ref = model(ids).logits
        low = model.to(torch.bfloat16)(ids).logits
    assert low.dtype == (torch.float32 if family == "llada2" else torch.bfloat16)  # LLaDA2 upcasts its logits
    assert (low.float() - ref).abs().max() < 0.05


def test_bad_inputs_give_one_line_errors():
    model = tiny_model("llada")
    with pytest.raises(InputError, match=r"input_ids must lie in \[0, 264\); got values in \[1, 999\]"):
        model(torch.tensor([[1, 999]]))
    with pytest.raises(InputError, match=r"got values in \[-3, 7\]"):
        model(torch.tensor([[7, -3]]))
    assert model(torch.tensor([[0, 263]])).logits.shape[1] == 2  # both ends of the vocabulary are ids
    with pytest.raises(InputError, match="attention_mask must have shape"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(InputError, match="cu_seqlens"):
        model(torch.tensor([[1, 2, 3]]), cu_seqlens=torch.tensor([0, 2]))
    with pytest.raises(InputError, match="position_ids are required"):
        model(torch.tensor([[1, 2]]), cache=KVCache())
    with pytest.raises(ConfigError, match="unknown attention backend 'sdp'.*did you mean 'sdpa'"):
        model(torch.tensor([[1, 2]]), attn_backend="sdp")


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_config_errors(family):
    spec = dare.get_family(family)
    config, _ = tiny_config(family)
    bad = config.to_dict()
    bad["mask_token_id"] = 5000
    with pytest.raises(ConfigError, match="mask_token_id=5000 is outside the vocabulary"):
        spec.model_class(spec.config_class.from_dict(bad))
    bad["mask_token_id"] = bad["eos_token_id"]
    with pytest.raises(ConfigError, match="must differ from eos"):
        spec.model_class(spec.config_class.from_dict(bad))
    missing = config.to_dict()
    key = spec.config_class.required_keys[0]
    del missing[key]
    with pytest.raises(ConfigError, match=f"missing required key.*{key}"):
        spec.model_class(spec.config_class.from_dict(missing))


def test_unknown_family_error():
    with pytest.raises(ConfigError, match="unknown model family 'drem'.*did you mean 'dream'"):
        dare.get_family("drem")


def test_placeholder_minus_one_is_rejected():
    config, _ = tiny_config("llada_moe")
    raw = config.to_dict()
    raw["partial_rotary_factor"] = -1
    with pytest.raises(ConfigError, match="placeholder -1.*partial_rotary_factor"):
        dare.get_family("llada_moe").model_class(type(config).from_dict(raw))


def test_load_model_mistakes_from_python_are_one_line_errors(tmp_path):
    """Before: torch's AssertionError (CUDA without CUDA), RuntimeError (a misspelt device), TypeError (int8)."""
    from dare.models.loading import load_model

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^device cuda: CUDA is not available on this machine"):
            load_model("tiny:llada", device="cuda")
    with pytest.raises(ConfigError, match=r"^device gpu: not a torch device"):
        load_model("tiny:llada", device="gpu")
    with pytest.raises(ConfigError, match=r"^dtype torch.int8 is not a floating-point dtype"):
        load_model("tiny:llada", dtype=torch.int8)
    assert load_model("tiny:llada", device=torch.device("cpu"), dtype=torch.float64).dtype == torch.float64


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_generate_is_missing_with_a_message_that_says_how_to_decode(family):
    """``model.generate`` / ``model.diffusion_generate`` (transformers' and the released remote code's habits) stay
    AttributeErrors, so ``hasattr`` probes see no such method, and the message names DARE's way to decode."""
    model = dare.models.tiny.tiny_model(family)
    for name in ("generate", "diffusion_generate"):
        assert not hasattr(model, name)
        with pytest.raises(AttributeError, match=rf"no attribute '{name}': DARE's models decode with a sampler: "
                                                 r"dare\.rollout\.generate\(model"):
            getattr(model, name)
    with pytest.raises(AttributeError, match=r"object has no attribute 'generat'$"):  # any other name: unchanged
        model.generat
    assert isinstance(model.blocks, torch.nn.ModuleList)  # submodules still resolve through nn.Module


def test_a_family_whose_config_subclasses_another_familys_is_its_own():
    """family_of takes the nearest registered class of the config's MRO: a plug-in family derived from LLaDA's
    classes gets its own spec (ids, default sampler), not LLaDA's, whatever the registration order."""
    import dataclasses

    from dare.models import FAMILIES, register_family
    from dare.models.llada import LLADA, LLaDAConfig, LLaDAModelLM, tiny_llada_config

    class SubConfig(LLaDAConfig):
        model_type = "llada_sub_test"

    class SubModel(LLaDAModelLM):
        config_class = SubConfig

    def tiny(**kwargs):
        return {**tiny_llada_config(**kwargs), "model_type": "llada_sub_test", "architectures": ["SubModel"]}

    try:
        sub = register_family(dataclasses.replace(LLADA, name="llada_sub_test", config_class=SubConfig,
                                                  model_class=SubModel, tiny_config=tiny, mask_token_id=7))
        model = tiny_model("llada_sub_test")
        assert type(model) is SubModel and family_of(model) is sub and family_of(SubConfig()).mask_token_id == 7
        assert family_of(tiny_model("llada")) is LLADA
    finally:
        FAMILIES.pop("llada_sub_test", None)
