"""The trainer from Python: ``Trainer(config, model=m)`` trains ``m`` as it is and its run directory says so; a
custom batch source that lacks a key gets a one-line error.

Before, config.yaml recorded the config's ``model.path`` / ``model.dtype`` (the defaults ``tiny:llada`` /
``float32`` when the caller set neither), so the run directory named weights it was not trained from, and a rerun
from the recorded config trained another model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from dare.config import load_yaml
from dare.models.loading import load_model
from dare.trainer import Trainer, load_train_config

SFT = str(Path(__file__).resolve().parents[1] / "configs/llada/sft_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=4", "data.max_length=32", "trainer.batch_size=2",
         "trainer.micro_batch_size=2", "trainer.max_steps=1", "trainer.export=false"]


def trainer_warnings(caplog, out, model) -> tuple[Trainer, list[str]]:
    config = load_train_config(SFT, [f"trainer.output_dir={out}", *SMALL])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        trainer = Trainer(config, model=model)
    return trainer, [r.getMessage() for r in caplog.records if "Trainer(model=...)" in r.getMessage()]


def test_config_yaml_records_where_the_given_model_comes_from_and_its_dtype(tmp_path, caplog):
    model = load_model("tiny:llada:3", dtype=torch.bfloat16)
    trainer, warnings = trainer_warnings(caplog, tmp_path, model)
    assert warnings == [
        "warning: ignoring model.path=tiny:llada: Trainer(model=...) trains the given model, loaded from "
        "tiny:llada:3; config.yaml records model.path=tiny:llada:3",
        "warning: ignoring model.dtype=float32: Trainer(model=...) trains the given model as it is, in bfloat16; "
        "config.yaml records model.dtype=bfloat16"]
    assert trainer.model is model and next(model.parameters()).dtype == torch.bfloat16
    recorded = load_yaml(tmp_path / "config.yaml")["model"]
    assert (recorded["path"], recorded["dtype"]) == ("tiny:llada:3", "bfloat16")
    trainer.train()
    # the same model given again resumes (its settings are the recorded ones) without another word on the path
    again, warnings = trainer_warnings(caplog, tmp_path, load_model("tiny:llada:3", dtype=torch.bfloat16))
    assert len(warnings) == 2 and again.resume_from is not None


def test_a_model_that_matches_the_config_gets_no_warning(tmp_path, caplog):
    _, warnings = trainer_warnings(caplog, tmp_path, load_model("tiny:llada"))
    assert warnings == []



def test_a_custom_batch_source_without_a_key_the_algorithm_reads_is_one_line(tmp_path):
    from tensordict import TensorDict

    from dare.errors import ConfigError

    class IdsOnly:
        steps_per_epoch = 1

        def batch(self, step):
            return [TensorDict({"input_ids": torch.randint(0, 200, (2, 8))}, batch_size=[2])]

    config = load_train_config(SFT, [f"trainer.output_dir={tmp_path}", *SMALL])
    trainer = Trainer(config, source=IdsOnly())
    with pytest.raises(ConfigError) as caught:
        trainer.train_step(0)
    assert str(caught.value) == ("algorithm 'sft' reads 'maskable' from each micro-batch, but the batch source's "
                                 "micro-batches hold only input_ids (the built-in sources show what each algorithm "
                                 "needs: DatasetSource, PairSource, RolloutSource)")
