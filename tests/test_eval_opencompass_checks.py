"""The checks behind ``dare eval opencompass``'s one-line loading errors (``dare.eval.opencompass_checks``).

They work on plain config dicts, files and log text, so they run without OpenCompass; the OpenCompass tests
(``tests/test_eval_opencompass.py``, in CI's second environment) run the same cases through the command."""

import logging
from pathlib import Path

import pytest

from dare.commands.eval_oc import FailedTasks
from dare.errors import DareError, InputError
from dare.eval.opencompass_checks import (
    check_config,
    check_dataset_config,
    check_dataset_names,
    check_model_config,
    failed_task,
    failure_message,
    missing_base_config,
    model_arguments,
    task_failure_cause,
)
from dare.models.tiny import write_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(type="dare.eval.opencompass.DareDiffusionModel", abbr="tiny", path="tiny:llada",
             sampler=dict(sampler="fastdllm", block_length=8), likelihood=dict(mc_samples=4), max_out_len=16,
             batch_size=4, run_cfg=dict(num_gpus=0))
DATASETS = [dict(path="configs/opencompass/data/tiny_mcq.jsonl", data_type="mcq", infer_method="ppl"),
            dict(path="configs/opencompass/data/tiny_qa.jsonl", data_type="qa", infer_method="gen")]


def error_of(check, *args) -> str:
    with pytest.raises(DareError) as err:
        check(*args)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_shipped_tiny_config_passes(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's data paths are relative to the repository root
    check_config({"models": [MODEL], "datasets": DATASETS})
    assert "sampler" in model_arguments() and "unknown" not in model_arguments()


@pytest.mark.parametrize("change, expected", [
    ({"smapler": {}}, "OpenCompass model tiny: unknown argument 'smapler' (did you mean 'sampler'?)"),
    ({"sampler": {"block_lenght": 8}}, "unknown sampler option 'block_lenght' (did you mean 'block_length'?)"),
    ({"sampler": {"sampler": "fastdlm"}}, "unknown sampler 'fastdlm'"),
    ({"sampler": "fastdllm"}, "sampler must be a dict of fields"),
    ({"likelihood": {"mc_sample": 2}}, "unknown likelihood option 'mc_sample'"),
    ({"path": "/nonexistent/ckpt"}, "OpenCompass model tiny: model path /nonexistent/ckpt: no such checkpoint directory"),
    ({"path": "tiny:lada"}, "unknown model family 'lada' (did you mean 'llada'?)"),
    ({"path": None}, "path is required"),
    ({"adapter": "/nonexistent/lora"}, "/nonexistent/lora is not a LoRA adapter directory"),
])
def test_wrong_model_args_name_the_argument(change, expected):
    message = error_of(check_model_config, {**MODEL, **change})
    assert expected in message, message


@pytest.mark.parametrize("change, expected", [
    ({"sampler": {"mc_samples": 8}},
     "'mc_samples' is not a sampler option; write it as likelihood=dict(mc_samples=...)"),
    ({"sampler": {"mc_sampels": 8}},
     "unknown sampler option 'mc_sampels' (did you mean likelihood=dict(mc_samples=...)?)"),
    ({"likelihood": {"steps": 8}}, "'steps' is not a likelihood option; write it as sampler=dict(steps=...)"),
    ({"likelihood": {"mc_batch_size": 4}}, "'mc_batch_size' is not a likelihood option; write it as mc_batch_size=... "
                                           "in the model entry"),
    ({"sampler": {"max_out_len": 32}}, "'max_out_len' is not a sampler option; write it as max_out_len=... in the "
                                       "model entry"),
    ({"sampler": {"seed": 1}}, "'seed' is not a sampler option; write it as seed=... in the model entry"),
    ({"mc_samples": 8},
     "'mc_samples' is not an argument of DareDiffusionModel; write it as likelihood=dict(mc_samples=...)"),
    ({"schedule": "cosine"}, "'schedule' is not an argument of DareDiffusionModel; write it as "
                             "sampler=dict(schedule=...) or likelihood=dict(schedule=...)"),
    ({"generation_kwargs": {"do_sample": False}}, "unknown generation_kwargs option 'do_sample' (did you mean "
                                                  "'temperature'?)"),
    ({"generation_kwargs": {"mc_samples": 2}}, "'mc_samples' is not a generation_kwargs option; write it as "
                                               "likelihood=dict(mc_samples=...)"),
])
def test_a_key_in_the_wrong_place_says_where_it_goes(change, expected):
    message = error_of(check_model_config, {**MODEL, **change})
    assert message == f"OpenCompass model tiny: {expected}", message


def test_a_local_checkpoint_and_non_dare_models_pass(tmp_path):
    write_tiny_checkpoint("llada", tmp_path / "ckpt")
    check_model_config({**MODEL, "path": str(tmp_path / "ckpt")})
    check_model_config({**MODEL, "path": "GSAI-ML/LLaDA-8B-Instruct"})  # a hub name is the hub's to resolve
    check_config({"models": [{"type": "HuggingFaceBaseModel", "path": "/nonexistent", "smapler": 1}], "datasets": []})


def test_dataset_files_and_kinds_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qa.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    check_dataset_config({"path": "qa.jsonl", "data_type": "qa", "infer_method": "gen"})
    message = error_of(check_dataset_config, {"path": "data/missing.jsonl", "data_type": "mcq"})
    assert message.startswith("OpenCompass dataset data/missing.jsonl: no such file") and str(tmp_path) in message
    with pytest.raises(InputError, match="missing.csv: no such file"):
        check_dataset_config({"path": "missing.csv"})
    assert "a .jsonl or .csv file; got qa.json" in error_of(check_dataset_config, {"path": "qa.json"})
    assert "unknown data_type 'mqc' (did you mean 'mcq'?)" in error_of(
        check_dataset_config, {"path": "qa.jsonl", "data_type": "mqc"})
    assert "infer_method 'ppl' is not supported; qa datasets support: gen" in error_of(
        check_dataset_config, {"path": "qa.jsonl", "data_type": "qa", "infer_method": "ppl"})
    assert "meta_path nope.json: no such file" in error_of(check_dataset_config, {"path": "qa.jsonl", "meta_path": "nope.json"})
    assert "neither a type nor a path" in error_of(check_dataset_config, {"abbr": "x"})
    # typed datasets: an absolute path must exist; relative ones are OpenCompass dataset ids
    check_dataset_config({"type": "GSM8KDataset", "abbr": "gsm8k", "path": "opencompass/gsm8k"})
    assert error_of(check_dataset_config, {"type": "GSM8KDataset", "abbr": "gsm8k", "path": "/no/gsm8k"}) == \
        "OpenCompass dataset gsm8k: no such file or directory: /no/gsm8k"
    message = error_of(check_config, {"models": [MODEL], "datasets": [{"path": "qa.jsonl"}, {"path": "gone.jsonl"}]})
    assert "gone.jsonl: no such file" in message


def test_dataset_names_are_config_files(tmp_path):
    (tmp_path / "datasets" / "gsm8k").mkdir(parents=True)
    for name in ("gsm8k_gen.py", "gsm8k_gen_1d7fe4.py", "__init__.py"):
        (tmp_path / "datasets" / "gsm8k" / name).write_text("")
    dirs = [tmp_path / "datasets", tmp_path / "missing_dir"]
    check_dataset_names(["gsm8k_gen", "GSM8K_GEN_1d7fe4/gsm8k_datasets", "gsm8k_gen_*"], dirs)
    message = error_of(check_dataset_names, ["gsm8k_gen", "gsm8k_gne"], dirs)
    assert message.startswith("unknown OpenCompass dataset 'gsm8k_gne' (did you mean 'gsm8k_gen'?)")


def test_a_read_base_import_of_a_missing_config(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "gsm8k_gen.py").write_text("")
    missing = tmp_path / "gsm8k" / "gsm8k_gne.py"
    mmengine_text = (f"{missing} not found! It means that incorrect module is defined in `with read_base(): = from "
                     "opencompass.configs.datasets.gsm8k.gsm8k_gne import ...`, please make sure the base config "
                     "module is valid\nand is consistent with the prior import logic")
    message = missing_base_config(mmengine_text, "eval.py")
    assert message == (f"OpenCompass config eval.py: no config opencompass.configs.datasets.gsm8k.gsm8k_gne (no file "
                       f"{missing}); did you mean 'gsm8k_gen'?")
    wrong_dir = tmp_path / "gsm8c" / "gsm8k_gen.py"
    message = missing_base_config(mmengine_text.replace(str(missing), str(wrong_dir)), "eval.py")
    assert message.endswith("did you mean 'gsm8k'?")
    assert missing_base_config("invalid syntax (eval.py, line 3)", "eval.py") is None


TRACEBACK = """Traceback (most recent call last):
  File "openicl_infer.py", line 161, in <module>
    inferencer.run()
{error}
"""


def test_the_cause_of_a_failed_task_is_its_last_error():
    dare_error = TRACEBACK.format(error="dare.errors.ConfigError: unknown sampler option 'x'")
    torchrun = TRACEBACK.format(error="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====")
    assert task_failure_cause("loading...\n" + dare_error + torchrun) == "unknown sampler option 'x'"
    missing = TRACEBACK.format(error="FileNotFoundError: [Errno 2] No such file or directory: 'data/x.jsonl'")
    handled = TRACEBACK.format(error="KeyError: 'local'") + "\nDuring handling of the above exception ...\n"
    assert task_failure_cause(handled + missing + torchrun) == \
        "FileNotFoundError: [Errno 2] No such file or directory: 'data/x.jsonl'"
    assert task_failure_cause("100%|####| 2/2\nall done\n") is None


def test_failed_tasks_become_one_line(tmp_path):
    log = tmp_path / "tiny_mcq.out"
    log.write_text("12/03 10:16:40 - OpenCompass - INFO - Task ...\n"
                   + TRACEBACK.format(error="dare.errors.ConfigError: unknown sampler option 'block_lenght'"))
    handler = FailedTasks()
    logger = logging.getLogger("test-opencompass-runner")
    logger.addHandler(handler)
    try:
        logger.error(f"task OpenICLInfer[tiny/tiny_mcq,tiny/tiny_qa] fail, see\n{log}")
        logger.error("OpenICLInfer[tiny/tiny_mcq,tiny/tiny_qa] failed with code 1")  # the summary: no log path
        logger.error(f"task OpenICLEval[tiny/tiny_mcq] fail, see\n{tmp_path / 'eval.out'}")
    finally:
        logger.removeHandler(handler)
    assert handler.failures == [("OpenICLInfer[tiny/tiny_mcq,tiny/tiny_qa]", str(log)),
                                ("OpenICLEval[tiny/tiny_mcq]", str(tmp_path / "eval.out"))]
    assert failure_message(handler.failures) == (
        f"OpenCompass task OpenICLInfer[tiny/tiny_mcq,tiny/tiny_qa] failed: unknown sampler option 'block_lenght' "
        f"(log: {log}); 1 more task failed")
    assert failure_message(handler.failures[1:]).endswith("failed: no error in its log (log: " + str(tmp_path / "eval.out") + ")")
    assert failed_task("task X is running") is None


def test_without_opencompass_the_command_says_what_to_install(monkeypatch, capsys):
    import dare.eval.opencompass as plugin
    from dare.cli import main

    monkeypatch.setattr(plugin, "_IMPORT_ERROR", ImportError("No module named 'opencompass'"))
    assert main(["eval", "opencompass", "configs/opencompass/eval_dare_tiny.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'dare-dllm[opencompass]'" in err[0], err
