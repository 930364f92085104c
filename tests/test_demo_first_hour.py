"""A new user's first hour with ``dare demo``: a setting the chosen algorithm does not use is an error (not silently
unused) and the report records what ran; the demo's own evaluations do not warn about a ``--gen-length`` it does not
have; Ctrl-C says honestly that a rerun starts over (and saves no checkpoint for it); each phase's final held-out
accuracy is in its ``metrics.jsonl``; short SFT phases warm up within their steps; ``--quick`` says it is no
measurement of RL's gain."""

import json
import logging

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.demo import DemoConfig, run_demo
from dare.demo.pipeline import INTERRUPTED, check_config, rl_recipe, warmup_steps
from dare.errors import ConfigError


# ------------------------------------------------------------------------------------------------ 1. inapplicable
@pytest.mark.parametrize("quick", [[], ["--quick"]])
def test_rl_lr_with_the_sft_baseline_is_a_one_line_error_before_any_work(quick, tmp_path, capsys):
    """Before: ``--algorithm sft --rl-lr 0.05`` trained at the SFT lr while report.json recorded rl_lr 0.05."""
    out = tmp_path / "demo"
    line = one_line_error(capsys, "demo", *quick, "--algorithm", "sft", "--rl-lr", "0.05", "--out", out)
    assert line == ("error: --rl-lr does not apply to --algorithm sft: continued SFT trains at the SFT learning rate "
                    "(0.001); leave --rl-lr out, or choose an RL --algorithm")
    assert not out.exists()


@pytest.mark.parametrize("setting, value", [("rl_lr", 0.05), ("group_size", 3), ("prompts_per_step", 2),
                                            ("temperature", 0.5), ("algorithm_options", {"kl_coef": 0.1})])
def test_every_rl_only_setting_is_an_error_with_the_sft_baseline_in_python(setting, value):
    with pytest.raises(ConfigError, match=f"^{setting} does not apply to algorithm 'sft': "):
        check_config(DemoConfig(algorithm="sft", **{setting: value}))
    check_config(DemoConfig(algorithm="d1", **{setting: value}))  # RL uses it


def test_the_baseline_accepts_the_full_and_the_quick_defaults():
    check_config(DemoConfig(algorithm="sft"))
    check_config(DemoConfig.quick(algorithm="sft"))


def test_the_d_treerpo_schedule_spans_the_rl_steps_the_demo_runs(tmp_path):
    """Before: distill_horizon was 120 whatever --rl-steps said, so lambda(t) never ran its course in a shorter run."""
    from dare.demo.task import write_task

    data = write_task(tmp_path, digits=3, train_size=4, validation_size=2, test_size=2, seed=0)
    horizon = [rl_recipe(DemoConfig(algorithm="dtreerpo", digits=3, **steps), "m", data, tmp_path)["algorithm"]
               ["distill_horizon"] for steps in ({}, {"rl_steps": 40})]
    assert horizon == [120, 40]


def test_both_recipes_record_the_imports_the_demo_ran_with(tmp_path):
    """Before: with ``--algorithm sft`` no recipe recorded ``--import`` (only an RL algorithm's rl.yaml did)."""
    from dare.demo.pipeline import sft_recipe
    from dare.demo.task import write_task

    data = write_task(tmp_path, digits=3, train_size=4, validation_size=2, test_size=2, seed=0)
    config = DemoConfig(algorithm="sft", digits=3, imports=["my_plugin"])
    assert sft_recipe(config, "m", data, tmp_path, 5)["imports"] == ["my_plugin"]
    assert rl_recipe(config, "m", data, tmp_path)["imports"] == ["my_plugin"]  # the baseline's continued SFT
    assert "imports" not in sft_recipe(DemoConfig(), "m", data, tmp_path, 5)


# ------------------------------------------------------------------------------------------------ runs
class Warnings(logging.Handler):
    """The messages of the warnings DARE logs while attached."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def demo_run(out, **overrides) -> dict:
    """A quick demo of 2 SFT steps (an untrained model: every answer uses all its positions) in ``out``: its report,
    its log lines and the warnings logged meanwhile."""
    lines, warnings, logger = [], Warnings(), logging.getLogger("dare")
    logger.addHandler(warnings)
    try:
        report = run_demo(DemoConfig.quick(out_dir=str(out), sft_max_steps=2, **overrides), log=lines.append)
    finally:
        logger.removeHandler(warnings)
    return {"out": out, "report": report, "lines": lines, "warnings": warnings.messages}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """``dare demo --quick --algorithm sft --sft-max-steps 2 --rl-steps 2``."""
    return demo_run(tmp_path_factory.mktemp("baseline") / "demo", algorithm="sft", rl_steps=2)


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory):
    """``dare demo --quick --sft-max-steps 2 --rl-steps 3``: held-out checks at step 2 and (the final one) 3."""
    return demo_run(tmp_path_factory.mktemp("rl") / "demo", rl_steps=3)


def last_record(path):
    return json.loads(path.read_text().splitlines()[-1])


def test_the_baseline_header_says_continued_sft_and_the_report_records_what_it_used(baseline):
    """Before: "[2/3] RL with continued SFT (baseline): 2 steps, 4 prompts x 4 rollouts", and report.json recorded
    only rl_lr, not the lr continued SFT trained at."""
    header = next(line for line in baseline["lines"] if line.startswith("[2/3]"))
    assert header == ("[2/3] continued SFT instead of RL (the baseline): 2 steps of 32 demonstrations at lr 0.001, "
                      "held-out accuracy every 2 steps")
    settings = baseline["report"]["settings"]
    assert settings["optim"]["rl"]["lr"] == 0.001 == settings["optim"]["sft"]["lr"]  # what each phase trained at
    assert settings["demo"]["rl_lr"] == DemoConfig.rl_lr  # the only value it can have with sft (else an error)
    assert any(line.startswith("continued SFT changed held-out accuracy by") for line in baseline["lines"])


def test_a_short_sft_phase_warms_up_within_its_steps(baseline):
    """Before: "warning: optim.warmup_steps=20 >= the run's 2 steps (trainer.max_steps)", keys the demo cannot set."""
    assert not [w for w in baseline["warnings"] if "warmup" in w], baseline["warnings"]
    optim = baseline["report"]["settings"]["optim"]
    assert optim["sft"]["warmup_steps"] == optim["rl"]["warmup_steps"] == 1


@pytest.mark.parametrize("run", ["baseline", "rl_run"])
def test_the_demos_evaluations_do_not_warn_of_a_gen_length_it_does_not_have(run, request):
    done = request.getfixturevalue(run)
    assert json.loads((done["out"] / "eval_sft.json").read_text())["timings"]["finished_by_length"] > 0
    assert not [w for w in done["warnings"] if "gen-length" in w or "finish=length" in w], done["warnings"]
    assert not logging.getLogger("dare.eval").filters  # the demo's filter is gone after it


def test_each_phase_ends_its_metrics_with_its_final_held_out_accuracy(baseline):
    for name in ("sft", "rl"):
        record = last_record(baseline["out"] / name / "metrics.jsonl")
        assert record["step"] == 2 and record["eval/heldout_accuracy"] == baseline["report"]["accuracy"][name]
        assert "loss" in record  # added to the last step's own record


def test_dare_runs_reads_the_rl_accuracy_the_demo_printed_last(rl_run):
    """Before: ``dare runs`` showed the step-2 check as the last value (0.1562 -> 0.1562; the demo: -> 14.1%)."""
    from dare.runs import read_run

    report = rl_run["report"]
    series = read_run(rl_run["out"] / "rl").series("eval/heldout_accuracy")
    assert series == [value for _, value in report["curves"]["rl_heldout_accuracy"][1:]] and len(series) == 2
    assert series[-1] == report["accuracy"]["rl"] and last_record(rl_run["out"] / "rl" / "metrics.jsonl")["step"] == 3


def test_a_quick_rl_run_says_it_measures_no_gain(rl_run, baseline):
    lines = rl_run["lines"]
    said = lines.index(next(line for line in lines if line.startswith("RL changed held-out accuracy")))
    assert lines[said + 1] == ("note: --quick is a smoke test, too short for RL to show a gain (3 RL steps); the full "
                               "`dare demo` measures it (d1: +30 to +56 points on seeds 0-2, README)")
    assert not [line for line in baseline["lines"] if "--quick is a smoke test" in line]  # no RL to speak of


def test_only_a_quick_rl_run_gets_the_smoke_test_note(tmp_path, monkeypatch):
    import sys

    from dare.demo.pipeline import Phase
    from dare.demo.report import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plot: faster
    phases = [Phase("init", accuracy=0.0), Phase("sft", steps=2, accuracy=0.25, records=[]),
              Phase("rl", steps=4, accuracy=0.2, records=[])]

    def said(algorithm, quick):
        lines = []
        settings = {"algorithm": {"name": algorithm}, "task": {"digits": 3, "test": 4}}
        write_report(tmp_path, settings, phases, {"seconds": 1.0, "cpu_seconds": 1.0}, log=lines.append, quick=quick)
        return [line for line in lines if line.startswith("note: --quick")]

    assert len(said("d1", True)) == 1 and "(4 RL steps)" in said("d1", True)[0]
    assert said("d1", False) == [] and said("sft", True) == []


# ------------------------------------------------------------------------------------------------ 3. Ctrl-C
def test_ctrl_c_says_a_rerun_starts_over_and_saves_no_checkpoint(tmp_path, capsys, monkeypatch):
    """Before: Ctrl-C promised "saving a checkpoint there", then a rerun said "starting over ... removing
    checkpoints/"."""
    import dare.trainer

    seen = []

    def interrupted(config, on_step=None):
        seen.append(config.trainer.save_on_interrupt)
        raise KeyboardInterrupt

    monkeypatch.setattr(dare.trainer, "run_training", interrupted)
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert INTERRUPTED in captured.out.splitlines() and captured.err.strip().endswith("interrupted")
    assert INTERRUPTED == "note: the demo does not resume: rerunning the same command starts it over"
    assert seen == [False]  # the trainer stops at once: no checkpoint for a resume that never comes
    assert "save_on_interrupt" not in (out / "sft.yaml").read_text()  # `dare train sft.yaml` keeps its default


# ------------------------------------------------------------------------------------------------ 5. warm-up
def test_warmup_fits_inside_a_short_sft_phase():
    assert [warmup_steps(n) for n in (400, 21, 20, 4, 2, 1)] == [20, 20, 19, 3, 1, 0]
