"""Every tiny RL recipe (configs/*/*_tiny.yaml whose algorithm trains on rollouts) starts where the reward varies:
its first step has groups whose rewards differ, non-zero advantages and a non-zero gradient. Recipes added later
are discovered automatically."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def rl_recipes() -> list[Path]:
    from dare.algorithms import ALGORITHMS

    found = []
    for path in sorted(ROOT.glob("configs/*/*_tiny.yaml")):
        name = (yaml.safe_load(path.read_text()).get("algorithm") or {}).get("name", "sft")
        if name in ALGORITHMS and ALGORITHMS[name].needs.rollout:
            found.append(path)
    return found


def test_the_tiny_rl_recipes_are_found():
    names = {f"{p.parent.name}/{p.stem}" for p in rl_recipes()}
    assert {"llada/d1_tiny", "sdar/bgpo_tiny", "sdar/ebpo_tiny"} <= names


@pytest.mark.parametrize("recipe", rl_recipes(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_tiny_rl_recipe_has_a_learning_signal_from_its_first_step(recipe, tmp_path):
    from dare.trainer import Trainer, load_train_config

    config = load_train_config(recipe, [f"trainer.output_dir={tmp_path}", "trainer.max_steps=1",
                                        "trainer.progress=false", "trainer.export=false"])
    record = Trainer(config).train()
    assert record["rollout/reward_std"] > 0
    assert record["rollout/flat_groups"] == 0, record["rollout/flat_groups"]  # every group's rewards differ
    assert record["rollout/advantage_abs"] > 0
    assert record["grad_norm"] > 0
