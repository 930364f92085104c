"""RMSNorm order per family in bf16: SDAR / SDAR-MoE multiply by the weight in fp32 before the cast (the fused
triton RMSNorm of their reference); the HF-style families cast first, then multiply in bf16."""

import pytest
import torch
from conftest import ALL_FAMILIES

from dare.models.layers import RMSNorm
from dare.models.tiny import tiny_model

FUSED_ORDER = {"sdar", "sdar_moe"}


def scale_in_fp32(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def cast_first(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_norm_of_a_bf16_model_follows_its_reference_order(family):
    model = tiny_model(family, seed=0).to(torch.bfloat16)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert norms
    generator = torch.Generator().manual_seed(0)
    expected, other = (scale_in_fp32, cast_first) if family in FUSED_ORDER else (cast_first, scale_in_fp32)
    differs = False
    for norm in norms:
        with torch.no_grad():
            norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=generator))
        x = torch.randn(64, norm.weight.shape[0], generator=generator).to(torch.bfloat16)
        out = norm(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, expected(x, norm.weight, norm.eps), atol=0, rtol=0)
        differs |= not torch.equal(out, other(x, norm.weight, norm.eps))
    assert differs  # the two orders really differ in bf16 on these inputs (the test can tell them apart)


def test_the_orders_agree_in_fp32():
    norm = RMSNorm(64, 1e-6, scale_in_fp32=True)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(8, 64)
    torch.testing.assert_close(norm(x), cast_first(x, norm.weight, norm.eps), atol=1e-7, rtol=1e-6)
