"""A new user's first hour with `dare train` and the Python training API, second pass: distributed.mixed_precision=bf16
takes effect on CPU, a recipe that forgot model.path / data.path says which default it trains, load_train_config takes
its overrides as a string or a mapping too, a recipe after the overrides and a `--flag` for a config key are one-line
errors saying what to write, and trainer.resume takes a run directory (errors name the zero-padded checkpoints)."""

import json
import logging
from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error

from dare.cli import main
from dare.errors import ConfigError
from dare.trainer import Trainer, load_train_config, run_training

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4",
         "trainer.micro_batch_size=4", "trainer.max_steps=1"]


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dare.trainer" and r.getMessage().startswith("note:")]


# ---- 1. distributed.mixed_precision=bf16 on CPU ------------------------------------------------------------------
def test_bf16_mixed_precision_is_applied_in_a_single_cpu_process(tmp_path):
    """Before: bf16 was applied only under FSDP2 (or CUDA autocast), so a one-process CPU run trained in fp32 and its
    loss equalled the fp32 run's to the last bit."""
    losses = {}
    for precision in ("fp32", "auto", "bf16"):
        config = load_train_config(SFT, [*SMALL, f"trainer.output_dir={tmp_path / precision}",
                                         f"distributed.mixed_precision={precision}"])
        losses[precision] = run_training(config)["loss"]
    assert losses["auto"] == losses["fp32"]  # auto stays fp32 on CPU
    assert losses["bf16"] != losses["fp32"]
    assert abs(losses["bf16"] - losses["fp32"]) < 0.05 * abs(losses["fp32"])  # rounded, not broken

    trainer = Trainer(load_train_config(SFT, [*SMALL, f"trainer.output_dir={tmp_path / 'spy'}",
                                              "distributed.mixed_precision=bf16"]))
    try:
        with trainer.precision():
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # master weights stay fp32
    finally:
        trainer.release_output_dir()


# ---- 2. defaults a recipe did not set ----------------------------------------------------------------------------
def test_a_recipe_without_model_or_data_path_says_which_default_it_trains(tmp_path, caplog, capsys):
    """Before: a recipe that forgot model.path / data.path trained tiny:llada on synthetic:reverse without a word."""
    recipe = tmp_path / "forgot.yaml"
    recipe.write_text("algorithm:\n  name: sft\ntrainer:\n  max_steps: 1\n")
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        load_train_config(recipe)
    assert notes(caplog) == [
        f"note: the recipe {recipe} sets no model.path: using the default model.path=tiny:llada (a tiny randomly "
        "initialised LLaDA, no weights); set model.path to choose",
        f"note: the recipe {recipe} sets no data.path: using the default data.path=synthetic:reverse (a generated "
        "word-reversal task, 'reverse WORD'); set data.path to choose"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        load_train_config(recipe, ["model.path=tiny:llada"])  # given as an override: only data.path is noted
        assert [n.split(":")[2].strip() for n in notes(caplog)] == ["using the default data.path=synthetic"]
        caplog.clear()
        load_train_config(SFT)  # a recipe that sets both: nothing to say
        assert notes(caplog) == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):  # the command says it before training
        assert main(["train", str(recipe), f"trainer.output_dir={tmp_path / 'run'}", *SMALL]) == 0
    assert [n.split(": ")[1] for n in notes(caplog)] == [f"the recipe {recipe} sets no model.path",
                                                          f"the recipe {recipe} sets no data.path"]


# ---- 3. load_train_config's overrides ----------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", ["trainer.max_steps=3", ("trainer.max_steps=3",), {"trainer.max_steps": 3},
                                       {"trainer": {"max_steps": 3}}])
def test_overrides_may_be_one_string_or_a_mapping(overrides):
    """Before: a string was read character by character ("override 't' must look like key=value") and a dict by
    its keys ("override 'trainer.max_steps' must look like key=value")."""
    config = load_train_config(SFT, overrides)
    assert config.trainer.max_steps == 3 and config == load_train_config(SFT, ["trainer.max_steps=3"])


def test_a_mapping_keeps_its_values_and_merges_sections():
    config = load_train_config(SFT, {"optim.lr": 1e-4, "optim": {"weight_decay": 0.1}, "trainer.output_dir": "0123"})
    assert (config.optim.lr, config.optim.weight_decay, config.trainer.output_dir) == (1e-4, 0.1, "0123")
    assert config.optim.scheduler == "cosine"  # the recipe's other optim settings stay


@pytest.mark.parametrize("path, overrides, message", [
    (SFT, 5, "overrides must be a list of 'key=value' strings, one 'key=value' string or a mapping {key: value} "
             "(dotted keys or nested sections); got an int (5)"),
    (SFT, ["trainer.max_steps=3", 4], "overrides[1] must be a 'key=value' string; got an int (4)"),
    (SFT, {"optim": None, "optim.lr": 1e-4}, "overrides: optim is given twice (again by the key 'optim.lr')"),
    (["trainer.max_steps=3"], (), "load_train_config's path must be a recipe path (str or Path) or None; got a list "
                                  "(['trainer.max_steps=3']): overrides go second: load_train_config(path, "
                                  "['key=value', ...])"),
    ("trainer.max_steps=3", (), "load_train_config's path 'trainer.max_steps=3' looks like an override, not a recipe: "
                                "load_train_config(None, ['trainer.max_steps=3']) (or load_train_config(RECIPE, "
                                "['trainer.max_steps=3']))"),
])
def test_overrides_of_another_type_are_one_line_errors(path, overrides, message):
    with pytest.raises(ConfigError) as err:
        load_train_config(path, overrides)
    assert str(err.value) == message


# ---- 4. the command line: recipe order and --flags ---------------------------------------------------------------
def test_a_recipe_after_the_overrides_says_it_must_come_first(capsys):
    """Before: `override 'configs/llada/sft_tiny.yaml' must look like key=value`."""
    assert one_line_error(capsys, "train", "trainer.max_steps=1", SFT, "optim.lr=1e-3", "--dry-run") == (
        f"error: the recipe must come first, before the key=value overrides: dare train {SFT} trainer.max_steps=1 "
        "optim.lr=1e-3 --dry-run")
    other = str(ROOT / "configs/llada/d1_tiny.yaml")
    assert one_line_error(capsys, "train", SFT, other, "--show-config") == (
        f"error: one recipe per run: got {SFT} and {other} (settings of another file go in as key=value overrides)")


@pytest.mark.parametrize("flags, message", [
    (["--max-steps", "5"], "unknown option --max-steps: settings are key=value overrides here (use "
                           "trainer.max_steps=5)"),
    (["--lr=1e-4", "--max_steps", "3"], "unknown option --lr --max_steps: settings are key=value overrides here "
                                        "(use optim.lr=1e-4 trainer.max_steps=3)"),
    (["--trainer.output_dir", "runs/x"], "unknown option --trainer.output_dir: settings are key=value overrides here "
                                         "(use trainer.output_dir=runs/x)"),
    (["--path", "m"], "unknown option --path: settings are key=value overrides here (use model.path=m or "
                      "data.path=m)"),
    (["--lr", "-1e-3"], "unknown option --lr: settings are key=value overrides here (use optim.lr=-1e-3)"),
    (["--rl-lr", "1e-3"], "unknown option --rl-lr: settings are key=value overrides here (use optim.lr=1e-3)"),
    (["--out", "runs/x"], "unknown option --out: settings are key=value overrides here (use "
                          "trainer.output_dir=runs/x)"),
    (["--dryrun"], "unrecognized arguments: --dryrun (did you mean '--dry-run'?)"),  # an option of its own: as before
    (["--verbose"], "unrecognized arguments: --verbose"),
])
def test_an_unknown_flag_that_names_a_config_key_says_which_override_to_write(flags, message, capsys):
    """Before: `unrecognized arguments: --max-steps 5` with no hint that settings are key=value overrides."""
    with pytest.raises(SystemExit) as stop:
        main(["train", SFT, *flags])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: dare train: {message}; see 'dare train --help'"]


# ---- 5. trainer.resume: a run directory, checkpoint names --------------------------------------------------------
CONSTANT = ["optim.scheduler=constant", "optim.min_lr_ratio=0"]  # the run length may change on resume


@pytest.fixture
def run_dir(tmp_path, capsys):
    """A finished two-step run with a checkpoint after each step."""
    out = tmp_path / "first"
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, *CONSTANT, "trainer.max_steps=2",
                 "trainer.save_every=1", "trainer.keep_last=0"]) == 0
    capsys.readouterr()
    assert [p.name for p in sorted((out / "checkpoints").iterdir())] == ["step_00000001", "step_00000002"]
    return out


@pytest.mark.parametrize("where", ["", "checkpoints"])
def test_resume_from_a_run_directory_takes_its_latest_checkpoint(where, run_dir, tmp_path, capsys):
    """Before: `trainer.resume=RUN is not a complete DARE checkpoint`."""
    out = tmp_path / "second"
    args = ["train", SFT, f"trainer.output_dir={out}", *SMALL, *CONSTANT, "trainer.max_steps=3",
            f"trainer.resume={run_dir / where}"]
    assert main([*args, "--dry-run"]) == 0
    capsys.readouterr()
    assert main(args) == 0
    assert f"resumed from {run_dir / 'checkpoints' / 'step_00000002'} at step 2\n" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [3]


@pytest.mark.parametrize("resume, problem", [
    ("{run}/checkpoints/step_2", "does not exist (did you mean {run}/checkpoints/step_00000002?); the checkpoints in "
                                 "{run}/checkpoints: step_00000001, step_00000002"),
    ("{run}/checkpoints/step_00000007", "does not exist; the checkpoints in {run}/checkpoints: step_00000001, "
                                        "step_00000002"),
    ("{run}/final", "holds no checkpoint, only exported weights (to train from them: model.path={run}/final)"),
    ("latest", "is not a checkpoint directory (did you mean auto?)"),
    ("nevr", "is not a checkpoint directory (did you mean never?)"),
])
def test_a_resume_path_that_is_no_checkpoint_names_the_checkpoints_there(resume, problem, run_dir, tmp_path, capsys):
    """Before: `trainer.resume=.../step_2 does not exist; use ... (OUTPUT_DIR/checkpoints/step_N)`, while the
    checkpoints are named step_00000002."""
    resume, problem = resume.format(run=run_dir), problem.format(run=run_dir)
    line = one_line_error(capsys, "train", SFT, f"trainer.output_dir={tmp_path / 'second'}", *SMALL,
                          f"trainer.resume={resume}", "--dry-run")
    assert line == (f"error: trainer.resume={resume} {problem}; use auto, never, a run directory (its latest "
                    "checkpoint) or a checkpoint directory (OUTPUT_DIR/checkpoints/step_00000012)")


def test_a_run_directory_without_a_complete_checkpoint_is_refused(run_dir, tmp_path, capsys):
    def error(resume) -> str:
        return one_line_error(capsys, "train", SFT, f"trainer.output_dir={tmp_path / 'second'}", *SMALL, *CONSTANT,
                              f"trainer.resume={resume}", "--dry-run")

    cut_short = run_dir / "checkpoints" / "step_00000002"
    (cut_short / "trainer_state.pt").unlink()  # as a write cut short leaves it
    assert error(cut_short).startswith(f"error: trainer.resume={cut_short} is not a complete checkpoint; the "
                                       f"checkpoints in {run_dir / 'checkpoints'}: step_00000001; use auto, ")
    assert main(["train", SFT, f"trainer.output_dir={tmp_path / 'second'}", *SMALL, *CONSTANT,
                 f"trainer.resume={run_dir}", "--dry-run"]) == 0  # the latest complete one: step_00000001
    assert capsys.readouterr().err.endswith(f"would resume from {run_dir / 'checkpoints' / 'step_00000001'} in "
                                            f"{tmp_path / 'second'} (nothing was loaded or written)\n")
    (run_dir / "checkpoints" / "step_00000001" / "trainer_state.pt").unlink()
    assert error(run_dir).startswith(f"error: trainer.resume={run_dir} holds no complete checkpoint; use auto, ")
    assert error(cut_short).startswith(f"error: trainer.resume={cut_short} is not a complete checkpoint (no "
                                       "trainer_state.pt: its write was cut short); use auto, ")


def test_a_length_key_equal_on_both_sides_is_not_named_as_a_difference():
    """Before: a constant-schedule checkpoint resumed with a cosine schedule listed `trainer.epochs (1.0 -> 1.0)`
    among the differences (a key relevant on one side only counted as differing whatever its values)."""
    from dare.trainer.resume import differing_keys

    saved = {"optim": {"scheduler": "constant"}, "trainer": {"epochs": 1.0, "max_steps": 2}}
    new = {"optim": {"scheduler": "cosine"}, "trainer": {"epochs": 1.0, "max_steps": 1}}
    assert differing_keys(saved, new) == ["optim.scheduler", "trainer.max_steps"]
    assert differing_keys(saved, {**saved, "optim": {"scheduler": "constant"}}) == []


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_a_seed_outside_torchs_range_is_a_config_error(seed):
    """A seed of 2^64 or more failed deep inside torch.manual_seed with a traceback; the range is the demo's."""
    with pytest.raises(ConfigError, match=r"trainer.seed must be in \[0, 4294967295\]"):
        load_train_config(None, [f"trainer.seed={seed}"])


@pytest.mark.parametrize("name,hint", [("grpo", "d1"), ("DTreeRPO", "dtreerpo"), ("D1", "d1")])
def test_an_unknown_algorithm_suggests_the_one_meant(name, hint):
    """``grpo`` suggested the preference algorithm ``vrpo`` (closest spelling); ``DTreeRPO`` suggested nothing."""
    with pytest.raises(ConfigError, match=rf"unknown algorithm '{name}' \(did you mean '{hint}'\?\)"):
        load_train_config(ROOT / "configs/llada/d1_tiny.yaml", [f"algorithm.name={name}"])
