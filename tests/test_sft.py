"""SFT: loss = hand computation, invariance to micro-batching / packing, learning, data preparation."""

import json

import pytest
import torch
import torch.nn.functional as F

from dare.algorithms import get_algorithm, resolve_algorithm_config
from dare.data.sft import build_sft_dataset, collate_packed, collate_padded, pack, tokenize_record
from dare.data.tokenizer import EOS_ID, EOT_ID, MASK_ID, PAD_ID, build_byte_tokenizer
from dare.errors import ConfigError, InputError
from dare.models import family_of
from dare.models.tiny import tiny_model
from dare.trainer import Trainer, load_train_config
from dare.trainer.config import DataConfig


def small_config(tmp_path, *overrides):
    base = [f"trainer.output_dir={tmp_path}", "trainer.progress=false", "data.num_examples=32",
            "data.max_length=48", "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.max_steps=2"]
    return load_train_config(None, base + list(overrides))


def tiny_examples(n=4, **data_overrides):
    cfg = DataConfig(path="synthetic:reverse", num_examples=n, max_length=64, **data_overrides)
    return build_sft_dataset(cfg, build_byte_tokenizer(), EOS_ID).examples


def run_sft(model, batch, **options):
    config = resolve_algorithm_config({"name": "sft", **options})
    algo = get_algorithm("sft")(config, token_ids=family_of(model).token_ids(model.config), seed=0)
    batch = algo.corrupt(batch, step=0)
    totals = algo.totals(batch)
    loss, _ = algo.loss(batch, algo.estimate(model, batch), totals)
    return loss, batch


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_full_mask_loss_is_mean_per_sequence_answer_ce(family):
    """t = 1: every answer token masked; L = mean_i mean_{j in answer_i} CE (algorithms.md 1.1 sanity test)."""
    model = tiny_model(family, seed=0)
    examples = tiny_examples(3)
    width = max(len(e) for e in examples) + 2
    batch = collate_padded(examples, width, EOS_ID, PAD_ID, eos_padding=True)
    loss, _ = run_sft(model, batch, t_min=1.0, t_max=1.0)
    per_seq = []
    for ex in examples:
        ids = torch.tensor(list(ex.ids) + [EOS_ID] * (width - len(ex)))
        noisy = ids.clone()
        noisy[ex.prompt_len:] = MASK_ID
        raw = model(noisy[None]).logits[0]
        shift = 1 if family == "dream" else 0  # Dream: the output at j - 1 predicts token j
        targets = range(ex.prompt_len, width)
        ce = [F.cross_entropy(raw[j - shift][None].float(), ids[j][None]) for j in targets]
        per_seq.append(torch.stack(ce).mean())
    assert torch.allclose(loss, torch.stack(per_seq).mean(), atol=1e-5, rtol=1e-5)


def test_random_t_loss_is_the_llada_nelbo():
    model = tiny_model("llada", seed=0)
    examples = tiny_examples(4)
    width = max(len(e) for e in examples)
    batch = collate_padded(examples, width, EOS_ID, PAD_ID, eos_padding=False)
    loss, views = run_sft(model, batch)
    total = 0.0
    torch.set_grad_enabled(False)
    for r, ex in enumerate(examples):
        n = len(ex)
        noisy = views["noisy_ids"][r, :n]
        logits = model(noisy[None]).logits[0].float()
        masked = views["mask"][r, :n]
        t = float(views["p_mask"][r, ex.prompt_len])
        ce = F.cross_entropy(logits[masked], views["input_ids"][r, :n][masked], reduction="sum")
        total += float(ce) / t / (n - ex.prompt_len)
        assert bool(views["mask"][r, :ex.prompt_len].sum() == 0)
    torch.set_grad_enabled(True)
    assert abs(loss.detach().item() - total / len(examples)) < 1e-4


def grads_of(trainer, step=0):
    trainer.optimizer.zero_grad(set_to_none=True)
    metrics = trainer.forward_backward(step)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.optimizer.zero_grad(set_to_none=True)
    return metrics, grads


def assert_same(a, b):
    (ma, ga), (mb, gb) = a, b
    assert abs(float(ma["loss"]) - float(mb["loss"])) < 1e-6 * max(1.0, abs(float(ma["loss"])))
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_micro_batching_and_packing_do_not_change_loss_or_gradients(tmp_path, family):
    common = [f"model.path=tiny:{family}", "data.eos_padding=false"]
    reference = grads_of(Trainer(small_config(tmp_path / "a", *common)))
    assert_same(reference, grads_of(Trainer(small_config(tmp_path / "b", *common, "trainer.micro_batch_size=3"))))
    packed = Trainer(small_config(tmp_path / "c", *common, "data.packing=true", "data.pack_length=64"))
    assert len(packed.source.batch(0)) > 1  # several packed micro-batches
    assert_same(reference, grads_of(packed))
    eos = [f"model.path=tiny:{family}", "algorithm.normalize=d1"]
    assert_same(grads_of(Trainer(small_config(tmp_path / "d", *eos))),
                grads_of(Trainer(small_config(tmp_path / "e", *eos, "trainer.micro_batch_size=2"))))


def test_sft_on_a_synthetic_task_lowers_the_loss(tmp_path):
    config = small_config(tmp_path, "data.num_examples=128", "trainer.batch_size=16", "trainer.max_steps=40",
                          "optim.lr=3e-3", "trainer.export=false")
    trainer = Trainer(config)
    before = float(grads_of(trainer, step=0)[0]["loss"])
    trainer.train()
    after = float(grads_of(trainer, step=0)[0]["loss"])
    assert after < 0.6 * before, (before, after)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 41))


def test_chat_and_plain_tokenization():
    tok = build_byte_tokenizer()
    cfg = DataConfig()
    prompt, answer = tokenize_record({"prompt": "hi", "response": "yo"}, tok, cfg, EOS_ID)
    assert tok.decode(prompt) == "<|bos|><|user|>hi<|eot|><|assistant|>"
    assert answer == [ord("y"), ord("o"), EOT_ID, EOS_ID]
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    assert tokenize_record(chat, tok, cfg, EOS_ID) == (prompt, answer)
    plain = DataConfig(chat_template=False, pad_response_to=5)
    assert tokenize_record({"prompt": "hi", "response": "yo"}, tok, plain, EOS_ID) == (
        [ord("h"), ord("i")], [ord("y"), ord("o"), EOS_ID, EOS_ID, EOS_ID])
    with pytest.raises(InputError, match="record 0 has neither"):
        tokenize_record({"question": "x"}, tok, cfg, EOS_ID)


def test_overlong_examples_are_dropped_and_counted_or_rejected(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": "p", "response": "r" * n}) for n in (2, 40, 3)) + "\n")
    data = build_sft_dataset(DataConfig(path=str(path), max_length=20), build_byte_tokenizer(), EOS_ID)
    assert len(data) == 2 and data.dropped == 1 and [e.index for e in data.examples] == [0, 1]
    with pytest.raises(InputError, match="record 1 has"):
        build_sft_dataset(DataConfig(path=str(path), max_length=20, overlong="error"), build_byte_tokenizer(), EOS_ID)


def test_collate_layouts():
    examples = tiny_examples(3)
    rows = pack(examples, 2 * max(len(e) for e in examples))
    assert [e.index for row in rows for e in row] == [0, 1, 2]
    packed = collate_packed(examples)
    lengths = [len(e) for e in examples]
    assert packed["cu_seqlens"][0].tolist() == [0, lengths[0], lengths[0] + lengths[1], sum(lengths)]
    assert int(packed["maskable"].sum()) == sum(len(e) - e.prompt_len for e in examples)
    width = max(lengths) + 3
    eos = collate_padded(examples, width, EOS_ID, PAD_ID, eos_padding=True)
    pad = collate_padded(examples, width, EOS_ID, PAD_ID, eos_padding=False)
    assert int(eos["maskable"].sum()) == sum(width - e.prompt_len for e in examples)  # EOS fill is answer
    assert int(pad["maskable"].sum()) == int(packed["maskable"].sum())
    assert bool((pad["example_index"][pad["attention_mask"] == 0] == -1).all())
    assert bool((pad["input_ids"][pad["attention_mask"] == 0] == PAD_ID).all())


def test_sft_config_errors_name_the_option():
    with pytest.raises(ConfigError, match="did you mean 'algorithm.normalize'"):
        resolve_algorithm_config({"name": "sft", "normalise": "llada"})
    with pytest.raises(ConfigError, match="unknown value for algorithm.normalize 'lada'"):
        resolve_algorithm_config({"name": "sft", "normalize": "lada"})
    with pytest.raises(ConfigError, match="unknown algorithm 'stf'"):
        resolve_algorithm_config({"name": "stf"})


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    plain = grads_of(Trainer(small_config(tmp_path / "a", "model.path=tiny:llada_moe")))
    ckpt = Trainer(small_config(tmp_path / "b", "model.path=tiny:llada_moe", "model.gradient_checkpointing=true"))
    from dare.models.loading import unwrap

    assert unwrap(ckpt.model).is_gradient_checkpointing
    assert_same(plain, grads_of(ckpt))


def test_shared_corruptions_make_the_antithetic_score_exactly_zero():
    """VRPO sanity: pi_theta = pi_ref with shared stored corruptions -> identical ELBO terms; fresh noise differs."""
    from dare.algorithms.logprobs import mc_elbo
    from dare.diffusion import ForwardProcess, corrupt_mc

    policy, reference = tiny_model("llada", seed=0), tiny_model("llada", seed=0)
    batch = collate_padded(tiny_examples(3), 24, EOS_ID, PAD_ID, eos_padding=True)
    args = (batch["input_ids"], batch["maskable"], batch["example_index"], MASK_ID)
    views = corrupt_mc(*args, seed=0, step=0, n=3, process=ForwardProcess(schedule="discrete"), stratified=True)
    with torch.no_grad():
        ids_p, terms_p = mc_elbo(policy, batch["input_ids"], views, batch["example_index"])
        ids_r, terms_r = mc_elbo(reference, batch["input_ids"], views, batch["example_index"])
        other = corrupt_mc(*args, seed=1, step=0, n=3, process=ForwardProcess(schedule="discrete"), stratified=True)
        _, terms_o = mc_elbo(reference, batch["input_ids"], other, batch["example_index"])
    assert terms_p.shape == (3, 3) and torch.equal(ids_p, ids_r) and bool((terms_p < 0).all())
    assert torch.equal(terms_p.mean(-1) - terms_r.mean(-1), torch.zeros(3))
    assert not torch.allclose(terms_p.mean(-1), terms_o.mean(-1))


def test_on_step_callback_adds_metrics_and_can_stop_early(tmp_path):
    config = small_config(tmp_path, "trainer.max_steps=6", "trainer.log_every=4")
    trainer = Trainer(config)
    seen = []

    def on_step(tr, record):
        seen.append((tr.step, record["step"]))
        if tr.step == 3:
            tr.request_stop()
        return {"eval/custom": tr.step * 10}

    trainer.train(on_step)
    assert seen == [(1, 1), (2, 2), (3, 3)]
    assert trainer.step == 3
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["eval/custom"]) for r in records] == [(3, 30)]  # the stopping step is always logged
    assert (tmp_path / "final").is_dir()  # the export still happens


def test_progress_bar_says_when_training_stopped_early(tmp_path, capsys):
    config = small_config(tmp_path, "trainer.max_steps=5", "trainer.progress=true")
    trainer = Trainer(config)
    trainer.train(lambda tr, record: tr.request_stop() if tr.step == 2 else None)
    err = capsys.readouterr().err
    assert "stopped early at step 2" in err and "2/5" in err
    complete = Trainer(small_config(tmp_path / "full", "trainer.max_steps=2", "trainer.progress=true"))
    complete.train()
    assert "stopped early" not in capsys.readouterr().err
