"""User plug-ins (dare.plugins): the recipe key ``imports``, ``--import``, the ``dare.plugins`` entry-point group,
their one-line errors, the resume rule and the reward helper process."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare import plugins
from dare.cli import main
from dare.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
TINY_GEN = str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl")
SMALL_RL = ["trainer.progress=false", "trainer.batch_size=8", "trainer.micro_batch_size=8", "algorithm.inner_steps=1",
            "trainer.max_steps=1"]

LENGTH_REWARD = '''
from dare.rewards import Reward, RewardResult, register_reward


@register_reward("{name}")
class LengthBonus(Reward):
    """1 + the completion's length / 1000: above 1, which no built-in reward gives."""

    def score_one(self, completion, sample):
        return RewardResult(reward=1 + len(completion) / 1000, correct=False)
'''

COUNTING = '''
from pathlib import Path

runs = Path(__file__).with_suffix(".runs")
runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
'''


@pytest.fixture(autouse=True)
def isolated_plugins(monkeypatch, tmp_path_factory):
    """Each test starts with no plug-in imported and leaves the registries, sys.path and the plug-in modules of
    sys.modules as it found them (a plug-in's registrations must not leak into other tests)."""
    from dare.algorithms import ALGORITHMS
    from dare.eval.benchmark import BENCHMARKS
    from dare.rewards import REWARDS
    from dare.rollout.registry import SAMPLERS

    registries = [ALGORITHMS, BENCHMARKS, REWARDS, SAMPLERS]
    saved = [dict(r) for r in registries]
    modules, path = set(sys.modules), list(sys.path)
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", False)
    installed_only([], monkeypatch)  # no installed plug-in of this machine
    yield
    for registry, before in zip(registries, saved):
        registry.clear()
        registry.update(before)
    temporary = str(tmp_path_factory.getbasetemp())
    for name in set(sys.modules) - modules:  # DARE's own modules imported meanwhile stay
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(temporary):
            del sys.modules[name]
    sys.path[:] = path


def installed_only(points: list, monkeypatch, asked: list | None = None) -> None:
    """Make ``points`` the installed ``dare.plugins`` entry points (recording each query of that group in ``asked``);
    other groups (fsspec's, transformers', ...) stay those of the machine."""
    import importlib.metadata

    real = importlib.metadata.entry_points

    def entry_points(**selection):
        if selection.get("group") != "dare.plugins":
            return real(**selection)
        if asked is not None:
            asked.append(selection)
        return points

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def runs_of(plugin: Path) -> int:
    """How many times the COUNTING plug-in ``plugin`` was executed."""
    counter = plugin.with_suffix(".runs")
    return len(counter.read_text()) if counter.exists() else 0


# ---------------------------------------------------------------------------------------- dare train imports=[...]

def test_a_reward_of_a_plugin_file_trains_and_its_values_are_in_the_run(tmp_path, monkeypatch, capsys):
    write(tmp_path / "my_reward.py", LENGTH_REWARD.format(name="length_bonus_t"))
    monkeypatch.chdir(tmp_path)  # a relative file: relative to the current directory
    out = tmp_path / "run"
    assert main(["train", D1, "imports=[my_reward.py]", "rollout.reward=length_bonus_t", *SMALL_RL,
                 f"trainer.output_dir={out}"]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert rows and all(r["reward"] == pytest.approx(1 + len(r["completion"]) / 1000) for r in rows)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 1.0 < metrics[-1]["rollout/reward"] <= 1.0 + 8 * 4 / 1000  # 8 tokens of at most 4 bytes
    from dare.config import load_yaml

    assert load_yaml(out / "config.yaml")["imports"] == [str(tmp_path / "my_reward.py")]  # readable from anywhere
    assert "reward 1.0" in capsys.readouterr().out


def test_a_plugin_algorithm_is_selectable_by_name_and_unknown_without_its_import(tmp_path, capsys):
    plugin = write(tmp_path / "my_algorithm.py", '''
        from dare.algorithms import ALGORITHMS, register_algorithm


        @register_algorithm
        class MyD1(ALGORITHMS["d1"]):
            name = "my_d1_t"
        ''')
    out = f"trainer.output_dir={tmp_path / 'run'}"
    assert main(["train", D1, f"imports=[{plugin}]", "algorithm.name=my_d1_t", out, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "  name: my_d1_t\n" in printed and f"imports:\n- {plugin}\n" in printed
    assert main(["train", D1, f"imports=[{plugin}]", "algorithm.name=my_d1_t", "--show-config"]) == 0
    shown, notes = capsys.readouterr()
    assert "algorithm.name (str) = 'my_d1_t'" in shown
    # a subclass of the recipe's d1 keeps the recipe's d1 settings (no "dropping ..." note)
    from dare.config import load_yaml

    recipe_steps = load_yaml(D1)["algorithm"]["inner_steps"]
    assert recipe_steps != 12  # d1's default: the check below tells the recipe's value from it
    assert f"algorithm.inner_steps (int) = {recipe_steps}" in shown and "dropping" not in notes
    from dare.algorithms import ALGORITHMS

    del ALGORITHMS["my_d1_t"]
    line = one_line_error(capsys, "train", D1, "algorithm.name=my_d1_t", out, "--dry-run")
    assert line.startswith("error: unknown algorithm 'my_d1_t'")


def test_a_config_built_in_python_imports_its_plugins_when_checked(tmp_path):
    from dare.trainer.config import TrainConfig, load_train_config, revalidate

    plugin = write(tmp_path / "my_reward.py", LENGTH_REWARD.format(name="length_bonus_py"))
    config = load_train_config(D1)
    config.imports = [str(plugin)]
    revalidate(config)
    from dare.rewards import REWARDS

    assert "length_bonus_py" in REWARDS
    assert TrainConfig().imports == []


# ------------------------------------------------------------------------------------- module names, files, once

def test_a_module_name_and_a_file_are_each_imported_once(tmp_path, monkeypatch):
    module = write(tmp_path / "mods" / "counting_mod.py", COUNTING)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    plugins.load_plugins(["counting_mod"])
    plugins.load_plugins(["counting_mod"])
    assert runs_of(module) == 1
    file = write(tmp_path / "files" / "counting_file.py", COUNTING)
    monkeypatch.chdir(tmp_path / "files")
    plugins.load_plugins([str(file)])
    plugins.load_plugins(["counting_file.py"])  # the same file, relative: the same module
    assert runs_of(file) == 1
    name = plugins.file_module_name(file)
    assert name in sys.modules and plugins.imported() == ["counting_mod", str(file)]
    assert str(file.parent) == sys.path[-1]  # appended: siblings import, nothing installed is shadowed


def test_the_current_directory_is_searched_for_a_module_name_and_a_file_imports_its_siblings(tmp_path, monkeypatch):
    from dare.rewards import REWARDS

    write(tmp_path / "pkg_t" / "__init__.py", "")
    write(tmp_path / "pkg_t" / "rewards.py", LENGTH_REWARD.format(name="length_bonus_pkg"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    plugins.load_plugins(["pkg_t.rewards"])
    assert "length_bonus_pkg" in REWARDS
    write(tmp_path / "side" / "helper_t.py", "VALUE = 7\n")
    plugin = write(tmp_path / "side" / "uses_helper.py", "from helper_t import VALUE\n")
    plugins.load_plugins([str(plugin)])
    assert sys.modules[plugins.file_module_name(plugin)].VALUE == 7


def test_a_plugin_that_registers_nothing_gets_a_note_and_one_that_registers_does_not(tmp_path, monkeypatch, capsys):
    """A forgotten decorator shows at once, not only later as an unknown name; DARE's own registrations (a built-in
    module imported for the first time by the plug-in) do not count as the plug-in's."""
    forgot = write(tmp_path / "forgot_t.py", '''
        from dare.rewards import Reward, RewardResult


        class Forgotten(Reward):  # no @register_reward
            def score_one(self, completion, sample):
                return RewardResult(reward=1.0, correct=False)
        ''')
    plugins.load_plugins([str(forgot)])
    assert capsys.readouterr().err == (
        f"note: imports: {forgot} registered nothing (no register_reward, register_algorithm, register_sampler, "
        "register_benchmark or register_family call ran while it was imported)\n")
    plugins.load_plugins([str(forgot)])  # imported once: no second note
    registers = write(tmp_path / "registers_t.py", LENGTH_REWARD.format(name="length_bonus_note"))
    plugins.load_plugins([str(registers)])
    monkeypatch.setenv("RANK", "1")  # under torchrun only rank 0 says it
    quiet = write(tmp_path / "quiet_t.py", "VALUE = 1\n")
    plugins.load_plugins([str(quiet)])
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------------ errors

def test_a_missing_module_or_file_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    write(tmp_path / "my_rewards.py", "")
    monkeypatch.chdir(tmp_path)
    out = f"trainer.output_dir={tmp_path / 'run'}"
    assert one_line_error(capsys, "train", D1, "imports=[my_rewardz]", out, "--dry-run") == (
        "error: imports: no module named 'my_rewardz' (and no file my_rewardz)")
    assert one_line_error(capsys, "train", D1, "imports=[my_rewardz.py]", out, "--dry-run") == (
        f"error: imports: no file my_rewardz.py in {tmp_path} (did you mean my_rewards.py?)")
    assert one_line_error(capsys, "train", D1, f"imports=[{tmp_path / 'nothing.py'}]", out, "--dry-run") == (
        f"error: imports: no file {tmp_path / 'nothing.py'}")
    assert one_line_error(capsys, "train", D1, "imports=my_rewards.py", out, "--dry-run") == (
        "error: imports must be a list of modules or .py files; got the string 'my_rewards.py' (write "
        "imports=[my_rewards.py], or in a recipe imports: [my_rewards.py])")
    assert one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--import",
                          "my_rewardz") == "error: --import: no module named 'my_rewardz' (and no file my_rewardz)"


def test_a_plugin_that_raises_is_named_with_its_own_line(tmp_path, monkeypatch, capsys):
    write(tmp_path / "my_rewards.py", '''
        import os


        def helper():
            return x


        helper()
        ''')
    monkeypatch.chdir(tmp_path)
    out = f"trainer.output_dir={tmp_path / 'run'}"
    assert one_line_error(capsys, "train", D1, "imports=[my_rewards.py]", out, "--dry-run") == (
        "error: imports: my_rewards.py line 6 raised NameError: name 'x' is not defined (python my_rewards.py shows "
        "the traceback)")
    with pytest.raises(ConfigError) as caught:  # Python callers keep the whole traceback
        plugins.load_plugins(["my_rewards.py"])
    assert isinstance(caught.value.__cause__, NameError)
    write(tmp_path / "syntax.py", "def f(:\n    pass\n")
    assert one_line_error(capsys, "generate", "--model", "tiny:llada", "--prompt", "hi", "--import", "syntax.py") == (
        "error: --import: syntax.py line 1: SyntaxError: invalid syntax (python syntax.py shows the traceback)")
    write(tmp_path / "pkg_bad" / "__init__.py", "")
    write(tmp_path / "pkg_bad" / "helpers.py", "RATE = 1 / 0\n")
    write(tmp_path / "pkg_bad" / "rewards.py", "from pkg_bad.helpers import RATE\n")
    assert one_line_error(capsys, "train", D1, "imports=[pkg_bad.rewards]", out, "--dry-run") == (
        "error: imports: pkg_bad.rewards: pkg_bad/helpers.py line 1 raised ZeroDivisionError: division by zero "
        "(python -c 'import pkg_bad.rewards' shows the traceback)")


def test_a_name_registered_twice_is_a_one_line_error(tmp_path, capsys):
    plugin = write(tmp_path / "twice.py", '''
        from dare.rewards import Reward, register_reward


        @register_reward("gsm8k")
        class Mine(Reward):
            pass
        ''')
    assert one_line_error(capsys, "eval", "score", "--benchmark", "gsm8k", "--predictions", "x.jsonl", "--import",
                          plugin) == (f"error: --import: {plugin} line 5 raised ValueError: reward 'gsm8k' registered "
                                      f"twice (python {plugin} shows the traceback)")


@pytest.mark.parametrize("body, message", [
    ('from dare.algorithms import ALGORITHMS, register_algorithm\n\n\n@register_algorithm\n'
     'class MyD1(ALGORITHMS["d1"]):\n    pass\n',
     "algorithm class MyD1 needs its own name = '...' (it inherits 'd1')"),
    ('from dare.algorithms import ALGORITHMS, register_algorithm\n\n\n@register_algorithm\n'
     'class MyD1(ALGORITHMS["d1"]):\n    name = "d1"\n',
     "algorithm 'd1' registered twice (MyD1; the first is dare.algorithms.d1.D1): give it another name"),
    ('from dare.rollout import Sampler, register_sampler\n\n\n'
     'register_sampler(Sampler("llada", "mine", {}))\n',
     "sampler 'llada' registered twice: give the second one another name"),
    ('import dataclasses\n\nfrom dare.eval.benchmark import get_benchmark, register_benchmark\n'
     'register_benchmark(dataclasses.replace(get_benchmark("gsm8k"), name="mine"), aliases=("gsm",))\n',
     "benchmark 'mine' takes the alias 'gsm', which names the benchmark 'gsm8k' already: give it another name"),
    ('import dataclasses\n\nfrom dare.eval.benchmark import get_benchmark, register_benchmark\n'
     'register_benchmark(dataclasses.replace(get_benchmark("gsm8k"), name="MyBench"))\n',
     "benchmark 'MyBench': the name 'MyBench' is looked up as 'mybench'; register it under that one"),
])
def test_an_algorithm_or_sampler_name_taken_is_a_one_line_error_and_the_built_in_stays(tmp_path, capsys, body,
                                                                                         message):
    """A variant of d1 that forgot its own ``name`` used to replace the built-in d1 for the whole process."""
    from dare.algorithms import ALGORITHMS
    from dare.rollout.registry import SAMPLERS

    builtins = (ALGORITHMS["d1"], SAMPLERS["llada"])
    plugin = write(tmp_path / "taken.py", body)
    line = one_line_error(capsys, "train", D1, f"imports=[{plugin}]", f"trainer.output_dir={tmp_path / 'run'}",
                          "--dry-run")
    assert line == f"error: imports: {plugin} line 4 raised ValueError: {message} (python {plugin} shows the traceback)"
    assert (ALGORITHMS["d1"], SAMPLERS["llada"]) == builtins


# ----------------------------------------------------------------------------------------------- dare eval --import

EVAL_PLUGIN = '''
import dataclasses

from dare.eval import get_benchmark
from dare.eval.benchmark import register_benchmark
from dare.rollout import Sampler, register_sampler
''' + LENGTH_REWARD.format(name="length_bonus_eval") + '''

register_benchmark(dataclasses.replace(get_benchmark("gsm8k"), name="gsm8k_length_t", reward="length_bonus_eval"))
register_sampler(Sampler("llada_blocks4_t", "llada in blocks of 4", {"block_length": 4}))
'''


def test_eval_run_imports_a_plugin_benchmark_reward_and_sampler_and_records_it(tmp_path, capsys):
    plugin = write(tmp_path / "my_eval.py", EVAL_PLUGIN)
    command = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k_length_t", "--data", TINY_GEN,
               "--limit", "8", "--json", "--sampler", "llada_blocks4_t", "--gen-length", "8", "--no-progress"]
    line = one_line_error(capsys, *command)
    assert line.startswith("error: unknown benchmark 'gsm8k_length_t'")
    out = tmp_path / "results.json"
    assert main([*command, "--import", str(plugin), "--out", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.splitlines()[0])["metrics"]["reward"] > 1.0
    results = json.loads(out.read_text())
    assert results["imports"] == [str(plugin)]
    assert results["sampler"]["name"] == "llada_blocks4_t" and results["sampler"]["settings"]["block_length"] == 4
    assert all(s["reward"] == pytest.approx(1 + len(s["prediction"]) / 1000) for s in results["samples"])
    from dare.eval.results import EvalResults

    assert EvalResults.read(out).imports == [str(plugin)]


BROKEN_REWARDS = '''
import dataclasses

from dare.eval import get_benchmark
from dare.eval.benchmark import register_benchmark
from dare.rewards import Reward, RewardResult, register_reward


@register_reward("raises_t")
class Raises(Reward):
    def score_one(self, completion, sample):
        return RewardResult(reward=float(sample["nope"]), correct=False)


@register_reward("float_t")
class ReturnsFloat(Reward):
    def score_one(self, completion, sample):
        return 1.0


@register_reward("nan_t")
class ReturnsNan(Reward):
    def score_one(self, completion, sample):
        return RewardResult(reward=float("nan"), correct=False)


@register_reward("text_t")
class ReturnsText(Reward):
    def score_one(self, completion, sample):
        return RewardResult(reward="1", correct=False)


for name in ("raises_t", "float_t", "nan_t", "text_t"):
    register_benchmark(dataclasses.replace(get_benchmark("gsm8k"), name=f"gsm8k_{name}", reward=name))
'''


@pytest.mark.parametrize("reward, message", [
    ("raises_t", "reward 'raises_t': {plugin} line 12 raised KeyError: 'nope' (DARE_TRACEBACK=1 shows the traceback)"),
    ("float_t", "reward 'float_t' returned float 1.0 for completion 0: score_one returns RewardResult(reward=..., "
                "correct=...)"),
    ("nan_t", "reward 'nan_t' returned reward=nan for completion 0: a reward is a finite number"),
    ("text_t", "reward 'text_t' returned reward='1' for completion 0: a reward is a finite number"),
])
def test_a_plugin_reward_that_fails_while_scoring_is_one_line_and_the_generations_are_kept(tmp_path, capsys, reward,
                                                                                           message):
    """Before: a traceback after the whole generation (KeyError, AttributeError: 'float' has no 'to_dict', a numpy
    TypeError) and nothing written; a NaN reward wrote invalid JSON."""
    plugin = write(tmp_path / "broken_t.py", BROKEN_REWARDS)
    out = tmp_path / "results.json"
    command = ["eval", "run", "--model", "tiny:llada", "--benchmark", f"gsm8k_{reward}", "--data", TINY_GEN,
               "--limit", "2", "--gen-length", "8", "--no-progress", "--import", str(plugin)]
    saved = tmp_path / "results.predictions.jsonl"
    rescore = (f"dare eval score --benchmark gsm8k_{reward} --predictions {saved} --data {TINY_GEN} --import "
               f"{plugin}")
    assert one_line_error(capsys, *command, "--out", out) == (
        f"error: {message.format(plugin=plugin)}; the 2 generations are saved in {saved} (once the reward is "
        f"fixed: {rescore})")
    assert not out.exists()
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["gsm8k/0", "gsm8k/1"] and all(isinstance(r["prediction"], str) for r in rows)
    assert one_line_error(capsys, "eval", "score", "--benchmark", f"gsm8k_{reward}", "--predictions", saved, "--data",
                          TINY_GEN, "--import", plugin) == f"error: {message.format(plugin=plugin)}"


def test_dare_traceback_prints_the_traceback_behind_the_one_line_error(tmp_path, monkeypatch, capsys):
    plugin = write(tmp_path / "broken_t.py", BROKEN_REWARDS)
    monkeypatch.setenv("DARE_TRACEBACK", "1")
    assert main(["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k_raises_t", "--data", TINY_GEN,
                 "--limit", "1", "--gen-length", "8", "--no-progress", "--import", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and f'File "{plugin}", line 12, in score_one' in err
    assert err.strip().splitlines()[-1].startswith("error: reward 'raises_t': ")


def test_a_plugin_reward_that_raises_in_training_is_one_line(tmp_path, capsys):
    plugin = write(tmp_path / "broken_t.py", BROKEN_REWARDS)
    line = one_line_error(capsys, "train", D1, f"imports=[{plugin}]", "rollout.reward=raises_t", *SMALL_RL,
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line == (f"error: reward 'raises_t': {plugin} line 12 raised KeyError: 'nope' (DARE_TRACEBACK=1 shows "
                    "the traceback)")


def test_generate_imports_a_plugin_sampler(tmp_path, capsys):
    plugin = write(tmp_path / "my_eval.py", EVAL_PLUGIN)
    assert main(["generate", "--model", "tiny:llada", "--prompt", "hi", "--sampler", "llada_blocks4_t",
                 "--gen-length", "8", "--json", "--import", str(plugin)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["sampler"] == "llada_blocks4_t"


# --------------------------------------------------------------------------------------------- entry points

class FakeEntryPoint:
    """What ``importlib.metadata.entry_points(group=...)`` yields for an installed distribution."""

    def __init__(self, name: str, value: str):
        self.name, self.value, self.module = name, value, value.partition(":")[0]
        self.dist = type("Dist", (), {"name": "my-dare-plugin"})()


def test_an_installed_entry_point_is_imported_once_at_the_same_moments(tmp_path, monkeypatch, capsys):
    module = write(tmp_path / "site" / "installed_plugin_t.py", COUNTING + LENGTH_REWARD.format(name="installed_t"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    asked = []
    installed_only([FakeEntryPoint("mine", "installed_plugin_t")], monkeypatch, asked)
    from dare.cli import build_parser

    build_parser().parse_args(["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k"])
    assert asked == [] and runs_of(module) == 0  # `dare --help` and parsing load nothing
    out = f"trainer.output_dir={tmp_path / 'run'}"
    assert main(["train", D1, "rollout.reward=installed_t", out, "--dry-run"]) == 0, capsys.readouterr().err
    assert main(["train", D1, "rollout.reward=installed_t", out, "--dry-run"]) == 0
    assert runs_of(module) == 1 and asked == [{"group": "dare.plugins"}]
    assert plugins.imported() == ["installed_plugin_t"]


def test_a_broken_entry_point_names_its_distribution(tmp_path, monkeypatch, capsys):
    installed_only([FakeEntryPoint("gone", "uninstalled_module_t:register")], monkeypatch)
    assert one_line_error(capsys, "train", D1, f"trainer.output_dir={tmp_path}", "--dry-run") == (
        "error: dare.plugins entry point 'gone' of my-dare-plugin: no module named 'uninstalled_module_t' (and no "
        "file uninstalled_module_t); it loads in every dare command: fix it, or pip uninstall my-dare-plugin")


# ---------------------------------------------------------------------------------------------------- resume

def test_a_resume_with_the_plugin_elsewhere_is_accepted():
    from dare.trainer.resume import FREE_KEYS, check_same_settings, differing_keys

    saved = {"imports": ["my_reward.py"], "rollout": {"reward": "length_bonus"}, "algorithm": {"name": "d1"}}
    moved = {**saved, "imports": ["/home/me/plugins/my_reward.py"]}
    assert "imports" in FREE_KEYS and differing_keys(saved, moved) == []
    check_same_settings(saved, moved, "runs/x", "")
    other = {**moved, "rollout": {"reward": "other_reward"}}
    assert differing_keys(saved, other) == ["rollout.reward"]


# ------------------------------------------------------------------------------------- reward helper processes

def test_a_helper_process_imports_the_plugins_so_a_plugin_files_function_runs_there(tmp_path, monkeypatch):
    from dare.rewards.worker import BoundedWorker

    plugin = write(tmp_path / "checks.py", '''
        def length(text):
            return len(text)
        ''')
    plugins.load_plugins([str(plugin)])
    target = f"{plugins.file_module_name(plugin)}:length"
    worker = BoundedWorker(target)
    try:
        assert worker.call(("abcd",), timeout=60, default=-1) == 4
    finally:
        worker.close()
    monkeypatch.setattr(plugins, "child_setup", dict)  # without the plug-ins the helper cannot find it
    worker = BoundedWorker(target, start_timeout=60)
    try:
        assert worker.call(("abcd",), timeout=60, default=-1) == -1
    finally:
        worker.close()


def test_train_answers_the_eval_habit_import_flag_with_the_imports_override(capsys):
    """``dare train RECIPE --import x.py`` (the eval / generate option) names the override to write instead, as a
    list: ``imports=[x.py]`` (a bare ``imports=x.py`` would be a string, which the key refuses)."""
    from dare.cli import main

    for flag in (["--import", "x.py"], ["--imports=x.py"]):
        with pytest.raises(SystemExit):
            main(["train", "configs/llada/d1_tiny.yaml", *flag])
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: dare train: unknown option {flag[0].split('=')[0]}: settings are key=value overrides here (use "
            "imports=[x.py]); see 'dare train --help'")


def test_dare_targets_start_their_helper_without_the_plugins(monkeypatch):
    """The math reward's helper (a DARE target) imports no plug-in: it would pay each one's import at every restart,
    and a plug-in failing there would silently turn its answers into defaults. A target of the user's own gets them."""
    from dare.rewards.worker import BoundedWorker

    setup = {"path": ["/x"], "imports": ["/x/slow.py"]}
    assert BoundedWorker("dare.rewards.math_check:verify_pair")._plugins(setup) == {}
    assert BoundedWorker("dare_plugin_checks_0123:length")._plugins(setup) == setup


def test_a_plugin_that_imports_a_sibling_plugin_gets_the_same_module(tmp_path, monkeypatch):
    """``imports=[my_reward.py, combo.py]`` where combo.py does ``from my_reward import ...``: the file is aliased
    under its plain name, so it runs once (before: a second run registered ``my_reward`` twice and failed)."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_reward_t.py", '''
        from pathlib import Path
        from dare.rewards import Reward, RewardResult, register_reward
        with open(Path(__file__).with_suffix(".runs"), "a") as f:
            f.write("x")

        @register_reward("my_reward_t")
        class MyReward(Reward):
            def score_one(self, completion, sample):
                return RewardResult(reward=1.0, correct=False)
        ''')
    write(tmp_path / "combo_t.py", '''
        from my_reward_t import MyReward
        from dare.rewards import register_reward

        @register_reward("combo_t")
        class Combo(MyReward):
            pass
        ''')
    plugins.load_plugins(["my_reward_t.py", "combo_t.py", "my_reward_t"])
    assert runs_of(tmp_path / "my_reward_t.py") == 1
    assert sys.modules["my_reward_t"] is sys.modules[plugins.file_module_name(tmp_path / "my_reward_t.py")]


def test_a_plain_name_never_shadows_an_installed_module(tmp_path, monkeypatch):
    """A plug-in file named like a stdlib module (code.py) is imported under its path's name only."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "code.py", "VALUE = 1\n")
    import code as stdlib_code

    plugins.load_plugins(["code.py"])
    assert sys.modules["code"] is stdlib_code
    assert plugins.plain_alias(tmp_path / "code.py") is None


def test_a_plugin_that_exits_while_importing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "exits_t.py", "import sys\nsys.exit('bye')\n")
    with pytest.raises(ConfigError, match=r"^imports: exits_t\.py line 2 raised SystemExit: bye \(python exits_t\.py "
                                          r"shows the traceback\)$"):
        plugins.load_plugins(["exits_t.py"])


def test_a_plugin_file_given_where_a_recipe_or_override_goes_names_the_imports_key(capsys):
    assert one_line_error(capsys, "train", "my_reward.py") == (
        "error: my_reward.py is Python, not a YAML recipe: a plug-in of your own goes in as imports=[my_reward.py] "
        "after the recipe (dare train RECIPE imports=[FILE.py])")
    assert one_line_error(capsys, "train", "llada/d1_tiny", "my_reward.py") == (
        "error: my_reward.py is Python, not a YAML recipe or a key=value override: a plug-in of your own goes in as "
        "imports=[my_reward.py]")
