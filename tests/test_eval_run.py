"""``dare eval run`` and ``dare.eval.evaluate``: generation through any sampler, MC-ELBO likelihood scoring of
multiple-choice options, results files, determinism, batching invariance, stop ids, one-line errors."""

import dataclasses
import json
import re

import pytest
import torch
from eval_helpers import train_block, train_memorised
from rollout_helpers import sharp_model, single_thread, sprinkle_token  # noqa: F401  (fixture)

from dare.cli import main
from dare.data.tokenizer import build_byte_tokenizer
from dare.eval import EvalConfig, EvalResults, LikelihoodConfig, Request, continuation_elbo, evaluate, get_benchmark
from dare.eval.likelihood import LikelihoodStats
from dare.eval.run import _finish
from dare.models.block_diffusion import block_ids
from dare.rollout.engine import kernel_settings
from dare.models.spec import family_of
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate

GSM8K = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many?",
          "answer": f"{i}+{i + 2}=<<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}\n#### {2 * i + 2}"} for i in range(5)]
MMLU = [{"question": f"What is {i} + {i}?", "subject": "elementary_mathematics",
         "choices": [str(2 * i + d) for d in (0, 1, 2, 3)], "answer": i % 4} for i in range(4)]
ALL_MASKED = LikelihoodConfig(mc_samples=1, schedule="continuous", t_min=1.0, t_max=1.0)


@pytest.fixture(scope="module")
def tok():
    return build_byte_tokenizer()


@pytest.fixture
def data(tmp_path):
    paths = {}
    for name, rows in (("gsm8k", GSM8K), ("mmlu", MMLU)):
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def requests(tok, context="Question: capital of France? Answer:", options=(" Paris", " Milan", " Tokyo", " Cairo")):
    ctx = tok(context)["input_ids"]
    return [Request(ctx, tok(o, add_special_tokens=False)["input_ids"], 0) for o in options]


# ------------------------------------------------------------------------------- likelihood

@pytest.mark.parametrize("family", ["llada", "dream"])
def test_all_masked_single_sample_is_the_hand_computed_log_likelihood(family, tok):
    """t = 1, n = 1: every answer token masked, weight 1 -> sum_j log p(y_j | x, all masks) (Dream: shifted)."""
    model = tiny_model(family, seed=2).eval()
    mask_id = family_of(model).token_ids(model.config).mask
    reqs = requests(tok, options=(" Paris", " no", " Rome!"))
    terms = continuation_elbo(model, reqs, ALL_MASKED, batch_size=2)
    full = continuation_elbo(model, reqs, dataclasses.replace(ALL_MASKED, full_logits=True), batch_size=2)
    torch.testing.assert_close(full, terms, atol=1e-5, rtol=0)  # LM head inside the forward (FSDP) or after it
    for req, term in zip(reqs, terms[:, 0].tolist()):
        ids = torch.tensor([[*req.context, *[mask_id] * len(req.continuation)]])
        logits = model(ids).logits[0].float()
        shift = family_of(model).logit_shift
        hand = sum(torch.log_softmax(logits[len(req.context) + j - shift], -1)[tok_id].item()
                   for j, tok_id in enumerate(req.continuation))
        assert term == pytest.approx(hand, abs=1e-4)


def test_block_causal_all_masked_is_the_block_by_block_hand_computation(tok):
    """SDAR (block 4): answer block b is predicted from the clean tokens before it and its own masked block."""
    model = tiny_model("sdar", seed=2).eval()
    mask_id = family_of(model).token_ids(model.config).mask
    req = requests(tok, context="Q: name a city. A:", options=(" Amsterdam",))[0]  # 10 answer tokens, 4 blocks
    term = continuation_elbo(model, [req], ALL_MASKED)[0, 0].item()
    full = continuation_elbo(model, [req], dataclasses.replace(ALL_MASKED, full_logits=True))[0, 0].item()
    assert full == pytest.approx(term, abs=1e-5)
    clean = [*req.context, *req.continuation]
    start, size = len(req.context), model.block_size
    blocks = block_ids(torch.arange(len(clean))[None], size)[0]
    hand = 0.0
    for b in sorted(set(blocks[start:].tolist())):
        end = min((b + 1) * size, len(clean))
        ids = [t if (p < start or blocks[p] < b) else mask_id for p, t in enumerate(clean[:end])]
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        hand += sum(logp[p, clean[p]].item() for p in range(max(b * size, start), end))
    assert term == pytest.approx(hand, abs=1e-4)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_elbo_ranks_a_memorised_continuation_above_distractors(family, tok):
    model = tiny_model(family, seed=0)
    context = "Question: capital of France? Answer:"
    before = continuation_elbo(model.eval(), requests(tok, context), LikelihoodConfig(mc_samples=4)).mean(1)
    (train_block if family == "sdar" else train_memorised)(model, tok, context, " Paris")
    after = continuation_elbo(model, requests(tok, context), LikelihoodConfig(mc_samples=4)).mean(1)
    assert int(after.argmax()) == 0 and after[0] > after[1:].max() + 5.0
    assert after[0] > before[0] + 5.0  # the memorised answer became far more likely


def test_likelihood_is_seeded_and_options_of_a_question_share_corruptions(tok):
    model = tiny_model("llada", seed=1).eval()
    config = LikelihoodConfig(mc_samples=3)
    reqs = requests(tok)
    first = continuation_elbo(model, reqs, config, seed=7)
    assert torch.equal(first, continuation_elbo(model, reqs, config, seed=7))
    assert not torch.equal(first, continuation_elbo(model, reqs, config, seed=8))
    same = Request(reqs[0].context, reqs[0].continuation, 0)
    other = Request(reqs[0].context, reqs[0].continuation, 1)
    terms = continuation_elbo(model, [reqs[0], same, other], config, seed=7)
    assert torch.equal(terms[0], terms[1])  # same group and length: the same masks, the same terms
    assert not torch.equal(terms[0], terms[2])  # another question: its own noise
    assert torch.equal(terms[0], first[0])  # and nothing depends on the other requests of the call


def test_likelihood_batched_equals_per_question(tok):
    model = tiny_model("dream", seed=1).eval()
    config = LikelihoodConfig(mc_samples=4, schedule="continuous")
    questions = [requests(tok, "Q: colour of the sky? A:", (" blue", " green", " red")),
                 requests(tok, "Q: 2+2? A:", (" 4", " 22", " four"))]
    groups = [[Request(r.context, r.continuation, g) for r in q] for g, q in enumerate(questions)]
    together = continuation_elbo(model, [r for q in groups for r in q], config, batch_size=5)
    alone = torch.cat([continuation_elbo(model, q, config, batch_size=1) for q in groups])
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=0)


def test_identical_corruptions_are_forwarded_once(tok):
    model = tiny_model("llada", seed=1).eval()
    stats = LikelihoodStats()
    one_token = [Request(tok("Q: pick. A:")["input_ids"], [ord(c)], 0) for c in "ABCD"]
    terms = continuation_elbo(model, one_token, LikelihoodConfig(mc_samples=8), stats=stats)
    assert stats.rows == 4 and stats.mc_terms == 32  # l ~ U{1..1}: every sample masks the one token
    assert torch.equal(terms, terms[:, :1].expand(-1, 8))


# ------------------------------------------------------------------------------------- CLI

def test_eval_run_generation_records_every_setting(data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "sdpa")
    monkeypatch.setenv("DARE_FUSE_PROJECTIONS", "0")
    monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", "0")
    out = tmp_path / "results.json"
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data["gsm8k"]),
            "--limit", "3", "--sampler", "fastdllm", "--cache", "dual", "--gen-length", "16", "--block-length", "8",
            "-o", "threshold=0.7", "--batch-size", "2", "--seed", "3", "--out", str(out), "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["benchmark"] == "gsm8k" and summary["mode"] == "generate" and summary["num_problems"] == 3
    # stderr is no terminal here (a log): the run still reports its progress, as a plain final line
    assert "\r" not in captured.err and re.search(r"(?m)^gsm8k \(fastdllm\): 3/3 sample \(100%\)", captured.err)
    results = EvalResults.read(out)
    assert results.model["path"] == "tiny:llada" and results.model["family"] == "llada"
    assert results.model["dtype"] == "float32" and results.model["adapter"] is None
    settings = results.sampler["settings"]
    assert results.sampler["name"] == "fastdllm"
    assert set(settings) == {f.name for f in dataclasses.fields(SamplerConfig)}  # every decoding setting
    assert (settings["cache"], settings["gen_length"], settings["block_length"], settings["threshold"],
            settings["decoder"], settings["seed"]) == ("dual", 16, 8, 0.7, "threshold", 3)
    assert results.sampler["kernels"] == {"decode_attention": "sdpa", "fuse_max_rows": 0, "lora_fuse_max_rows": 0,
                                          "compile_sampling": True,
                                          "proposal_kernel": True, "top_p_kernel": True,
                                          "cache_writes_in_blocks": False, "static_compile": True}
    assert results.seed == 3 and results.mode == "generate"
    assert results.prompt == {"template": "zero_shot", "shots": 0, "chat": True, "fewshot_seed": 3, "stop": []}
    assert results.data["source"] == str(data["gsm8k"]) and results.data["limit"] == 3
    assert results.timings["nfe"] > 0 and results.timings["generated_tokens"] > 0
    assert results.timings["tokens_per_second"] > 0
    assert len(results.samples) == 3
    for record in results.samples:
        assert record["prompt"].startswith("<|bos|><|user|>Tom has") and record["prompt"].endswith("<|assistant|>")
        assert 1 <= record["tokens"] <= 16 and record["finish"] in ("stop", "length", "stop_string")
        assert record["gold"] in {"2", "4", "6"} and isinstance(record["correct"], bool)


def test_eval_run_compiles_the_blocks_when_asked_and_records_it(data, tmp_path, capsys, compiled_models):
    from dare.models.compile import is_compiled
    from dare.models.loading import unwrap

    out = tmp_path / "results.json"
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data["gsm8k"]),
            "--limit", "2", "--gen-length", "8", "--block-length", "8", "--out", str(out), "--json"]
    assert main(args) == 0 and not compiled_models
    assert EvalResults.read(out).model["compile_blocks"] is False
    plain = [r["prediction"] for r in EvalResults.read(out).samples]
    assert main(args + ["--compile-blocks"]) == 0
    assert len(compiled_models) == 1 and all(is_compiled(b) for b in unwrap(compiled_models[0]).blocks)
    results = EvalResults.read(out)
    assert results.model["compile_blocks"] is True
    assert [r["prediction"] for r in results.samples] == plain  # same decoding
    capsys.readouterr()


def test_eval_run_multiple_choice_defaults_to_likelihood(data, tmp_path, capsys):
    out = tmp_path / "mc.json"
    args = ["eval", "run", "--model", "tiny:dream", "--benchmark", "mmlu", "--data", str(data["mmlu"]), "--shots", "1",
            "--mc-samples", "2", "--length-norm", "tokens", "--out", str(out), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "likelihood" and set(summary["metrics"]) >= {"accuracy", "acc", "acc_norm"}
    results = EvalResults.read(out)
    assert results.sampler == {"name": "mc_elbo", "settings": dataclasses.asdict(
        LikelihoodConfig(mc_samples=2, length_norm="tokens")), "kernels": kernel_settings()}
    assert results.prompt["template"] == "likelihood" and results.prompt["shots"] == 1
    for record, row in zip(results.samples, MMLU):
        assert record["prompt"].count("Answer:") == 2  # one exemplar, then the question
        assert len(record["choice_elbo"]) == 4 and record["choice_tokens"] == [2, 2, 2, 2]  # " A" in bytes
        best = max(range(4), key=record["choice_scores"].__getitem__)
        assert record["prediction"] == "ABCD"[best] and record["correct"] == (best == row["answer"])
    accuracy = sum(r["correct"] for r in results.samples) / len(MMLU)
    assert results.metrics["accuracy"] == accuracy == results.metrics["acc"]  # tokens norm = raw for equal lengths


def test_eval_run_generate_mode_on_a_choice_benchmark(data, capsys):
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", str(data["mmlu"]), "--limit", "2",
            "--mode", "generate", "--shots", "0", "--gen-length", "8", "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["mode"] == "generate" and summary["num_predictions"] == 2


def test_eval_run_pass_at_k(data, tmp_path, capsys):
    out = tmp_path / "k.json"
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--limit", "2",
            "--gen-length", "8", "-n", "3", "--temperature", "1.0", "--k", "1", "3", "--out", str(out), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"pass@1", "pass@3"} <= set(summary["metrics"]) and summary["num_predictions"] == 6
    records = EvalResults.read(out).samples
    assert [(r["id"], r["sample_index"]) for r in records] == [(f"gsm8k/{i}", j) for i in range(2) for j in range(3)]
    assert len({r["prediction"] for r in records[:3]}) > 1  # temperature 1: the 3 samples differ


def test_eval_run_errors_are_one_line(data, tmp_path, capsys, monkeypatch):
    base = ["eval", "run", "--model", "tiny:llada"]
    cases = [
        (["--benchmark", "gsm9k", "--data", str(data["gsm8k"])], "unknown benchmark 'gsm9k' (did you mean 'gsm8k'?)"),
        (["--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--sampler", "fastdlm"],
         "unknown sampler 'fastdlm' (did you mean 'fastdllm'?)"),
        (["--benchmark", "gsm8k", "--data", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["--benchmark", "mmlu", "--data", str(data["mmlu"]), "--temperature", "0.5"],
         "--temperature applies to generation"),
        (["--benchmark", "mmlu", "--data", str(data["mmlu"]), "-o", "mc_sample=3"],
         "unknown likelihood option 'mc_sample' (did you mean 'mc_samples'?)"),
        (["--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--mode", "likelihood"],
         "--mode likelihood needs a multiple-choice benchmark"),
        (["--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--mc-samples", "4"], "--mc-samples applies to --mode"),
        (["--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--template", "few_shoot"],
         "unknown gsm8k prompt template 'few_shoot'"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (extra, lines)
    assert main(["eval", "run", "--model", str(tmp_path / "nope"), "--benchmark", "gsm8k", "--data",
                 str(data["gsm8k"])]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("nope: no such checkpoint directory"), lines
    monkeypatch.setenv("DARE_DECODE_ATTENTION", "trition")
    assert main(base + ["--benchmark", "gsm8k", "--data", str(data["gsm8k"]), "--limit", "1", "--gen-length", "8",
                        "--block-length", "8"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "DARE_DECODE_ATTENTION must be one of auto, triton, sdpa" in lines[0], lines


# ------------------------------------------------------------------------------- Python API

@pytest.fixture(scope="module")
def gsm8k_samples(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm") / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
    return get_benchmark("gsm8k").load(path)


def run(model, tok, samples, batch_size, seed=0, n=2, **sampler):
    config = SamplerConfig(sampler="llada", gen_length=16, block_length=8, temperature=1.0, **sampler)
    results = evaluate(model, tok, "gsm8k", samples, sampler=config,
                       config=EvalConfig(batch_size=batch_size, seed=seed, num_samples=n))
    return [r["prediction"] for r in results.samples], results


def test_generation_is_seeded_and_independent_of_batching(tok, gsm8k_samples):
    model = sharp_model("llada")
    alone, _ = run(model, tok, gsm8k_samples, batch_size=1)
    batched, results = run(model, tok, gsm8k_samples, batch_size=4)
    assert batched == alone  # prompts of different lengths, sorted and padded differently
    again, _ = run(model, tok, gsm8k_samples, batch_size=3)
    assert again == alone
    other, _ = run(model, tok, gsm8k_samples, batch_size=4, seed=1)
    assert other != alone
    assert results.timings["batches"] == 3 and len(results.samples) == 10


def test_completions_stop_at_the_first_stop_id(tok, gsm8k_samples):
    model = sharp_model("llada")
    eos = family_of(model).token_ids(model.config).eos
    sprinkle_token(model, eos, rate=0.03)
    texts, results = run(model, tok, gsm8k_samples, batch_size=2, n=1, eos_early_stop=False)
    prompts = [tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in results.samples]
    config = SamplerConfig(sampler="llada", gen_length=16, block_length=8, temperature=1.0, eos_early_stop=False)
    out = generate(model, prompts, config=config, example_ids=list(range(len(prompts))))
    stopped = 0
    for row, (text, record) in enumerate(zip(texts, results.samples)):
        tokens = out.completion[row].tolist()
        first = tokens.index(eos) if eos in tokens else len(tokens)
        assert text == tok.decode(tokens[:first], skip_special_tokens=True)  # nothing after the first EOS
        assert record["tokens"] == min(first + 1, len(tokens))
        if first < len(tokens):
            stopped += 1
            assert record["finish"] == "stop"
    assert stopped > 0 and any(r["tokens"] > 1 for r in results.samples)


def test_stop_strings_cut_the_text(tok):
    ids = tok("The answer is 4.\nQuestion: next", add_special_tokens=False)["input_ids"]
    done = _finish(tok, ids, stop_ids=(258,), stop=("\nQuestion:",), steps=5)
    assert done == {"text": "The answer is 4.", "tokens": len(ids), "steps": 5, "finish": "stop_string"}
    assert _finish(tok, ids + [258], (258,), (), 5)["finish"] == "stop"
    assert _finish(tok, ids, (258,), (), 5)["finish"] == "length"


def test_evaluate_leaves_the_model_mode_and_accepts_a_peft_model(tok, gsm8k_samples):
    from peft import LoraConfig, get_peft_model

    model = tiny_model("llada", seed=0)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=family_of(model).lora_targets))
    peft.train()
    results = evaluate(peft, tok, "gsm8k", gsm8k_samples[:2], sampler=SamplerConfig(gen_length=8),
                       model_info={"path": "in-memory"})
    assert peft.training and results.model["path"] == "in-memory" and results.model["family"] == "llada"
    mmlu = get_benchmark("mmlu")
    samples = [mmlu.parse_row(row, i) for i, row in enumerate(MMLU)]
    scored = evaluate(peft, tok, mmlu, samples, likelihood=LikelihoodConfig(mc_samples=1), config=EvalConfig(shots=0))
    assert scored.mode == "likelihood" and peft.training


def test_eval_run_checkpoint_directory_with_adapter(tiny_dirs, data, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    from dare.models.loading import load_model

    base = str(tiny_dirs["dream"])
    peft = get_peft_model(load_model(base), LoraConfig(r=2, target_modules=family_of(load_model(base)).lora_targets))
    peft.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "r.json"
    assert main(["eval", "run", "--model", base, "--adapter", str(tmp_path / "adapter"), "--benchmark", "gsm8k",
                 "--data", str(data["gsm8k"]), "--limit", "1", "--gen-length", "8", "--dtype", "float32",
                 "--out", str(out), "--json"]) == 0
    results = EvalResults.read(out)
    assert results.model["path"] == base and results.model["adapter"] == str(tmp_path / "adapter")
    assert results.model["family"] == "dream" and results.sampler["name"] == "dream"  # the family's sampler
    assert results.sampler["settings"]["schedule"] == "timestep"


def test_acc_norm_divides_by_the_options_own_characters_as_lm_eval(tmp_path):
    """Before: the character count included the space joining the option to the prompt (and the prompt's trailing
    whitespace), so acc_norm on text options (HellaSwag, ARC) disagreed with lm-eval's len(choice)."""
    import json

    from dare.cli import main

    endings = [["them cat", "dog it red", "big over dog it", "big"], ["the red slowly fast", "house", "the", "she"]]
    rows = [{"ind": i, "ctx": "A man walks to the", "activity_label": "Walking", "endings": e, "label": 0}
            for i, e in enumerate(endings)]
    data = tmp_path / "hs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.json"
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", "hellaswag", "--data", str(data),
                 "--mc-samples", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    samples = result["samples"]
    assert [s["choice_chars"] for s in samples] == [[len(e) for e in row] for row in endings]
    norm_hits = [max(range(4), key=lambda j: s["choice_elbo"][j] / len(endings[i][j])) == 0
                 for i, s in enumerate(samples)]
    assert result["metrics"]["acc_norm"] == sum(norm_hits) / len(norm_hits)


def test_results_record_the_data_file_versions_and_command_and_a_replacement_is_said(tmp_path, capsys):
    """Before: a results file named its data by the path as typed (not reproducible from another directory, no
    content check), recorded no command line or library versions, and --out replaced an earlier run silently."""
    import hashlib
    import json

    from dare.cli import main

    data = tmp_path / "hs.jsonl"
    data.write_text(json.dumps({"ind": 0, "ctx": "A man walks to the", "activity_label": "Walking",
                                "endings": ["cat", "dog", "tree", "house"], "label": 1}) + "\n")
    out = tmp_path / "r.json"
    args = ["eval", "run", "--model", "tiny:llada", "--benchmark", "hellaswag", "--data", str(data),
            "--mc-samples", "2", "--out", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"wrote {out}"
    first = json.loads(out.read_text())
    assert first["data"]["path"] == str(data.resolve())
    assert first["data"]["digest"] == "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    assert set(first["versions"]) >= {"python", "torch", "transformers"}
    assert first["command"][:3] == ["dare", "eval", "run"] and str(data) in first["command"]
    assert main([*args, "--seed", "3"]) == 0  # the same --out again
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"wrote {out} (replaced the results of tiny:llada on hellaswag from {first['created']})")


def test_score_refuses_a_k_above_n_before_any_program_runs_and_warns_on_mixed_n(caplog, monkeypatch, tmp_path):
    """Before: pass@6 over 5 predictions was refused only after every program had run in the sandbox; problems with
    different numbers of predictions were averaged without a word."""
    import pytest

    from dare.errors import InputError
    from dare.eval import get_benchmark
    from dare.eval.scoring import score_predictions

    bench = get_benchmark("gsm8k")
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    samples = bench.load(str(data))
    scored, real = [], type(bench).score
    monkeypatch.setattr(type(bench), "score", lambda self, predictions, rows, **kw: scored.append(len(predictions))
                        or real(self, predictions, rows, **kw))
    with pytest.raises(InputError, match=r"pass@6 needs at least 6 predictions per problem \(fewest: 2\)"):
        score_predictions(bench, samples, [["#### 2"] * 2, ["#### 4"] * 3], ks=[6])
    assert scored == []  # nothing was scored
    results = score_predictions(bench, samples, [["#### 2", "#### 3"], ["#### 4"]])
    assert "problems have 1 to 2 predictions each" in caplog.text
    assert results.metrics["accuracy"] == 2 / 3


def test_the_mc_samples_help_names_the_default_the_estimator_uses(capsys):
    import pytest

    from dare.cli import main
    from dare.eval.likelihood import LikelihoodConfig

    with pytest.raises(SystemExit):
        main(["eval", "run", "--help"])
    assert f"(default {LikelihoodConfig.mc_samples}:" in " ".join(capsys.readouterr().out.split())


def test_completions_that_ran_out_of_positions_are_counted_and_warned_about(tmp_path, caplog):
    """Before: the results file's per-sample finish field was the only trace of answers cut off by --gen-length."""
    import json

    from dare.cli import main

    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    out = tmp_path / "r.json"
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data),
                 "--gen-length", "8", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cut = sum(s["finish"] == "length" for s in result["samples"])
    assert result["timings"]["finished_by_length"] == cut
    said = f"gsm8k: {cut} of 2 completions used all 8 positions without a stop (finish=length)"
    assert (said in caplog.text) is (cut > 0) and cut > 0  # a random tiny model never stops within 8 tokens


def test_the_cut_off_warning_with_suppressed_eos_does_not_advise_a_longer_generation(tmp_path, caplog):
    from dare.cli import main

    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", str(data),
                 "--gen-length", "8", "-o", "suppress_eos=true"]) == 0
    assert ("their answers may be cut off; with suppress_eos a completion ends only at a stop string or the length"
            in caplog.text)
