"""CUDA-only paths (compiled FlexAttention, varlen flash attention, bf16 kernels); skipped without a GPU.

Run on a GPU machine with ``python -m pytest tests/test_gpu.py``; CI (CPU) skips the module.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from dare.models.tiny import tiny_model  # noqa: E402

TOL32 = dict(atol=5e-4, rtol=1e-3)  # TF32 / kernel differences on GPU


def seqs(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


def padded(batch, side="left"):
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), 256)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for i, s in enumerate(batch):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, sl], mask[i, sl] = s, 1
    return ids.cuda(), mask.cuda()


@pytest.mark.parametrize("family", ["llada", "dream", "llada_moe", "sdar", "llada2"])
def test_backends_agree_on_cuda(family):
    model = tiny_model(family, seed=1).cuda()
    ids, mask = padded(seqs([37, 150, 90]))
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, attn_backend="sdpa").logits.float()
        for backend in ("eager", "flex"):
            out = model(ids, attention_mask=mask, attn_backend=backend).logits.float()
            torch.testing.assert_close(out[mask.bool()], ref[mask.bool()], **TOL32)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_flex_backward_matches_sdpa(family):
    model = tiny_model(family, seed=2).cuda().train()
    batch = seqs([130, 60, 200], seed=1)
    cu = torch.tensor([0, 130, 190, 390]).cuda()
    ids = torch.cat(batch)[None].cuda()
    grads = {}
    for backend in ("sdpa", "flex"):
        model.zero_grad()
        model(ids, cu_seqlens=cu, attn_backend=backend).logits.float().logsumexp(-1).mean().backward()
        grads[backend] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads["sdpa"], grads["flex"]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_varlen_packed_equals_padded_bf16(family):
    model = tiny_model(family, seed=3).cuda().to(torch.bfloat16)
    batch = seqs([70, 33, 129], seed=2)
    cu = torch.tensor([0, 70, 103, 232], dtype=torch.int32).cuda()
    ids, mask = padded(batch, side="right")
    with torch.no_grad():
        pad_out = model(ids, attention_mask=mask, attn_backend="sdpa").logits.float()
        packed = model(torch.cat(batch)[None].cuda(), cu_seqlens=cu, attn_backend="varlen").logits.float()[0]
    for i, s in enumerate(batch):
        diff = (packed[cu[i]:cu[i + 1]] - pad_out[i, : len(s)]).abs().max().item()
        assert diff < 0.1, diff  # bf16 flash vs bf16 sdpa


def test_rollout_on_cuda_matches_cpu_greedy():
    from dare.rollout import SamplerConfig, generate

    model = tiny_model("llada", seed=4)
    prompts = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(3))
    config = SamplerConfig(sampler="llada", gen_length=16, block_length=8, steps=16, temperature=0.0)
    cpu = generate(model, prompts, None, config)
    gpu = generate(model.cuda(), prompts.cuda(), None, config)
    agree = (cpu.completion == gpu.completion.cpu()).float().mean().item()
    assert agree > 0.9, agree


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_rl_step_on_cuda_decodes_under_the_trainers_autocast(tmp_path, cache):
    """fp32 master weights on one GPU: rollout, old/reference and training forwards all run under bf16 autocast
    (the rollout used to decode in fp32), with the dual cache too."""
    from pathlib import Path

    from dare.trainer import Trainer, load_train_config

    root = Path(__file__).resolve().parents[1]
    config = load_train_config(root / "configs/llada/d1_tiny.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.export=false", "trainer.max_steps=2",
        "distributed.device=cuda", "model.dtype=float32", f"rollout.sampler.cache={cache}",
        "rollout.sampler.sampler=fastdllm"])
    trainer = Trainer(config)
    seen = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cuda")))
    record = trainer.train_step(0)
    assert seen and all(seen), seen
    assert torch.isfinite(torch.tensor(record["loss"])) and record["rollout/logprob_s"] > 0
