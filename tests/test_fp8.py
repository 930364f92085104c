"""Decoding with copies of the projections (``SamplerConfig.weights``): ``fp8`` (the quantisation, the matmul,
which projections it covers, the engine's use of it; CPU: PyTorch's own ``_scaled_mm`` kernel) and ``merged``
(LoRA adapters merged into copies in the model's dtype)."""

import pytest
import torch
import torch.nn as nn

import dare.models.fusion as fusion
from dare.errors import ConfigError
from dare.models.fp8 import FP8, FP8_MAX, fp8_linear, quantize_activation, quantize_rows
from dare.models.fusion import FusedProjections
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate
from rollout_helpers import single_thread, trained_lora  # noqa: F401

FAMILIES = ["llada", "dream", "sdar", "llada_moe", "llada2", "sdar_moe"]


def _quantized(weight):
    q = torch.empty(weight.shape, dtype=FP8)
    scale = torch.empty(weight.shape[0])
    quantize_rows(weight, q, scale)
    return q, scale


def test_row_quantisation_keeps_e4m3_precision_per_channel():
    torch.manual_seed(0)
    w = torch.randn(6, 64) * torch.tensor([1e-3, 0.02, 1.0, 30.0, 0.0, 5.0])[:, None]
    q, scale = _quantized(w)
    back = q.float() * scale[:, None]
    # each row's largest magnitude maps to +-448 and back to itself
    torch.testing.assert_close(back.abs().amax(1)[[0, 1, 2, 3, 5]], w.abs().amax(1)[[0, 1, 2, 3, 5]])
    # 3 mantissa bits: half a unit in the last place is 2^-4 of the value (2^-10 of the scale among subnormals)
    bound = torch.maximum(w.abs() * 2.0 ** -4, scale[:, None] * 2.0 ** -10) * 1.0001
    assert bool(((back - w).abs() <= bound).all())
    assert bool((back[4] == 0).all()) and float(scale[4]) > 0  # an all-zero channel stays zero, no division by 0
    assert 0 < float((back - w).abs().max()) and q.dtype == FP8


def test_fp8_linear_is_the_matmul_of_the_dequantised_operands():
    torch.manual_seed(0)
    x, w, bias = torch.randn(2, 5, 32), torch.randn(48, 32) * 0.1, torch.randn(48)
    q, scale = _quantized(w)
    out = fp8_linear(x, q, scale, bias)
    xq, x_scale = quantize_activation(x.reshape(-1, 32))
    expected = (xq.float() * x_scale) @ (q.float() * scale[:, None]).t() + bias
    assert out.shape == (2, 5, 48)
    torch.testing.assert_close(out.reshape(-1, 48), expected, atol=1e-5, rtol=1e-5)
    exact = x @ w.t() + bias
    error = float((out - exact).norm() / (exact - bias).norm())
    assert 1e-4 < error < 0.1, error  # quantised (not the fp32 product), within e4m3's few percent
    assert float(x_scale.max()) * FP8_MAX == pytest.approx(float(x.abs().max()), rel=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_copies_cover_every_dense_projection_of_the_blocks(family):
    model = tiny_model(family, seed=0)
    copies = FusedProjections(model, mode="fp8")
    covered = {id(m) for *_, members, _ in copies.groups for m in members}
    dense = {id(m) for block in model.blocks for name, m in block.named_modules()
             if type(m) is nn.Linear and not name.endswith("gate")}
    assert dense and covered == dense  # routers (``gate``) keep the model's weights, as does the LM head
    assert all(entry.weight.dtype == FP8 and entry.scale is not None for *_, entry in copies.groups)
    # in the model's dtype a group of one projection is never copied (nothing to fuse)
    assert all(len(members) > 1 for *_, members, _ in FusedProjections(model).groups)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_forward_stays_close_to_the_model_and_is_not_equal(family):
    model = tiny_model(family, seed=0)
    ids = torch.randint(0, 200, (2, 12))
    copies = FusedProjections(model, mode="fp8")
    with torch.no_grad():
        reference = model(ids).logits
        with copies.active():
            quantised = model(ids).logits
        after = model(ids).logits
    error = float((quantised - reference).norm() / reference.norm())
    assert 0 < error < 0.1, error
    assert torch.equal(after, reference)  # leaving the context restores the model's weights


def test_fp8_refresh_keeps_addresses_and_follows_the_weights():
    model = tiny_model("sdar", seed=0)
    copies = FusedProjections(model, mode="fp8")
    entry = copies.groups[0][3]
    addresses = (entry.weight.data_ptr(), entry.scale.data_ptr())
    before = entry.scale.clone()
    with torch.no_grad():
        for member in copies.groups[0][2]:
            member.weight.mul_(2.0)  # an optimizer step, in place
    copies.refresh()
    assert (entry.weight.data_ptr(), entry.scale.data_ptr()) == addresses
    torch.testing.assert_close(entry.scale, before * 2)


def _config(family, weights, **extra):
    if family == "sdar":
        return SamplerConfig(sampler="sdar", gen_length=12, engine="static", weights=weights, **extra)
    return SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8, engine="static",
                         weights=weights, **extra)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_fp8_decoding_runs_every_projection_through_the_copies(family, monkeypatch):
    model = tiny_model(family, seed=0)
    prompts = torch.randint(0, 200, (2, 8))
    called = set()
    real = fusion.fp8_linear

    def spy(x, weight, *args, **kwargs):
        called.add(weight.data_ptr())
        return real(x, weight, *args, **kwargs)

    monkeypatch.setattr(fusion, "fp8_linear", spy)
    out = generate(model, prompts, None, _config(family, "fp8"))
    reference = generate(model, prompts, None, _config(family, "model"))
    copies = FusedProjections(model, mode="fp8")
    assert len(called) == len(copies.groups)  # every group's FP8 copy was read
    assert out.completion.shape == reference.completion.shape
    assert not torch.equal(out.logprobs, reference.logprobs)  # the quantised weights were used


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_fp8_decoding_is_batch_invariant(family):
    """Activations are scaled per row, so a row decodes the same alone and in a batch."""
    model = tiny_model(family, seed=0)
    prompts = torch.randint(0, 200, (3, 8))
    config = _config(family, "fp8", temperature=1.0, seed=7)
    batched = generate(model, prompts, None, config)
    for i in range(3):
        alone = generate(model, prompts[i:i + 1], None, config, example_ids=[i])
        assert torch.equal(alone.completion[0], batched.completion[i])
        torch.testing.assert_close(alone.logprobs[0], batched.logprobs[i])


def test_fp8_setting_errors_are_one_line():
    model = tiny_model("llada", seed=0)
    prompts = torch.randint(0, 200, (1, 8))
    with pytest.raises(ConfigError, match="unknown weights 'fp4'"):
        SamplerConfig(sampler="fastdllm", gen_length=16, block_length=8, weights="fp4").resolved()
    with pytest.raises(ConfigError, match="static engines"):
        SamplerConfig(sampler="fastdllm", gen_length=16, block_length=8, engine="eager", weights="fp8").resolved()
    with pytest.raises(ConfigError, match="engine 'auto' is 'eager' on cpu"):
        generate(model, prompts, None, SamplerConfig(sampler="fastdllm", gen_length=16, block_length=8, weights="fp8"))
    from peft import LoraConfig, get_peft_model

    targets = r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)"
    dora = get_peft_model(tiny_model("llada", seed=0), LoraConfig(r=4, use_dora=True, target_modules=targets))
    with pytest.raises(ConfigError, match="no projection of this model can run in FP8"):  # DoRA: no weight form
        generate(dora, prompts, None, _config("llada", "fp8"))




def test_fp8_copies_of_a_lora_model_merge_its_active_adapters():
    model = trained_lora()
    copies = FusedProjections(model.get_base_model(), mode="fp8")
    assert len(copies.groups) == len(FusedProjections(tiny_model("llada", seed=0), mode="fp8").groups)
    reference = FusedProjections(trained_lora().merge_and_unload(), mode="fp8")  # adapters merged by peft
    for (*_, entry), (*_, expected) in zip(copies.groups, reference.groups):
        torch.testing.assert_close(entry.scale, expected.scale)
        assert float((entry.weight.float() != expected.weight.float()).float().mean()) < 0.01  # rounding ties
    with model.disable_adapter():  # adapters off: the copies hold the base weights
        copies.refresh()
    plain = FusedProjections(tiny_model("llada", seed=0), mode="fp8")
    for (*_, entry), (*_, expected) in zip(copies.groups, plain.groups):
        assert torch.equal(entry.scale, expected.scale) and torch.equal(entry.weight.float(), expected.weight.float())


def test_a_lora_policy_decodes_fp8_with_its_adapters():
    model = trained_lora()
    prompts = torch.randint(0, 200, (2, 8))
    with_adapters = generate(model, prompts, None, _config("llada", "fp8"))
    with model.disable_adapter():
        without = generate(model, prompts, None, _config("llada", "fp8"))
    merged = generate(trained_lora().merge_and_unload(), prompts, None, _config("llada", "fp8"))
    assert not torch.equal(with_adapters.logprobs, without.logprobs)  # the adapters reach the FP8 copies
    torch.testing.assert_close(with_adapters.logprobs, merged.logprobs, atol=0.05, rtol=0)


def test_merged_copies_decode_a_lora_policy_as_its_merged_model():
    """``weights='merged'``: LoRA adapters merged into copies in the model's dtype; in fp32 the decoding equals the
    one of the model peft merges itself, and stays within rounding of the adapter wrappers."""
    model = trained_lora()
    prompts = torch.randint(0, 200, (2, 8))
    merged_copies = generate(model, prompts, None, _config("llada", "merged"))
    wrapped = generate(model, prompts, None, _config("llada", "model"))
    merged_model = generate(trained_lora().merge_and_unload(), prompts, None, _config("llada", "model"))
    assert torch.equal(merged_copies.completion, merged_model.completion)
    torch.testing.assert_close(merged_copies.logprobs, merged_model.logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(merged_copies.logprobs, wrapped.logprobs, atol=1e-4, rtol=0)
    copies = FusedProjections(model.get_base_model(), mode="merged")
    assert copies and all(entry.weight.dtype == torch.float32 for *_, entry in copies.groups)
    with model.disable_adapter():  # the adapters' state is read at every refresh
        off = generate(model, prompts, None, _config("llada", "merged"))
    assert not torch.equal(off.logprobs, merged_copies.logprobs)


def test_merged_weights_need_a_lora_policy():
    with pytest.raises(ConfigError, match="no mergeable LoRA layer"):
        generate(tiny_model("llada", seed=0), torch.randint(0, 200, (1, 8)), None, _config("llada", "merged"))


def test_fp8_weights_on_a_gpu_without_fp8_matmuls_are_a_preflight_error(monkeypatch):
    """The dry run names a GPU without FP8 matmuls (an A100) before the policy loads, not its first rollout."""
    from dare.trainer.preflight import check_rollout_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ConfigError, match=r"^rollout.sampler: weights 'fp8': this GPU \(compute capability 8.0\) has "
                                          r"no FP8 matmuls; they need 8.9 or newer \(Ada, Hopper\); use weights"):
        check_rollout_engine(SamplerConfig(weights="fp8"), "cuda")
    check_rollout_engine(SamplerConfig(weights="merged"), "cuda")  # merged copies need no FP8
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_rollout_engine(SamplerConfig(weights="fp8"), "cuda")  # a Hopper GPU
