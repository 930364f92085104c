"""The lm-evaluation-harness model ``dare`` (``dare.eval.lm_harness``) on the tiny tasks in ``configs/lm_eval``.

Offline: the tasks read local jsonl files through ``datasets``' json builder. The CLI test runs the command the
README shows and compares it with ``dare eval run`` on the same data and settings."""

import functools
import json
import logging
import sys
from pathlib import Path

import pytest
from _pytest.capture import CaptureIO
from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.cli import main
from dare.errors import ConfigError

lm_eval = pytest.importorskip("lm_eval")

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "configs" / "lm_eval"


@pytest.fixture(autouse=True)
def offline(monkeypatch, capsys):
    """No network, the relative data paths of the task files resolve from the repository root, and lm-eval's
    logging stays usable across in-process runs: its handlers are made once per process on the then-captured
    stderr, so they are pointed at this test's, and INFO lines (logged before that can happen) are off."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LMEVAL_LOG_LEVEL", "WARNING")
    monkeypatch.chdir(ROOT)
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    for handler in (h for logger in loggers for h in logger.handlers):
        if type(handler) is logging.StreamHandler and isinstance(handler.stream, CaptureIO):
            handler.stream = sys.stderr  # not setStream: it flushes the previous test's (closed) stream


@pytest.fixture
def only_local_tasks(monkeypatch):
    """lm-eval's CLI without indexing its thousands of built-in task files (only ``--include_path`` tasks)."""
    import lm_eval.tasks

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager, include_defaults=False))


def lm_eval_outputs(out: Path) -> tuple[dict, dict[str, list[dict]]]:
    """``(results document, {task: samples sorted by doc_id})`` of an lm-eval ``--output_path`` directory."""
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {}
    for task in ("dare_tiny_gen", "dare_tiny_mc"):
        path = next(out.rglob(f"samples_{task}_*.jsonl"))
        samples[task] = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda d: d["doc_id"])
    return results, samples


def dare_eval_run(tmp_path: Path, benchmark: str, data: str, *flags: str) -> dict:
    out = tmp_path / f"{benchmark}.json"
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", benchmark, "--data", data, "--batch-size", "4",
                 "--shots", "0", "--no-progress", "--json", "--out", str(out), *flags]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # lm-eval's CLI indexes its built-in task files first (about 20 s on 2 cores)
def test_cli_metrics_and_predictions_equal_dare_eval_run(tmp_path, capsys):
    out = tmp_path / "lm_eval"
    code = main(["eval", "lm-eval", "--model", "dare", "--model_args", "pretrained=tiny:llada,gen_length=16",
                 "--tasks", "dare_tiny_gen,dare_tiny_mc", "--include_path", "configs/lm_eval", "--batch_size", "4",
                 "--output_path", str(out), "--log_samples"])
    assert code == 0
    results, samples = lm_eval_outputs(out)
    # the model's seed is lm-eval's torch seed (--seed's default 0,1234,1234,1234)
    gen = dare_eval_run(tmp_path, "gsm8k", "configs/lm_eval/data/tiny_gen.jsonl", "--template", "few_shot",
                        "--no-chat", "--gen-length", "16", "--seed", "1234")
    mc = dare_eval_run(tmp_path, "mmlu", "configs/lm_eval/data/tiny_mc.jsonl", "--seed", "1234")

    # generation: the same prompts, the same completions (after the stop string), the same accuracy
    assert [s["arguments"]["gen_args_0"]["arg_0"] for s in samples["dare_tiny_gen"]] == [r["prompt"] for r in gen["samples"]]
    assert [s["filtered_resps"][0] for s in samples["dare_tiny_gen"]] == [r["prediction"] for r in gen["samples"]]
    assert results["results"]["dare_tiny_gen"]["accuracy,none"] == gen["metrics"]["accuracy"]
    # multiple choice: every option's log-likelihood is the MC-ELBO of dare eval run; acc and acc_norm agree
    lm_scores = [[float(r[0]) for r in s["filtered_resps"]] for s in samples["dare_tiny_mc"]]
    assert lm_scores == [pytest.approx(r["choice_elbo"], abs=1e-5) for r in mc["samples"]]
    assert results["results"]["dare_tiny_mc"]["acc,none"] == mc["metrics"]["acc"]
    assert results["results"]["dare_tiny_mc"]["acc_norm,none"] == mc["metrics"]["acc_norm"]
    # every resolved decoding setting is in lm-eval's results file, and it is the one dare eval run used
    recorded = results["config"]["dare"]
    assert [s["settings"] for s in recorded["samplers"]] == [gen["sampler"]["settings"]]
    assert recorded["likelihood"] == mc["sampler"]["settings"] and recorded["model"]["family"] == "llada"


def evaluate_in_process(batch_size: int, **sampler):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from dare.eval.lm_harness import DareLM

    model = DareLM(pretrained="tiny:llada", device="cpu", batch_size=batch_size, mc_samples=4, seed=0, **sampler)
    return simple_evaluate(model=model, tasks=["dare_tiny_gen", "dare_tiny_mc"], log_samples=True,
                           task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
                           verbosity="ERROR")


def test_predictions_do_not_depend_on_the_batch_size():
    sampled = dict(sampler="fastdllm", threshold=0.3, temperature=1.0, gen_length=16, block_length=8)
    one, three = evaluate_in_process(1, **sampled), evaluate_in_process(3, **sampled)
    def responses(results, task):
        return [s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]

    assert responses(one, "dare_tiny_gen") == responses(three, "dare_tiny_gen")
    # likelihoods: equal up to float32 rounding of differently padded batches; the same option wins
    first, second = ([[float(r[0]) for r in doc] for doc in responses(x, "dare_tiny_mc")] for x in (one, three))
    assert len(first) == 8 and [pytest.approx(doc, abs=1e-5) for doc in first] == second
    assert [doc.index(max(doc)) for doc in first] == [doc.index(max(doc)) for doc in second]
    texts = [s["filtered_resps"][0] for s in one["samples"]["dare_tiny_gen"]]
    assert len(set(texts)) > 1  # temperature 1: rows differ, so equal lists are not a constant output


def test_loglikelihood_rolling_is_the_elbo_of_the_whole_text():
    from lm_eval.api.instance import Instance

    from dare.data.tokenizer import build_byte_tokenizer
    from dare.eval.likelihood import LikelihoodConfig, Request, continuation_elbo
    from dare.eval.lm_harness import DareLM
    from dare.models.tiny import tiny_model

    model, tok = tiny_model("llada", seed=0).eval(), build_byte_tokenizer()
    lm = DareLM(model=model, tokenizer=tok, mc_samples=3, seed=2)
    text = "a short document"
    request = Instance("loglikelihood_rolling", {}, (text,), 0, ("t", 5, 1))
    (value,) = lm.loglikelihood_rolling([request])
    ids = tok(text)["input_ids"]
    cut = 1 if ids[0] == tok.bos_token_id else 0  # the whole text is scored, given BOS when the tokenizer adds one
    expected = continuation_elbo(model, [Request(ids[:cut], ids[cut:], 5)], LikelihoodConfig(mc_samples=3), seed=2)
    assert value == pytest.approx(float(expected.mean()), rel=1e-9) and value < 0


def test_wrong_model_args_are_one_line_errors():
    from dare.eval.lm_harness import DareLM

    with pytest.raises(ConfigError, match=r"unknown dare model arg 'temprature' \(did you mean 'temperature'\?\)"):
        DareLM(pretrained="tiny:llada", temprature=1.0)
    with pytest.raises(ConfigError, match="unknown sampler 'fastdlm'"):
        DareLM(pretrained="tiny:llada", sampler="fastdlm")
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        DareLM(pretrained="tiny:llada", batch_size="0")
    with pytest.raises(ConfigError, match="needs pretrained="):
        DareLM()
    with pytest.raises(ConfigError, match="compile_blocks must be true or false; got 'maybe'"):
        DareLM(pretrained="tiny:llada", compile_blocks="maybe")
    with pytest.raises(ConfigError, match=r"'schedule' is a SamplerConfig field and a LikelihoodConfig field with "
                                          r"different meanings: write sampler.schedule=\.\.\. or likelihood.schedule"):
        DareLM(pretrained="tiny:llada", schedule="continuous")
    with pytest.raises(ConfigError, match=r"unknown dare model arg 'likelihood.temperature'"):
        DareLM(pretrained="tiny:llada", **{"likelihood.temperature": 1.0})
    with pytest.raises(ConfigError, match=r"dare model arg 'sampler.seed' is not used: the model's own seed applies "
                                          r"to every request; write seed=5"):  # before: decoded with seed 0, silently
        DareLM(pretrained="tiny:llada", **{"sampler.seed": 5})


def test_a_misspelt_kernel_switch_fails_when_the_model_is_made(monkeypatch, capsys):
    """lm-eval reads the model info (which records the switches) only after the whole evaluation: the switches
    are checked when the model is made, and unknown ``DARE_*`` names are warned about then."""
    from dare.eval.lm_harness import DareLM

    monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", "yes")
    with pytest.raises(ConfigError, match="DARE_FUSE_CACHE_WRITES must be 0 or 1, got 'yes'"):
        DareLM(pretrained="tiny:llada")
    monkeypatch.setenv("DARE_FUSE_CACHE_WRITES", "1")
    monkeypatch.setenv("DARE_COMPILE_SAMPLNG", "0")
    DareLM(pretrained="tiny:llada")
    assert "warning: DARE_COMPILE_SAMPLNG is not a DARE setting and is ignored (did you mean DARE_COMPILE_SAMPLING?)" \
        in capsys.readouterr().err


def test_prefixed_model_args_set_one_config_and_shared_ones_both():
    from dare.eval.harness import split_options

    sampler, likelihood = split_options({"likelihood.schedule": "continuous", "sampler.schedule": "timestep",
                                         "full_logits": True, "mc_samples": 4, "steps": 8, "seed": 1},
                                        own=("seed",), kind="dare model arg")
    assert sampler == {"schedule": "timestep", "full_logits": True, "steps": 8}
    assert likelihood == {"schedule": "continuous", "full_logits": True, "mc_samples": 4}


def test_compile_blocks_model_arg_compiles_every_block_and_is_recorded(compiled_models):
    from dare.eval.lm_harness import DareLM
    from dare.models.compile import is_compiled

    lm = DareLM(pretrained="tiny:llada", compile_blocks="true")  # model args arrive as strings
    assert all(is_compiled(b) for b in lm.model.blocks)
    assert lm.get_model_info()["dare"]["model"]["compile_blocks"] is True
    plain = DareLM(pretrained="tiny:llada")
    assert not any(is_compiled(b) for b in plain.model.blocks)
    assert plain.get_model_info()["dare"]["model"]["compile_blocks"] is False


def run_cli_error(capsys, *args: str) -> str:
    code = main(["eval", "lm-eval", "--model", "dare", "--include_path", "configs/lm_eval", *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: "), err
    return line


def test_cli_loading_errors_are_one_line(tmp_path, capsys, only_local_tasks):
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada,temprature=1", "--tasks", "dare_tiny_gen")
    assert "unknown dare model arg 'temprature'" in line
    line = run_cli_error(capsys, "--model_args", "pretrained=/nonexistent/ckpt", "--tasks", "dare_tiny_gen")
    assert "no such checkpoint directory" in line
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_tiny_gne")
    assert "Tasks not found: dare_tiny_gne (check --tasks; task YAML files of your own need --include_path DIR)" in line
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_tiny_gen", "--model", "dar")
    assert "'dar'" in line and line.endswith("(the DARE model is --model dare)")
    broken = tmp_path / "tasks"
    broken.mkdir()
    task = (TASKS / "dare_tiny_mc.yaml").read_text().replace("task: dare_tiny_mc", "task: dare_broken")
    (broken / "broken.yaml").write_text(task.replace("data/tiny_mc.jsonl", "data/missing.jsonl"))
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_broken",
                         "--include_path", str(broken))
    assert "missing.jsonl" in line and "check the task's dataset_path and dataset_kwargs (data_files)" in line


@pytest.mark.parametrize("model_args, message", [
    ("pretrained=tiny:llada,device=cpu",
     "error: --model_args device=cpu is lm-eval's own --device, which lm-eval passes to the model itself: write "
     "--device cpu instead"),
    ("pretrained=tiny:llada,batch_size=4",
     "error: --model_args batch_size=4 is lm-eval's own --batch_size, which lm-eval passes to the model itself: "
     "write --batch_size 4 instead"),
    ('{"pretrained": "tiny:llada", "max_batch_size": 8}',
     "error: --model_args max_batch_size=8 is lm-eval's own --max_batch_size, which lm-eval passes to the model "
     "itself: write --max_batch_size 8 instead"),
])
def test_lm_evals_own_flags_in_model_args_are_one_line_errors(model_args, message, capsys, only_local_tasks):
    """Before: lm-eval passed its --device / --batch_size values too, and the model got them twice (`TypeError:
    DareLM() got multiple values for keyword argument 'device'`, a traceback), though --help offered them."""
    assert run_cli_error(capsys, "--model_args", model_args, "--tasks", "dare_tiny_gen") == message


def test_import_brings_a_plugin_sampler_in_and_is_not_passed_to_lm_eval(tmp_path, monkeypatch, capsys, request,
                                                                         only_local_tasks):
    """``--import`` is DARE's own flag (lm-eval has none): taken out of the arguments, imported before the model args
    name the plug-in's sampler, which decodes (its block length recorded with the resolved sampler)."""
    from dare import plugins
    from dare.rollout.registry import SAMPLERS

    monkeypatch.setattr(plugins, "_LOADED", {})
    request.addfinalizer(lambda: SAMPLERS.pop("llada_blocks4_lm", None))  # the plug-in's sampler leaves with the test
    plugin = tmp_path / "my_sampler_lm.py"
    plugin.write_text('from dare.rollout import Sampler, register_sampler\n\n'
                      'register_sampler(Sampler("llada_blocks4_lm", "llada in blocks of 4", {"block_length": 4}))\n')
    args = ["--model_args", "pretrained=tiny:llada,gen_length=8,sampler=llada_blocks4_lm", "--tasks", "dare_tiny_gen"]
    assert "unknown sampler 'llada_blocks4_lm'" in run_cli_error(capsys, *args)
    out = tmp_path / "out"
    assert main(["eval", "lm-eval", "--model", "dare", *args, "--import", str(plugin), "--include_path",
                 "configs/lm_eval", "--output_path", str(out)]) == 0, capsys.readouterr().err
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samplers = json.dumps(results)
    assert '"llada_blocks4_lm"' in samplers and '"block_length": 4' in samplers
    assert results["config"]["dare"]["imports"] == [str(plugin)]  # recorded as dare eval run's results record it
    assert "--import needs a module name" in run_cli_error(capsys, *args, "--import")


def test_an_include_path_that_is_no_directory_is_named(capsys, only_local_tasks):
    """Before: lm-eval's 'Tasks not found ... need --include_path DIR', though --include_path was given."""
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_tiny_gen", "--include_path",
                         "configs/lm_evl")
    assert line == f"error: --include_path configs/lm_evl: no such directory (relative to {ROOT})"


@pytest.mark.parametrize("device", ["--device cuda:1", "--device=cuda"])
def test_an_explicit_cuda_device_without_cuda_is_an_error(device, capsys, only_local_tasks, monkeypatch):
    """Before: it ran on the CPU without a word (dare eval run --device cuda refuses); lm-eval's own default still
    falls back to the CPU (the other tests here run so)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_tiny_gen", *device.split())
    value = device.replace("=", " ").split()[1]
    assert line == (f"error: --device {value}: CUDA is not available here (omit --device, or --device cpu, to run on "
                    "the CPU)")


def test_without_lm_eval_the_command_says_what_to_install(monkeypatch, capsys):
    import dare.eval.lm_harness as harness

    monkeypatch.setattr(harness, "_IMPORT_ERROR", ImportError("No module named 'lm_eval'"))
    assert main(["eval", "lm-eval", "--model", "dare", "--tasks", "dare_tiny_gen"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'dare-dllm[lm-eval]'" in err[0], err


@pytest.fixture
def tiny_lm():
    """A ``DareLM`` factory over a tiny LLaDA and the byte tokenizer (model args as keyword arguments)."""
    from dare.data.tokenizer import build_byte_tokenizer
    from dare.eval.lm_harness import DareLM
    from dare.models.tiny import tiny_model

    model, tok = tiny_model("llada", seed=0).eval(), build_byte_tokenizer()
    return lambda **args: DareLM(model=model, tokenizer=tok, **{"seed": 0, **args})


def generation(gen_kwargs: dict, doc_id: int = 0):
    from lm_eval.api.instance import Instance

    return Instance("generate_until", {}, ("Question: 2+2?\nAnswer:", gen_kwargs), 0, ("t", doc_id, 1))


def dare_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dare.eval"]


def test_do_sample_without_a_temperature_samples_at_temperature_one(tiny_lm):
    """Before: do_sample=True without a temperature decoded greedily (temperature 0.0 recorded); lm-eval's vLLM
    model samples at vLLM's default temperature 1.0 then."""
    lm = tiny_lm()
    (text,) = lm.generate_until([generation({"until": ["\n"], "max_gen_toks": 8, "do_sample": True})])
    assert isinstance(text, str)
    (record,) = lm.get_model_info()["dare"]["samplers"]
    assert record["request"] == {"max_gen_toks": 8, "do_sample": True} and record["settings"]["temperature"] == 1.0
    assert lm._sampler({"do_sample": True, "temperature": 0.5}).temperature == 0.5
    assert lm._sampler({"do_sample": False, "temperature": 0.5}).temperature == 0.0  # greedy, as lm-eval does
    assert lm._sampler({"temperature": 0.7}).temperature == 0.7
    assert tiny_lm(temperature=0.3)._sampler({"do_sample": True}).temperature == 0.3  # the model arg wins


@pytest.mark.parametrize("temperature", [0, 0.0])
def test_do_sample_with_temperature_zero_is_an_error(tiny_lm, temperature):
    lm = tiny_lm()
    with pytest.raises(ConfigError) as err:
        lm.generate_until([generation({"until": ["\n"], "do_sample": True, "temperature": temperature})])
    message = str(err.value)
    assert message == (f"gen_kwargs do_sample=True and temperature={temperature} contradict each other: give a "
                       "temperature > 0 to sample, or do_sample=False to decode greedily")
    assert tiny_lm(temperature=0.0)._sampler({"do_sample": True, "temperature": 0}).temperature == 0.0  # model arg


def test_gen_kwargs_dare_does_not_apply_are_warned_about_once_per_key(tiny_lm, caplog):
    """Before: num_beams, repetition_penalty, min_gen_toks ... were dropped without a word."""
    lm = tiny_lm()
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        lm._sampler({"until": ["\n"], "max_gen_toks": 8, "num_beams": 4, "repetition_penalty": 1.5})
        lm._sampler({"until": ["\n"], "max_gen_toks": 8, "num_beams": 4, "repetition_penalty": 1.5})
        lm._sampler({"num_beams": 2, "min_gen_toks": 5, "do_sample": False})
        lm._sampler({"until": ["\n"], "max_gen_toks": 8, "do_sample": False, "temperature": 0.0, "top_p": 0.9,
                     "top_k": 5})
    applied = "DARE applies until, max_gen_toks, do_sample, temperature, top_p, top_k"
    assert dare_warnings(caplog) == [
        f"warning: dare model: ignoring gen_kwargs num_beams=4, repetition_penalty=1.5: {applied} (set decoding "
        "with SamplerConfig fields in --model_args)",
        f"warning: dare model: ignoring gen_kwargs min_gen_toks=5: {applied} (set decoding with SamplerConfig fields "
        "in --model_args)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        tiny_lm()._sampler({"num_beams": 4})  # once per model: a new model says it again
    assert len(dare_warnings(caplog)) == 1


def test_model_args_that_override_a_request_are_warned_about_once(tiny_lm, caplog):
    """Before: gen_length / temperature model args beat the task's max_gen_toks / temperature / do_sample without a
    word."""
    lm = tiny_lm(gen_length=16, temperature=0.0)
    request = {"until": ["\n"], "max_gen_toks": 4, "temperature": 0.9, "do_sample": True}
    with caplog.at_level(logging.WARNING, logger="dare.eval"):
        config = lm._sampler(request)
        lm._sampler(request)
        lm._sampler({"max_gen_toks": 16, "temperature": 0.0, "do_sample": False})  # the same values: nothing to say
    assert config.gen_length == 16 and config.temperature == 0.0
    assert dare_warnings(caplog) == [
        "warning: dare model arg gen_length=16 overrides the request's max_gen_toks=4 (gen_kwargs; model args win)",
        "warning: dare model arg temperature=0.0 overrides the request's temperature=0.9 (gen_kwargs; model args win)",
        "warning: dare model arg temperature=0.0 overrides the request's do_sample=True (gen_kwargs; model args win)"]


def test_the_seed_defaults_to_lm_evals_torch_seed():
    """Before: lm-eval's --seed had no effect (the model's seed was 0 unless the model args gave one). lm-eval
    seeds torch before it makes the model (lm_eval/evaluator.py simple_evaluate)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import dare.eval.lm_harness  # noqa: F401  (registers the dare model)

    def recorded(torch_seed: int, model_args: str) -> dict:
        results = simple_evaluate(model="dare", model_args=model_args, tasks=["dare_tiny_gen"], limit=1,
                                  torch_random_seed=torch_seed, device="cpu", verbosity="ERROR",
                                  task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
        return results["config"]["dare"]

    seven = recorded(7, "pretrained=tiny:llada,gen_length=8")
    assert seven["seed"] == 7 and seven["samplers"][0]["settings"]["seed"] == 7
    assert recorded(7, "pretrained=tiny:llada,gen_length=8,seed=3")["seed"] == 3  # the model arg wins


@pytest.mark.parametrize("limit", [["--limit", "0"], ["-L", "-1"], ["--limit=0.0"]])
def test_a_limit_that_leaves_no_documents_is_an_error_before_the_model_loads(limit, capsys, only_local_tasks,
                                                                               monkeypatch):
    """Before: the model loaded, then lm-eval stopped with a traceback (task.build_requests() did not find any
    docs!)."""
    import dare.eval.run

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(dare.eval.run, "load_for_eval", load)
    line = run_cli_error(capsys, "--model_args", "pretrained=tiny:llada", "--tasks", "dare_tiny_gen", *limit)
    value = "0" if limit[-1] in ("0", "--limit=0.0") else "-1"
    assert line == (f"error: --limit {value}: the limit must be positive (a count of documents per task, or a "
                    "fraction of them below 1); omit --limit to evaluate every document")


def test_a_fractional_limit_keeps_lm_evals_meaning():
    from dare.commands.eval_lm import check_limit, parsed_limit

    argv = ["--model", "dare", "--tasks", "dare_tiny_gen", "--limit", "0.5"]
    assert parsed_limit(argv) == 0.5
    check_limit(argv)  # no error: half of each task's documents (lm-eval's fraction)
    assert parsed_limit(["--model", "dare", "--tasks", "dare_tiny_gen"]) is None
