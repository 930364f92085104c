"""A plug-in that breaks its contract at run time (an algorithm's advantages of the wrong shape, a hook that raises)
gets one line naming the plug-in's own line, never a silently wrong run or a long traceback; DARE's own errors keep
their traceback."""

import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare import plugins
from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
SMALL_RL = ["trainer.progress=false", "trainer.batch_size=8", "trainer.micro_batch_size=8", "algorithm.inner_steps=1",
            "trainer.max_steps=1", "algorithm.kl_coef=0"]

ALGORITHM = '''
from dare.algorithms import ALGORITHMS, register_algorithm


@register_algorithm
class Variant(ALGORITHMS["d1"]):
    name = "{name}"

    def assign_advantages(self, batch, context):
        r = batch["rewards"]
{body}
'''


@pytest.fixture(autouse=True)
def isolated_plugins(monkeypatch):
    """The plug-ins' registrations and modules leave with the test."""
    from dare.algorithms import ALGORITHMS

    saved, modules, path = dict(ALGORITHMS), set(sys.modules), list(sys.path)
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", True)  # no installed plug-in of this machine
    yield
    ALGORITHMS.clear()
    ALGORITHMS.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith(plugins.FILE_MODULE_PREFIX):
            del sys.modules[name]
    sys.path[:] = path


def train_variant(capsys, tmp_path, name: str, body: str) -> tuple[str, Path]:
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(ALGORITHM.format(name=name, body=textwrap.indent(textwrap.dedent(body), " " * 8)))
    line = one_line_error(capsys, "train", D1, f"imports=[{plugin}]", f"algorithm.name={name}", *SMALL_RL,
                          f"trainer.output_dir={tmp_path / 'run'}")
    return line, plugin


@pytest.mark.parametrize("name, body, said", [
    ("column", 'batch["advantages"] = (r - r.mean())[:, None]\nreturn batch',
     "set advantages of shape [8, 1] (torch.float32); its loss reads a float tensor [R], R = 8 rollouts "
     "(advantage_dims = 1)"),
    ("integer", 'batch["advantages"] = (r > 0).long()\nreturn batch',
     "set advantages of shape [8] (torch.int64); its loss reads a float tensor [R], R = 8 rollouts "
     "(advantage_dims = 1)"),
    ("nan", 'batch["advantages"] = r * float("nan")\nreturn batch', "set 8 non-finite advantage(s) of 8"),
    ("unset", "return None", "set no batch['advantages'] (edit the batch it is given, or return it)"),
])
def test_advantages_the_loss_cannot_read_are_refused(capsys, tmp_path, name, body, said):
    """Before: [R, 1] broadcast against per-token log-probs and trained on a gradient of ~1e-7 without a word; NaN
    advantages were blamed on the learning rate; unset ones were a 50-line KeyError."""
    line, _ = train_variant(capsys, tmp_path, name, body)
    assert line == f"error: algorithm '{name}': assign_advantages {said}"


def test_a_hook_that_returns_a_new_batch_trains_on_it(capsys, tmp_path):
    """The hook is typed to return the batch: one that builds a new one is used, not ignored."""
    plugin = tmp_path / "fresh.py"
    body = 'new = batch.clone()\nnew["advantages"] = r - r.mean()\nreturn new'
    plugin.write_text(ALGORITHM.format(name="fresh", body=textwrap.indent(body, " " * 8)))
    assert main(["train", D1, f"imports=[{plugin}]", "algorithm.name=fresh", *SMALL_RL,
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 0


def test_a_hook_that_raises_is_one_line_at_its_own_line(capsys, tmp_path, monkeypatch):
    line, plugin = train_variant(capsys, tmp_path, "raising", 'return batch["no_such_key"]')
    assert line.startswith(f"error: plug-in: {plugin} line 11 raised KeyError: 'key \"no_such_key\" not found"), line
    assert line.endswith("(DARE_TRACEBACK=1 shows the traceback)")


def test_an_error_outside_every_plugin_keeps_its_traceback():
    """DARE's own bug is no plug-in's: runtime_failure leaves it to the traceback."""
    try:
        raise KeyError("inside DARE")
    except KeyError as err:
        assert plugins.runtime_failure(err) is None


def test_a_config_class_without_dataclass_is_refused_when_it_registers(capsys, tmp_path):
    """Before: its new field was no config key, and algorithm.scale=3 suggested 'rollout.sampler'."""
    plugin = tmp_path / "nodataclass.py"
    plugin.write_text(textwrap.dedent('''\
        from dare.algorithms import ALGORITHMS, register_algorithm


        class ScaledConfig(ALGORITHMS["d1"].config_class):
            scale: float = 1.0


        @register_algorithm
        class Scaled(ALGORITHMS["d1"]):
            name = "scaled"
            config_class = ScaledConfig
        '''))
    line = one_line_error(capsys, "train", D1, f"imports=[{plugin}]", "algorithm.name=scaled", "--dry-run",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line == (f"error: imports: {plugin} line 8 raised ValueError: algorithm 'scaled': config_class ScaledConfig "
                    "needs @dataclass (without it, the fields it adds are no algorithm.* keys) (python "
                    f"{plugin} shows the traceback)")


def test_an_unknown_algorithm_says_how_ones_own_comes_in(capsys, tmp_path):
    line = one_line_error(capsys, "train", D1, "algorithm.name=rank_grpo", "--dry-run",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line.startswith("error: unknown algorithm 'rank_grpo'")
    assert line.endswith("; an algorithm of your own loads with imports=[my_algo.py]")


def test_the_demo_runs_an_algorithm_of_ones_own(capsys, tmp_path):
    """Before: dare demo had no --import, so a plug-in algorithm was an 'unknown demo algorithm'."""
    import json

    from dare.config import load_yaml

    plugin = tmp_path / "demo_variant.py"
    body = 'Path(__file__).with_suffix(".called").write_text("yes")\nreturn super().assign_advantages(batch, context)'
    plugin.write_text("from pathlib import Path\n" + ALGORITHM.format(name="my_d1_demo",
                                                                      body=textwrap.indent(body, " " * 8)))
    unknown = one_line_error(capsys, "demo", "--quick", "--algorithm", "my_d1_demo", "--out", str(tmp_path / "no"))
    assert unknown.endswith("; an algorithm of your own loads with --import FILE.py")
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--import", str(plugin), "--algorithm", "my_d1_demo", "--rl-steps", "1",
                 "--out", str(out)]) == 0
    assert plugin.with_suffix(".called").read_text() == "yes"
    assert json.loads((out / "report.json").read_text())["settings"]["algorithm"]["name"] == "my_d1_demo"
    assert load_yaml(out / "rl.yaml")["imports"] == [str(plugin)]  # dare train rl.yaml reproduces the phase


def test_a_plugin_extending_the_recipe_algorithms_config_keeps_the_recipes_settings(tmp_path):
    """Before: only a variant keeping d1's config class kept d1_tiny's settings; one adding a field (the documented
    way) silently trained with d1's defaults (inner_steps 12 instead of the recipe's)."""
    import dataclasses

    from dare.trainer import load_train_config

    plugin = tmp_path / "extended.py"
    plugin.write_text(textwrap.dedent('''\
        from dataclasses import dataclass

        from dare.algorithms import ALGORITHMS, register_algorithm


        @dataclass
        class ExtendedConfig(ALGORITHMS["d1"].config_class):
            name: str = "extended"
            scale: float = 1.0
            """A new setting."""


        @register_algorithm
        class Extended(ALGORITHMS["d1"]):
            name = "extended"
            config_class = ExtendedConfig
        '''))
    recipe = load_train_config(D1).algorithm
    extended = load_train_config(D1, [f"imports=[{plugin}]", "algorithm.name=extended"]).algorithm
    assert extended.scale == 1.0 and extended.name == "extended"
    assert {k: v for k, v in dataclasses.asdict(extended).items() if k not in ("name", "scale")} == {
        k: v for k, v in dataclasses.asdict(recipe).items() if k != "name"}
    igpo = load_train_config(D1, ["algorithm.name=igpo"]).algorithm  # DARE's own subclass: its own defaults
    assert igpo.inner_steps != recipe.inner_steps


HOOKS = '''
from dare.algorithms import ALGORITHMS, register_algorithm


@register_algorithm
class Hooked(ALGORITHMS["d1"]):
    name = "{name}"
{body}
'''


@pytest.mark.parametrize("name, body, said", [
    ("corrupt_in_place", "    def corrupt(self, batch, step):\n        super().corrupt(batch, step)\n", None),
    ("corrupt_list", "    def corrupt(self, batch, step):\n        return [batch]\n",
     "algorithm 'corrupt_list': corrupt returned a list; return the batch (a TensorDict), or None after editing it in "
     "place"),
    ("refine_batch_only", "    def refine_rollouts(self, batch, context):\n        return batch\n", None),
    ("refine_none", "    def refine_rollouts(self, batch, context):\n        pass\n",
     "algorithm 'refine_none': refine_rollouts returned None; return (batch, metrics dict)"),
])
def test_corrupt_and_refine_rollouts_returns(capsys, tmp_path, name, body, said):
    """Before: corrupt returning None (an in-place edit) and refine_rollouts returning the batch alone were
    tracebacks at DARE's lines; a two-row batch would even have unpacked into two rows."""
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(HOOKS.format(name=name, body=body))
    args = ["train", D1, f"imports=[{plugin}]", f"algorithm.name={name}", *SMALL_RL,
            f"trainer.output_dir={tmp_path / 'run'}"]
    if said is None:
        assert main(args) == 0
    else:
        assert one_line_error(capsys, *args) == f"error: {said}"
