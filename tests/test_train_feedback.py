"""What `dare train` says about whether a run learns: TraceRL's truncation rule in the metrics and warnings, IGPO
without reasoning in its data, the RL progress bar and summary (reward and gradient norm, not the ~0 policy loss),
the shared warning on rollouts without learning signal, and ``Trainer.train_step``'s 0-based step index."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

from rl_helpers import Constant, algorithm, policy, source

from dare.cli import main
from dare.distributed import DistInfo
from dare.trainer import Trainer, load_train_config
from dare.trainer.rl import RolloutSource

ROOT = Path(__file__).resolve().parents[1]
TRACERL = str(ROOT / "configs/sdar/tracerl_tiny.yaml")
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
IGPO = str(ROOT / "configs/llada/igpo_tiny.yaml")
SMALL = ["trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.progress=false", "trainer.export=false"]
NO_STOP = ("algorithm.truncated_reward=0 replaced the reward of the 8 of 8 rollouts that emitted no stop token (none "
           "stopped within rollout.sampler.gen_length: raise it, or set algorithm.truncated_reward=null to keep their "
           "rewards)")


def dare_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dare") and r.levelno >= logging.WARNING]


def tracerl(tmp_path, *overrides):
    return load_train_config(TRACERL, [f"trainer.output_dir={tmp_path}", *SMALL, "algorithm.truncated_reward=0",
                                       "algorithm.value_model=false", *overrides])


# ---- 1. TraceRL's truncation rule ----------------------------------------------------------------------------------
def test_tracerl_truncation_shows_in_the_metrics_and_is_warned(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        record = Trainer(tracerl(tmp_path, "trainer.max_steps=1")).train()
    assert record["rollout/eos_fraction"] == 0  # the tiny model stops within no 8-token completion
    assert record["rollout/reward"] > 0 and record["rollout/trained_reward"] == 0  # what the update used
    assert record["rollout/flat_groups"] == 1 and record["rollout/informative_groups"] == 0
    assert [w for w in dare_warnings(caplog) if "learning signal" in w] == [
        f"warning: step 1: no learning signal in this rollout (all 2 groups have equal rewards; {NO_STOP}): every "
        "advantage is 0, so nothing is learned from it (later such rollouts are counted in the end-of-run summary)"]
    assert record["rollouts_without_signal"] == 1


def test_dynamic_sampling_judges_the_rewards_after_the_truncation_rule(tmp_path):
    record = Trainer(tracerl(tmp_path, "trainer.max_steps=1", "rollout.dynamic_sampling=true",
                             "rollout.dynamic_extra_rounds=1")).train()
    # every group is flat once truncated (the reward's own values differ): both slots are filled with flat groups
    assert record["rollout/dynamic/filled"] == 2 and record["rollout/dynamic/extra_rounds"] == 1


def test_a_truncation_that_flattens_some_groups_is_said_once(caplog):
    source_ = SimpleNamespace(info=DistInfo(), algorithm=algorithm("tracerl", policy()), _warned=set())
    counts = {"groups": 4.0, "flat": 1.0, "made_flat": 1.0, "informative": 3.0, "rows": 16.0, "stopped": 12.0,
              "dropped": 0.0}
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        RolloutSource._check_signal(source_, 2, counts)
        RolloutSource._check_signal(source_, 3, counts)
    assert dare_warnings(caplog) == [
        "warning: step 3: algorithm.truncated_reward=0 replaced the reward of the 4 of 16 rollouts that emitted no "
        "stop token: that made 1 of 4 groups flat (equal rewards, zero advantage); said once, see "
        "rollout/trained_reward and rollout/flat_groups"]


# ---- 2. IGPO without reasoning -------------------------------------------------------------------------------------
def test_igpo_says_at_start_when_no_record_can_give_a_hint(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        Trainer(load_train_config(IGPO, [f"trainer.output_dir={tmp_path / 'a'}", *SMALL,
                                         "algorithm.reasoning_key=reasoning"])).release_output_dir()
    assert dare_warnings(caplog) == [
        "warning: algorithm.reasoning_key='reasoning': none of the 64 prompt records has this field (they hold: "
        "answer, prompt), so IGPO never writes hints: failed groups are only re-rolled (set algorithm.reasoning_key "
        "to the field holding reference reasoning, or to null to re-roll without hints on purpose)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):  # the shipped recipe asks for no hints
        Trainer(load_train_config(IGPO, [f"trainer.output_dir={tmp_path / 'b'}", *SMALL])).release_output_dir()
    assert dare_warnings(caplog) == []


def test_igpo_sample_check_tells_missing_from_unusable_reasoning():
    algo = algorithm("igpo", policy())
    assert algo.check_samples([{"answer": "7", "reasoning": "3 + 4 = 7"}, {"answer": "7", "reasoning": "x"}]) is None
    assert algo.check_samples([{"answer": "7", "reasoning": "3 + 4 = 7"}, {"answer": "1"}]) == (
        "note: 1 of the 2 prompt records have no reasoning before the answer in 'reasoning': their failed groups are "
        "re-rolled without hints")
    assert algo.check_samples([{"answer": "7", "reasoning": "7 because"}]).startswith(
        "warning: algorithm.reasoning_key='reasoning': no prompt record has reasoning before its answer")
    assert algorithm("igpo", policy(), reasoning_key=None).check_samples([{"answer": "1"}]) is None


# ---- 3. the RL progress bar and summary ----------------------------------------------------------------------------
def test_the_rl_progress_bar_and_summary_show_reward_and_grad_norm(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "inf")  # the final line only
    assert main(["train", D1, f"trainer.output_dir={tmp_path}", "trainer.max_steps=4", "trainer.batch_size=8",
                 "trainer.export=false"]) == 0
    captured = capfd.readouterr()
    bar = captured.err.strip().splitlines()[-1]
    assert re.fullmatch(r"train: 4/4 it \(100%\), [\d.]+ it/s, in \d+s, reward=[\d.]+, grad_norm=[\d.e+-]+, "
                        r"lr=[\d.e+-]+", bar), bar
    done = next(line for line in captured.out.splitlines() if line.startswith("done: "))
    assert re.search(r"reward [\d.]+ -> [\d.]+ \(first -> last of 2 rollouts\), grad_norm [\d.e+-]+;", done), done
    assert " loss " not in done


def test_the_summary_averages_the_first_and_last_rollouts():
    from dare.trainer.loop import reward_digest, summary_parts

    record = {"grad_norm": 0.5, "loss": 0.0, **reward_digest([0.1, 0.2, 0.3, 0.5, 0.6, 0.7])}
    assert summary_parts(record) == ["reward 0.2000 -> 0.6000 (means of the first / last 3 of 6 rollouts)",
                                     "grad_norm 0.5"]
    assert summary_parts({"loss": 1.25}) == ["loss 1.2500"]  # SFT: the loss


# ---- 4. rollouts without a learning signal, any group algorithm ----------------------------------------------------
def test_a_rollout_without_learning_signal_is_warned_once_for_any_group_algorithm(caplog):
    src = source("d1", reward=Constant(), inner_steps=1)
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        src.batch(0)
        src.batch(1)
    assert src.step_metrics["rollout/informative_groups"] == 0 and src.step_metrics["rollout/flat_groups"] == 1
    assert dare_warnings(caplog) == [
        "warning: step 1: no learning signal in this rollout (all 2 groups have equal rewards): every advantage is 0, "
        "so nothing is learned from it (later such rollouts are counted in the end-of-run summary)"]


def test_the_summary_counts_rollouts_without_learning_signal(tmp_path, capsys):
    # a random tiny model never writes the <reasoning>/<answer> format: every reward is 0
    assert main(["train", D1, f"trainer.output_dir={tmp_path}", *SMALL, "trainer.max_steps=4",
                 "rollout.reward=strict_format"]) == 0
    assert "warning: 2 of the 2 rollouts had no learning signal" in capsys.readouterr().out


# ---- 5. train_step's step index ------------------------------------------------------------------------------------
def test_train_step_1_as_first_call_says_the_index_is_0_based(tmp_path, caplog):
    trainer = Trainer(load_train_config(D1, [f"trainer.output_dir={tmp_path}", *SMALL]))
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        record = trainer.train_step(1)
    trainer.release_output_dir()
    assert record["step"] == 2
    assert dare_warnings(caplog) == [
        "warning: step index 1 (0-based, logged as step 2) is update 2 of algorithm.inner_steps=2 on the rollouts "
        "made at step index 0, which were never made: rolling them out now with the current policy. "
        "Trainer.train_step(step) takes the 0-based index of the step to run: the first step is train_step(0), the "
        "next one train_step(trainer.step)"]
    assert "0-based" in Trainer.train_step.__doc__


def test_a_resumed_cycle_without_its_rollouts_keeps_the_resume_warning(caplog):
    src = source("d1", inner_steps=2)
    src.load_state_dict({})
    with caplog.at_level(logging.WARNING, logger="dare.trainer"):
        src.batch(1)
    assert dare_warnings(caplog) == [
        "warning: step index 1 (0-based, logged as step 2) is update 2 of algorithm.inner_steps=2 on the rollouts "
        "made at step index 0, which are not cached (resumed with another world size or "
        "distributed.sequence_parallel?): rolling them out again with the current policy"]
