"""Masked grouped-query attention on the ``sdpa`` backend (``dare.models.attention._masked_gqa_sdpa``).

PyTorch's fused SDPA kernels refuse ``enable_gqa`` with a mask, so DARE folds the query heads of each KV head into
its query axis (short query blocks) or repeats the KV heads (long rows). Both layouts must be the attention of a
float64 reference (KV heads repeated, masked softmax), values and gradients.
"""

import pytest
import torch

from dare.models.attention import AttentionLayout, attend, folds_query_groups


def _inputs(batch=2, heads=8, kv_heads=2, queries=4, keys=11, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(batch, kv_heads, keys, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, kv_heads, keys, dim, generator=gen, dtype=torch.float64, requires_grad=True)
    return q, k, v


def _layouts(batch, queries, keys):
    key_mask = torch.ones(batch, keys, dtype=torch.bool)
    key_mask[0, :3] = False  # left padding of row 0
    padding = AttentionLayout(batch, queries, keys, torch.device("cpu"), key_mask=key_mask)
    # block-causal over a cache: query block = the last `queries` keys, blocks of 2 keys
    k_block = (torch.arange(keys) // 2)[None].expand(batch, keys)
    q_block = k_block[:, keys - queries:]
    blocks = AttentionLayout(batch, queries, keys, torch.device("cpu"), key_mask=key_mask, q_block=q_block,
                             k_block=k_block)
    return {"padding": padding, "block_causal": blocks}


def _reference(q, k, v, layout):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    probs = torch.softmax(scores.masked_fill(~layout.dense_mask(), float("-inf")), dim=-1)
    out = probs @ v
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _attention_and_grads(backend, layout, q, k, v):
    out = _reference(q, k, v, layout) if backend == "reference" else attend(q, k, v, layout, backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    return out, grads


@pytest.mark.parametrize("mask", ["padding", "block_causal"])
@pytest.mark.parametrize("queries,keys", [(4, 11), (6, 6)])
def test_masked_gqa_sdpa_equals_the_reference_loop(mask, queries, keys):
    q, k, v = _inputs(queries=queries, keys=keys)
    layout = _layouts(2, queries, keys)[mask]
    ref, ref_grads = _attention_and_grads("reference", layout, q, k, v)
    out, grads = _attention_and_grads("sdpa", layout, q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_both_gqa_layouts_are_exercised_and_agree(monkeypatch):
    """Force each layout in turn on a query-dependent (block-causal) mask: folded == repeated == reference."""
    import dare.models.attention as attention

    q, k, v = _inputs(queries=4, keys=11, seed=3)
    layout = _layouts(2, 4, 11)["block_causal"]
    assert layout.dense_mask().shape[-2] == 4  # a query-dependent mask: folding must repeat it
    ref, _ = _attention_and_grads("reference", layout, q, k, v)
    outputs = {}
    for fold in (True, False):
        monkeypatch.setattr(attention, "folds_query_groups", lambda *args, fold=fold: fold)
        outputs[fold], _ = _attention_and_grads("sdpa", layout, q, k, v)
        torch.testing.assert_close(outputs[fold], ref, atol=1e-12, rtol=1e-10)


def test_folding_is_chosen_for_decoding_blocks_and_repeating_for_long_rows():
    per_query = torch.ones(1, 1, 4, 8, dtype=torch.bool)
    per_key = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    assert folds_query_groups(4, per_query, groups=4, heads=32, head_dim=128)  # a 4-token block step
    assert not folds_query_groups(8192, torch.ones(1, 1, 8192, 8, dtype=torch.bool), groups=4, heads=32, head_dim=128)
    assert folds_query_groups(8192, per_key, groups=4, heads=32, head_dim=128)  # padding only: no repetition
