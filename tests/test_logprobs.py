"""Chunked log-probs at selected positions == the full-logits path (values and gradients), for every layout."""

import pytest
import torch

from dare.algorithms import get_algorithm, resolve_algorithm_config
from dare.algorithms.logprobs import aligned_logits, masked_logprobs, model_inputs, selected_logprobs
from dare.data.sft import build_sft_dataset, collate_packed, collate_padded
from dare.data.tokenizer import EOS_ID, PAD_ID, build_byte_tokenizer
from dare.errors import ConfigError
from dare.models import family_of
from dare.models.tiny import tiny_model
from dare.trainer.config import DataConfig


def examples(n=4):
    cfg = DataConfig(path="synthetic:reverse", num_examples=n, max_length=64)
    return build_sft_dataset(cfg, build_byte_tokenizer(), EOS_ID).examples


def batch_of(layout):
    exs = examples()
    if layout == "packed":
        return collate_packed(exs)
    return collate_padded(exs, max(len(e) for e in exs) + 3, EOS_ID, PAD_ID, eos_padding=False)


def reference_logprobs(model, ids, targets, select, **layout):
    return selected_logprobs(aligned_logits(model, ids, **layout), targets, select)


def grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_chunked_logprobs_equal_full_logits_at_any_selection(family, layout):
    """Every position selectable, document starts included: Dream's shift must restart per packed document."""
    model = tiny_model(family, seed=1)
    batch = batch_of(layout)
    kwargs = model_inputs(batch)
    ids = batch["input_ids"]
    gen = torch.Generator().manual_seed(0)
    select = (torch.rand(ids.shape, generator=gen) < 0.5) & (batch["example_index"] >= 0)
    if layout == "packed":
        select[0, batch["cu_seqlens"][0][:-1].long()] = True  # the first token of every document is scored
    weights = torch.rand(ids.shape, generator=gen)
    noisy = torch.where(select, torch.full_like(ids, 259), ids)

    ref = reference_logprobs(model, noisy, ids, select, **kwargs)
    (weights * ref).sum().backward()
    ref_grads = grads(model)
    for chunk in (3, 10_000):
        out = masked_logprobs(model, noisy, ids, select, chunk_size=chunk, **kwargs)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert bool((out[~select] == 0).all()) and bool((out[select] < 0).all())
        (weights * out).sum().backward()
        got = grads(model)
        assert got.keys() == ref_grads.keys()
        for name in ref_grads:
            torch.testing.assert_close(got[name], ref_grads[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sft_loss_and_gradients_do_not_depend_on_the_logits_path(family, layout):
    model = tiny_model(family, seed=2)
    config = resolve_algorithm_config({"name": "sft"})
    results = []
    for chunk in (0, 4, 2048):
        algo = get_algorithm("sft")(config, token_ids=family_of(model).token_ids(model.config), seed=0,
                                    logits_chunk_size=chunk)
        batch = algo.corrupt(batch_of(layout), step=0)
        loss, _ = algo.loss(batch, algo.estimate(model, batch), algo.totals(batch))
        loss.backward()
        results.append((loss.detach(), grads(model)))
    (ref_loss, ref_grads), *others = results
    for loss, got in others:
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
        for name in ref_grads:
            torch.testing.assert_close(got[name], ref_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_the_head_only_ever_sees_one_chunk_of_selected_rows():
    """Forward and backward recomputation both apply the head to <= chunk rows: [B, L, V] never exists."""
    model = tiny_model("llada", seed=0)
    batch = batch_of("padded")
    ids = batch["input_ids"]
    select = batch["maskable"].clone()
    seen = []
    original = model.head

    def recording_head(x):
        seen.append(x.shape[:-1].numel())
        return original(x)

    model.head = recording_head
    count, chunk = int(select.sum()), 7
    out = masked_logprobs(model, ids, ids, select, chunk_size=chunk, **model_inputs(batch))
    calls = -(-count // chunk)
    assert len(seen) == calls and sum(seen) == count and max(seen) <= chunk < ids.numel()
    out.sum().backward()
    assert len(seen) == 2 * calls and max(seen) <= chunk  # each chunk recomputed once in backward
    seen.clear()
    with torch.no_grad():
        masked_logprobs(model, ids, ids, select, chunk_size=chunk, **model_inputs(batch))
    assert len(seen) == calls


def test_nothing_selected_gives_zeros_but_keeps_every_parameter_in_the_graph():
    model = tiny_model("dream", seed=0)
    batch = batch_of("packed")
    ids = batch["input_ids"]
    none = torch.zeros_like(ids, dtype=torch.bool)
    out = masked_logprobs(model, ids, ids, none, **model_inputs(batch))
    assert out.shape == ids.shape and bool((out == 0).all())
    out.sum().backward()
    got = grads(model)
    reference_logprobs(model, ids, ids, none, **model_inputs(batch)).sum().backward()
    assert got.keys() == grads(model).keys() and got
    assert all(bool((g == 0).all()) for g in got.values())


def test_negative_chunk_size_is_a_config_error():
    model = tiny_model("llada", seed=0)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ConfigError, match="chunk size must be positive"):
        masked_logprobs(model, ids, ids, ids > 1, chunk_size=-1)
