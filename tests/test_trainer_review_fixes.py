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
    # the shared RL check says why once (the trainer's generic "nothing trained" line would repeat it)
    said = [w for w in dare_warnings(caplog) if "nothing trained" in w or "learning signal" in w]
    assert said == ["warning: step 1: no learning signal in this rollout (algorithm.accuracy_filter [0.2, 0.8] "
                    "dropped 2 of 2 groups (accuracy outside it)): every advantage is 0, so nothing is learned from "
                    "it (later such rollouts are counted in the end-of-run summary)"]
    out = capsys.readouterr().out
    assert "2 of the 2 steps run trained nothing" in out and "1 of the 1 rollouts had no learning signal" in out


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
    assert config.algorithm.name == "tracerl" and config.algorithm.inner_steps == 1  # tracerl's default, not d1's 2
    assert [w for w in dare_warnings(caplog) if "dropping" in w] == [
        "note: algorithm.name=tracerl replaces the recipe's d1: dropping its algorithm.inner_steps, "
        "algorithm.kl_coef, algorithm.clip_low, algorithm.p_mask_prompt (tracerl starts from its own defaults; keep "
        "a setting with algorithm.KEY=VALUE)"]
    for flag in ("--dry-run", "--show-config"):
        assert main(["train", D1, "algorithm.name=tracerl", flag, "trainer.output_dir=/nonexistent/x"]) == 0, flag
    capsys.readouterr()


LLADA = ROOT / "configs/llada"


@pytest.mark.parametrize("recipe, name", [("vrpo_tiny.yaml", "dpo"), ("d1_tiny.yaml", "igpo"),
                                          ("sft_tiny.yaml", "bgpo")])
def test_another_algorithm_starts_from_its_own_defaults(recipe, name):
    """The recipe's settings of keys the new algorithm also has (VRPO's MC samples under DPO, d1's p_mask_prompt under
    IGPO, SFT's normalize under BGPO, which has other values) no longer carry over."""
    switched = load_train_config(LLADA / recipe, [f"algorithm.name={name}"]).algorithm
    assert switched == load_train_config(None, [f"algorithm.name={name}"]).algorithm


def test_an_algorithm_override_beside_the_switch_is_kept(caplog):
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        config = load_train_config(LLADA / "d1_tiny.yaml", ["algorithm.name=igpo", "algorithm.kl_coef=0.04"])
    algorithm = config.algorithm
    assert algorithm.kl_coef == 0.04 and algorithm.p_mask_prompt == 0.0 and algorithm.inner_steps == 4
    notes = [w for w in dare_warnings(caplog) if "dropping" in w]
    assert len(notes) == 1 and "algorithm.kl_coef" not in notes[0] and "algorithm.p_mask_prompt" in notes[0]


def test_the_recipes_own_algorithm_keeps_its_settings(caplog):
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        config = load_train_config(LLADA / "vrpo_tiny.yaml", ["algorithm.name=vrpo"])
    assert config.algorithm.mc_num == 4 and not [w for w in dare_warnings(caplog) if "dropping" in w]


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
