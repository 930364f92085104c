"""``dare demo``: the task's splits and scoring, one-line errors, and the shortened demo end to end."""

import importlib.util
import json
import sys

import pytest

from dare.cli import main
from dare.demo import DemoConfig, demo_algorithms
from dare.demo.pipeline import check_config, rl_recipe
from dare.demo.task import draw_numbers, problem, write_task
from dare.errors import ConfigError
from dare.eval import get_benchmark, score_predictions
from dare.rewards import get_reward


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def numbers_of(rows):
    return {row["question"].removeprefix("Reverse ").removesuffix(".") for row in rows}


def test_splits_are_disjoint_and_the_held_out_splits_do_not_depend_on_the_seed(tmp_path):
    sizes = dict(digits=3, train_size=200, validation_size=30, test_size=50)
    a = write_task(tmp_path / "a", seed=0, **sizes)
    b = write_task(tmp_path / "b", seed=1, **sizes)
    train_a = [r["answer"][::-1] for r in read_jsonl(a.prompts)]
    validation, test = numbers_of(read_jsonl(a.validation_path)), numbers_of(read_jsonl(a.test_path))
    assert (len(set(train_a)), len(validation), len(test)) == (200, 30, 50)  # no duplicates within a split
    assert not set(train_a) & validation and not set(train_a) & test and not validation & test
    assert a.validation_path.read_text() == b.validation_path.read_text()
    assert a.test_path.read_text() == b.test_path.read_text()
    train_b = {r["answer"][::-1] for r in read_jsonl(b.prompts)}
    assert train_b != set(train_a) and not train_b & (validation | test)  # the seed draws other training problems
    assert all(set(n) <= set("123456789") and len(n) == 3 for n in train_a + sorted(validation | test))


def test_every_split_poses_the_same_problem_in_its_consumers_format(tmp_path):
    data = write_task(tmp_path, digits=4, train_size=8, validation_size=4, test_size=4, seed=0)
    bench = get_benchmark("gsm8k")
    sft, prompts = read_jsonl(data.sft), read_jsonl(data.prompts)
    for demo, rl in zip(sft, prompts):
        question = demo["prompt"].split("Question: ")[1].split("\n")[0]
        number = question.removeprefix("Reverse ").removesuffix(".")
        assert demo["response"] == " " + number[::-1] and rl["answer"] == number[::-1]
        assert demo["prompt"] == rl["prompt"] and demo["prompt"].endswith("Answer:")
    sample = data.test[0]  # read back by the GSM8K benchmark itself
    assert sample.answer == sample.question.removeprefix("Reverse ").removesuffix(".")[::-1]
    assert bench.render(sample, template="few_shot", chat=False) == f"Question: {sample.question}\nAnswer:"
    assert problem("1234") == ("Reverse 1234.", "4321")


def test_too_many_problems_is_a_config_error():
    import random

    with pytest.raises(ConfigError, match="cannot draw 82"):
        draw_numbers(random.Random(0), 2, 82, set())  # only 81 two-digit numbers without zeros
    assert len(draw_numbers(random.Random(0), 2, 81, set())) == 81


def test_gsm8k_scorer_and_reward_grade_the_answers(tmp_path):
    data = write_task(tmp_path, digits=5, train_size=4, validation_size=2, test_size=3, seed=0)
    bench = get_benchmark("gsm8k")
    gold = [s.answer for s in data.test]
    predictions = [f" {gold[0]}", f" {gold[1][::-1]}", f" {gold[2][:4]}"]  # right, the question's number, a digit short
    results = score_predictions(bench, data.test, predictions)
    assert [r["correct"] for r in results.samples] == [True, False, False]
    assert results.metrics["accuracy"] == pytest.approx(1 / 3)
    reward = get_reward("gsm8k")  # the RL reward reads the same answer from the prompts file's records
    record = read_jsonl(data.prompts)[0]
    scores = reward.score([f" {record['answer']}", " 12345", ""], [record] * 3)
    assert [s.reward for s in scores] == [1.0, float(record["answer"] == "12345"), 0.0]


def test_algorithm_choices_and_one_line_errors(capsys, tmp_path):
    choices = demo_algorithms()
    assert {"d1", "wd1", "coupled_grpo", "mdpo", "spg", "bgpo", "cj_grpo", "sft"} <= set(choices)
    assert "vrpo" not in choices and "dpo" not in choices
    from dare.commands.demo import HELP_ALGORITHMS

    assert set(HELP_ALGORITHMS) == set(choices) - {"sft"}  # `dare demo --help` names every choice
    for name, message in [("nope", "unknown demo algorithm 'nope'"), ("vrpo", "trains on preference pairs")]:
        assert main(["demo", "--algorithm", name, "--out", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err
        assert not (tmp_path / name).exists()  # checked before any work
    with pytest.raises(ConfigError, match="sft_target"):
        check_config(DemoConfig(sft_target=1.5))


def test_rl_recipe_uses_the_demo_sampler_and_per_algorithm_settings(tmp_path):
    data = write_task(tmp_path, digits=3, train_size=4, validation_size=2, test_size=2, seed=0)
    recipe = rl_recipe(DemoConfig(algorithm="spg", digits=3, temperature=0.7), "m", data, tmp_path / "rl")
    assert recipe["rollout"]["sampler"]["gen_length"] == 6
    assert recipe["algorithm"]["block_length"] == 3  # SPG's num_t = 2 masking blocks need 2 blocks
    assert recipe["rollout"]["sampler"]["temperature"] == 0.7 and recipe["rollout"]["reward"] == "gsm8k"
    assert recipe["trainer"]["batch_size"] == 8 * 16  # group size x prompts per step


def test_quick_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--seed", "1", "--rl-steps", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "dare.demo.report/1"
    assert set(report["accuracy"]) == {"init", "sft", "rl"}
    assert all(0 <= v <= 1 for v in report["accuracy"].values())
    assert report["accuracy"]["init"] == 0 < report["accuracy"]["sft"]  # SFT from scratch learned the task partly
    assert report["improvement"] == pytest.approx(report["accuracy"]["rl"] - report["accuracy"]["sft"])
    settings = report["settings"]
    assert settings["seed"] == 1 and settings["algorithm"]["name"] == "d1" and settings["sft_stop"] == "target"
    assert settings["sampler"]["eval"]["confidence"] == "prob"  # low-confidence remasking
    assert settings["sampler"]["eval"]["temperature"] == 0 and settings["sampler"]["rollout"]["temperature"] == 1.0
    assert {"gen_length", "steps", "block_length", "confidence"} <= set(settings["sampler"]["eval"])
    curves = report["curves"]
    assert [step for step, _ in curves["rl_reward"]] and len(curves["sft_loss"]) == report["phases"][1]["steps"]
    assert curves["rl_heldout_accuracy"][0] == [0, report["accuracy"]["sft"]]
    assert curves["rl_heldout_accuracy"][-1] == [2, report["accuracy"]["rl"]]
    assert [p["name"] for p in report["phases"]] == ["init", "sft", "rl"]
    assert report["timings"]["seconds"] > 0
    for phase in report["phases"]:  # every accuracy is a regular GSM8K results file of the held-out split
        results = json.loads((out / f"eval_{phase['name']}.json").read_text())
        assert results["benchmark"] == "gsm8k" and len(results["samples"]) == settings["task"]["test"]
        assert results["metrics"]["accuracy"] == pytest.approx(phase["accuracy"])
    assert (out / "sft.yaml").is_file() and (out / "rl.yaml").is_file() and (out / "rl" / "final").is_dir()
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (out / "curves.png").is_file() == has_matplotlib


def test_without_matplotlib_the_report_is_written_and_the_plot_skipped_with_one_line(tmp_path, monkeypatch):
    from dare.demo.pipeline import Phase
    from dare.demo.report import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    phases = [Phase("init", accuracy=0.0), Phase("sft", steps=2, accuracy=0.25, records=[{"step": 1, "loss": 3.0}]),
              Phase("rl", steps=2, accuracy=0.5, records=[{"step": 1, "rollout/reward": 0.2, "loss": 0.1},
                                                          {"step": 2, "loss": 0.0}])]
    settings = {"seed": 0, "algorithm": {"name": "d1"}, "task": {"digits": 3, "test": 4}}
    lines = []
    report = write_report(tmp_path, settings, phases, {"seconds": 1.0, "cpu_seconds": 1.0}, log=lines.append)
    assert not (tmp_path / "curves.png").exists() and report["files"]["curves"] is None
    assert any("no curves.png" in line and "[plot]" in line and "\n" not in line for line in lines)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["improvement"] == pytest.approx(0.25) and saved["reward"] == {"first": 0.2, "last": 0.2}
    assert saved["curves"]["rl_heldout_accuracy"] == [[0, 0.25], [2, 0.5]]


def test_the_first_and_last_reward_windows_never_share_a_batch():
    from dare.demo.pipeline import Phase
    from dare.demo.report import build_report

    def first_last(batches):  # batch i has reward i
        records = [{"step": step, "rollout/reward": float(step), "loss": 0.0} for step in range(1, batches + 1)]
        phases = [Phase("init", accuracy=0.0), Phase("sft", steps=1, accuracy=0.0, records=[]),
                  Phase("rl", steps=batches, accuracy=0.0, records=records)]
        reward = build_report({}, phases, {})["reward"]
        return reward["first"], reward["last"]

    # fewer than 2 x REWARD_WINDOW (5) batches: the windows shrink; one batch: its reward twice
    assert [first_last(n) for n in (1, 2, 3, 4, 9, 10, 12)] == [
        (1.0, 1.0), (1.0, 2.0), (1.0, 3.0), (1.5, 3.5), (2.5, 7.5), (3.0, 8.0), (3.0, 10.0)]


@pytest.mark.parametrize("algorithm", ["coupled_grpo", "sft"])
def test_quick_demo_with_another_algorithm_and_the_sft_baseline(tmp_path, algorithm):
    out = tmp_path / algorithm
    assert main(["demo", "--quick", "--out", str(out), "--algorithm", algorithm, "--rl-steps", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["algorithm"]["name"] == algorithm
    assert [p["steps"] for p in report["phases"]][2] == 2
    if algorithm == "sft":  # continued SFT: no rollouts, no reward, no rollout sampler
        assert report["reward"] is None and report["settings"]["sampler"]["rollout"] is None
        assert len(report["curves"]["rl_loss"]) == 2
    else:
        assert report["settings"]["algorithm"]["inner_steps"] == 2 and len(report["curves"]["rl_reward"]) == 1


def test_the_default_output_is_runs_demo_which_git_ignores():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert DemoConfig().out_dir == "runs/demo"
    assert "/runs/" in (root / ".gitignore").read_text().splitlines()


def test_the_demo_pins_its_threads_and_its_sft_recipe_reproduces_the_checkpoint(tmp_path):
    import torch
    import yaml
    from safetensors.torch import load_file

    from dare.demo import run_demo
    from dare.trainer import load_train_config, run_training

    from transformers.utils import logging as hf_logging

    before = torch.get_num_threads()
    hf_logging.enable_progress_bar()
    out = tmp_path / "demo"
    report = run_demo(DemoConfig.quick(out_dir=str(out), rl_steps=1), log=lambda message: None)
    assert torch.get_num_threads() == before and report["settings"]["torch_threads"] == 1
    assert hf_logging.is_progress_bar_enabled()  # the demo silences transformers' bars only while it runs
    steps = report["phases"][1]["steps"]
    recipe_file = out / "sft.yaml"
    assert (f"OMP_NUM_THREADS=1 dare train {recipe_file} trainer.output_dir={out / 'sft'}-repro\n"
            in recipe_file.read_text())  # beside the demo's run, which the recipe (resume: never) would start over
    recipe = load_train_config(recipe_file, [f"trainer.output_dir={tmp_path / 'again'}", "trainer.progress=false"])
    assert recipe.trainer.max_steps == steps < DemoConfig.quick().sft_max_steps  # SFT stopped at its target
    assert yaml.safe_load((out / "sft" / "config.yaml").read_text())["trainer"]["max_steps"] == steps
    torch.set_num_threads(1)
    try:
        run_training(recipe)
    finally:
        torch.set_num_threads(before)
    demo = load_file(out / "sft" / "final" / "model.safetensors")
    again = load_file(tmp_path / "again" / "final" / "model.safetensors")
    assert demo.keys() == again.keys() and all(torch.equal(demo[k], again[k]) for k in demo)


def test_sft_stopping_at_its_step_cap_before_the_target_is_said_and_recorded(tmp_path):
    from dare.demo import run_demo

    lines = []
    report = run_demo(DemoConfig.quick(out_dir=str(tmp_path / "demo"), sft_max_steps=2, rl_steps=1), log=lines.append)
    assert report["settings"]["sft_stop"] == "step cap" and report["phases"][1]["steps"] == 2
    assert [line for line in lines if "SFT:" in line] == [
        f"      SFT: stopped at its step cap (sft_max_steps = 2) before validation accuracy reached 20%; RL starts "
        f"from a weaker model. Held-out accuracy {report['accuracy']['sft']:.1%}"]
