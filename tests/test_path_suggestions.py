"""A missing path's 'did you mean' names only an existing path that it mistypes (:func:`dare.errors.closest_name`),
never an unrelated one that shares a few letters: ``dare eval run --model /nope`` suggested ``/opt`` and ``dare demo
--import nope.py`` (like ``imports=[nope.py]``) suggested ``setup.py``."""

from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.errors import closest_name, one_typo_apart

ROOT = Path(__file__).resolve().parents[1]
DATA = str(ROOT / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl")


@pytest.mark.parametrize("name, names, hint", [
    ("sft_tny.yaml", ["sft_tiny.yaml", "sft_8b.yaml"], "sft_tiny.yaml"),
    ("my_rewardz.py", ["my_rewards.py", "setup.py"], "my_rewards.py"),
    ("tnp", ["opt", "tmp", "usr"], "tmp"),  # one letter: short names too
    ("Reward.py", ["reward.py"], "reward.py"),
    ("rewrad.py", ["reward.py"], "reward.py"),  # two letters swapped
    ("nope", ["opt", "tmp", "usr"], None),
    ("nope.py", ["setup.py"], None),
    ("tests.py", ["setup.py"], None),
    ("a.py", ["setup.py"], None),
])
def test_only_a_mistyped_name_is_corrected(name, names, hint):
    assert closest_name(name, names) == hint


def test_one_typo_apart():
    assert one_typo_apart("abc", "abd") and one_typo_apart("abc", "ab") and one_typo_apart("abc", "abxc")
    assert one_typo_apart("abc", "bac")
    assert not one_typo_apart("abc", "abc") and not one_typo_apart("abc", "cab") and not one_typo_apart("abc", "a")


def test_a_missing_model_directory(tmp_path, capsys):
    (tmp_path / "opt").mkdir()
    (tmp_path / "step_00000040").mkdir()
    run = ["eval", "run", "--benchmark", "gsm8k", "--data", DATA, "--model"]
    assert one_line_error(capsys, *run, tmp_path / "nope") == (
        f"error: model path {tmp_path / 'nope'}: no such checkpoint directory")
    assert one_line_error(capsys, *run, tmp_path / "otp") == (
        f"error: model path {tmp_path / 'otp'}: no such checkpoint directory (did you mean {tmp_path / 'opt'}?)")
    assert one_line_error(capsys, *run, tmp_path / "step_40").endswith(f"(did you mean {tmp_path / 'step_00000040'}?)")


@pytest.mark.parametrize("args, where", [
    (["demo", "--import", "{name}"], "--import"),
    (["train", "llada/sft_tiny", "imports=[{name}]", "--dry-run"], "imports"),
])
def test_a_missing_plug_in_file(args, where, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "my_rewards.py").write_text("")
    assert one_line_error(capsys, *(a.format(name="nope.py") for a in args)) == (
        f"error: {where}: no file nope.py in {tmp_path}")
    assert one_line_error(capsys, *(a.format(name="my_rewardz.py") for a in args)) == (
        f"error: {where}: no file my_rewardz.py in {tmp_path} (did you mean my_rewards.py?)")


@pytest.mark.parametrize("typed, suggestion", [
    ("configs/llada/sft_tny.yaml", " (did you mean configs/llada/sft_tiny.yaml?)"),
    ("configs/llada/sft.yaml", ""),  # used to be corrected to sft_8b.yaml: one of three sft recipes
    ("configs/llada/nope.yaml", ""),
])
def test_a_recipe_path(typed, suggestion, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert one_line_error(capsys, "train", typed, "--dry-run") == (
        f"error: config file {typed} does not exist{suggestion}; dare recipes lists the recipes")
