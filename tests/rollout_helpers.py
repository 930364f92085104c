"""Shared helpers of the rollout tests: tiny models with realistic confidences, padded prompt batches."""

import pytest
import torch

from dare.models.tiny import tiny_model
from dare.rollout import left_pad


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models run fastest on one thread; two OpenMP threads on a shared 2-core machine spin-wait
    (measured 50x slower under load). Import this fixture into a test module to use it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sharp_model(family: str, seed: int = 1, scale: float = 50.0, dtype=torch.float32, **overrides):
    """A tiny model whose LM head is scaled so that confidences spread over (0, 1) like a trained model's
    (with the default init every token has probability ~1/264)."""
    model = tiny_model(family, seed=seed, dtype=dtype, **overrides)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    return model


def trained_lora(family: str = "llada", seed: int = 0, alpha: int = 32, **overrides):
    """A tiny model wrapped in LoRA adapters (r 4) whose ``lora_B`` is drawn N(0, 0.05): peft starts it at zero,
    and adapters that change nothing would let a test pass without them."""
    from dare.models.lora import apply_lora

    model = apply_lora(tiny_model(family, seed=seed, **overrides), r=4, alpha=alpha)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def prompts(lengths, seed: int = 0, vocab: int = 256):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def padded(lengths, seed: int = 0, pad_id: int = 256):
    """Left-padded ``input_ids, attention_mask`` of random byte prompts."""
    return left_pad(prompts(lengths, seed), pad_id)


def bias_token(model, token_id: int, value: float):
    """Add ``value`` to one token's logit (a hook on the LM head); returns the hook handle."""
    def hook(module, inputs, output):
        output = output.clone()
        output[..., token_id] += value
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def sprinkle_token(model, token_id: int, rate: float = 0.25, margin: float = 6.0):
    """Make ``token_id`` the clear favourite at a pseudo-random, context-dependent ``rate`` of positions
    (a deterministic function of each position's own logits), e.g. to get EOS at varying places."""
    def hook(module, inputs, output):
        output = output.clone()
        pick = torch.sin(output[..., 1].double() * 1000.0) > 1 - 2 * rate
        top = output.max(-1).values + margin
        output[..., token_id] = torch.where(pick, top, output[..., token_id])
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def unmix32(y: int) -> int:
    """The inverse of :func:`dare.rollout.engine.noise.mix32` on one 32-bit value: tests pick the inputs whose
    hash is a chosen one (the largest hash gives the largest uniform)."""
    mask = 0xFFFFFFFF

    def unshift(value: int, shift: int) -> int:  # inverts v ^ (v >> shift)
        x = value
        for _ in range(32 // shift + 1):
            x = value ^ (x >> shift)
        return x & mask

    x = unshift(y & mask, 15)
    x = unshift((x * pow(0x735A2D97, -1, 2**32)) & mask, 15)
    return unshift((x * pow(0x21F0AAAD, -1, 2**32)) & mask, 16)


def counters_hashing_to(keys: torch.Tensor, positions: torch.Tensor, stream: int, targets: list[int]) -> torch.Tensor:
    """``[B]`` step counters for which :func:`~dare.rollout.engine.noise.position_hash` of row ``b`` (one position
    each: ``positions [B, 1]``) is ``targets[b]``."""
    from dare.rollout.engine.noise import position_hash

    before = position_hash(keys, torch.zeros(len(targets), dtype=torch.long), positions, stream)[:, 0].tolist()
    return torch.tensor([unmix32(unmix32(t) ^ unmix32(h)) for t, h in zip(targets, before)], dtype=torch.long)
