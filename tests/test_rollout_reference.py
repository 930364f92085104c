"""DARE's samplers against literal transcriptions of the reference loops (T = 0, tiny fp32 models, CPU).

The transcriptions below follow ML-GSAI/LLaDA ``generate.py``, Dream's ``diffusion_generate``
(``generation_utils.py::_sample``), NVlabs/Fast-dLLM ``llada/generate.py`` (no cache, prefix cache, dual
cache, ``get_transfer_index``) and dInfer's ``get_transfer_index_dynamic`` (factor rule) step by step,
including their per-row Python loops, so that they share no code with ``dare.rollout``. The model is DARE's
(the references call ``model(x, attention_mask)``; Fast-dLLM's cache is emulated with ``KVCache``, whose
post-RoPE entries equal its pre-RoPE cache re-rotated).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from rollout_helpers import padded, sharp_model, single_thread  # noqa: F401

from dare.models import KVCache
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate

MASK = 259

# ------------------------------------------------------------------------------------------ LLaDA


def ref_gumbel(logits, temperature):
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    return logits.exp() / (-torch.log(noise)) ** temperature


def ref_num_transfer_tokens(mask_index, steps):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, remainder = mask_num // steps, mask_num % steps
    counts = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for row in range(mask_num.size(0)):
        counts[row, : remainder[row]] += 1
    return counts


@torch.no_grad()
def ref_llada_generate(model, prompt, attention_mask=None, steps=128, gen_length=128, block_length=128,
                       temperature=0.0, remasking="low_confidence", mask_id=MASK):
    P = prompt.shape[1]
    x = torch.full((prompt.shape[0], P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt.clone()
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, torch.ones((prompt.shape[0], gen_length), dtype=attention_mask.dtype)], -1)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for nb in range(num_blocks):
        block_mask_index = x[:, P + nb * block_length: P + (nb + 1) * block_length] == mask_id
        num_transfer_tokens = ref_num_transfer_tokens(block_mask_index, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x, attention_mask=attention_mask).logits
            x0 = torch.argmax(ref_gumbel(logits, temperature), dim=-1)
            if remasking == "low_confidence":
                p = F.softmax(logits, dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            else:
                x0_p = torch.rand((x0.shape[0], x0.shape[1]))
            x0_p[:, P + (nb + 1) * block_length:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j, i]))
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x


LLADA_SETTINGS = [  # (gen_length, block_length, steps)
    (16, 16, 16), (16, 8, 8), (24, 8, 12), (16, 4, 16), (12, 4, 6),
]


@pytest.mark.parametrize("gen_length,block_length,steps", LLADA_SETTINGS)
def test_llada_matches_reference(gen_length, block_length, steps):
    model = tiny_model("llada", seed=3)
    ids, mask = padded([5, 9, 7], seed=1)
    ref = ref_llada_generate(model, ids, mask, steps=steps, gen_length=gen_length, block_length=block_length)
    out = generate(model, ids, mask, SamplerConfig(sampler="llada", gen_length=gen_length,
                                                   block_length=block_length, steps=steps, eos_early_stop=False))
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


def test_llada_matches_reference_unpadded_and_sharp():
    """No attention mask (the reference's default path) and a confident model (many distinct confidences)."""
    model = sharp_model("llada", seed=4)
    ids = torch.tensor([[10, 20, 30, 40, 50, 60]])
    ref = ref_llada_generate(model, ids, None, steps=8, gen_length=16, block_length=8)
    out = generate(model, ids, None, sampler="llada", gen_length=16, block_length=8, steps=8, eos_early_stop=False)
    assert torch.equal(out.sequences, ref)


# ------------------------------------------------------------------------------------------ Dream


def ref_top_p(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cumulative > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def ref_top_k(logits, top_k):
    top_k = min(top_k, logits.size(-1))
    remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def ref_sample_tokens(logits, temperature=0.0, top_p=None, top_k=None, margin_confidence=False, neg_entropy=False):
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = ref_top_p(logits, top_p)
    if top_k is not None:
        logits = ref_top_k(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        x0 = torch.distributions.Categorical(probs=probs).sample()
        confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


@torch.no_grad()
def ref_dream_generate(model, input_ids, attention_mask, max_length, steps, alg, eps=1e-3, temperature=0.0,
                       top_p=None, top_k=None, mask_token_id=MASK):
    x = F.pad(input_ids, (0, max_length - input_ids.shape[1]), value=mask_token_id)
    if attention_mask is not None and torch.any(attention_mask == 0.0):
        attention_mask = F.pad(attention_mask, (0, max_length - attention_mask.shape[1]), value=1.0)
    else:
        attention_mask = None  # "full"
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_token_id
        logits = model(x, attention_mask=attention_mask).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        kwargs = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        if alg == "maskgit_plus":
            confidence, x0 = ref_sample_tokens(mask_logits, **kwargs)
        elif alg == "topk_margin":
            confidence, x0 = ref_sample_tokens(mask_logits, margin_confidence=True, **kwargs)
        else:
            confidence, x0 = ref_sample_tokens(mask_logits, neg_entropy=True, **kwargs)
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        if n > 0:
            _, transfer_index = torch.topk(full_confidence, n)
            x_ = torch.zeros_like(x) + mask_token_id
            x_[mask_index] = x0.clone()
            rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
            x[rows, transfer_index] = x_[rows, transfer_index]
    return x


DREAM_CASES = [  # (alg, gen_length, steps, top_p, top_k, padded)
    ("entropy", 16, 16, None, None, True),
    ("entropy", 16, 5, None, None, False),
    ("maskgit_plus", 16, 8, None, None, True),
    ("maskgit_plus", 12, 12, 0.5, 3, True),
    ("topk_margin", 16, 7, None, None, True),
]


@pytest.mark.parametrize("alg,gen_length,steps,top_p,top_k,pad", DREAM_CASES)
def test_dream_matches_reference(alg, gen_length, steps, top_p, top_k, pad):
    model = sharp_model("dream", seed=5, scale=20.0)
    ids, mask = padded([6, 9, 4] if pad else [7, 7], seed=2)
    ref = ref_dream_generate(model, ids, mask, ids.shape[1] + gen_length, steps, alg, top_p=top_p, top_k=top_k)
    out = generate(model, ids, mask, SamplerConfig(sampler="dream", gen_length=gen_length, steps=steps,
                                                   confidence=alg, top_p=top_p, top_k=top_k, eos_early_stop=False))
    assert torch.equal(out.sequences, ref)
    assert out.nfe == steps


# ------------------------------------------------------------------------------------------ Fast-dLLM


def ref_transfer_index(logits, temperature, remasking, mask_index, x, num_transfer_tokens, threshold=None):
    """Fast-dLLM ``get_transfer_index`` (batch loop, float64 confidence, threshold keeps the top-1)."""
    x0 = torch.argmax(ref_gumbel(logits, temperature), dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer_index[j, select_index] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select_index[k]] < threshold:
                    transfer_index[j, select_index[k]] = False
    return x0, transfer_index


def ref_transfer_index_factor(logits, temperature, remasking, mask_index, x, num_transfer_tokens, factor=1.0):
    """dInfer ``get_transfer_index_dynamic`` (Fast-dLLM factor rule, with its last-rank behaviour)."""
    x0 = torch.argmax(ref_gumbel(logits, temperature), dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    counts = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        threshs = [1 - factor / (n + 1) for n in range(1, int(counts[j]) + 1)]
        threshs[0] = -1
        sorted_confidence = torch.sort(confidence[j][mask_index[j]], dim=-1, descending=True)[0]
        for top_i in range(len(threshs)):
            if sorted_confidence[top_i] < threshs[top_i]:
                break
        if top_i == 0 or top_i == len(threshs) - 1:
            top_i += 1
        _, select_index = torch.topk(confidence[j], k=top_i)
        transfer_index[j, select_index] = True
    return x0, transfer_index


@torch.no_grad()
def ref_fastdllm(model, prompt, cache, steps, gen_length, block_length, threshold=None, factor=None, mask_id=MASK):
    """Fast-dLLM ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache`` (batch 1).

    Returns ``(x, nfe, idle)``: ``idle`` counts the cached forwards the reference runs after the block-start
    step has already filled the block (its loop checks for remaining masks only after a step); DARE skips
    them.
    """
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt.clone()
    pos = torch.arange(x.shape[1])[None]
    num_blocks = gen_length // block_length
    steps = steps // num_blocks

    def transfer(logits, mask_index, xx, k):
        if factor is not None:
            return ref_transfer_index_factor(logits, 0.0, "low_confidence", mask_index, xx, None, factor)
        return ref_transfer_index(logits, 0.0, "low_confidence", mask_index, xx, k if threshold is None else None,
                                  threshold)

    nfe = idle = 0
    for nb in range(num_blocks):
        s, e = P + nb * block_length, P + (nb + 1) * block_length
        num_transfer_tokens = ref_num_transfer_tokens(x[:, s:e] == mask_id, steps)
        if cache == "none":
            i = 0
            while True:
                nfe += 1
                mask_index = x == mask_id
                logits = model(x).logits
                mask_index[:, e:] = 0
                x0, idx = transfer(logits, mask_index, x, num_transfer_tokens[:, i])
                x[idx] = x0[idx]
                i += 1
                if (x[:, s:e] == mask_id).sum() == 0:
                    break
            continue
        kv = KVCache(mode="append")
        logits = model(x, cache=kv, position_ids=pos).logits
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, idx = transfer(logits, mask_index, x, num_transfer_tokens[:, 0])
        x[idx] = x0[idx]
        nfe += 1
        if cache == "prefix":
            kv.truncate(s).set_mode("read")
        else:
            kv.set_mode("replace", replace_start=s)
        i = 1
        while True:
            nfe += 1
            hi = None if cache == "prefix" else e
            window = x[:, s:hi]
            mask_index = window == mask_id
            mask_index[:, block_length:] = 0
            logits = model(window, cache=kv, position_ids=pos[:, s:hi]).logits
            if mask_index.sum() == 0:  # an idle forward: it commits nothing (the factor rule would crash)
                idle += 1
            else:
                x0, idx = transfer(logits, mask_index, window, num_transfer_tokens[:, i] if i < steps else None)
                x[:, s:hi][idx] = x0[idx]
            if (x[:, s:e] == mask_id).sum() == 0:
                break
            i += 1
    return x, nfe, idle


FAST_CASES = [  # (cache, decoder, gen_length, block_length, steps)
    ("none", "threshold", 16, 8, 16),
    ("prefix", "quota", 16, 8, 8),
    ("prefix", "threshold", 24, 8, 24),
    ("dual", "quota", 16, 4, 16),
    ("dual", "threshold", 24, 8, 24),
    ("none", "factor", 16, 8, 16),
    ("dual", "factor", 16, 8, 16),
]


@pytest.mark.parametrize("cache,decoder,gen_length,block_length,steps", FAST_CASES)
def test_fastdllm_matches_reference(cache, decoder, gen_length, block_length, steps):
    model = sharp_model("llada", seed=6)
    ids = torch.tensor([[11, 22, 33, 44, 55, 66, 77]])
    kwargs = dict(threshold=0.7 if decoder == "threshold" else None, factor=1.0 if decoder == "factor" else None)
    ref, ref_nfe, idle = ref_fastdllm(model, ids, cache, steps, gen_length, block_length, **kwargs)
    out = generate(model, ids, None, SamplerConfig(
        sampler="fastdllm", cache=cache, decoder=decoder, gen_length=gen_length, block_length=block_length,
        steps=steps, factor_last_rank_quirk=True, eos_early_stop=False, **{k: v for k, v in kwargs.items() if v},
    ))
    assert torch.equal(out.sequences, ref)
    assert out.nfe == ref_nfe - idle
    if decoder != "quota":  # parallel decoding commits several tokens in some step
        assert out.nfe < gen_length
