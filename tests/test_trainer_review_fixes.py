"""Review fixes of the trainer: steps that train nothing are said, switching algorithm on a recipe, the sampler's
attention kind first, and Ctrl-C during a checkpoint write."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dare.cli import main
from dare.errors import ConfigError
from dare.trainer import load_train_config

ROOT = Path(__file__).resolve().parents[1]
TRACERL = str(ROOT / "configs/sdar/tracerl_tiny.yaml")
D1 = str(ROOT / "configs/sdar/d1_tiny.yaml")
BGPO = str(ROOT / "configs/sdar/bgpo_tiny.yaml")
SMALL = ["trainer.max_steps=2", "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.progress=false"]


def dare_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dare") and r.levelno >= logging.WARNING]


# ---- 1. a step whose every group was filtered ---------------------------------------------------------------------
def test_tracerl_accuracy_filter_dropping_every_group_is_said(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        assert main(["train", TRACERL, "algorithm.accuracy_filter=[0.2,0.8]", f"trainer.output_dir={out}",
                     *SMALL]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["rows"] for r in records] == [0.0, 0.0]  # the random model's groups are all outside [0.2, 0.8]
    said = [w for w in dare_warnings(caplog) if "nothing trained" in w]
    assert said == ["warning: step 1: algorithm.accuracy_filter [0.2, 0.8] dropped all 2 groups (mean accuracy "
                    "outside it): nothing trained this step (later such steps are counted in the end-of-run "
                    "summary)"]
    assert "2 of the 2 steps run trained nothing" in capsys.readouterr().out


def test_summary_counts_steps_that_trained_nothing(tmp_path):
    from dare.commands.train import run_summary

    config = load_train_config(TRACERL, [f"trainer.output_dir={tmp_path}"])
    assert "trained nothing" not in run_summary(config, {"step": 3, "loss": 0.1})
    text = run_summary(config, {"step": 3, "loss": 0.0, "steps_run": 3, "steps_trained_nothing": 2})
    assert "warning: 2 of the 3 steps run trained nothing" in text


def test_a_training_step_with_rows_is_not_counted(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        assert main(["train", TRACERL, f"trainer.output_dir={out}", *SMALL]) == 0  # the recipe's filter: null
    assert not [w for w in dare_warnings(caplog) if "nothing trained" in w]
    assert "trained nothing" not in capsys.readouterr().out


# ---- 2. algorithm.name on a recipe of another algorithm -------------------------------------------------------------
def test_switching_algorithm_drops_the_recipes_other_keys_with_one_warning(caplog, capsys):
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        config = load_train_config(D1, ["algorithm.name=tracerl"])
    assert config.algorithm.name == "tracerl" and config.algorithm.inner_steps == 2  # shared keys are kept
    assert [w for w in dare_warnings(caplog) if "dropping" in w] == [
        "warning: algorithm.name=tracerl: dropping the recipe's algorithm.p_mask_prompt (a d1 setting tracerl "
        "does not have)"]
    for flag in ("--dry-run", "--show-config"):
        assert main(["train", D1, "algorithm.name=tracerl", flag, "trainer.output_dir=/nonexistent/x"]) == 0, flag
    capsys.readouterr()


def test_a_key_given_as_override_stays_an_error():
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.p_mask_prompt'"):
        load_train_config(D1, ["algorithm.name=tracerl", "algorithm.p_mask_prompt=0.1"])


def test_an_other_algorithms_key_in_the_recipe_says_so(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(Path(D1).read_text().replace("name: d1", "name: tracerl"))
    with pytest.raises(ConfigError) as err:
        load_train_config(str(recipe), [])
    message = str(err.value)
    assert "'algorithm.p_mask_prompt' in the recipe" in message and str(recipe) in message
    assert "it is a setting of" in message and "d1" in message and "\n" not in message


# ---- 3. the sampler's attention kind before its settings -----------------------------------------------------------
def test_full_attention_sampler_on_block_model_names_the_real_problem(capsys):
    assert main(["train", BGPO, "rollout.sampler.sampler=dream", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sampler 'dream' decodes full models; sdar is block-causal" in err[0], err
    assert "block_steps" not in err[0]


def test_rollout_sampler_checks_the_family_first():
    from dare.trainer.rl import rollout_sampler

    config = load_train_config(BGPO, ["rollout.sampler.sampler=dream"])
    with pytest.raises(ConfigError, match="decodes full models; sdar is block-causal"):
        rollout_sampler(config.rollout, "sdar")


# ---- 4. Ctrl-C during a checkpoint write ----------------------------------------------------------------------------
@pytest.mark.parametrize("wrapped", [True, False])
def test_interrupt_during_checkpoint_save_is_one_line(tmp_path, capsys, monkeypatch, wrapped):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    def interrupted_save(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:  # what dcp raises: the rank's exception wrapped with its traceback
            if wrapped:
                raise CheckpointException("CheckpointException ranks:dict_keys([0])", {0: _wrap_exception(err)})
            raise

    monkeypatch.setattr(dcp, "save", interrupted_save)
    out = tmp_path / "run"
    code = main(["train", TRACERL, f"trainer.output_dir={out}", "trainer.save_every=1", *SMALL])
    err = capsys.readouterr().err
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err
