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
    gen = dare_eval_run(tmp_path, "gsm8k", "configs/lm_eval/data/tiny_gen.jsonl", "--template", "few_shot",
                        "--no-chat", "--gen-length", "16")
    mc = dare_eval_run(tmp_path, "mmlu", "configs/lm_eval/data/tiny_mc.jsonl")

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

    model = DareLM(pretrained="tiny:llada", device="cpu", batch_size=batch_size, mc_samples=4, **sampler)
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
    assert len(err) == 1 and "pip install 'dare-dllm[lm_eval]'" in err[0], err
