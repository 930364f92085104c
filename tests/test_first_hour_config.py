"""A new user's first hour with devices, overrides and flags: every mistake is one line (``error: ...``), a value is
never silently read as something else, and hints name the key meant."""

import json
import logging

import pytest
import torch

from dare.cli import main
from dare.commands.generate import parse_options
from dare.config import closest_key, config_keys, parse_boolean
from dare.devices import ACCELERATORS, resolve_device
from dare.errors import ConfigError
from dare.rollout import SamplerConfig
from dare.trainer.config import TrainConfig, load_train_config


def stderr_line(capsys) -> str:
    """The one line a command wrote to stderr."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def no_accelerator(monkeypatch):
    """A machine without any accelerator, whatever this one has."""
    for kind in ACCELERATORS:
        monkeypatch.setattr(getattr(torch, kind), "is_available", lambda: False)


@pytest.fixture
def no_model_load(monkeypatch):
    import dare.commands.generate as generate

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(generate, "load_model", refuse)


# 1. --device: every device torch names, not only cuda -------------------------------------------------------------

@pytest.mark.parametrize("name, why", [("mps", "MPS is not available on this machine"),
                                       ("xpu", "XPU is not available on this machine"),
                                       ("hpu", "HPU is not available on this machine"),
                                       ("meta", "the meta device holds no data, so nothing can run on it")])
def test_a_device_this_machine_lacks_is_one_line(name, why, no_accelerator, no_model_load, capsys):
    with pytest.raises(ConfigError, match=rf"^device {name}: {why} \(use device='cpu'\)$"):
        resolve_device(name, "device")
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", "--device", name]) == 2
    assert stderr_line(capsys) == f"error: --device {name}: {why} (use --device cpu)"


def test_an_available_accelerator_is_used_and_gpu_is_pointed_to_cuda(no_accelerator, monkeypatch):
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    assert resolve_device("xpu") == torch.device("xpu")
    with pytest.raises(ConfigError, match=r"^--device xpu:1: this machine has 1 XPU device\(s\)$"):
        resolve_device("xpu:1")
    with pytest.raises(ConfigError, match=r"^--device mps: .* \(use --device cpu or --device xpu\)$"):
        resolve_device("mps")
    with pytest.raises(ConfigError, match=r"^--device gpu: not a torch device \(did you mean 'cuda'\?\); "
                                          r"this machine has: cpu, xpu$"):
        resolve_device("gpu")


# 2. overrides keep a string field's text -------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["0123", "12:30", "1_000", "0x1F", "yes", "off", "#run", "run # 2", "1e-5", ".5"])
def test_a_string_field_keeps_the_text_of_an_override(text):
    config = load_train_config(None, [f"trainer.output_dir={text}", f"model.path={text}"])
    assert config.trainer.output_dir == text and config.model.path == text


def test_numbers_switches_and_null_still_parse():
    config = load_train_config(None, ["optim.lr=1e-5", "optim.betas=[0.9,0.95]", "trainer.max_steps=10",
                                      "data.packing=TRUE", "trainer.export=False", "lora.target_modules=null",
                                      "optim.grad_clip=~", "model.path='0123'"])
    assert config.optim.lr == 1e-5 and config.optim.betas == [0.9, 0.95] and config.trainer.max_steps == 10
    assert config.data.packing is True and config.trainer.export is False
    assert config.lora.target_modules is None and config.optim.grad_clip is None and config.model.path == "0123"
    with pytest.raises(ConfigError, match=r"^config key 'trainer.max_steps': expected an integer, got '0100'$"):
        load_train_config(None, ["trainer.max_steps=0100"])  # not octal 64
    with pytest.raises(ConfigError, match=r"^config key 'optim.lr': expected a number, got inf$"):
        load_train_config(None, ["optim.lr=.inf"])


def test_a_recipe_reads_its_values_as_an_override_does(tmp_path):
    """A recipe's plain scalars: a ``str`` field keeps the text as written (YAML 1.1 read ``0123`` as 83 and
    ``12:30`` as 750), numbers still parse (``1.50e-5``, ``.5``), and a switch is ``true``/``false``."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: 12:30\ntrainer:\n  output_dir: 0123\n  max_steps: 7\n"
                      "optim:\n  lr: 1.50e-5\n  betas: [.5, 0.999]\ndata:\n  packing: True\n")
    config = load_train_config(recipe, [])
    assert config.trainer.output_dir == "0123" and config.model.path == "12:30"
    assert config.trainer.max_steps == 7 and config.optim.lr == 1.5e-5 and config.optim.betas == [0.5, 0.999]
    assert config.data.packing is True
    recipe.write_text("data:\n  packing: yes\n")
    with pytest.raises(ConfigError, match=r"^config key 'data.packing': expected true/false, got 'yes'$"):
        load_train_config(recipe, [])
    recipe.write_text("trainer:\n  max_steps: 0100\n")
    with pytest.raises(ConfigError, match=r"^config key 'trainer.max_steps': expected an integer, got '0100'$"):
        load_train_config(recipe, [])  # not octal 64


def test_an_override_given_twice_takes_its_last_value():
    """Scripts put shared overrides first and their own after them (the tests do): the last value wins."""
    assert load_train_config(None, ["optim.lr=1e-5", "trainer.max_steps=3", "optim.lr=2e-5"]).optim.lr == 2e-5


def test_a_recipe_number_must_be_finite(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  lr: .inf\n")
    with pytest.raises(ConfigError, match=r"^config key 'optim.lr': expected a number, got inf$"):
        load_train_config(recipe, [])


# 4. hints look at every key of the config ------------------------------------------------------------------------

@pytest.mark.parametrize("key, hint", [("lr", "optim.lr"), ("trainer.lr", "optim.lr"), ("optim.lrr", "optim.lr"),
                                       ("batch_size", "trainer.batch_size"), ("seed", "trainer.seed"),
                                       ("temprature", "rollout.sampler.temperature"),
                                       ("rollout.temperature", "rollout.sampler.temperature"),
                                       ("gpu", "distributed.device"), ("optimizer", "optim"), ("lor", "lora")])
def test_an_unknown_key_names_the_key_meant_wherever_it_is(key, hint):
    assert closest_key(key, config_keys(TrainConfig)) == hint
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [f"{key}=1"])
    assert str(err.value) == f"unknown config key '{key}' (did you mean '{hint}'?)"


def test_command_line_hints_skip_the_dashes_and_know_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--device", "gpu"])
    assert "(did you mean 'cuda'?)" in stderr_line(capsys)
    with pytest.raises(SystemExit):
        main(["generate", "--model", "tiny:llada", "--prompt", "hi", "--gpu"])
    assert "(did you mean '--device'?)" in stderr_line(capsys)
    with pytest.raises(ConfigError, match=r"^unknown sampler option 'temp' \(did you mean 'temperature'\?\)$"):
        SamplerConfig.from_dict(parse_options(["temp=1"]))


# 5. one spelling of a switch for dare train and dare generate ----------------------------------------------------

@pytest.mark.parametrize("text", ["yes", "no", "on", "off", "Y"])
def test_train_and_generate_refuse_the_same_switch_spellings(text, no_model_load, capsys):
    assert parse_boolean(text) is None
    with pytest.raises(ConfigError, match=rf"^config key 'trainer.export': expected true/false, got '{text}'$"):
        load_train_config(None, [f"trainer.export={text}"])
    with pytest.raises(ConfigError, match=r"expected true/false"):
        load_train_config(None, [f"rollout.sampler.suppress_eos={text}"])
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", "-o", f"suppress_eos={text}"]) == 2
    assert stderr_line(capsys) == f"error: suppress_eos must be true or false; got '{text}'"


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), ("tRuE", True), ("False", False)])
def test_train_and_generate_take_the_same_switch_spellings(text, value):
    assert parse_boolean(text) is value
    assert load_train_config(None, [f"trainer.export={text}"]).trainer.export is value
    assert parse_options([f"suppress_eos={text}"]) == {"suppress_eos": value}


# 6. sampling numbers must be finite -------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "inf", "temperature must be a finite number >= 0; got inf"),
    ("--temperature", "nan", "temperature must be a finite number >= 0; got nan"),
    ("--temperature", "-0.5", "temperature must be >= 0; got -0.5"),
    ("--top-p", "nan", "top_p must be a finite number in (0, 1]; got nan"),
    ("--threshold", "inf", "threshold must be a finite number in (0, 1]; got inf"),
])
def test_sampling_numbers_must_be_finite(flag, value, message, no_model_load, capsys):
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", flag, value]) == 2
    assert stderr_line(capsys) == f"error: {message}"
    with pytest.raises(ConfigError, match=r"^factor must be a finite number > 0; got inf$"):
        SamplerConfig(sampler="llada", decoder="factor", factor=float("inf")).resolved()


# 7. dare train without a recipe -----------------------------------------------------------------------------------

def test_train_without_a_recipe_ends_with_an_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("usage: dare train")
    assert err[-1] == ("error: dare train: no recipe given (e.g. dare train llada/sft_tiny; dare recipes lists "
                       "them); see 'dare train --help'")


# 8. the benchmark-as-training-data notice is a warning ------------------------------------------------------------

def test_training_on_a_benchmark_s_evaluation_problems_is_a_warning(tmp_path, caplog, monkeypatch):
    from dare.eval.benchmark import Benchmark
    from dare.trainer.config import DataConfig
    from dare.trainer.prompts import prompt_records

    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text(json.dumps({"question": "What is 1+1?", "answer": "#### 2"}) + "\n")
    real_load = Benchmark.load
    monkeypatch.setattr(Benchmark, "load", lambda self, source=None, **kw: real_load(self, source or str(rows), **kw))
    with caplog.at_level(logging.WARNING, logger="dare"):
        prompt_records(DataConfig(path="benchmark:gsm8k"))
    notices = [r.getMessage() for r in caplog.records if "trains on the problems" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith("warning: data.path=benchmark:gsm8k trains on the problems")
