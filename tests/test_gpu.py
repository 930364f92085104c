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


def _dare_train(recipe, out, nproc=None, steps=3, extra=()):
    """``dare train RECIPE`` on CUDA, plainly or under ``torchrun --nproc_per_node nproc`` (NCCL, FSDP2);
    returns the logged metrics records."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    args = [str(root / recipe), f"trainer.output_dir={out}", "trainer.progress=false", "trainer.log_every=1",
            f"trainer.max_steps={steps}", "distributed.device=cuda", "model.dtype=float32", *extra]
    if nproc is None:
        cmd = [sys.executable, "-m", "dare.cli", "train", *args]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(port), "-m", "dare.cli", "train", *args]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0",
               PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    assert (Path(out) / "final").exists()
    return [r for r in records if "loss" in r]


def test_torchrun_nccl_sft_matches_the_plain_process(tmp_path):
    """FSDP2 over NCCL on every visible GPU (one on a single-GPU machine) trains the tiny SFT recipe with the
    plain single-process losses (same global batch; bf16 compute, so a bf16 tolerance)."""
    nproc = torch.cuda.device_count()
    plain = _dare_train("configs/llada/sft_tiny.yaml", tmp_path / "plain")
    fsdp = _dare_train("configs/llada/sft_tiny.yaml", tmp_path / "fsdp", nproc=nproc)
    assert len(plain) == len(fsdp) == 3
    torch.testing.assert_close(torch.tensor([r["loss"] for r in fsdp]), torch.tensor([r["loss"] for r in plain]),
                               rtol=2e-2, atol=2e-3)


def test_torchrun_nccl_d1_step_runs_and_exports(tmp_path):
    """A d1 RL step (sharded rollout, rewards, old / reference log-probs, update) under torchrun + NCCL on every
    visible GPU: finite losses, rollout metrics logged, the adapter / checkpoint exported."""
    records = _dare_train("configs/llada/d1_tiny.yaml", tmp_path / "d1", nproc=torch.cuda.device_count(), steps=2)
    assert len(records) == 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert "rollout/reward" in records[0] and records[0]["rollout/nfe"] > 0, sorted(records[0])


# ---- the CUDA-graph rollout engine ------------------------------------------------------------------------------

GRAPH_CASES = [
    ("llada", dict(sampler="llada")),
    ("llada", dict(sampler="fastdllm", cache="dual", threshold=0.3)),
    ("llada", dict(sampler="fastdllm", cache="prefix", decoder="quota")),
    ("dream", dict(sampler="fastdllm_dream", cache="dual", threshold=0.3)),
    ("sdar", dict(sampler="sdar", cache="block")),
    ("sdar", dict(sampler="sdar", cache="none", decoder="quota")),
    ("sdar", dict(sampler="sdar", cache="block", decoder="quota", block_steps=4)),  # steps queued back to back
]


def sharp_cuda_model(family):
    model = tiny_model(family, seed=1).cuda()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    return model


@pytest.mark.parametrize("family,overrides", GRAPH_CASES)
def test_graph_engine_equals_eager_and_records_once(family, overrides):
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    torch.backends.cuda.matmul.allow_tf32 = False
    model = sharp_cuda_model(family)
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(gen_length=32, block_length=8, **overrides)
    eager = generate(model, ids, mask, config, engine="eager")
    static = generate(model, ids, mask, config, engine="static")
    graph = generate(model, ids, mask, config, engine="graph")
    stats = engine_stats(model)
    captures, replays = stats.captures, stats.replays
    assert captures >= 1 and replays >= 1
    again = generate(model, ids, mask, config, engine="graph")
    assert engine_stats(model).captures == captures  # the same shapes record nothing new
    assert engine_stats(model).replays > replays
    for out in (graph, again):
        assert torch.equal(out.completion, static.completion)
        assert torch.equal(out.step_map, static.step_map)
        assert out.nfe == static.nfe
        torch.testing.assert_close(out.logprobs, static.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(static.completion, eager.completion)
    assert torch.equal(static.step_map, eager.step_map)


def test_graph_engine_sampling_is_batch_invariant_and_reuses_buckets():
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    model = sharp_cuda_model("llada")
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=32, block_length=8, temperature=1.0)
    ids, mask = padded(seqs([9, 14, 5]))
    batch = generate(model, ids, mask, config, engine="graph", example_ids=[4, 5, 6])
    captures = engine_stats(model).captures
    two = generate(model, ids[:2, -14:], mask[:2, -14:], config, engine="graph", example_ids=[4, 5])
    # 3 and 2 rows: buckets 4 and 2 (a new shape); the rows' samples do not depend on the bucket
    assert torch.equal(two.completion[1], batch.completion[1])
    assert engine_stats(model).captures > captures
    three = generate(model, ids, mask, config, engine="graph", example_ids=[4, 5, 6])
    assert torch.equal(three.completion, batch.completion)


def test_moe_graph_engine_records_or_falls_back_with_the_same_tokens():
    """MoE layers whose expert dispatch reads device values cannot be recorded: the engine falls back to eager
    (one logged note) and decodes the same tokens; a dispatch without host reads is recorded."""
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    model = sharp_cuda_model("llada2")
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="llada21", gen_length=32, block_length=8)
    eager = generate(model, ids, mask, config, engine="eager")
    graph = generate(model, ids, mask, config, engine="graph")
    stats = engine_stats(model)
    assert stats.captures >= 1 or stats.fallbacks >= 1
    assert torch.equal(graph.completion, eager.completion)


@pytest.mark.parametrize("family", ["llada2", "llada_moe"])
def test_grouped_experts_are_recorded_by_the_graph_engine(family):
    """In bf16 the experts run as grouped GEMMs whose dispatch (sort, counts, offsets) never reads the device
    from the host, so MoE decoding steps are recorded (no fallback: the H200 run fell back while the counts
    came from CUDA ``bincount``, which syncs) and replay the static engine's tokens."""
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    model = sharp_cuda_model(family).to(torch.bfloat16)
    ids, mask = padded(seqs([9, 14, 5]))
    sampler = "llada21" if family == "llada2" else "fastdllm"
    config = SamplerConfig(sampler=sampler, gen_length=32, block_length=8)
    static = generate(model, ids, mask, config, engine="static")
    graph = generate(model, ids, mask, config, engine="graph")
    stats = engine_stats(model)
    assert stats.fallbacks == 0 and stats.captures >= 1
    assert torch.equal(graph.completion, static.completion)


def _moe_logits_and_grads(model, ids, backend):
    from dare.models.moe import set_expert_backend

    set_expert_backend(model, backend)
    model.zero_grad()
    logits = model(ids).logits.float()
    (logits * torch.linspace(-1, 1, logits.shape[-1], device=logits.device)).sum().backward()
    return logits.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llada_moe", "sdar_moe", "llada2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_grouped_experts_on_cuda_equal_the_loop(family, dtype):
    """bf16 picks the CUDA grouped GEMM, fp32 the padded-bmm fallback; both match the loop over experts."""
    from dare.models.moe import ExpertBank, grouped_mm_applies

    model = tiny_model(family, seed=3, dtype=dtype).cuda().train()
    bank = next(m for m in model.modules() if isinstance(m, ExpertBank))
    x = torch.randn(4, 64, device="cuda", dtype=dtype)
    assert grouped_mm_applies(x, bank.gate_up_proj, bank.down_proj) == (dtype == torch.bfloat16)
    ids = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(0)).cuda()
    ref_logits, ref_grads = _moe_logits_and_grads(model, ids, "loop")
    logits, grads = _moe_logits_and_grads(model, ids, "auto")
    tol = TOL32 if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(logits, ref_logits, **tol)
    for name in ("gate_up_proj", "down_proj"):
        key = next(k for k in grads if k.endswith(name))
        assert grads[key].abs().sum() > 0
        scale = ref_grads[key].abs().max()
        torch.testing.assert_close(grads[key] / scale, ref_grads[key] / scale, **tol)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="expert parallelism needs 2 GPUs")
def test_torchrun_nccl_expert_parallel_matches_plain_fsdp(tmp_path):
    """LLaDA2 SFT with the experts spread over 2 GPUs (all-to-all over NCCL) logs the losses of plain FSDP2."""
    plain = _dare_train("configs/llada2/sft_tiny.yaml", tmp_path / "plain", nproc=2, steps=2)
    ep = _dare_train("configs/llada2/sft_tiny.yaml", tmp_path / "ep", nproc=2, steps=2,
                     extra=["distributed.expert_parallel=2"])
    torch.testing.assert_close(torch.tensor([r["loss"] for r in ep]), torch.tensor([r["loss"] for r in plain]),
                               rtol=2e-2, atol=2e-3)


def test_compiled_proposals_at_a_real_vocabulary_equal_the_eager_ops(monkeypatch):
    """The compiled proposal kernels build at LLaDA's vocabulary size (32-bit hash constants once overflowed the
    compiler's int32 index arithmetic, and every T>0 rollout fell back to the eager ops) and give the eager
    ops' tokens, confidences and log-probabilities (the one-pass kernel, which serves greedy steps, is off)."""
    from dare.rollout import SamplerConfig
    from dare.rollout.engine import noise, sampling

    monkeypatch.setenv("DARE_PROPOSAL_KERNEL", "0")

    logits = torch.randn(3, 32, 126464, device="cuda", dtype=torch.bfloat16) * 4
    eligible = torch.rand(3, 32, device="cuda") < 0.7
    keys = noise.row_keys([11, 12, 13], "cuda")
    counters, positions = torch.arange(3, device="cuda"), torch.arange(32, device="cuda")[None].expand(3, 32)
    for settings in (dict(temperature=0.9, top_k=50), dict(temperature=0.0),
                     dict(temperature=1.0, top_p=0.9, confidence="margin")):
        config = SamplerConfig(sampler="llada", **settings).resolved()
        args = dict(config=config, banned=7, keys=keys, counters=counters, positions=positions)
        compiled = sampling.propose_static(logits, eligible, **args)
        assert sampling._propose.enabled, "compiled sampling was disabled after a compiler error"
        sampling._propose.enabled = False
        try:
            eager = sampling.propose_static(logits, eligible, **args)
        finally:
            sampling._propose.enabled = True
        assert torch.equal(compiled.tokens, eager.tokens)
        torch.testing.assert_close(compiled.confidence, eager.confidence, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled.logprob, eager.logprob, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("b,w,vocab", [(3, 32, 126464), (64, 4, 151936), (1, 4, 151936)])
def test_proposal_kernel_at_real_vocabularies_matches_the_compiled_ops(b, w, vocab, monkeypatch):
    """The one-pass proposal kernel at LLaDA's and SDAR's vocabularies, bf16 logits: greedy tokens equal the
    compiled ops' (ties included: bf16 logits tie often); a Gumbel-max token is a maximum of the same noisy keys
    (up to float32 rounding of the logarithms); the random confidence is the same numbers; confidences (the
    probability and Dream's ``neg_entropy``) and log-probabilities agree to float32 rounding. With top-p, the
    kernel reads the top-p kernel's nuclei and the compiled ops its filtered copies."""
    from dare.rollout import SamplerConfig
    from dare.rollout.engine import noise, proposal_kernel, sampling

    torch.manual_seed(0)
    logits = torch.randn(b, w, vocab, device="cuda", dtype=torch.bfloat16) * 4
    logits[0, 0, 7] = 100.0  # the banned id
    eligible = torch.rand(b, w, device="cuda") < 0.7
    keys = noise.row_keys(list(range(11, 11 + b)), "cuda")
    counters, positions = torch.arange(b, device="cuda") + 3, torch.arange(w, device="cuda")[None].expand(b, w)
    for settings in (dict(temperature=0.0), dict(temperature=0.9), dict(temperature=1.3, confidence_source="sampling"),
                     dict(temperature=0.7, confidence="random"), dict(temperature=0.0, confidence="neg_entropy"),
                     dict(temperature=0.2, confidence="neg_entropy", confidence_source="sampling"),
                     dict(temperature=1.0, top_p=0.95, confidence="neg_entropy", confidence_source="sampling"),
                     dict(temperature=0.8, top_p=0.9, confidence_source="sampling"), dict(temperature=0.0, top_p=0.5)):
        config = SamplerConfig(sampler="llada", **settings).resolved()
        args = dict(config=config, banned=7, keys=keys, counters=counters, positions=positions)
        monkeypatch.setenv("DARE_PROPOSAL_KERNEL", "1")
        assert proposal_kernel.serves(config, logits)
        fast = sampling.propose_static(logits, eligible, **args)
        assert not sampling._KERNEL_FAILED
        monkeypatch.setenv("DARE_PROPOSAL_KERNEL", "0")
        slow = sampling.propose_static(logits, eligible, **args)
        t = config.temperature
        if t == 0:
            assert torch.equal(fast.tokens, slow.tokens)
        elif config.top_p is not None:  # the top-p kernel's nuclei against its filters under the compiled ops
            assert (fast.tokens != slow.tokens).sum() <= 1  # (uniforms of 24 bits: 4 of 256 drew outside a nucleus)
        else:
            scores = logits.double().masked_fill(torch.arange(vocab, device="cuda") == 7, float("-inf")) / t
            base = noise.position_hash(keys, counters, positions, noise.STREAM_SAMPLE)
            u = noise.uniform(noise.mix32(base[..., None] ^ noise.vocabulary_salts(vocab, "cuda"))).double()
            noisy = scores - torch.log(-torch.log(u))
            picked = noisy.gather(-1, fast.tokens[..., None]).squeeze(-1)
            assert (picked >= noisy.max(-1).values - 1e-4).all()
            assert (fast.tokens != slow.tokens).sum() <= 1  # float32 rounding of the logarithms: near-ties only
        same = eligible & (fast.tokens == slow.tokens)
        torch.testing.assert_close(fast.confidence[same], slow.confidence[same], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast.logprob[same], slow.logprob[same], atol=1e-4, rtol=1e-5)
        assert torch.equal(fast.confidence == float("-inf"), ~eligible) and (fast.logprob[~eligible] == 0).all()


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_an_improbable_token_is_never_drawn_at_a_real_vocabulary(kernel, monkeypatch):
    """Sampling statistics at Dream's vocabulary: one token per position carries all but ~1.4e-8 of the mass
    (every other logit 30 below it), so over 2048 positions x 4 steps no other token may be drawn (expected
    count 1e-4), with and without a top-p nucleus, by the kernel and by the compiled ops. Uniforms that reach 1.0
    (24-bit ones did) force a random draw at ~1 position in 110: ~75 here."""
    from dare.rollout import SamplerConfig
    from dare.rollout.engine import noise, sampling

    monkeypatch.setenv("DARE_PROPOSAL_KERNEL", kernel)
    b, w, vocab = 64, 32, 152064
    logits = torch.full((b, w, vocab), -30.0, device="cuda", dtype=torch.bfloat16)
    likely = torch.randint(0, vocab, (b, w), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    likely = torch.where(likely == 7, 8, likely)  # not the banned id
    logits.scatter_(-1, likely[..., None], 0.0)
    eligible = torch.ones(b, w, dtype=torch.bool, device="cuda")
    keys = noise.row_keys(list(range(b)), "cuda")
    positions = torch.arange(w, device="cuda")[None].expand(b, w)
    for settings in (dict(temperature=1.0), dict(temperature=1.0, top_p=0.95, confidence="neg_entropy",
                                                 confidence_source="sampling")):
        config = SamplerConfig(sampler="llada", **settings).resolved()
        others = 0
        for step in range(4):
            counters = torch.full((b,), step, device="cuda", dtype=torch.long)
            proposal = sampling.propose_static(logits, eligible, config=config, banned=7, keys=keys,
                                               counters=counters, positions=positions)
            others += int((proposal.tokens != likely).sum())
        assert others == 0, (settings, others)


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_tiny_temperatures_break_exact_ties_by_the_noise_at_a_real_vocabulary(kernel, monkeypatch):
    """Two exactly tied top logits per position (lanes, tiles or slices apart) at T = 1e-7, LLaDA's vocabulary: each
    is drawn about half the time, by the kernel and by the compiled ops. Keys
    ``logit / T + noise`` lost the noise (4e8 + noise in float32): the lower id won every draw."""
    from dare.rollout import SamplerConfig
    from dare.rollout.engine import noise, sampling

    monkeypatch.setenv("DARE_PROPOSAL_KERNEL", kernel)
    b, w, vocab = 16, 32, 126464
    config = SamplerConfig(sampler="llada", temperature=1e-7).resolved()
    keys = noise.row_keys(list(range(b)), "cuda")
    positions = torch.arange(w, device="cuda")[None].expand(b, w)
    eligible = torch.ones(b, w, dtype=torch.bool, device="cuda")
    for first, second in ((1000, 1001), (100, 100 + 1024), (100, 120000)):
        logits = torch.full((b, w, vocab), 30.0, device="cuda", dtype=torch.bfloat16)
        logits[..., first] = logits[..., second] = 40.0
        tokens = sampling.propose_static(logits, eligible, config=config, banned=7, keys=keys,
                                         counters=torch.zeros(b, dtype=torch.long, device="cuda"),
                                         positions=positions).tokens
        assert set(tokens.unique().tolist()) == {first, second}, (first, second)
        share = float((tokens == first).float().mean())
        assert abs(share - 0.5) < 4 * 0.5 / tokens.numel() ** 0.5, (first, second, share)


@pytest.mark.parametrize("rows,vocab,scale", [(512, 152064, 4.0), (64, 126464, 1.0), (4, 151936, 12.0)])
def test_top_p_kernel_at_real_vocabularies_matches_the_sorted_filter(rows, vocab, scale):
    """The sort-free top-p filter, compiled, at Dream's, LLaDA's and SDAR's vocabularies (bf16 values: many ties)
    against a float64 stable sort (ties in index order): each row's kept set is a prefix of the same sorted order
    (so one set contains the other), the tokens on which they differ carry at most 2e-5 of probability (float32
    rounding of a cumulative sum; near-uniform rows, ``scale`` 1, have ~1e-5 per token), and the kept entries are
    the input's. Float32 scores (32-bit keys), bf16 logits divided by a temperature inside the kernel (16-bit keys),
    and the drawn / source pair sharing their passes."""
    from dare.rollout.engine.top_p_kernel import top_p_filter, top_p_filter_pair

    torch.manual_seed(0)
    logits = (torch.randn(rows, vocab, device="cuda") * scale).to(torch.bfloat16)
    logits[0, 7] = float("-inf")
    banned, t = 11, 0.8

    def check(filtered, scores, p):
        got = torch.isfinite(filtered)
        x = scores.double()
        s, idx = torch.sort(x, dim=-1, descending=True, stable=True)
        remove = torch.cumsum(torch.softmax(s, -1), -1) > p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        want = ~torch.zeros_like(remove).scatter(-1, idx, remove) & torch.isfinite(x)
        nested = ((got & ~want).any(-1) & (want & ~got).any(-1)).sum().item()
        assert nested == 0, (p, nested)
        differ = torch.where(got ^ want, torch.softmax(x, -1), 0.0).sum(-1).max().item()
        assert differ <= 2e-5, (p, differ)
        assert torch.equal(filtered[got], scores[got]), p  # kept entries are the scores, bit for bit

    x = logits.float()
    scaled = x / t
    choice = scaled.clone()
    choice[:, banned] = float("-inf")
    for p in (0.05, 0.5, 0.95):
        check(top_p_filter(x, p), x, p)
        check(top_p_filter(logits, p, temperature=t), scaled, p)
        drawn, source = top_p_filter_pair(logits, p, banned=banned, temperature=t)
        check(drawn, choice, p)
        check(source, scaled, p)
        assert not torch.isfinite(drawn[:, banned]).any()


@pytest.mark.parametrize("overrides", [dict(sampler="fastdllm", cache="dual", threshold=0.3, temperature=0.9),
                                       dict(sampler="llada", temperature=0.0)])
def test_graph_engine_under_autocast_decodes_with_the_current_weights(overrides):
    """RL decodes fp32 weights (or fp32 LoRA adapters) under bf16 autocast. Graphs recorded there must cast the
    weights on every replay: a graph that read autocast's cached casts decoded with freed memory and ignored the
    optimizer's in-place updates."""
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    model = sharp_cuda_model("llada").float()
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(gen_length=32, block_length=8, **overrides)
    outputs = []
    for update in range(2):
        if update:
            with torch.no_grad():  # an optimizer step: in place, same addresses
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            static = generate(model, ids, mask, config, engine="static", example_ids=[1, 2, 3])
            graph = generate(model, ids, mask, config, engine="graph", example_ids=[1, 2, 3])
        assert torch.equal(graph.completion, static.completion), update
        assert graph.nfe == static.nfe
        outputs.append(graph.completion)
    assert engine_stats(model).captures >= 1 and engine_stats(model).replays >= 1
    assert not torch.equal(outputs[0], outputs[1])  # the update changed what is decoded


def test_static_confidences_round_as_the_eager_softmax_does_under_autocast():
    """bf16 logits: the eager samplers' softmax rounds confidences to bf16, but under CUDA autocast it runs in
    float32 (softmax is on autocast's float32 list), so static steps round to float32 there."""
    from dare.rollout.engine.sampling import confidence_rounding

    logits = torch.zeros(1, 2, 8, device="cuda", dtype=torch.bfloat16)
    probs = torch.softmax(logits, dim=-1)
    assert confidence_rounding("model", logits) == probs.dtype == torch.bfloat16
    with torch.autocast("cuda", dtype=torch.bfloat16):
        probs = torch.softmax(logits, dim=-1)
        assert confidence_rounding("model", logits) == probs.dtype == torch.float32
        assert confidence_rounding("float64", logits) is None


def test_decode_attention_kernels_equal_sdpa_at_decoding_shapes_and_record_in_graphs():
    import torch.nn.functional as F

    from dare.models.decode_attention import decode_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    # SDAR-8B heads (32 query, 8 KV) with a mask; LLaDA-8B heads (32, 32) without one (a dual-cache window step)
    for batch, kv_heads, queries, keys, masked in [(64, 8, 4, 388, True), (1, 8, 8, 260, True),
                                                   (16, 8, 4, 1030, True), (16, 32, 32, 384, False)]:
        groups = 32 // kv_heads
        q = torch.randn(batch, 32, queries, 128, device="cuda", generator=gen).bfloat16()
        cache = torch.randn(2, batch, kv_heads, keys + 20, 128, device="cuda", generator=gen).bfloat16()
        k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]
        mask = torch.rand(batch, 1, queries, keys, device="cuda", generator=gen) < 0.7
        mask[..., 0] = True
        mask = mask if masked else None
        expected = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(groups, 1),
                                                  v.float().repeat_interleave(groups, 1), attn_mask=mask)
        out = decode_attention(q, k, v, mask, 128 ** -0.5)
        torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            decode_attention(q, k, v, mask, 128 ** -0.5)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            recorded = decode_attention(q, k, v, mask, 128 ** -0.5)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(recorded, out)


def test_graph_engine_decodes_block_steps_with_the_decode_attention_kernels_by_default(monkeypatch):
    from dare.models import decode_attention as kernels
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import release

    model = tiny_model("sdar", seed=1, head_dim=64, num_attention_heads=8, num_key_value_heads=2).cuda()
    model = model.to(torch.float16)  # fp16's finer mantissa: fewer near-ties between the two attention kernels
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(50.0)
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="sdar", cache="block", gen_length=32, block_length=4)
    calls, real = [], kernels.decode_attention
    monkeypatch.setattr(kernels, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "sdpa")
    plain = generate(model, ids, mask, config, engine="graph")
    assert not calls
    monkeypatch.delenv("DARE_DECODE_ATTENTION")  # the default: masked block steps use the kernels
    release(model)  # record the steps again
    routed = generate(model, ids, mask, config, engine="graph")
    assert calls  # recorded into the steps' graphs
    assert routed.nfe == plain.nfe
    assert (routed.completion == plain.completion).float().mean() > 0.9  # near-ties may still differ


@pytest.mark.parametrize("family,overrides", [("llada", dict(sampler="fastdllm", cache="dual", threshold=0.3)),
                                              ("sdar", dict(sampler="sdar", cache="block"))])
def test_compiled_blocks_that_write_their_own_cache_layer_decode_the_same_tokens(family, overrides, monkeypatch):
    """DARE_FUSE_CACHE_WRITES=1 under the graph engine with statically compiled blocks (inductor: the key/value
    writes join the generated kernels) records its steps - no fallback to the eager loop, which would decode the
    same tokens slowly (seen once: the first run allocated the buffers, so the recording compiled again) - and
    decodes what the cache's own writes decode (fp32)."""
    from dare.models.compile import compile_blocks
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats, release

    torch.backends.cuda.matmul.allow_tf32 = False
    model = compile_blocks(sharp_cuda_model(family), dynamic=False)
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(gen_length=32, block_length=8, **overrides)
    outputs = {}
    try:
        for switch in ("0", "1"):
            monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", switch)
            release(model)  # record the steps again
            fallbacks = engine_stats(model).fallbacks
            outputs[switch] = generate(model, ids, mask, config, engine="graph")
            assert engine_stats(model).fallbacks == fallbacks and engine_stats(model).captures > 0, switch
    finally:
        torch._dynamo.reset()
    assert torch.equal(outputs["0"].completion, outputs["1"].completion)
    assert outputs["0"].nfe == outputs["1"].nfe
    torch.testing.assert_close(outputs["0"].logprobs, outputs["1"].logprobs, atol=1e-5, rtol=0)


def test_graph_engine_decodes_a_model_compiled_for_training_with_its_static_compilation():
    """A model compiled with dynamic shapes (``model.compile``, as for training) records its graph steps through
    the blocks' static compilation (dare.models.compile.static_shapes): the same tokens and log-probs as a model
    compiled with static shapes (the same generated kernels), no fallback; a training forward and backward then
    run the dynamic compilation again."""
    from torch._dynamo.utils import counters

    from dare.models.compile import compile_blocks
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    torch.backends.cuda.matmul.allow_tf32 = False
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(gen_length=32, block_length=8, sampler="fastdllm", cache="dual", threshold=0.3)
    outputs = {}
    try:
        for dynamic in (False, True):
            torch._dynamo.reset()
            model = compile_blocks(sharp_cuda_model("llada"), dynamic=dynamic)
            outputs[dynamic] = generate(model, ids, mask, config, engine="graph")
            assert engine_stats(model).fallbacks == 0 and engine_stats(model).captures > 0, dynamic
        model.train()(ids[:, :11]).logits.float().sum().backward()
        graphs = counters["stats"]["unique_graphs"]
        model.train()(ids).logits.float().sum().backward()  # another length: the dynamic graph, no recompile
        assert counters["stats"]["unique_graphs"] == graphs
    finally:
        torch._dynamo.reset()
    assert torch.equal(outputs[False].completion, outputs[True].completion)
    assert outputs[False].nfe == outputs[True].nfe
    torch.testing.assert_close(outputs[False].logprobs, outputs[True].logprobs, atol=0, rtol=0)


def test_steps_recorded_again_after_their_pool_lost_every_graph():
    """A block of the old pool still held (here a tensor made during the recording), every graph gone: the allocator
    asserts if the next recording reuses the pool's handle. The engine's pool hands out a fresh one, and a model
    whose steps were released records them again without falling back."""
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats, release
    from dare.rollout.engine.graphs import GraphPool

    x = torch.ones(1 << 20, device="cuda")

    def record(pool):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool.for_recording()):
            made = x * 2
        pool.add(graph)
        return graph, made

    pool = GraphPool()
    graph, held = record(pool)
    graph.replay()
    first = pool.handle
    del graph
    torch.cuda.empty_cache()
    graph, again = record(pool)
    graph.replay()
    assert pool.handle != first and torch.equal(again, x * 2) and torch.equal(held, x * 2)

    model = sharp_cuda_model("llada")
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=32, block_length=8)
    outputs = []
    for _ in range(2):
        release(model)
        fallbacks, captures = engine_stats(model).fallbacks, engine_stats(model).captures
        outputs.append(generate(model, ids, mask, config, engine="graph"))
        assert engine_stats(model).fallbacks == fallbacks and engine_stats(model).captures > captures
    assert torch.equal(outputs[0].completion, outputs[1].completion)


def test_an_fsdp_model_decodes_with_recorded_graphs_of_its_own_copy(tmp_path):
    """FSDP2 over NCCL on every visible GPU: the sharded model decodes with CUDA graphs of the engine's unsharded
    copy, exactly what the unsharded model's graphs decode, before and after an in-place update; the update is
    replayed by the graphs recorded before it (no new recording); a copy that cannot be made falls back cleanly."""
    from test_distributed import check_fsdp_rollout, run_fsdp_rollout_worker

    result = run_fsdp_rollout_worker(tmp_path, nproc=torch.cuda.device_count(), device="cuda")
    check_fsdp_rollout(result)
    assert result["twin_captures"] >= 1
    assert result["twin_captures_after_update"] == result["twin_captures"]


def test_recorded_steps_of_a_lora_model_follow_its_adapter_state():
    """Graphs recorded with the adapter on must not replay inside peft's disable_adapter: on, off and on again,
    each graph decode equals the static steps run eagerly in the same adapter state, and off differs from on."""
    from dare.models.lora import apply_lora
    from dare.rollout import SamplerConfig, generate

    torch.backends.cuda.matmul.allow_tf32 = False
    model = apply_lora(sharp_cuda_model("llada"), r=4, alpha=8)
    with torch.no_grad():  # peft starts B at zero: make the adapter change the logits
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=32, block_length=8)

    def both():
        return [generate(model, ids, mask, config, engine=e).completion for e in ("static", "graph")]

    on = both()
    with model.disable_adapter():
        off = both()
    on_again = both()
    for static, graph in (on, off, on_again):
        assert torch.equal(static, graph)
    assert not torch.equal(on[1], off[1]) and torch.equal(on[1], on_again[1])


def test_resumed_and_inpainted_decoding_records_and_replays():
    """canvas / step_range on CUDA graphs: each call equals the static steps run eagerly; later calls with other
    starts and stops replay (no recording beyond one per first-block budget)."""
    from dare.models.spec import family_of
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    torch.backends.cuda.matmul.allow_tf32 = False
    model = sharp_cuda_model("llada")
    mask_id = family_of(model).token_ids(model.config).mask
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=24, block_length=8, steps=12,
                           eos_early_stop=False)
    head = generate(model, ids, mask, config, engine="graph", step_range=(0, 5))
    state = head.state(mask_id)
    canvas = torch.full((3, 24), mask_id, device="cuda")
    canvas[:, 3] = 65
    calls = [dict(step_range=(0, 5)), dict(canvas=state, step_range=(5, None)), dict(canvas=canvas),
             dict(canvas=state, step_range=(5, 9))]
    for resume in calls:
        static = generate(model, ids, mask, config, engine="static", **resume)
        graph = generate(model, ids, mask, config, engine="graph", **resume)
        assert torch.equal(graph.completion, static.completion) and torch.equal(graph.step_map, static.step_map)
        assert graph.nfe == static.nfe and engine_stats(model).fallbacks == 0
    captures = engine_stats(model).captures
    generate(model, ids, mask, config, engine="graph", canvas=state, step_range=(5, 7))
    assert engine_stats(model).captures == captures


@pytest.mark.parametrize("family,overrides", [("llada", dict(sampler="fastdllm", cache="dual")),
                                              ("sdar", dict(sampler="sdar", cache="block"))])
def test_fp8_graph_engine_replays_its_static_steps_and_compiles(family, overrides):
    """``weights='fp8'``: recorded steps equal the static steps they record (same FP8 kernels), stay close to the
    bf16 decoding without equalling it, and statically compiled blocks record them too (no fallback)."""
    from dare.models.compile import compile_blocks
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats, release

    model = sharp_cuda_model(family).to(torch.bfloat16)
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(gen_length=32, block_length=8, weights="fp8", **overrides)
    static = generate(model, ids, mask, config, engine="static")
    graph = generate(model, ids, mask, config, engine="graph")
    stats = engine_stats(model)
    assert stats.fallbacks == 0 and stats.captures > 0 and stats.fused_bytes > 0
    assert torch.equal(graph.completion, static.completion) and graph.nfe == static.nfe
    torch.testing.assert_close(graph.logprobs, static.logprobs, atol=1e-5, rtol=0)
    bf16 = generate(model, ids, mask, config.replace(weights="model"), engine="graph")
    assert not torch.equal(bf16.logprobs, graph.logprobs)
    assert float((bf16.completion == graph.completion).float().mean()) > 0.5
    try:
        compile_blocks(model, dynamic=False)
        release(model)
        compiled = generate(model, ids, mask, config, engine="graph")
        assert engine_stats(model).fallbacks == 0
        # inductor may round an activation's scaled value to the neighbouring FP8 value (x * (1 / s) for x / s):
        # a perturbation of the size of the quantisation itself, so the bound is the bf16-vs-FP8 one
        assert float((compiled.completion == graph.completion).float().mean()) > 0.5
        assert not torch.equal(compiled.logprobs, bf16.logprobs)  # the compiled blocks read the FP8 copies
    finally:
        torch._dynamo.reset()


def test_fp8_graph_engine_decodes_a_lora_policy_with_its_adapters_merged():
    """FP8 copies of LoRA-wrapped projections carry the adapters (merged at each refresh): recorded steps replay
    the static ones, and turning the adapters off changes the decoding."""
    from dare.models.lora import apply_lora
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import engine_stats

    model = apply_lora(sharp_cuda_model("llada").to(torch.bfloat16), r=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    ids, mask = padded(seqs([9, 14, 5]))
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=32, block_length=8, weights="fp8")
    static = generate(model, ids, mask, config, engine="static")
    graph = generate(model, ids, mask, config, engine="graph")
    assert engine_stats(model).fallbacks == 0
    assert torch.equal(graph.completion, static.completion)
    torch.testing.assert_close(graph.logprobs, static.logprobs, atol=1e-5, rtol=0)
    with model.disable_adapter():
        off = generate(model, ids, mask, config, engine="graph")
    assert not torch.equal(off.logprobs, graph.logprobs)
