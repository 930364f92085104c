"""Block-diffusion SFT (SDAR / LLaDA2, algorithms.md 1.2): hand computations with explicit per-block forwards of
``[x_<b ; z_b]``, the B' = n (MDLM) and B' = 1 (next-token) limits, invariance to micro-batching / packing, learning,
LoRA round trip, config errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_sft import assert_same, grads_of, small_config, tiny_examples

from dare.algorithms import get_algorithm, resolve_algorithm_config
from dare.algorithms.logprobs import prompt_lengths_of
from dare.data.sft import collate_packed, collate_padded
from dare.data.tokenizer import EOS_ID, MASK_ID, PAD_ID
from dare.errors import ConfigError
from dare.models import family_of
from dare.models.tiny import tiny_model
from dare.trainer import Trainer, load_train_config

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def bd_sft(model, batch, **options):
    """Loss and corrupted batch of the ``sft`` algorithm bound to ``model`` (one micro-batch = the global batch)."""
    config = resolve_algorithm_config({"name": "sft", **options})
    algo = get_algorithm("sft")(config, token_ids=family_of(model).token_ids(model.config), seed=3)
    algo.bind_model(model)
    batch = algo.corrupt(batch, step=0)
    loss, _ = algo.loss(batch, algo.estimate(model, batch), algo.totals(batch))
    return loss, batch, algo


def padded(n=3, extra=0, eos_padding=False):
    examples = tiny_examples(n)
    width = max(len(e) for e in examples) + extra
    return examples, collate_padded(examples, width, EOS_ID, PAD_ID, eos_padding=eos_padding)


def blocks_of(length, prompt, bs, origin):
    """Block id of each position, written out by hand for both origins."""
    if origin == "global":
        return [p // bs for p in range(length)]
    first = math.ceil(prompt / bs)
    return [p // bs if p < prompt else first + (p - prompt) // bs for p in range(length)]


def per_block_ce(model, clean, noisy, masked, blocks):
    """CE of every masked token, each block predicted by its own forward of ``[x_<b ; z_b]`` (block-causal)."""
    ids = torch.tensor(blocks)
    ce = torch.zeros(len(clean))

    def block_causal(b, h, q, k):
        return ids[k] <= ids[q]

    for block in sorted(set(blocks)):
        idx = [i for i, b in enumerate(blocks) if b == block]
        start, end = idx[0], idx[-1] + 1
        if not bool(masked[start:end].any()):
            continue
        prefix = torch.cat([clean[:start], noisy[start:end]])
        logits = model(prefix[None], attention_rule=block_causal).logits[0, start:end].float()
        ce[start:end] = F.cross_entropy(logits, clean[start:end], reduction="none")
    return torch.where(masked, ce, torch.zeros(()))


@pytest.mark.parametrize("family, origin", [("sdar", "global"), ("sdar_moe", "response"), ("llada2", "response")])
def test_fully_masked_loss_equals_explicit_per_block_forwards(family, origin):
    """t = 1 (all response tokens masked), several blocks: L = mean_i mean_{j in y_i} CE_j with block b of example i
    computed from a separate block-causal forward of [x_<b ; z_b] (no 2L trick)."""
    model = tiny_model(family, seed=1)
    bs = 3  # not a divisor of the prompt lengths: global blocks straddle the prompt / response boundary
    examples, batch = padded(3)
    loss, views, algo = bd_sft(model, batch, t_min=1.0, t_max=1.0, block_size=bs, block_origin=origin)
    assert algo.blocks.size == bs and algo.blocks.origin == origin
    per_seq = []
    with torch.no_grad():
        for r, ex in enumerate(examples):
            n, p = len(ex), ex.prompt_len
            clean, noisy, masked = views["input_ids"][r, :n], views["noisy_ids"][r, :n], views["mask"][r, :n]
            assert masked.tolist() == [j >= p for j in range(n)] and bool((noisy[p:] == MASK_ID).all())
            blocks = blocks_of(n, p, bs, origin)
            assert len(set(blocks[p:])) >= 2  # the response spans several blocks
            per_seq.append(per_block_ce(model, clean, noisy, masked, blocks).sum() / (n - p))
    torch.testing.assert_close(loss.detach(), torch.stack(per_seq).mean(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family, options, normaliser", [
    # BD3LM: one t per block, 1/t, / answer tokens (d1), response-aligned blocks
    ("sdar", dict(per_block_t=True, normalize="d1", block_origin="response"), "answer"),
    # LLaDA2 (DARE): one t ~ U[0.3, 0.8] per sample, unweighted mean over masked tokens, global blocks
    ("llada2", dict(t_min=0.3, t_max=0.8, inverse_t=False, normalize="masked", block_size=4), "masked"),
])
def test_random_t_loss_is_the_reference_objective(family, options, normaliser):
    model = tiny_model(family, seed=2)
    examples, batch = padded(4)
    loss, views, algo = bd_sft(model, batch, **options)
    bs, origin = algo.blocks.size, algo.blocks.origin
    total, answer, masked_count, distinct = 0.0, 0, 0, []
    with torch.no_grad():
        for r, ex in enumerate(examples):
            n, p = len(ex), ex.prompt_len
            clean, noisy, masked = views["input_ids"][r, :n], views["noisy_ids"][r, :n], views["mask"][r, :n]
            p_mask = views["p_mask"][r, :n]
            assert not bool(masked[:p].any())  # the prompt is never masked
            blocks = blocks_of(n, p, bs, origin)
            levels = {}
            for j in range(p, n):  # one level per block (BD3LM) or per sample (LLaDA2)
                levels.setdefault(blocks[j] if options.get("per_block_t") else 0, set()).add(float(p_mask[j]))
            assert all(len(v) == 1 for v in levels.values())
            low, high = options.get("t_min", 1e-3), options.get("t_max", 1.0)
            assert all(low <= next(iter(v)) <= high for v in levels.values())
            distinct.append(len({float(p_mask[j]) for j in range(p, n)}))
            ce = per_block_ce(model, clean, noisy, masked, blocks)
            weight = 1.0 / p_mask if options.get("inverse_t", True) else torch.ones(n)
            total += float((ce * weight).sum())
            answer += n - p
            masked_count += int(masked.sum())
    assert max(distinct) > 1 if options.get("per_block_t") else max(distinct) == 1  # levels differ across blocks
    expected = total / (answer if normaliser == "answer" else masked_count)
    assert abs(loss.item() - expected) < 1e-4 * max(1.0, abs(expected))


def test_one_block_gives_the_mdlm_loss_on_the_same_corruption():
    """B' >= n: one bidirectional block, no noisy -> clean edges: the loss is the MDLM loss of z (algorithms.md 1.2)."""
    model = tiny_model("sdar", seed=4)
    examples, batch = padded(3)
    width = batch["input_ids"].shape[1]
    loss, views, _ = bd_sft(model, batch, block_size=width)
    expected = []
    with torch.no_grad():
        for r, ex in enumerate(examples):
            n, p = len(ex), ex.prompt_len
            masked = views["mask"][r, :n]
            logits = model(views["noisy_ids"][r, :n][None], block_size=width).logits[0].float()  # full attention
            ce = F.cross_entropy(logits[masked], views["input_ids"][r, :n][masked], reduction="sum")
            expected.append(ce / float(views["p_mask"][r, p]) / (n - p))
    torch.testing.assert_close(loss.detach(), torch.stack(expected).mean(), atol=1e-5, rtol=1e-5)


def test_token_blocks_fully_masked_are_next_token_prediction():
    """B' = 1, everything masked: token j is predicted from the clean tokens < j (and its own mask token)."""
    model = tiny_model("sdar", seed=5)
    examples, batch = padded(2)
    loss, _, _ = bd_sft(model, batch, block_size=1, t_min=1.0, t_max=1.0, normalize="d1")
    ce, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:
            ids = torch.tensor(ex.ids)
            for j in range(ex.prompt_len, len(ex)):
                causal_input = torch.cat([ids[:j], torch.tensor([MASK_ID])])[None]
                logits = model(causal_input, block_size=1).logits[0, -1].float()  # block 1 = causal attention
                ce += float(F.cross_entropy(logits[None], ids[j:j + 1]))
                count += 1
    assert abs(loss.item() - ce / count) < 1e-5 * max(1.0, ce / count)


@pytest.mark.parametrize("family, options", [
    ("sdar", ["algorithm.normalize=d1"]),  # SDAR: t per sample, / answer tokens, global blocks
    ("llada2", ["algorithm.block_size=4", "algorithm.per_block_t=true", "algorithm.block_origin=response"]),
])
def test_micro_batching_and_packing_do_not_change_loss_or_gradients(tmp_path, family, options):
    common = [f"model.path=tiny:{family}", "data.eos_padding=false", *options]
    reference = grads_of(Trainer(small_config(tmp_path / "a", *common)))
    assert_same(reference, grads_of(Trainer(small_config(tmp_path / "b", *common, "trainer.micro_batch_size=4"))))
    fixed = Trainer(small_config(tmp_path / "d", *common, "data.fixed_shapes=true"))
    assert fixed.source.batch(0)[0]["input_ids"].shape[1] == 48  # data.max_length: padding is never attended
    assert_same(reference, grads_of(fixed))
    packed = Trainer(small_config(tmp_path / "c", *common, "data.packing=true", "data.pack_length=64",
                                  "data.fixed_shapes=true"))
    rows = packed.source.batch(0)
    assert len(rows) > 1 and {tuple(r["input_ids"].shape) for r in rows} == {(1, 64)}  # several fixed-shape rows
    assert_same(reference, grads_of(packed))


def test_prompt_lengths_of_padded_rows_and_packed_documents():
    examples = tiny_examples(3)
    lengths = [e.prompt_len for e in examples]
    pad = collate_padded(examples, max(len(e) for e in examples) + 2, EOS_ID, PAD_ID, eos_padding=False)
    assert prompt_lengths_of(pad["maskable"]).tolist() == lengths
    packed = collate_packed(examples, length=sum(len(e) for e in examples) + 5, pad_id=PAD_ID)
    assert packed["cu_seqlens"][0, -1] == packed["input_ids"].shape[1]  # the filler is a document of its own
    starts = prompt_lengths_of(packed["maskable"], packed["cu_seqlens"][0])
    assert starts.tolist() == lengths + [5]  # the filler counts as all prompt


@pytest.mark.parametrize("recipe", ["sdar", "llada2"])
def test_tiny_recipe_lowers_the_loss(tmp_path, recipe):
    config = load_train_config(ROOT / "configs" / recipe / "sft_tiny.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.max_steps=30", "trainer.save_every=null",
        "trainer.export=false", "data.num_examples=96"])
    trainer = Trainer(config)
    before = float(grads_of(trainer, step=0)[0]["loss"])
    trainer.train()
    after = float(grads_of(trainer, step=0)[0]["loss"])
    assert after < 0.6 * before, (before, after)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_lora_block_diffusion_round_trip(tmp_path, family):
    """Block-diffusion SFT with LoRA -> adapter reload (exact) -> merged checkpoint loads strictly, same logits."""
    from transformers import AutoModel

    from dare.models.block_diffusion import two_copy_inputs
    from dare.models.loading import load_model
    from dare.models.lora import merge_adapter

    run = tmp_path / "run"
    trainer = Trainer(small_config(run, f"model.path=tiny:{family}:2", "lora.enabled=true", "lora.r=4",
                                   "optim.lr=1e-2", "trainer.max_steps=3", "algorithm.block_size=4"))
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    clean = torch.randint(0, 256, (2, 10))
    noisy = torch.where(torch.rand(clean.shape) < 0.5, MASK_ID, clean)
    inputs = two_copy_inputs(noisy, clean, 4).model_kwargs()
    with torch.no_grad():
        expected = trainer.model.eval()(**inputs).logits
        assert not torch.allclose(expected, load_model(f"tiny:{family}:2")(**inputs).logits)  # the adapter matters
        reloaded = load_model(f"tiny:{family}:2", adapter=str(run / "final"))
        torch.testing.assert_close(reloaded(**inputs).logits, expected, atol=0, rtol=0)
        merged = AutoModel.from_pretrained(str(merge_adapter(str(run / "final"), str(tmp_path / "merged"))))
        torch.testing.assert_close(merged(**inputs).logits, expected, atol=1e-5, rtol=1e-5)


def test_block_options_are_validated():
    with pytest.raises(ConfigError, match="algorithm.block_origin 'responce'.*did you mean 'response'"):
        resolve_algorithm_config({"name": "sft", "block_origin": "responce"})
    with pytest.raises(ConfigError, match="block_size must be a positive integer"):
        resolve_algorithm_config({"name": "sft", "block_size": 0})
    algo = get_algorithm("sft")(resolve_algorithm_config({"name": "sft", "per_block_t": True}), token_ids=None)
    with pytest.raises(ConfigError, match="algorithm.per_block_t applies to block-causal families.*llada uses full"):
        algo.bind_model(tiny_model("llada"))
    algo.bind_model(tiny_model("sdar", block_size=8))  # the model's config.json block_size is the default
    assert algo.blocks.size == 8


def test_mc_elbo_uses_the_block_layout_on_block_causal_families():
    """The shared ELBO helper (VRPO / RL) scores block b of a block-causal model from [x_<b ; z_b] too."""
    from dare.algorithms.logprobs import mc_elbo
    from dare.diffusion import corrupt_mc

    model = tiny_model("sdar", seed=6)
    examples, batch = padded(2)
    views = corrupt_mc(batch["input_ids"], batch["maskable"], batch["example_index"], MASK_ID, seed=0, step=0, n=2)
    with torch.no_grad():
        _, terms = mc_elbo(model, batch["input_ids"], views, batch["example_index"],
                           attention_mask=batch["attention_mask"])
        for r, ex in enumerate(examples):
            n, blocks = len(ex), blocks_of(len(ex), ex.prompt_len, model.block_size, "global")
            for m in range(2):
                masked = views.mask[r, m, :n]
                ce = per_block_ce(model, batch["input_ids"][r, :n], views.noisy_ids[r, m, :n], masked, blocks)
                expected = -(ce / views.p_mask[r, m, :n]).sum()
                assert abs(float(terms[r, m]) - float(expected)) < 1e-4 * max(1.0, abs(float(expected)))


@pytest.mark.parametrize("lora", [False, True])
def test_a_block_size_other_than_the_checkpoints_is_saved_or_said(tmp_path, lora, caplog):
    """SFT with algorithm.block_size=8 on a block-4 checkpoint: the saved config.json says 8, so decoding the result
    uses the block length it was trained with; a LoRA adapter, which has no config.json, gets the length in the
    warning instead."""
    import json
    import logging

    run = tmp_path / "run"
    extra = ["lora.enabled=true", "lora.r=4"] if lora else []
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        Trainer(small_config(run, "model.path=tiny:sdar:2", "trainer.max_steps=1", "algorithm.block_size=8",
                             *extra)).train()
    warned = [r.getMessage() for r in caplog.records if "algorithm.block_size=8" in r.getMessage()]
    assert len(warned) == 1 and "block size 4" in warned[0]
    if lora:
        assert "block_length=8" in warned[0] and not (run / "final" / "config.json").exists()
    else:
        assert json.loads((run / "final" / "config.json").read_text())["block_size"] == 8
