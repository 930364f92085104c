"""Every seed a user gives takes the range ``trainer.seed`` and ``dare demo --seed`` take (:data:`dare.config.SEEDS`),
checked by one function (:func:`dare.config.check_seed`) with one wording: ``dare generate --seed -3``, ``dare eval run
--seed -1`` (or 2**64), ``dare eval sweep --seed -1`` and ``dare tiny --seed -1`` used to be accepted silently (tiny
wrote "seed -1")."""

from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.config import SEEDS, check_seed
from dare.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATA = str(ROOT / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl")
HUGE = "99999999999999999999"
RANGE = f"[{SEEDS[0]}, {SEEDS[1]}]"


@pytest.mark.parametrize("args", [
    ["generate", "--model", "tiny:llada", "--prompt", "hi", "--seed", "{seed}"],
    ["generate", "--model", "tiny:llada", "--prompt", "hi", "--sampler", "llada", "--seed", "{seed}"],
    ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--seed", "{seed}"],
    ["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--point", "steps=2",
     "--out", "{tmp}/sweep", "--seed", "{seed}"],
    ["tiny", "--family", "llada", "--out", "{tmp}/tiny", "--seed", "{seed}"],
])
@pytest.mark.parametrize("seed", ["-1", HUGE])
def test_every_commands_seed_takes_the_runs_range(args, seed, tmp_path, capsys, monkeypatch):
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval", lambda *a, **k: pytest.fail("the model was loaded"))
    args = [a.replace("{seed}", seed).replace("{tmp}", str(tmp_path)) for a in args]
    assert one_line_error(capsys, *args) == f"error: --seed must be in {RANGE}; got {seed}"
    assert not any(tmp_path.iterdir())  # nothing written


def test_generates_o_seed_is_checked_too(capsys):
    assert one_line_error(capsys, "generate", "--model", "tiny:llada", "--prompt", "hi", "-o", "seed=-3") == (
        f"error: -o seed must be in {RANGE}; got -3")


def test_the_same_words_as_the_trainer_and_the_demo(capsys):
    assert one_line_error(capsys, "train", "llada/sft_tiny", "trainer.seed=-1", "--dry-run") == (
        f"error: trainer.seed must be in {RANGE}; got -1")
    assert one_line_error(capsys, "train", "llada/d1_tiny", "rollout.sampler.seed=-1", "--dry-run") == (
        f"error: rollout.sampler.seed must be in {RANGE}; got -1")
    with pytest.raises(ConfigError, match=r"^--seed must be in \[0, 4294967295\]; got -1$"):
        check_seed(-1, "--seed")
    check_seed(SEEDS[1], "--seed")
    check_seed(0, "--seed")


def test_the_python_apis_seeds():
    from dare.eval import EvalConfig
    from dare.eval.harness import seed_number

    with pytest.raises(ConfigError) as err:
        EvalConfig(seed=-1).check()
    assert str(err.value) == f"EvalConfig.seed must be in {RANGE}; got -1"
    assert err.value.cli_message == f"--seed must be in {RANGE}; got -1"
    assert seed_number("seed", " 7") == 7
    with pytest.raises(ConfigError, match=r"^seed must be a whole number; got 'x'$"):
        seed_number("seed", "x")


def test_the_opencompass_model_seed():
    from dare.eval.opencompass_checks import check_model_config

    with pytest.raises(ConfigError, match=r"^OpenCompass model tiny: seed must be in \[0, 4294967295\]; got -1$"):
        check_model_config({"type": "dare.eval.opencompass.DareDiffusionModel", "abbr": "tiny", "path": "tiny:llada",
                            "seed": -1})


def test_the_lm_eval_model_seed():
    pytest.importorskip("lm_eval")
    from dare.eval.lm_harness import DareLM

    with pytest.raises(ConfigError, match=rf"^seed must be in \[0, 4294967295\]; got {HUGE}$"):
        DareLM(pretrained="tiny:llada", seed=HUGE)  # --model_args ...,seed=N arrives as a string
