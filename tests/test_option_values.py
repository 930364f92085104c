"""Sampler settings given as text (``-o KEY=VALUE``, ``--point``, lm-eval ``--model_args``) are checked before a
model loads, and never read as something else: a switch given as ``no`` is not true, ``None`` is not "unset"."""

import pytest

from dare.cli import main
from dare.commands.generate import parse_options
from dare.errors import ConfigError
from dare.rollout import SamplerConfig
from dare.rollout.config import RANGES


@pytest.mark.parametrize("text", ["no", "off", "0", "yes"])
def test_a_switch_takes_only_true_or_false(text):
    options = parse_options([f"suppress_eos={text}"])
    with pytest.raises(ConfigError, match=rf"^suppress_eos must be true or false; got {text!r}$"
                       if not text.isdigit() else r"^suppress_eos must be true or false; got 0$"):
        SamplerConfig.from_dict({"sampler": "llada", **options}).resolved()
    assert parse_options(["suppress_eos=FALSE"]) == {"suppress_eos": False}
    assert SamplerConfig.from_dict({"sampler": "llada", "suppress_eos": True}).resolved().suppress_eos is True


def test_python_none_is_text_and_null_is_unset():
    assert parse_options(["cache=None"]) == {"cache": "None"}
    assert parse_options(["cache=null"]) == {"cache": None}
    assert parse_options(["cache=none"]) == {"cache": "none"}
    with pytest.raises(ConfigError, match=r"unknown cache 'None' \(did you mean 'none'\?\)"):
        SamplerConfig.from_dict({"sampler": "fastdllm", **parse_options(["cache=None"])}).resolved()


@pytest.mark.parametrize("key", sorted(RANGES))
def test_every_range_is_checked_before_resolution(key):
    allowed, rule = RANGES[key]
    bad = next(v for v in (-1, 0, 1.5, 2) if not allowed(v))
    config = SamplerConfig.from_dict({key: bad})  # no sampler: not resolvable yet
    with pytest.raises(ConfigError, match=rf"^{key} must be {__import__('re').escape(rule)}; got {bad}$"):
        config.check_values()
    with pytest.raises(ConfigError, match=rf"^{key} must be"):  # the resolved config says the same
        SamplerConfig.from_dict({"sampler": "llada", key: bad}).resolved()
    SamplerConfig.from_dict({key: None}).check_values()  # unset: the preset decides


def test_generate_rejects_a_bad_value_before_loading_the_model(capsys, monkeypatch):
    import dare.commands.generate as generate

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(generate, "load_model", no_load)
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", "--temperature", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: temperature must be >= 0; got -1.0"
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", "-o", "suppress_eos=no"]) == 2
    assert capsys.readouterr().err.strip() == "error: suppress_eos must be true or false; got 'no'"


def test_lm_eval_model_args_are_checked_before_the_model_loads(monkeypatch):
    pytest.importorskip("lm_eval")
    import dare.eval.run as run
    from dare.eval.lm_harness import DareLM

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run, "load_for_eval", no_load)
    with pytest.raises(ConfigError, match=r"^temperature must be >= 0; got -1$"):
        DareLM(pretrained="tiny:llada", temperature=-1)
    with pytest.raises(ConfigError, match=r"^suppress_eos must be true or false; got 'no'$"):
        DareLM(pretrained="tiny:llada", suppress_eos="no")


@pytest.mark.parametrize("argv", [["--model_args", "pretrained=tiny:llada,gen_length=16,gen_length=32"],
                                  ["--model_args=pretrained=tiny:llada,gen_length=16,gen_length=32"]])
def test_lm_eval_model_args_given_twice_are_an_error(argv, capsys):
    assert main(["eval", "lm-eval", "--model", "dare", *argv, "--tasks", "none"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --model_args sets gen_length twice (gen_length=16 and "
                                               "gen_length=32); give it once")
