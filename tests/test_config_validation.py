"""Settings a user can get wrong: numbers out of range, YAML quirks, what --dry-run checks, ignored settings, the
end-of-run reward."""

import json
import logging
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.errors import ConfigError
from dare.trainer.config import load_train_config

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")


@pytest.mark.parametrize("override, message", [
    ("optim.grad_clip=0", "optim.grad_clip must be positive (null disables clipping); got 0.0"),
    ("optim.grad_clip=-1", "optim.grad_clip must be positive (null disables clipping); got -1.0"),
    ("data.num_examples=0", "data.num_examples must be a positive integer or null"),
    ("data.num_examples=-3", "data.num_examples must be a positive integer or null"),
    ("optim.weight_decay=-0.1", "optim.weight_decay must be >= 0; got -0.1"),
    ("optim.betas=[0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("optim.betas=[0.9,1.0]", "optim.betas must be two numbers in [0, 1)"),
    ("optim.betas=[0.9,0.99,0.9]", "optim.betas must be two numbers in [0, 1)"),
    ("optim.min_lr_ratio=5", "optim.min_lr_ratio must be in [0, 1]; got 5.0"),
    ("optim.min_lr_ratio=-0.5", "optim.min_lr_ratio must be in [0, 1]"),
    ("optim.warmup_ratio=2", "optim.warmup_ratio must be in [0, 1]"),
    ("optim.warmup_steps=-1", "optim.warmup_steps must be >= 0"),
    ("optim.eps=0", "optim.eps must be positive"),
    ("lora.alpha=0", "lora.alpha must be positive"),
    ("lora.dropout=1", "lora.dropout must be in [0, 1)"),
    ("trainer.keep_last=-1", "trainer.keep_last must be >= 0"),
    ("data.pack_length=0", "data.pack_length must be a positive integer or null"),
    ("data.pad_response_to=-2", "data.pad_response_to must be a positive integer or null"),
    ("rollout.chunk_size=-4", "rollout.chunk_size must be a positive integer or null"),
    ("rollout.samples_per_step=-1", "rollout.samples_per_step must be >= 0"),
    ("rollout.dynamic_extra_rounds=-1", "rollout.dynamic_extra_rounds must be >= 0"),
    ("trainer.output_dir=", "trainer.output_dir must not be empty"),
    ("model.path=", "model.path must not be empty"),
    ("data.path= ", "data.path must not be empty"),
])
def test_numbers_out_of_range_are_one_line_errors(override, message):
    with pytest.raises(ConfigError) as err:
        load_train_config(SFT, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("key, inside, outside", [
    ("optim.grad_clip", "null", "0"), ("optim.min_lr_ratio", "1", "1.01"), ("optim.betas", "[0,0.5]", "[0.5,1]"),
    ("data.num_examples", "1", "0"), ("trainer.keep_last", "0", "-1"), ("optim.weight_decay", "0", "-1e-9"),
])
def test_range_limits_are_exact(key, inside, outside):
    load_train_config(SFT, [f"{key}={inside}"])
    with pytest.raises(ConfigError, match=key):
        load_train_config(SFT, [f"{key}={outside}"])


def test_a_negative_limit_never_drops_records_of_a_file(tmp_path):
    from dare.data.sft import read_records

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": str(i), "response": str(i)}) + "\n" for i in range(4)))
    assert len(read_records(str(data), 3)) == 3
    with pytest.raises(ConfigError, match="data.num_examples must be a positive integer or null; got -1"):
        read_records(str(data), -1)


def test_yaml_exponents_without_a_dot_are_numbers(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  lr: 3e-3\n  eps: 1E-6\n  betas: [0.9, 9.99e-1]\nrollout:\n  sampler:\n"
                      "    temperature: 1e0\n")
    cfg = load_train_config(recipe, [])
    assert cfg.optim.lr == 3e-3 and cfg.optim.eps == 1e-6 and cfg.optim.betas == [0.9, 0.999]
    assert cfg.rollout.sampler.temperature == 1.0
    for value, shown in (("abc", "'abc'"), ("true", "True"), ("nan", "'nan'")):
        recipe.write_text(f"optim:\n  lr: {value}\n")
        with pytest.raises(ConfigError) as err:
            load_train_config(recipe, [])
        assert str(err.value) == f"config key 'optim.lr': expected a number, got {shown}"


def test_a_directory_or_broken_yaml_says_what_and_where(tmp_path, capsys):
    assert one_line_error(capsys, "train", str(tmp_path)) == \
        f"error: config file {tmp_path} is a directory, not a YAML file"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  lr: 1\n trainer: 2\n")
    line = one_line_error(capsys, "train", str(recipe))
    assert line.startswith(f"error: {recipe}: invalid YAML at line 3, column 2 (")


def test_an_rl_synthetic_task_typo_lists_every_task():
    from dare.trainer.config import DataConfig
    from dare.trainer.prompts import prompt_records

    with pytest.raises(ConfigError) as err:
        prompt_records(DataConfig(path="synthetic:revers"))
    assert str(err.value) == ("unknown synthetic task 'revers' (did you mean 'reverse'?); choose from: add, copy, "
                              "countdown, gsm_symbolic, reverse, sudoku, sudoku9")


def test_rl_prompts_from_a_benchmark_without_a_file_warn_that_they_are_its_evaluation_problems(tmp_path, caplog,
                                                                                                 monkeypatch):
    from dare.eval import get_benchmark
    from dare.eval.benchmark import Benchmark
    from dare.trainer.config import DataConfig
    from dare.trainer.prompts import prompt_records

    rows = [{"question": "What is 1+1?", "answer": "#### 2"}, {"question": "What is 2+2?", "answer": "#### 4"}]
    train = tmp_path / "gsm8k_train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gsm8k = get_benchmark("gsm8k")
    real_load = Benchmark.load
    monkeypatch.setattr(Benchmark, "load", lambda self, source=None, **kw: real_load(self, source or str(train), **kw))
    with caplog.at_level(logging.WARNING, logger="dare"):
        assert len(prompt_records(DataConfig(path=f"benchmark:gsm8k:{train}"))) == 2
        assert "trains on the problems" not in caplog.text
        assert len(prompt_records(DataConfig(path="benchmark:gsm8k"))) == 2  # the hub's test split, offline: the file
    assert (f"data.path=benchmark:gsm8k trains on the problems dare eval scores gsm8k on (split "
            f"'{gsm8k.hf.split}' of {gsm8k.hf.path}); for a training set give its file: benchmark:gsm8k:PATH"
            in caplog.text)


@pytest.mark.parametrize("override, message", [
    ("rollout.sampler.sampler=fastdlm", "error: rollout.sampler: unknown sampler 'fastdlm' (did you mean 'fastdllm'?)"),
    ("rollout.reward=exact_mach", "error: unknown reward 'exact_mach' (did you mean 'exact_match'?)"),
    ("rollout.sampler.gen_length=-8", "error: rollout.sampler: gen_length must be >= 1; got -8"),
    ("rollout.sampler.temperature=-1", "error: RL rollouts need rollout.sampler.temperature > 0"),
    ("rollout.reward=null", "error: RL needs a reward: set rollout.reward"),
    ("model.path=tiny:lada", "error: unknown model family 'lada' (did you mean 'llada'?)"),
    ("model.path=./no/such/checkpoint", "error: model path ./no/such/checkpoint: no such checkpoint directory"),
    ("data.path=synthetic:revers", "error: unknown synthetic task 'revers' (did you mean 'reverse'?)"),
    ("data.path=missing.jsonl", "error: data file missing.jsonl does not exist"),
    ("data.path=benchmark:gsm8q", "error: unknown benchmark 'gsm8q' (did you mean 'gsm8k'?)"),
    ("trainer.resume=sometimes", ("error: trainer.resume=sometimes is not a checkpoint directory; use auto, never, "
                                  "a run directory (its latest checkpoint) or a checkpoint directory")),
    ("rollout.group_size=3", "error: trainer.batch_size=16 (rollouts per step) must be a multiple of "
                             "rollout.group_size=3"),
    ("rollout.reward={exact_match:2.0}", "error: reward 'exact_match:2.0': the weight must be a number"),
    ("rollout.reward=[exact_match]", "error: reward must be a name or a mapping {name: weight}"),
])
def test_dry_run_finds_what_the_run_would_reject(override, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert one_line_error(capsys, "train", D1, "--dry-run", override).startswith(message)
    out = tmp_path / "run"  # the run itself fails alike, before it creates its output directory
    assert one_line_error(capsys, "train", D1, override, f"trainer.output_dir={out}",
                          "trainer.progress=false").startswith(message)
    assert not out.exists()


def test_dry_run_refuses_an_output_directory_trained_with_other_settings(tmp_path, capsys):
    out = tmp_path / "run"
    common = [f"trainer.output_dir={out}", "trainer.max_steps=1", "trainer.progress=false"]
    assert main(["train", SFT, *common]) == 0
    capsys.readouterr()
    assert main(["train", SFT, "--dry-run", *common]) == 0  # the same settings would resume
    capsys.readouterr()
    line = one_line_error(capsys, "train", SFT, "--dry-run", *common, "optim.lr=1e-3")
    assert line.startswith(f"error: trainer.output_dir={out} was trained with other settings: optim.lr (0.003 -> ")
    assert main(["train", SFT, "--dry-run", *common, "optim.lr=1e-3", "trainer.resume=never"]) == 0


def test_dry_run_checks_sft_data_and_passes_good_recipes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", SFT, "--dry-run", "data.path=synthetic:countdown")
    assert line.startswith("error: unknown synthetic task 'countdown'; choose from: add, copy, reverse")
    assert one_line_error(capsys, "train", SFT, "--dry-run", f"data.path={tmp_path}") == \
        f"error: data file {tmp_path} is a directory; expected a .jsonl, .json or .parquet file"
    for recipe in (SFT, D1, str(ROOT / "configs/llada/vrpo_tiny.yaml")):
        assert main(["train", recipe, "--dry-run"]) == 0, capsys.readouterr().err


def warnings_of(caplog, recipe, *overrides) -> list[str]:
    from dare.trainer.preflight import check_run

    config = load_train_config(recipe, list(overrides))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        check_run(config)
    return [r.getMessage() for r in caplog.records if r.name == "dare.trainer"]


def test_settings_that_do_not_apply_get_one_warning_each(caplog):
    assert warnings_of(caplog, SFT, "rollout.group_size=3", "rollout.reward=gsm8k", "rollout.sampler.steps=4") == [
        ("warning: ignoring rollout.group_size, rollout.sampler.steps, rollout.reward: algorithm 'sft' makes no "
         "rollouts")]
    assert warnings_of(caplog, SFT, "lora.r=4") == [
        "warning: ignoring lora.r: lora.enabled is false (set lora.enabled=true to train an adapter)"]
    assert warnings_of(caplog, D1, "data.packing=true") == [
        "warning: ignoring data.packing: not used by algorithm 'd1' (it trains on RL prompts)"]
    assert warnings_of(caplog, SFT, "data.pack_length=128") == [
        "warning: ignoring data.pack_length: data.packing is false"]


def test_defaults_and_settings_that_apply_warn_nothing(caplog):
    assert warnings_of(caplog, SFT, "rollout.group_size=8", "lora.r=16", "data.packing=true",
                       "data.eos_padding=false") == []
    assert warnings_of(caplog, D1, "lora.enabled=true", "lora.r=4") == []
    assert warnings_of(caplog, str(ROOT / "configs/llada/sft_lora_tiny.yaml")) == []


PACKED_EOS_NOTE = ("note: data.packing=true: packed rows get no EOS padding (data.eos_padding=true pads only padded "
                   "rows with trained EOS), so the loss differs from a padded run's; set data.eos_padding=false to "
                   "compare packed and padded runs")


def test_packing_under_eos_padding_is_noted_by_the_dry_run_and_the_run(tmp_path, caplog):
    """Packed rows carry no EOS padding, so a packed run under the default data.eos_padding=true trains another
    objective than the padded run (fewer answer tokens): its start says so, once, in the dry run and the run. With
    data.eos_padding=false the two are the same run (test_sft.py: same loss and gradients), and nothing is said."""
    from dare.trainer import Trainer

    assert warnings_of(caplog, SFT, "data.packing=true") == [PACKED_EOS_NOTE]
    assert warnings_of(caplog, SFT, "data.packing=true", "data.eos_padding=false") == []
    assert warnings_of(caplog, D1, "data.packing=true") == [  # RL prompts: packing itself is ignored
        "warning: ignoring data.packing: not used by algorithm 'd1' (it trains on RL prompts)"]
    run = [SFT, f"trainer.output_dir={tmp_path / 'run'}", "data.packing=true", "data.num_examples=16",
           "trainer.progress=false"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        assert main(["train", *run, "--dry-run"]) == 0
        Trainer(load_train_config(run[0], run[1:])).release_output_dir()
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note: ")]
    assert notes == [PACKED_EOS_NOTE, PACKED_EOS_NOTE]  # one from the dry run, one from the run's start


def test_the_summary_reports_the_first_and_last_reward_of_an_rl_run_with_inner_steps(tmp_path, capsys):
    out = tmp_path / "d1"
    assert main(["train", D1, f"trainer.output_dir={out}", "trainer.progress=false", "trainer.max_steps=4"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "rollout/reward" not in records[-1]  # mu = 2: the last step is an inner update
    first, last = records[0]["rollout/reward"], records[-2]["rollout/reward"]
    done = [line for line in capsys.readouterr().out.splitlines() if line.startswith("done: ")]
    assert len(done) == 1, done
    assert (f"reward {first:.4f} -> {last:.4f} (first -> last of 2 rollouts), "
            f"grad_norm {records[-1]['grad_norm']:.4g};") in done[0]
    assert " loss " not in done[0]  # the policy-gradient loss says little (0 at the old policy)


def test_the_summary_prefers_the_reward_of_the_last_record():
    from dare.commands.train import run_summary

    config = load_train_config(D1, [])
    line = run_summary(config, {"step": 4, "loss": 0.5, "rollout/reward": 0.25}, {"step": 3, "reward": 0.75})
    assert "reward 0.2500;" in line and "0.7500" not in line
    assert "reward" not in run_summary(load_train_config(SFT, []), {"step": 2, "loss": 0.5}, None)
