"""``dare eval lm-eval --help`` / ``dare eval opencompass --help``: DARE's part of the help (the model plug-in and
its arguments) before the tool's own, and a help rather than an error when OpenCompass is not installed."""

import importlib.util

import pytest

from dare.cli import main
from dare.commands.passthrough import asks_for_help


def test_help_is_asked_before_a_double_dash_only():
    assert asks_for_help(["run", "-h"]) and asks_for_help(["--tasks", "gsm8k", "--help"])
    assert not asks_for_help(["--tasks", "gsm8k"]) and not asks_for_help(["--", "--help"])


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_lm_eval_help_starts_with_the_dare_model_arguments(capsys):
    assert main(["eval", "lm-eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dare eval lm-eval: ") and "--model dare" in out and "pretrained=" in out
    assert out.index("pretrained=") < out.index("usage: lm-eval")  # then lm-eval's own help


def test_opencompass_help_is_a_help_even_without_opencompass(capsys):
    status = main(["eval", "opencompass", "--help"])
    captured = capsys.readouterr()
    assert status == 0 and captured.out.startswith("dare eval opencompass: ") and "DareDiffusionModel" in captured.out
    if importlib.util.find_spec("opencompass") is None:
        assert "pip install 'dare-dllm[opencompass]'" in captured.out and "error" not in captured.err
        assert "own help follows" not in captured.out  # none follows without OpenCompass
