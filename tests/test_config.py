"""Config system: YAML + key=value overrides, closest-key errors, types, the resolved config on disk."""

import subprocess
import sys

import pytest
import yaml

from dare.config import describe, parse_overrides, plain
from dare.errors import ConfigError
from dare.trainer.config import TrainConfig, load_train_config


def test_yaml_plus_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  lr: 1.0e-4\ntrainer:\n  batch_size: 4\nalgorithm:\n  normalize: d1\n")
    cfg = load_train_config(recipe, ["optim.lr=2e-5", "lora.target_modules=null", "data.packing=true",
                                     "optim.betas=[0.9,0.95]"])
    assert cfg.optim.lr == 2e-5 and cfg.trainer.batch_size == 4 and cfg.data.packing is True
    assert cfg.optim.betas == [0.9, 0.95] and cfg.lora.target_modules is None
    assert cfg.algorithm.name == "sft" and cfg.algorithm.normalize == "d1" and cfg.algorithm.t_min == 1e-3
    given = parse_overrides(["a.b=3", "a.c=x y", "a.d=0123"])
    assert plain(given) == {"a": {"b": 3, "c": "x y", "d": "0123"}}  # 0123: YAML 1.1's octal 83, as written here
    assert given["a"]["b"] == "3" and given["a"]["b"].parsed == 3  # the text, and its reading for a number field


def test_section_override_merges_into_earlier_dotted_overrides():
    after = parse_overrides(["trainer.output_dir=/tmp/x", "trainer.max_steps=3", "trainer={save_every: 1}"])
    before = parse_overrides(["trainer={save_every: 1}", "trainer.output_dir=/tmp/x", "trainer.max_steps=3"])
    assert plain(after) == plain(before) == {"trainer": {"output_dir": "/tmp/x", "max_steps": 3, "save_every": 1}}
    assert plain(parse_overrides(["optim.lr=1e-4", "optim={weight_decay: 0.1}"])) == {
        "optim": {"lr": 1e-4, "weight_decay": 0.1}}
    assert plain(parse_overrides(["a.b.c=1", "a={b: {d: 2}}"])) == {"a": {"b": {"c": 1, "d": 2}}}
    # a leaf given both ways takes its last value, as `k=1 k=2` does
    assert plain(parse_overrides(["optim.lr=1", "optim={lr: 2}"])) == {"optim": {"lr": 2}}
    assert plain(parse_overrides(["optim={lr: 2}", "optim.lr=1"])) == {"optim": {"lr": 1}}
    cfg = load_train_config(None, ["optim.lr=1e-4", "optim={weight_decay: 0.1}"])
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 0.1


@pytest.mark.parametrize("override, message", [
    ("optim.lrr=1", "unknown config key 'optim.lrr' (did you mean 'optim.lr'?)"),
    ("trainer.batchsize=2", "did you mean 'trainer.batch_size'"),
    ("optimizer.lr=1", "unknown config key 'optimizer' (did you mean 'optim'?)"),
    ("trainer.batch_size=many", "config key 'trainer.batch_size': expected an integer, got 'many'"),
    ("data.packing=3", "expected true/false"),
    ("optim.scheduler=cosin", "did you mean 'cosine'"),
    ("algorithm.name=sfd", "unknown algorithm 'sfd' (did you mean 'sft'?)"),
    ("trainer.batch_size=0", "trainer.batch_size must be positive"),
    ("lr", "override 'lr' must look like key=value"),
])
def test_config_errors(override, message):
    with pytest.raises(ConfigError) as err:
        load_train_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("override, hint", [
    ("algorithm.group_size=8", "rollout.group_size"),  # a key of another section: named where it lives
    ("algorithm.max_steps=8", "trainer.max_steps"),
    ("algorithm.blok_size=8", "algorithm.block_size"),  # a typo of the algorithm's own setting: its closest
])
def test_an_algorithm_key_of_another_section_names_that_section(override, hint):
    with pytest.raises(ConfigError) as err:
        load_train_config("llada/d1_tiny", [override])
    assert str(err.value) == f"unknown config key '{override.split('=')[0]}' (did you mean '{hint}'?)"


def test_cli_error_is_one_line_and_dry_run_resolves(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "dare.cli", "train", "configs/llada/sft_tiny.yaml", "optim.lrr=1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: unknown config key 'optim.lrr' (did you mean 'optim.lr'?)"
    ok = subprocess.run([sys.executable, "-m", "dare.cli", "train", "configs/llada/sft_tiny.yaml", "--dry-run",
                         "optim.lr=0.5", f"trainer.output_dir={tmp_path / 'run'}"],  # not a run of the checkout's
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert resolved["optim"]["lr"] == 0.5 and resolved["algorithm"]["normalize"] == "llada"


def test_section_shorthands(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algorithm: sft\nlora:\n")
    cfg = load_train_config(recipe, [])
    assert cfg.algorithm.name == "sft" and cfg.lora.enabled is False
    recipe.write_text("algorithm: [1, 2]\n")
    with pytest.raises(ConfigError, match="algorithm section must be a mapping"):
        load_train_config(recipe, [])


def test_every_field_is_documented():
    from dare.algorithms import ALGORITHMS

    lines = describe(TrainConfig)
    assert len(lines) > 40
    for cls in ALGORITHMS.values():  # as --show-config lists them: inherited fields carry their base class's docs
        lines += describe(cls.config_class, "algorithm.")
    undocumented = [line for line in lines if line.endswith("# ")]
    assert not undocumented, undocumented


def test_shipped_recipes_validate():
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    recipes = sorted(p for p in configs.rglob("*.yaml") if "lm_eval" not in p.parts)  # lm_eval/: lm-eval task files
    assert len(recipes) >= 4
    for recipe in recipes:
        load_train_config(recipe, [])


def test_a_partial_sampler_section_keeps_the_rl_rollout_temperature():
    """``rollout.sampler`` defaults to temperature 1 (greedy rollouts give GRPO no signal); setting another sampler
    key, or writing an empty section, must not rebuild it from SamplerConfig's class defaults (temperature 0)."""
    overrides = ["algorithm.name=d1", "rollout.sampler.steps=8"]
    config = load_train_config(None, overrides)
    assert (config.rollout.sampler.temperature, config.rollout.sampler.steps) == (1.0, 8)
    assert load_train_config(None, ["algorithm.name=d1", "rollout.sampler.temperature=0.5"]).rollout.sampler.temperature == 0.5
    from dare.config import from_dict
    from dare.trainer.config import RolloutConfig

    assert from_dict(RolloutConfig, {"sampler": None}).sampler.temperature == 1.0
