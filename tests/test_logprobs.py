"""Chunked log-probs at selected positions == the full-logits path (values and gradients), for every family
topology (LLaDA, Dream's shift, SDAR's [noisy ; clean] forward), padded and packed rows, SFT and the RL
estimator (views, per-row temperature)."""

import pytest
import torch
from tensordict import TensorDict

from dare.algorithms import get_algorithm, resolve_algorithm_config
from dare.algorithms.logprobs import masked_logprobs, mc_elbo, model_inputs, selected_logprobs
from dare.algorithms.rl import forward_logp
from dare.data.sft import build_sft_dataset, collate_packed, collate_padded
from dare.data.tokenizer import EOS_ID, PAD_ID, build_byte_tokenizer
from dare.errors import ConfigError
from dare.models import family_of
from dare.models.block_diffusion import two_copy_inputs
from dare.models.tiny import tiny_model
from dare.trainer.config import DataConfig

FAMILIES = ["llada", "dream", "sdar"]  # full attention, full attention with the logit shift, block-causal (2L)


def examples(n=4):
    cfg = DataConfig(path="synthetic:reverse", num_examples=n, max_length=64)
    return build_sft_dataset(cfg, build_byte_tokenizer(), EOS_ID).examples


def batch_of(layout):
    exs = examples()
    if layout == "packed":
        return collate_packed(exs)
    return collate_padded(exs, max(len(e) for e in exs) + 3, EOS_ID, PAD_ID, eos_padding=False)


def reference_logprobs(model, noisy, clean, select, temperature=None, targets=None, **layout):
    """Written without the code under test: the model's logits at every position (both copies of the [noisy ;
    clean] forward for block-causal families), the family's shift, the temperature, then select."""
    spec = family_of(model)
    if spec.attention == "block_causal":
        inputs = two_copy_inputs(noisy, clean, model.block_size, attention_mask=layout.get("attention_mask"),
                                 cu_seqlens=layout.get("cu_seqlens"))
        logits = inputs.noisy_half(model(**inputs.model_kwargs()).logits)
    else:
        logits = model(noisy, **layout).logits
    logits = spec.align_logits(logits, layout.get("cu_seqlens"))
    if temperature is not None:
        logits = logits / temperature[:, None, None]
    return selected_logprobs(logits, clean if targets is None else targets, select)


def grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def assert_same_grads(got, want):
    assert got.keys() == want.keys() and want
    for name in want:
        # embedding rows of frequent tokens (pad/mask) sum hundreds of terms whose order differs: ~3e-6 on some CPUs
        atol = 5e-6 if "embed" in name else 1e-6
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_chunked_logprobs_equal_full_logits_at_any_selection(family, layout):
    """Every position selectable, document starts included: Dream's shift must restart per packed document; SDAR
    scores the noisy half of one [noisy ; clean] forward (chunk 0: the model's own head on that half)."""
    model = tiny_model(family, seed=1)
    mask_id = family_of(model).token_ids(model.config).mask
    batch = batch_of(layout)
    kwargs = model_inputs(batch)
    ids = batch["input_ids"]
    gen = torch.Generator().manual_seed(0)
    select = (torch.rand(ids.shape, generator=gen) < 0.5) & (batch["example_index"] >= 0)
    if layout == "packed":
        select[0, batch["cu_seqlens"][0][:-1].long()] = True  # the first token of every document is scored
    weights = torch.rand(ids.shape, generator=gen)
    noisy = torch.where(select, torch.full_like(ids, mask_id), ids)

    ref = reference_logprobs(model, noisy, ids, select, **kwargs)
    (weights * ref).sum().backward()
    ref_grads = grads(model)
    for chunk in (0, 3, 10_000):
        out = masked_logprobs(model, noisy, ids, select, chunk_size=chunk, **kwargs)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert bool((out[~select] == 0).all()) and bool((out[select] < 0).all())
        (weights * out).sum().backward()
        assert_same_grads(grads(model), ref_grads)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sft_loss_and_gradients_do_not_depend_on_the_logits_path(family, layout):
    model = tiny_model(family, seed=2)
    config = resolve_algorithm_config({"name": "sft"})
    results = []
    for chunk in (0, 4, 2048):
        algo = get_algorithm("sft")(config, token_ids=family_of(model).token_ids(model.config), seed=0,
                                    logits_chunk_size=chunk)
        assert algo.forward_options["chunk_size"] == chunk
        batch = algo.corrupt(batch_of(layout), step=0)
        loss, _ = algo.loss(batch, algo.estimate(model, batch), algo.totals(batch))
        loss.backward()
        results.append((loss.detach(), grads(model)))
    (ref_loss, ref_grads), *others = results
    for loss, got in others:
        torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
        assert_same_grads(got, ref_grads)


def rollout_like_batch(model, rows=4, width=14, views=2, seed=0):
    """Left-padded rows (prompt then a 6-token completion), ``views`` corruptions per row of the completion and of
    a few prompt tokens (d1 / SPG mask the prompt too)."""
    token_ids = family_of(model).token_ids(model.config)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, width), generator=gen)
    pads = torch.tensor([0, 3, 1, 5])[:rows]
    attention = (torch.arange(width)[None] >= pads[:, None]).long()
    ids = torch.where(attention.bool(), ids, torch.full_like(ids, token_ids.pad))
    completion = (torch.arange(width)[None] >= width - 6).expand(rows, width)
    select = (torch.rand(rows, views, width, generator=gen) < 0.6) & completion[:, None]
    prompt = attention.bool() & ~completion
    prompt_masked = (torch.rand(rows, views, width, generator=gen) < 0.3) & prompt[:, None]
    noisy = torch.where(select | prompt_masked, torch.full_like(select, token_ids.mask, dtype=torch.long), ids[:, None])
    batch = TensorDict({"input_ids": ids, "attention_mask": attention, "generated": completion}, batch_size=[rows])
    return batch, noisy, select


@pytest.mark.parametrize("family", FAMILIES)
def test_rl_forward_logp_is_chunked_on_every_family_with_views_and_temperature(family):
    """RL estimators: [R, n, S] views in one forward, per-row temperature, the family's denoiser (SDAR: the clean
    copy is the view's prompt then the clean completion); the chunked head equals the full logits in values and
    gradients."""
    model = tiny_model(family, seed=3)
    batch, noisy, select = rollout_like_batch(model)
    temperature = torch.tensor([1.0, 0.7, 1.3, 0.5])
    rows, views, width = noisy.shape
    weights = torch.rand(noisy.shape, generator=torch.Generator().manual_seed(1))
    ids, completion = batch["input_ids"], batch["generated"]

    ref = torch.stack([reference_logprobs(model, noisy[:, m], torch.where(completion, ids, noisy[:, m]), select[:, m],
                                          temperature, targets=ids, attention_mask=batch["attention_mask"])
                       for m in range(views)], 1)
    (weights * ref).sum().backward()
    ref_grads = grads(model)
    for chunk in (0, 5, 2048):
        out = forward_logp(model, batch, noisy, select, temperature=temperature, chunk_size=chunk)
        assert out.shape == (rows, views, width)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        (weights * out).sum().backward()
        assert_same_grads(grads(model), ref_grads)


@pytest.mark.parametrize("family", FAMILIES)
def test_mc_elbo_does_not_depend_on_the_logits_path(family):
    from dare.diffusion import corrupt_mc

    model = tiny_model(family, seed=4)
    mask_id = family_of(model).token_ids(model.config).mask
    batch = batch_of("padded")
    views = corrupt_mc(batch["input_ids"], batch["maskable"], batch["example_index"], mask_id, seed=0, step=0, n=2)
    with torch.no_grad():
        terms = [mc_elbo(model, batch["input_ids"], views, batch["example_index"], chunk_size=chunk,
                         **model_inputs(batch))[1] for chunk in (0, 3)]
    torch.testing.assert_close(terms[1], terms[0], atol=1e-5, rtol=1e-5)
    assert bool((terms[0] <= 0).all()) and bool((terms[0] < 0).any())


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_head_only_ever_sees_one_chunk_of_selected_rows(family):
    """Forward and backward recomputation both apply the head to <= chunk rows: [B, L, V] (SDAR: [B, 2L, V])
    never exists."""
    model = tiny_model(family, seed=0)
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
    seen.clear()
    with torch.no_grad():  # the plain path: one head call over the noisy positions only (SDAR: not the clean half)
        masked_logprobs(model, ids, ids, select, chunk_size=0, **model_inputs(batch))
    assert seen == [ids.numel()]


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
