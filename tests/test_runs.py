"""A run's output directory: resume only with the same training settings, config.yaml describes the weights,
exports are atomic, interrupted writes are cleaned up, per-step logs are truncated at resume."""

import json
from pathlib import Path

import pytest
import yaml

from dare.errors import ConfigError
from dare.outputs import OUTPUT_MARKER
from dare.trainer import Trainer, load_train_config
from dare.trainer.output_dir import LOCK_FILE

KEPT = (OUTPUT_MARKER, LOCK_FILE)
"""Hidden files a run keeps in its output directory (its marker and its lock), not strays."""

ROOT = Path(__file__).resolve().parents[1]
SFT = ["trainer.progress=false", "data.num_examples=16", "data.max_length=32", "trainer.batch_size=4",
       "trainer.micro_batch_size=4", "trainer.max_steps=2", "trainer.save_every=2"]


def sft(out, *overrides, path=None):
    return load_train_config(path, [f"trainer.output_dir={out}", *SFT, *overrides])


def run(config):
    trainer = Trainer(config)
    trainer.train()
    return trainer


def test_other_training_settings_do_not_resume_and_keep_the_runs_config(tmp_path):
    run(sft(tmp_path))
    before = (tmp_path / "config.yaml").read_text()
    with pytest.raises(ConfigError) as err:
        Trainer(sft(tmp_path, "optim.lr=1e-3", "data.packing=true"))
    message = str(err.value)
    assert "\n" not in message
    assert "optim.lr" in message and "data.packing" in message
    assert "trainer.output_dir" in message and "trainer.resume=never" in message
    assert (tmp_path / "config.yaml").read_text() == before  # still describes the weights in the directory


def test_another_algorithm_names_itself_first_and_not_fields_unset_on_both_sides():
    from dare.trainer.resume import check_same_settings, differing_keys

    saved = {"algorithm": {"name": "d1", "kl_coef": 0.04, "block_size": None}, "optim": {"lr": 1e-3}}
    new = {"algorithm": {"name": "vrpo", "beta": 0.2}, "optim": {"lr": 1e-3}}
    assert differing_keys(saved, new) == ["algorithm.beta", "algorithm.kl_coef", "algorithm.name"]
    with pytest.raises(ConfigError) as err:
        check_same_settings(saved, new, "trainer.output_dir=x", "use another trainer.output_dir")
    assert str(err.value) == ("trainer.output_dir=x was trained with other settings: algorithm.name (d1 -> vrpo), "
                              "algorithm.beta (unset -> 0.2), algorithm.kl_coef (0.04 -> unset); "
                              "use another trainer.output_dir")


def test_eos_padding_is_free_for_resume_only_in_a_packed_run():
    """Packed rows carry no EOS padding either way (the Dream recipes now say data.eos_padding: false): a packed run
    resumes across the setting; a padded one, which it changes, does not."""
    from dare.trainer.resume import differing_keys

    def settings(packing: bool, eos_padding: bool) -> dict:
        return {"data": {"packing": packing, "eos_padding": eos_padding}, "optim": {"lr": 1e-3}}

    assert differing_keys(settings(True, True), settings(True, False)) == []
    assert differing_keys(settings(False, True), settings(False, False)) == ["data.eos_padding"]
    assert differing_keys(settings(False, True), settings(True, False)) == ["data.eos_padding", "data.packing"]


def test_another_family_in_the_same_directory_is_a_one_line_error(tmp_path):
    run(sft(tmp_path))
    with pytest.raises(ConfigError, match=r"model.path \(tiny:llada -> tiny:dream\)"):
        Trainer(sft(tmp_path, "model.path=tiny:dream"))


def test_settings_that_do_not_change_the_weights_resume(tmp_path):
    run(sft(tmp_path))
    trainer = run(sft(tmp_path, "trainer.max_steps=3", "trainer.log_every=2", "trainer.micro_batch_size=2"))
    assert trainer.resume_from is not None and trainer.step == 3
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["trainer"]["max_steps"] == 3
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_the_run_length_matters_when_the_schedule_depends_on_it(tmp_path):
    run(sft(tmp_path, "optim.scheduler=cosine"))
    with pytest.raises(ConfigError, match=r"trainer.max_steps \(2 -> 3\)"):
        Trainer(sft(tmp_path, "optim.scheduler=cosine", "trainer.max_steps=3"))


def test_resume_never_starts_over_and_replaces_the_runs_weights(tmp_path):
    run(sft(tmp_path))
    old_final = (tmp_path / "final" / "model.safetensors").read_bytes()
    trainer = Trainer(sft(tmp_path, "optim.lr=1e-3", "trainer.resume=never", "trainer.save_every=null"))
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "final").exists()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["optim"]["lr"] == 1e-3
    trainer.train()
    assert trainer.step == 2 and (tmp_path / "final" / "model.safetensors").read_bytes() != old_final


def test_an_explicit_checkpoint_of_another_recipe_is_refused(tmp_path):
    run(sft(tmp_path / "a"))
    checkpoint = next((tmp_path / "a" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="data.num_examples"):
        Trainer(sft(tmp_path / "b", "data.num_examples=32", f"trainer.resume={checkpoint}"))


def test_an_interrupted_export_never_looks_finished_and_is_cleaned_up(tmp_path, monkeypatch):
    trainer = run(sft(tmp_path))
    good = (tmp_path / "final" / "model.safetensors").read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(trainer.tokenizer), "save_pretrained", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.export()  # dies after the weights were written
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == good  # the previous export is untouched
    strays = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.name not in KEPT]
    assert strays == [".final.partial"]
    monkeypatch.undo()
    (tmp_path / "checkpoints" / "step_00000009.tmp").mkdir()  # a checkpoint killed while being written
    Trainer(sft(tmp_path))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name not in KEPT]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002"]


def test_rollout_samples_are_truncated_at_resume_like_the_metrics(tmp_path):
    def config(out):
        return load_train_config(ROOT / "configs/llada/d1_tiny.yaml", [
            f"trainer.output_dir={out}", "trainer.progress=false", "trainer.export=false", "trainer.batch_size=8",
            "trainer.micro_batch_size=8", "trainer.max_steps=4", "trainer.save_every=2"])

    run(config(tmp_path / "full"))
    run(config(tmp_path / "killed"))
    import shutil

    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "step_00000004")  # killed after step 4, before its checkpoint
    run(config(tmp_path / "killed"))

    def steps(path, name):
        return [json.loads(line)["step"] for line in (path / name).read_text().splitlines()]

    assert steps(tmp_path / "full", "rollouts.jsonl") == [1, 1, 3, 3]
    assert steps(tmp_path / "killed", "rollouts.jsonl") == [1, 1, 3, 3]
    assert steps(tmp_path / "killed", "metrics.jsonl") == [1, 2, 3, 4]


@pytest.mark.parametrize("override,match", [
    ("trainer.max_steps=0", "trainer.max_steps must be positive or null"),
    ("trainer.save_every=0", "trainer.save_every must be positive or null"),
    ("trainer.epochs=0", "trainer.epochs must be positive"),
])
def test_zero_steps_and_checkpoint_intervals_are_errors(tmp_path, override, match):
    extra = ["trainer.max_steps=null"] if "epochs" in override else []
    with pytest.raises(ConfigError, match=match):
        load_train_config(None, [f"trainer.output_dir={tmp_path}", *extra, override])
