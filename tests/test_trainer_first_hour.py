"""A new user's first hour with `dare train`: resume=never never deletes the model it trains from, a rerun says what
it replaces, path mistakes are one-line errors the dry run finds too, settings another one overrides are warned,
rollout.sampler.seed takes effect, --show-config shows the recipe, a relative data path says relative to what."""

import glob
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from test_config_validation import warnings_of

from dare.cli import main
from dare.errors import ConfigError
from dare.trainer import Trainer, load_train_config

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
SPG = str(ROOT / "configs/llada/spg_tiny.yaml")
DTREERPO = str(ROOT / "configs/llada/dtreerpo_tiny.yaml")
TRACERL = str(ROOT / "configs/sdar/tracerl_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4",
         "trainer.micro_batch_size=4", "trainer.max_steps=1"]


def train(capsys, out, *overrides) -> str:
    """A one-step tiny SFT run into ``out``; returns what it printed."""
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, *overrides]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


# ---- 1. trainer.resume=never -------------------------------------------------------------------------------------
def test_resume_never_refuses_to_delete_the_model_it_trains_from(tmp_path, capsys):
    out = tmp_path / "run"
    train(capsys, out)
    weights = (out / "final" / "model.safetensors").read_bytes()
    again = ["train", SFT, f"model.path={out / 'final'}", f"trainer.output_dir={out}", *SMALL]
    for extra in (["trainer.resume=never", "--dry-run"], ["trainer.resume=never"]):
        line = one_line_error(capsys, *again, *extra)
        assert line == (f"error: trainer.resume=never would delete model.path={out / 'final'} before training from "
                        f"it; use another trainer.output_dir (or copy it out of {out} first)")
    assert (out / "final" / "model.safetensors").read_bytes() == weights and (out / "checkpoints").is_dir()
    # resume=auto: the other-settings error does not suggest the start-over that would delete the model
    line = one_line_error(capsys, *again)
    assert "trained with other settings: model.path" in line
    assert line.endswith(f"use another trainer.output_dir (trainer.resume=never would delete model.path="
                         f"{out / 'final'})")
    # the tokenizer, given as a path inside checkpoints/ or final/, is protected alike
    line = one_line_error(capsys, "train", SFT, f"model.tokenizer={out}/final/../final", f"trainer.output_dir={out}",
                          "trainer.resume=never", "--dry-run")
    assert line.startswith(f"error: trainer.resume=never would delete model.tokenizer={out}/final/../final ")


def test_resume_never_says_what_it_removes(tmp_path, capsys):
    out = tmp_path / "run"
    assert "starting over" not in train(capsys, out, "trainer.resume=never")  # nothing there yet: nothing to say
    printed = train(capsys, out, "trainer.resume=never", "optim.lr=1e-3")
    assert f"starting over in {out} (trainer.resume=never): removing checkpoints/, final/, metrics.jsonl\n" in printed


# ---- 2. a rerun without a checkpoint -----------------------------------------------------------------------------
def test_a_rerun_without_a_checkpoint_says_it_starts_from_step_0(tmp_path, capsys):
    out = tmp_path / "run"
    assert "no checkpoint" not in train(capsys, out, "trainer.save_every=null")
    shutil.rmtree(out / "checkpoints")  # as a run stopped before its first checkpoint leaves it
    printed = train(capsys, out, "trainer.save_every=null")
    assert f"no checkpoint in {out}: starting from step 0; final/ and metrics.jsonl are replaced\n" in printed
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    train(capsys, tmp_path / "saved", "trainer.save_every=null")  # null: one checkpoint, at the end
    printed = train(capsys, tmp_path / "saved", "trainer.save_every=null")
    assert "resumed from" in printed and "no checkpoint" not in printed


# ---- 3. paths and patterns the dry run finds ---------------------------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("model.tokenizer=/no/such/tokenizer", "error: model.tokenizer /no/such/tokenizer: no such tokenizer directory"),
    ("model.tokenizer={tmp}/file", "error: model.tokenizer {tmp}/file is a file; expected a tokenizer (or model) "
                                   "directory"),
    ("model.tokenizer={tmp}", "error: model.tokenizer {tmp} holds no tokenizer files"),
    ("lora.target_modules=(", "error: lora.target_modules='(' is not a valid regular expression (missing ), "
                              "unterminated subpattern at position 0)"),
    ("trainer.output_dir={tmp}/file", "error: trainer.output_dir {tmp}/file: exists and is not a directory"),
    ("trainer.output_dir={tmp}/file/run", "error: trainer.output_dir {tmp}/file/run: cannot create the directory"),
])
def test_the_dry_run_finds_path_and_pattern_mistakes_the_run_rejects(override, message, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    override, message = override.replace("{tmp}", str(tmp_path)), message.replace("{tmp}", str(tmp_path))
    assert one_line_error(capsys, "train", SFT, "--dry-run", f"trainer.output_dir={tmp_path / 'run'}",
                          override).startswith(message)
    assert one_line_error(capsys, "train", SFT, *SMALL, f"trainer.output_dir={tmp_path / 'run'}",
                          override).startswith(message)


def test_a_tokenizer_that_fails_to_load_is_one_line(tmp_path, capsys):
    broken = tmp_path / "tok"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text("{")  # passes the preflight, fails in transformers
    line = one_line_error(capsys, "train", SFT, *SMALL, f"model.tokenizer={broken}",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line.startswith(f"error: model.tokenizer={broken}: cannot load a tokenizer (")


def test_a_valid_target_pattern_passes():
    assert load_train_config(SFT, [r"lora.target_modules=.*\.(q_proj|v_proj)"]).lora.target_modules
    with pytest.raises(ConfigError) as err:
        load_train_config(SFT, ["lora.target_modules=a["])
    assert str(err.value).startswith("lora.target_modules='a[' is not a valid regular expression (")


# ---- 4. settings another setting overrides -----------------------------------------------------------------------
@pytest.mark.parametrize("recipe, overrides, warning, applies", [
    (SFT, ["trainer.epochs=3"], "warning: ignoring trainer.epochs: trainer.max_steps is set and sets the run length "
                                "(trainer.max_steps=null to train for trainer.epochs)", ["trainer.max_steps=null"]),
    (SFT, ["optim.warmup_ratio=0.1"], "warning: ignoring optim.warmup_ratio: optim.warmup_steps is set "
                                      "(warmup_ratio applies when warmup_steps is 0)", ["optim.warmup_steps=0"]),
    (SFT, ["optim.scheduler=constant"], "warning: ignoring optim.min_lr_ratio: optim.scheduler=constant does not "
                                        "decay (min_lr_ratio applies to cosine and linear)", ["optim.scheduler=linear"]),
    (D1, ["optim.min_lr_ratio=0.1"], "warning: ignoring optim.min_lr_ratio: optim.scheduler=constant does not decay "
                                     "(min_lr_ratio applies to cosine and linear)", ["optim.scheduler=cosine"]),
    (SFT, ["model.compile_backend=eager"], "warning: ignoring model.compile_backend: model.compile is false",
     ["model.compile=true"]),
    (D1, ["algorithm.kl_coef=0", "algorithm.kl_estimator=k1"], "warning: ignoring algorithm.kl_estimator: "
     "algorithm.kl_coef is 0: there is no KL term (set algorithm.kl_coef > 0 to add one)", ["algorithm.kl_coef=0.01"]),
    (D1, ["rollout.dynamic_extra_rounds=2"], "warning: ignoring rollout.dynamic_extra_rounds: "
     "rollout.dynamic_sampling is false", ["rollout.dynamic_sampling=true"]),
    (D1, ["rollout.samples_file=false", "rollout.samples_per_step=4"], "warning: ignoring rollout.samples_per_step: "
     "rollout.samples_file is false (no rollouts.jsonl is written)", ["rollout.samples_file=true"]),
    (D1, ["algorithm.population_std=true"], "warning: ignoring algorithm.population_std: algorithm.advantage is not "
     "zscore (population_std chooses the z-score's std)", ["algorithm.advantage=zscore"]),
    (TRACERL, ["algorithm.value_model=false", "algorithm.lam=0.9"], "warning: ignoring algorithm.value_lr, "
     "algorithm.lam: algorithm.value_model is false (no value model is trained, and GAE needs one)",
     ["algorithm.value_model=true"]),
    (SPG, ["algorithm.logp_estimation=eubo", "algorithm.mix_weight=0.3"], "warning: ignoring algorithm.mix_weight: "
     "algorithm.logp_estimation is not mix", ["algorithm.logp_estimation=mix"]),
    (SPG, ["algorithm.logp_estimation=elbo", "algorithm.eubo_beta=2"], "warning: ignoring algorithm.eubo_beta: "
     "algorithm.logp_estimation=elbo uses no EUBO", ["algorithm.logp_estimation=eubo"]),
    (DTREERPO, ["algorithm.self_distillation=false"], "warning: ignoring algorithm.distill_horizon: "
     "algorithm.self_distillation is false", ["algorithm.self_distillation=true"]),
])
def test_a_setting_another_one_overrides_gets_one_warning(recipe, overrides, warning, applies, caplog):
    assert warnings_of(caplog, recipe, *overrides) == [warning]
    assert warnings_of(caplog, recipe, *overrides, *applies) == []  # where it applies: no warning
    assert warnings_of(caplog, recipe) == []  # the recipe's own values (sft_tiny: min_lr_ratio with cosine) apply


def test_a_wandb_project_without_wandb_is_warned(caplog):
    assert warnings_of(caplog, SFT, "trainer.wandb_project=mine") == [
        "warning: ignoring trainer.wandb_project: trainer.wandb is false"]


def test_a_rollout_setting_without_rollouts_is_warned_once(caplog):
    assert warnings_of(caplog, SFT, "rollout.dynamic_extra_rounds=2") == [
        "warning: ignoring rollout.dynamic_extra_rounds: algorithm 'sft' makes no rollouts"]


def test_a_moot_setting_is_warned_once_by_the_dry_run_and_once_by_the_run(tmp_path, capsys, caplog):
    args = ["train", D1, *SMALL, "trainer.export=false", "algorithm.kl_coef=0", "algorithm.kl_estimator=k1",
            f"trainer.output_dir={tmp_path / 'run'}"]
    for extra in (["--dry-run"], []):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dare.trainer"):
            assert main([*args, *extra]) == 0, capsys.readouterr().err
        said = [r.getMessage() for r in caplog.records if "algorithm.kl_estimator" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith("warning: ignoring algorithm.kl_estimator: "), (extra, said)
    capsys.readouterr()


def test_no_recipe_warns():
    from dare.algorithms import get_algorithm
    from dare.trainer.preflight import overridden, warn_unused

    recipes = sorted({*glob.glob(str(ROOT / "configs/*/*_tiny.yaml")), *glob.glob(str(ROOT / "configs/*/*_[78]b.yaml")),
                      *glob.glob(str(ROOT / "configs/*/*_mini.yaml"))})
    assert len(recipes) > 40
    logger = logging.getLogger("dare.trainer")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(f"{record.getMessage()}")
    logger.addHandler(handler)
    try:
        for recipe in recipes:
            config = load_train_config(recipe)
            assert overridden(config) == [], recipe
            warn_unused(config, get_algorithm(config.algorithm.name).needs)
            assert records == [], recipe
    finally:
        logger.removeHandler(handler)


# ---- 5. rollout.sampler.seed -------------------------------------------------------------------------------------
def rollout_seeds(tmp_path, *overrides) -> tuple[list[int], list]:
    """The sampler seeds and completions of a one-step tiny d1 run."""
    config = load_train_config(D1, [f"trainer.output_dir={tmp_path}", "trainer.progress=false", "trainer.export=false",
                                    "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.max_steps=1",
                                    "algorithm.inner_steps=1", *overrides])
    trainer = Trainer(config)
    seeds, completions, generate = [], [], trainer.algorithm.generate

    def spy(policy, ids, attn, sampler, **kwargs):
        seeds.append(sampler.seed)
        out = generate(policy, ids, attn, sampler, **kwargs)
        completions.append(out.completion.tolist())
        return out

    trainer.algorithm.generate = spy
    trainer.train()
    return seeds, completions


def test_the_rollout_sampler_seed_changes_the_rollouts_and_0_keeps_the_derived_seed(tmp_path):
    from dare.rollout import derive_seed

    seeds, default = rollout_seeds(tmp_path / "a")
    assert seeds == [derive_seed(0, 0)]  # what every run used before rollout.sampler.seed was read
    seeds, seeded = rollout_seeds(tmp_path / "b", "rollout.sampler.seed=7")
    assert seeds == [derive_seed(derive_seed(0, 7), 0)] and seeded != default
    assert rollout_seeds(tmp_path / "c", "trainer.seed=3")[0] == [derive_seed(3, 0)]
    from dare.trainer.rl import rollout_base_seed

    assert rollout_base_seed(5, 0) == 5 and rollout_base_seed(5, 7) == derive_seed(5, 7)


def test_the_rl_progress_bar_shows_the_latest_rollout_reward(tmp_path, capsys):
    """Before, an RL run's bar showed only loss and lr; inner steps (mu = 2 here) keep the rollout's reward."""
    args = ["train", D1, f"trainer.output_dir={tmp_path / 'run'}", "trainer.max_steps=2", "algorithm.inner_steps=2"]
    assert main(args) == 0
    bar = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("train:")]
    assert "2/2" in bar[-1] and "reward=" in bar[-1], bar
    assert all("reward=" in line for line in bar if "1/2" in line or "2/2" in line), bar


def test_progress_false_also_silences_the_export_bars(tmp_path, capsys):
    """transformers' "Writing model shards" bar used to appear under trainer.progress=false."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()  # an earlier test (the demo) may have turned them off
    hf_logging.enable_progress_bar()
    try:
        assert main(["train", SFT, f"trainer.output_dir={tmp_path / 'run'}", *SMALL]) == 0  # SMALL: progress=false
        err = capsys.readouterr().err
        assert "Writing model shards" not in err and "train:" not in err, err
        assert hf_logging.is_progress_bar_enabled()  # restored after the export
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


def test_the_end_says_where_the_weights_are_without_an_export_and_a_deleted_resume_point_does_not_exist(
        tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.export=false"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"no final export (trainer.export=false); latest checkpoint: {out / 'checkpoints' / 'step_00000001'}")
    gone = out / "checkpoints" / "step_00000009"
    assert one_line_error(capsys, "train", SFT, *SMALL, f"trainer.resume={gone}", "--dry-run") == (
        f"error: trainer.resume={gone} does not exist; the checkpoints in {out / 'checkpoints'}: step_00000001; use "
        "auto, never, a run directory (its latest checkpoint) or a checkpoint directory "
        "(OUTPUT_DIR/checkpoints/step_00000012)")


def test_sft_rows_longer_than_the_models_context_are_warned(tmp_path, caplog):
    """The tiny model's context is 512 positions. Rows that reach past it are warned (they trained without a word
    before); a data.max_length above it that no row reaches is not (the default 1024 was warned on every tiny run)."""
    from dare.trainer import run_training

    short = [o for o in SMALL if not o.startswith("data.max_length")]
    cases = (
        (["data.max_length=512"], None),
        (["data.max_length=600"], None),  # no row is near 512
        (["data.max_length=600", "data.fixed_shapes=true"],
         "fixed-shape rows are padded to data.max_length=600 positions"),
        (["data.max_length=600", "data.fixed_shapes=true", "data.packing=true"], None),  # positions restart per row
        (["data.max_length=600", "data.pad_response_to=560"], "the longest example has 5"),
    )
    for number, (settings, warned) in enumerate(cases):
        config = load_train_config(SFT, [*short, *settings, f"trainer.output_dir={tmp_path / str(number)}"])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dare.trainer"):
            run_training(config)
        messages = [r.getMessage() for r in caplog.records if "context" in r.getMessage()]
        if warned is None:
            assert messages == [], (settings, messages)
        else:
            assert len(messages) == 1 and messages[0].startswith(f"warning: {warned}"), (settings, messages)
            assert messages[0].endswith("beyond the model's configured context length 512: positions past it are "
                                        "untrained"), messages


# ---- 6. --show-config --------------------------------------------------------------------------------------------
def show(capsys, *args) -> list[str]:
    assert main(["train", *args, "--show-config"]) == 0
    return capsys.readouterr().out.splitlines()


def test_show_config_shows_the_recipe_with_its_overrides_and_only_its_algorithm(capsys):
    lines = show(capsys, SFT, "optim.lr=0.5")
    assert lines[0] == f"# {SFT} with optim.lr=0.5"
    assert "optim.lr (float) = 0.5 (default: 1e-05)  # Peak learning rate (AdamW)." in lines
    assert any(line.startswith("data.num_examples (int | None) = 256 (default: None)  # ") for line in lines)
    assert any(line.startswith("optim.min_lr_ratio (float) = 0.1 (default: 0.0)  # ") for line in lines)
    assert [line for line in lines if line.startswith("algorithm.name ")] == [
        "algorithm.name (str) = 'sft'  # Algorithm name."]
    assert not any("bgpo" in line and line.startswith("algorithm.") for line in lines)
    rl = show(capsys, D1)
    assert "algorithm.name (str) = 'd1'  # Algorithm name." in rl and any(l.startswith("algorithm.kl_coef") for l in rl)
    assert any(line.startswith("rollout.group_size (int) = 4 (default: 8)") for line in rl)


def test_show_config_without_a_recipe_says_these_are_the_defaults(capsys):
    lines = show(capsys)
    assert lines[0].startswith("# defaults (no recipe given)")
    assert "algorithm.name (str) = 'sft'  # Algorithm name." in lines
    assert not [line for line in lines if " (default: " in line.split("  # ")[0]]  # every value is the default
    assert show(capsys, "algorithm.name=vrpo")[0].startswith("# defaults (no recipe given) with algorithm.name=vrpo")


@pytest.mark.parametrize("flag", ["--show-config", "--dry-run"])
def test_a_closed_pipe_ends_the_output_quietly(flag, tmp_path):
    import dare

    env = {**os.environ, "PYTHONPATH": str(Path(dare.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dare.cli", "train", SFT, flag], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path, env=env)
    proc.stdout.close()  # like `| head` that has read enough: every write finds the pipe closed
    err = proc.stderr.read().decode()
    said = "dry run: the checks passed; would start at step 0 in runs/llada_sft_tiny (nothing was loaded or written)\n"
    assert proc.wait(timeout=60) == 0 and err == (said if flag == "--dry-run" else "")  # no broken-pipe noise


# ---- 7. relative data paths --------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", [SFT, D1])
def test_a_missing_relative_data_path_says_relative_to_what(recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", recipe, "--dry-run", "data.path=w/dm/sft.jsonl")
    assert line == f"error: data file w/dm/sft.jsonl does not exist (relative to the current directory {tmp_path})"
    missing = tmp_path / "missing.jsonl"
    assert one_line_error(capsys, "train", recipe, "--dry-run", f"data.path={missing}") == \
        f"error: data file {missing} does not exist"


@pytest.mark.parametrize("edit, message", [
    (lambda c: setattr(c.optim, "lr", -1.0), "optim.lr must be positive; got -1.0"),
    (lambda c: setattr(c.trainer, "batch_size", "16"), "config key 'trainer.batch_size': expected an integer, got '16'"),
])
def test_a_config_edited_in_python_is_checked_again_before_any_work(edit, message, tmp_path):
    """Before: torch's ValueError (lr) or a TypeError deep in the data source (batch size), after config.yaml was
    written."""
    from dare.trainer import run_training

    config = load_train_config(SFT, [*SMALL, f"trainer.output_dir={tmp_path / 'run'}"])
    edit(config)
    with pytest.raises(ConfigError) as err:
        run_training(config)
    assert str(err.value) == message and not (tmp_path / "run").exists()
