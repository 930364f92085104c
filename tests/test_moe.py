"""Grouped-matmul experts (dare.models.moe): equal to the loop over experts, per family and at the bank level."""

import pytest
import torch

from dare.errors import ConfigError
from dare.models.moe import ExpertBank, grouped_mm_applies, released_state_dict, set_expert_backend
from dare.models.tiny import tiny_model

MOE_FAMILIES = ["llada_moe", "sdar_moe", "llada2"]
FAST_BACKENDS = ["grouped_mm", "padded_bmm"]


def outputs_and_grads(model, ids, backend):
    set_expert_backend(model, backend)
    model.zero_grad()
    logits = model(ids).logits
    (logits.float() * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach(), grads


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_family_forward_and_gradients_equal_the_loop(family, backend):
    model = tiny_model(family, seed=4).train()
    ids = torch.randint(0, 256, (3, 13), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_grads = outputs_and_grads(model, ids, "loop")
    logits, grads = outputs_and_grads(model, ids, backend)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert any("experts.gate_up_proj" in n and g.abs().sum() > 0 for n, g in grads.items())
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def bank_and_inputs(tokens=11, n_experts=6, seed=0):
    torch.manual_seed(seed)
    bank = ExpertBank(n_experts, 16, 8)
    bank.reset_parameters(std=0.3)
    return bank, torch.randn(tokens, 16)


def bank_grads(bank, x, chosen, backend):
    bank.backend = backend
    bank.zero_grad()
    x = x.clone().requires_grad_()
    out = bank(x, chosen)
    (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
    return out.detach(), x.grad, bank.gate_up_proj.grad.clone(), bank.down_proj.grad.clone()


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_bank_with_idle_experts_and_uneven_loads_equals_the_loop(backend):
    bank, x = bank_and_inputs()
    # 11 tokens: experts 0, 2 and 5 get no row, expert 1 ten, expert 3 one, expert 4 eleven
    chosen = torch.tensor([[1, 4]] * 9 + [[3, 4], [4, 1]])
    reference = bank_grads(bank, x, chosen, "loop")
    got = bank_grads(bank, x, chosen, backend)
    for a, b in zip(got, reference):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    idle = torch.tensor([0, 2, 5])
    assert torch.all(got[2][idle] == 0) and torch.all(got[3][idle] == 0)  # idle experts: zero gradient
    assert got[2][torch.tensor([1, 3, 4])].abs().sum(dim=(1, 2)).min() > 0


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_bank_output_is_the_chosen_experts_swiglu(backend):
    bank, x = bank_and_inputs(tokens=5, seed=2)
    chosen = torch.tensor([[0, 5], [5, 0], [2, 2], [1, 3], [4, 0]])
    bank.backend = backend
    out = bank(x, chosen)
    for t in range(5):
        for j in range(2):
            gate, up = (x[t] @ bank.gate_up_proj[chosen[t, j]].T).chunk(2)
            expected = (torch.nn.functional.silu(gate) * up) @ bank.down_proj[chosen[t, j]].T
            torch.testing.assert_close(out[t, j], expected, atol=1e-6, rtol=1e-5)


def test_auto_picks_grouped_mm_for_fp32_and_falls_back_for_fp64():
    bank, x = bank_and_inputs()
    assert grouped_mm_applies(x, bank.gate_up_proj, bank.down_proj)
    assert not grouped_mm_applies(x.double(), bank.gate_up_proj.double(), bank.down_proj.double())
    assert not grouped_mm_applies(x[:, :6].contiguous(), bank.gate_up_proj[..., :6].contiguous())  # 24-byte rows
    chosen = torch.randint(0, 6, (11, 2), generator=torch.Generator().manual_seed(1))
    bank.double()
    reference = bank_grads(bank, x.double(), chosen, "loop")
    got = bank_grads(bank, x.double(), chosen, "auto")
    for a, b in zip(got, reference):
        torch.testing.assert_close(a, b)


def test_bfloat16_grouped_mm_is_close_to_fp32():
    bank, x = bank_and_inputs(tokens=32)
    chosen = torch.randint(0, 6, (32, 2), generator=torch.Generator().manual_seed(3))
    bank.backend = "grouped_mm"
    fp32 = bank(x, chosen)
    bf16 = bank.to(torch.bfloat16)(x.bfloat16(), chosen)
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), fp32, atol=0.05, rtol=0.05)


def test_unknown_backend_is_a_one_line_error():
    with pytest.raises(ConfigError, match="unknown expert backend 'grouped' \\(did you mean 'grouped_mm'"):
        set_expert_backend(tiny_model("llada2"), "grouped")


def test_stacked_parameters_keep_released_names():
    model = tiny_model("sdar_moe", seed=0)
    names = released_state_dict(model)
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names
    assert not any(k.endswith("gate_up_proj") for k in names)
    bank = model.model.layers[1].mlp.experts
    assert torch.equal(names["model.layers.1.mlp.experts.7.up_proj.weight"], bank.gate_up_proj[7, 32:])
    assert torch.equal(names["model.layers.1.mlp.experts.2.down_proj.weight"], bank.down_proj[2])


def test_lora_on_moe_model_merges_into_a_released_checkpoint(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModel

    from dare.models.lora import apply_lora

    targets = r".*\.layers\.\d+\.(attention\.(query_key_value|dense)|mlp\.shared_experts\.(gate_proj|up_proj))"
    lora = apply_lora(tiny_model("llada2", seed=2), r=4, target_modules=targets)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = lora(ids).logits
        assert not torch.allclose(expected, tiny_model("llada2", seed=2)(ids).logits)  # the adapter matters
    lora.merge_and_unload().save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in saved and not any("lora" in k for k in saved)
    with torch.no_grad():
        torch.testing.assert_close(AutoModel.from_pretrained(tmp_path)(ids).logits, expected)


def test_checkpoint_missing_one_expert_tensor_is_a_one_line_error(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    from dare.models.tiny import write_tiny_checkpoint

    path = write_tiny_checkpoint("llada2", tmp_path, seed=0)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="per-expert tensors \\(experts.N.\\*\\) are incomplete or mis-shaped"):
        AutoModel.from_pretrained(path)
