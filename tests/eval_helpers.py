"""Shared helpers of the evaluation tests: a few SFT steps that make a tiny model memorise an answer."""

import torch

from dare.algorithms.logprobs import masked_logprobs, selected_logprobs
from dare.diffusion import corrupt
from dare.models.block_diffusion import two_copy_inputs
from dare.models.spec import family_of


def train_memorised(model, tok, context: str, answer: str, steps: int = 40):
    """A few masked-diffusion SFT steps on one (context, answer) pair (LLaDA / Dream)."""
    ctx = tok(context)["input_ids"]
    ans = tok(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + ans] * 8)
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[:, len(ctx):] = True
    example = torch.arange(8)[:, None].expand_as(ids)
    mask_id = family_of(model).token_ids(model.config).mask
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        views = corrupt(ids, maskable, example, mask_id, seed=0, step=step)
        logp = masked_logprobs(model, views.noisy_ids, ids, views.mask)
        loss = -(logp / views.p_mask).sum() / ids.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def train_block(model, tok, context, answer, steps=40):
    """SFT steps on the block-diffusion ``[noisy ; clean]`` layout (SDAR, LLaDA2)."""
    ctx, ans = tok(context)["input_ids"], tok(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + ans] * 8)
    maskable = torch.zeros_like(ids, dtype=torch.bool)
    maskable[:, len(ctx):] = True
    example = torch.arange(8)[:, None].expand_as(ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        views = corrupt(ids, maskable, example, family_of(model).token_ids(model.config).mask, seed=0, step=step)
        inputs = two_copy_inputs(views.noisy_ids, ids, model.block_size)
        logits = inputs.noisy_half(model(**inputs.model_kwargs()).logits)
        loss = -(selected_logprobs(logits, ids, views.mask) / views.p_mask).sum() / ids.numel()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()
