"""Fused q/k/v and gate/up projections (dare.models.fusion) and the rollout engine's use of them."""

import functools

import pytest
import torch
from peft import LoraConfig

from dare.errors import ConfigError
from dare.models.fusion import FusedProjections
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate
from dare.rollout.engine import engine_stats
from dare.rollout.engine.fused import FUSE_MAX_ROWS, LORA_FUSE_MAX_ROWS, fused_projections, wants_fusion
from rollout_helpers import padded, sharp_model, single_thread, trained_lora  # noqa: F401

FAMILIES = ["llada", "dream", "sdar", "llada_moe", "llada2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_forward_equals_the_separate_projections(family):
    model = tiny_model(family, seed=0).eval()
    ids = torch.randint(0, 200, (2, 12))
    fused = FusedProjections(model)
    assert fused and fused.nbytes > 0
    with torch.no_grad():
        separate = model(ids).logits
        with fused.active():
            together = model(ids).logits
        after = model(ids).logits
    torch.testing.assert_close(together, separate, atol=1e-5, rtol=1e-5)
    assert torch.equal(after, separate)  # leaving the context restores the separate path


def test_the_copies_follow_in_place_updates_only_after_a_refresh():
    model = tiny_model("llada", seed=0).eval()
    ids = torch.randint(0, 200, (1, 10))
    fused = FusedProjections(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # an optimizer step
        updated = model(ids).logits
        with fused.active():
            stale = model(ids).logits
        fused.refresh()
        with fused.active():
            fresh = model(ids).logits
    assert not torch.allclose(stale, updated, atol=1e-3)
    torch.testing.assert_close(fresh, updated, atol=1e-5, rtol=1e-5)


class _Linears(torch.overrides.TorchFunctionMode):
    """Counts ``F.linear`` calls."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.nn.functional.linear
        return func(*args, **(kwargs or {}))


_trained_lora = functools.partial(trained_lora, alpha=8)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_projections_fuse_with_their_adapters_unmerged(family):
    """``fused`` copies of a LoRA policy: every adapted projection is copied (single ones too), the adapters'
    lora_A rows follow the base rows, and the forward equals peft's wrapped forward."""
    model = _trained_lora(family).eval()
    base = model.get_base_model()
    ids = torch.randint(0, 200, (2, 12))
    fused = FusedProjections(base)
    assert fused.keeps_lora and not fused.merges_lora
    adapted = [entry for *_, entry in fused.groups if entry.adapters]
    assert adapted and any(len(entry.sizes) == 1 for entry in adapted)
    for entry in adapted:  # base rows, then 4 lora_A rows per adapted member
        assert entry.weight.shape[0] == sum(entry.sizes) + 4 * sum(len(a) for a in entry.adapters)
    with torch.no_grad():
        wrapped = model(ids).logits
        with fused.active():
            together = model(ids).logits
        with model.disable_adapter():
            plain = model(ids).logits
    assert not torch.allclose(plain, wrapped, atol=1e-3)  # the adapters matter, and the copies apply them
    torch.testing.assert_close(together, wrapped, atol=1e-5, rtol=1e-5)


def test_lora_copies_under_autocast_compute_the_adapters_in_its_dtype():
    """bf16 weights with peft's fp32 adapters: without autocast peft computes the adapters in fp32, which the
    copies leave separate; under bf16 autocast (as the RL trainer decodes) they are fused, in bf16."""
    model = _trained_lora(dtype=torch.bfloat16).eval()
    base = model.get_base_model()
    assert next(p for n, p in model.named_parameters() if "lora_A" in n).dtype == torch.float32
    assert not FusedProjections(base).keeps_lora
    half_adapters = _trained_lora(dtype=torch.bfloat16)
    half_adapters.to(torch.bfloat16)  # bf16 adapters under fp16 autocast: peft rounds their input to bf16 first
    assert FusedProjections(half_adapters.get_base_model(), torch.bfloat16).keeps_lora
    assert not FusedProjections(half_adapters.get_base_model(), torch.float16).keeps_lora
    fused = FusedProjections(base, torch.bfloat16)
    assert fused.keeps_lora and all(a.up.dtype == torch.bfloat16 for *_, e in fused.groups for m in e.adapters
                                    for a in m)
    ids = torch.randint(0, 200, (2, 12))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        wrapped = model(ids).logits
        with fused.active():
            together = model(ids).logits
    torch.testing.assert_close(together.float(), wrapped.float(), atol=0.05, rtol=0.02)


def _lora_calls(model) -> list:
    """Records each call of a peft ``lora_A`` module of ``model``."""
    calls = []
    for name, module in model.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_adapter_copies_compute_what_peft_computes_under_autocast(family):
    """``adapters`` copies (steps too large for fused copies): the base projections stay the model's own, the fp32
    adapters are copied in bf16 once, and the forward equals peft's under bf16 autocast bit for bit - adapters on
    or off, after an update once refreshed - without calling peft's adapter layers."""
    model = _trained_lora(family, dtype=torch.bfloat16).eval()
    base = model.get_base_model()
    copies = FusedProjections(base, torch.bfloat16, mode="adapters")
    entries = [entry for *_, entry in copies.groups]
    assert entries and all(entry.weight is None for entry in entries)
    assert all(a.down.dtype == a.up.dtype == torch.bfloat16 and a.down.shape[0] == 4
               for entry in entries for member in entry.adapters for a in member)
    assert copies.nbytes == sum(p.numel() * 2 for n, p in model.named_parameters() if "lora_" in n)
    assert not copies.merges_lora
    assert not FusedProjections(base, None, mode="adapters")  # nothing would be cast without autocast
    half = _trained_lora(family, dtype=torch.bfloat16).to(torch.bfloat16)
    assert not FusedProjections(half.get_base_model(), torch.bfloat16, mode="adapters")  # nor adapters in bf16
    ids = torch.randint(0, 200, (2, 12))
    calls = _lora_calls(model)

    def both():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            wrapped = model(ids).logits
            peft_calls = len(calls)
            with copies.active():
                copied = model(ids).logits
            assert len(calls) == peft_calls  # the copies never reach peft's layers
        return wrapped, copied

    wrapped, copied = both()
    assert calls and torch.equal(copied, wrapped)
    with model.disable_adapter():
        plain, copied_plain = both()
    assert torch.equal(copied_plain, plain) and not torch.equal(plain, wrapped)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.05)  # an optimizer step on the adapters
    stale = both()
    assert not torch.equal(*stale)
    copies.refresh()
    assert torch.equal(*both())


def test_lora_copies_follow_adapter_updates_and_switches():
    model = _trained_lora().eval()
    base = model.get_base_model()
    ids = torch.randint(0, 200, (1, 10))
    copies, replaced = fused_projections(base, None)
    assert copies.keeps_lora and not replaced
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.05)  # an optimizer step on the adapters
        updated = model(ids).logits
        with copies.active():
            stale = model(ids).logits
        again, replaced = fused_projections(base, None)  # what every rollout call does: refresh in place
        assert again is copies and not replaced
        with copies.active():
            fresh = model(ids).logits
    assert not torch.allclose(stale, updated, atol=1e-4)
    torch.testing.assert_close(fresh, updated, atol=1e-5, rtol=1e-5)
    with model.disable_adapter():  # the same copies; the adapters are skipped
        off, replaced = fused_projections(base, None)
        assert off is copies and not replaced
        with torch.no_grad():
            plain = model(ids).logits
            with off.active():
                torch.testing.assert_close(model(ids).logits, plain, atol=1e-5, rtol=1e-5)
                with _Linears() as disabled:
                    model(ids)
    with torch.no_grad(), copies.active(), _Linears() as enabled:
        model(ids)
    adapters = sum(len(member) for *_, entry in copies.groups for member in entry.adapters)
    assert adapters and enabled.count - disabled.count == adapters  # no lora_B matmul while off
    assert not torch.allclose(plain, updated, atol=1e-4)
    model.base_model.set_adapter("default")
    model.add_adapter("other", LoraConfig(r=2, target_modules=["q_proj"]))
    model.base_model.set_adapter("other")  # another adapter: other copies
    assert not copies.matches(base)
    with pytest.raises(RuntimeError, match="active adapters changed"):
        copies.refresh()
    other, replaced = fused_projections(base, None)
    assert replaced and other.keeps_lora


def test_copies_keep_their_addresses_and_are_rebuilt_when_modules_change():
    model = tiny_model("sdar", seed=0)
    first, replaced = fused_projections(model, None)
    assert first is not None and not replaced
    address = first.groups[0][3].weight.data_ptr()
    again, replaced = fused_projections(model, None)
    assert again is first and not replaced and first.groups[0][3].weight.data_ptr() == address
    attention = model.blocks[0].self_attn
    attention.q_proj = torch.nn.Linear(attention.q_proj.in_features, attention.q_proj.out_features, bias=False)
    rebuilt, replaced = fused_projections(model, None)
    assert rebuilt is not first and replaced  # graphs recorded with the old copies must be dropped
    bf16, _ = fused_projections(model, torch.bfloat16)
    assert bf16.groups[0][3].weight.dtype == torch.bfloat16


def test_only_small_steps_are_fused(monkeypatch):
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=256, block_length=32)
    assert wants_fusion(1, config) and wants_fusion(FUSE_MAX_ROWS // 32, config)
    assert not wants_fusion(16, config)
    assert wants_fusion(LORA_FUSE_MAX_ROWS // 32, config, lora=True) and not wants_fusion(32, config, lora=True)
    no_cache = config.replace(sampler="llada", cache="none")  # every forward computes prompt and generation
    assert wants_fusion(1, no_cache, prompt_width=192) and wants_fusion(8, no_cache, prompt_width=192)
    assert wants_fusion(1, no_cache, lora=True, prompt_width=192)  # 448 rows
    assert not wants_fusion(2, no_cache, lora=True, prompt_width=192)
    assert not wants_fusion(4, config.replace(cache="prefix"), lora=True)  # 4 x 256 rows at the first block
    monkeypatch.setenv("DARE_FUSE_MAX_ROWS", "512")
    assert wants_fusion(16, config) and not wants_fusion(32, config)
    assert not wants_fusion(32, config, lora=True)  # the switch moves both limits
    monkeypatch.setenv("DARE_FUSE_MAX_ROWS", "lots")
    with pytest.raises(ConfigError, match="DARE_FUSE_MAX_ROWS"):
        wants_fusion(1, config)
    monkeypatch.delenv("DARE_FUSE_MAX_ROWS")
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")
    assert not wants_fusion(1, config)


@pytest.mark.parametrize("family,overrides", [("llada", dict(sampler="fastdllm", cache="dual", threshold=0.3)),
                                              ("sdar", dict(sampler="sdar", cache="block"))])
def test_static_engine_with_fused_projections_equals_without(family, overrides, monkeypatch):
    model = sharp_model(family)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=32, block_length=8, temperature=0.7, **overrides)
    fused = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    assert engine_stats(model).fused_bytes > 0
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")
    separate = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    assert torch.equal(fused.completion, separate.completion)
    assert torch.equal(fused.step_map, separate.step_map)
    torch.testing.assert_close(fused.logprobs, separate.logprobs, atol=1e-5, rtol=0)


def test_static_engine_decodes_a_lora_policy_with_fused_copies_as_without(monkeypatch):
    model = _trained_lora(seed=1).eval()
    with torch.no_grad():
        model.get_base_model().get_output_embeddings().weight.mul_(50.0)  # spread confidences (sharp_model)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=32, block_length=8, temperature=0.7, sampler="fastdllm", cache="dual",
                           threshold=0.3)
    fused = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    assert engine_stats(model).fused_bytes > 0
    with model.disable_adapter():
        reference = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    greedy = config.replace(temperature=0.0)
    fused_greedy = generate(model, ids, mask, greedy, engine="static")
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")
    separate = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    with model.disable_adapter():
        reference_separate = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
    eager = generate(model, ids, mask, greedy, engine="eager")  # the engine's random streams are its own
    for a, b in ((fused, separate), (reference, reference_separate), (fused_greedy, eager)):
        assert torch.equal(a.completion, b.completion)
        assert torch.equal(a.step_map, b.step_map)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert not torch.equal(fused.completion, reference.completion)  # the adapters changed the decoding


def test_a_lora_policy_fuses_larger_steps(monkeypatch):
    from dare.rollout.engine import fused as fused_module

    monkeypatch.setattr(fused_module, "FUSE_MAX_ROWS", 16)  # a step of 3 rows x block 8 = 24 rows
    monkeypatch.setattr(fused_module, "LORA_FUSE_MAX_ROWS", 32)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, sampler="fastdllm", cache="dual")
    plain, lora = sharp_model("llada"), _trained_lora().eval()
    for model in (plain, lora):
        generate(model, ids, mask, config, engine="static")
    assert engine_stats(plain).fused_bytes == 0 and engine_stats(lora).fused_bytes > 0


def test_a_lora_policy_under_autocast_decodes_large_steps_with_adapter_copies(monkeypatch):
    """Steps past the fused copies' row limit: a LoRA policy under autocast decodes with copies of its adapters only
    (peft's adapter layers are never called; the copies' bytes in engine_stats), the same tokens, step maps and
    log-probs as peft's own layers (DARE_FUSE_PROJECTIONS=0); without autocast peft's layers compute (fp32
    adapters in fp32), and a plain bf16 model gets no copies."""
    from dare.rollout.engine import fused as fused_module

    monkeypatch.setattr(fused_module, "FUSE_MAX_ROWS", 8)  # a step of 3 rows x block 8 = 24 rows
    monkeypatch.setattr(fused_module, "LORA_FUSE_MAX_ROWS", 8)
    model = _trained_lora(seed=1, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        model.get_base_model().get_output_embeddings().weight.mul_(50.0)  # spread confidences (sharp_model)
    adapter_bytes = sum(p.numel() * 2 for n, p in model.named_parameters() if "lora_" in n)
    calls = _lora_calls(model)
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, temperature=0.7, sampler="fastdllm", cache="dual",
                           threshold=0.3)
    outputs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv("DARE_FUSE_PROJECTIONS", switch)
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs[switch] = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
        assert bool(calls) == (switch == "0")
    assert engine_stats(model).fused_bytes == adapter_bytes
    copied, peft_layers = outputs["1"], outputs["0"]
    assert torch.equal(copied.completion, peft_layers.completion)
    assert torch.equal(copied.step_map, peft_layers.step_map)
    assert torch.equal(copied.logprobs, peft_layers.logprobs)
    monkeypatch.delenv("DARE_FUSE_PROJECTIONS")
    calls.clear()
    generate(model, ids, mask, config, engine="static")
    assert calls
    plain = sharp_model("llada", dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        generate(plain, ids, mask, config, engine="static")
    assert engine_stats(plain).fused_bytes == 0


class _LinearWeightDtypes(torch.overrides.TorchFunctionMode):
    """Records the weight dtype of each ``F.linear`` call."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear:
            self.dtypes.append(args[1].dtype)
        return func(*args, **(kwargs or {}))


def test_fp32_master_weights_under_autocast_decode_large_steps_from_bf16_copies(monkeypatch):
    """fp32 weights decoding under bf16 autocast (the RL trainer's rollouts of fp32 master weights on one GPU), at
    steps past the fused row limit: every projection is copied in bf16 (single ones too: the copy is the cast
    autocast would make at every call), so only the LM head's matmul still reads fp32 weights; the same tokens, step
    maps and log-probs as with autocast's own casts (DARE_FUSE_PROJECTIONS=0)."""
    from dare.models.fusion import FusedProjections as Copies
    from dare.rollout.engine import fused as fused_module

    monkeypatch.setattr(fused_module, "FUSE_MAX_ROWS", 8)  # a step of 3 rows x block 8 = 24 rows
    model = sharp_model("llada")
    projections = sum(getattr(m, n).weight.numel() for m in model.modules()
                      for names in getattr(m, "fused_groups", {}).values() for n in names)
    assert Copies(model, torch.bfloat16).nbytes == projections * 2
    assert all(len(members) > 1 for _, _, members, _ in Copies(model).groups)  # in its own dtype: groups only
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, sampler="fastdllm", cache="dual", threshold=0.3)
    outputs, fp32_matmuls = {}, {}
    for switch in ("1", "0"):
        monkeypatch.setenv("DARE_FUSE_PROJECTIONS", switch)
        with torch.autocast("cpu", dtype=torch.bfloat16), _LinearWeightDtypes() as seen:
            outputs[switch] = generate(model, ids, mask, config, engine="static")
        fp32_matmuls[switch] = seen.dtypes.count(torch.float32)
    assert engine_stats(model).fused_bytes == projections * 2
    heads = outputs["1"].nfe  # one LM head matmul per forward
    assert fp32_matmuls["1"] == heads and fp32_matmuls["0"] > heads * len(model.blocks) * 4
    assert torch.equal(outputs["1"].completion, outputs["0"].completion)
    assert torch.equal(outputs["1"].step_map, outputs["0"].step_map)
    assert torch.equal(outputs["1"].logprobs, outputs["0"].logprobs)


def test_copies_that_do_not_fit_decode_unfused_with_one_warning(monkeypatch, caplog):
    from dare.rollout import engine

    model = sharp_model("llada")
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, sampler="fastdllm", cache="dual")
    calls = []

    def out_of_memory(*args, **kwargs):
        calls.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.70 GiB")

    monkeypatch.setattr(engine, "fused_projections", out_of_memory)
    with caplog.at_level("WARNING", logger="dare.rollout"):
        first = generate(model, ids, mask, config, engine="static")
        again = generate(model, ids, mask, config, engine="static")
    assert calls == [1]  # not retried on every call
    assert caplog.text.count("no memory for the fused") == 1 and engine_stats(model).fused_bytes == 0
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")
    separate = generate(model, ids, mask, config, engine="static")
    assert torch.equal(first.completion, separate.completion) and torch.equal(again.completion, separate.completion)
    engine.release(model)  # memory freed: the copies are tried again
    monkeypatch.delenv("DARE_FUSE_PROJECTIONS")
    generate(model, ids, mask, config, engine="static")
    assert calls == [1, 1]


def test_steps_recorded_with_copies_are_dropped_when_the_copies_are_freed(monkeypatch):
    """Running out of memory for one kind of copies frees every kind (``release_fused``): the states recorded with
    the freed FP8 copies must not be replayed, and the next FP8 call decodes as before over new copies."""
    from dare.rollout import engine

    model = sharp_model("llada")
    ids, mask = padded([9, 14, 5])
    config = SamplerConfig(gen_length=16, block_length=8, sampler="fastdllm", cache="dual", weights="fp8")
    before = generate(model, ids, mask, config, engine="static")
    assert any(key for key in engine._STATES[model])
    real = engine.fused_projections

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(engine, "fused_projections", out_of_memory)
    generate(model, ids, mask, config.replace(weights="model"), engine="static")
    assert len(engine._STATES[model]) == 1  # only the state of this unfused call: the FP8 ones were dropped
    monkeypatch.setattr(engine, "fused_projections", real)
    after = generate(model, ids, mask, config, engine="static")
    assert torch.equal(after.completion, before.completion)
    torch.testing.assert_close(after.logprobs, before.logprobs, atol=0, rtol=0)
    engine.release(model)
