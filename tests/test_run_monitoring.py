"""Watching and stopping an RL run: SIGTERM (kill, scancel) ends it like Ctrl-C, a resume past trainer.max_steps is
refused instead of rewriting config.yaml, and TensorBoard drops an interrupted run's later events on resume."""

import os
import signal
import sys
import time
import types
from pathlib import Path

import pytest

from cli_helpers import one_line_error

from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
SMALL_RL = ["trainer.progress=false", "trainer.batch_size=8", "trainer.micro_batch_size=8", "algorithm.inner_steps=1"]


def test_sigterm_ends_a_run_with_the_resume_hint_as_ctrl_c_does(tmp_path, capsys, monkeypatch):
    """Before: kill / scancel ended the run without a word (an empty log)."""

    def killed(config, on_step=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
        raise AssertionError("SIGTERM did not interrupt the run")

    monkeypatch.setattr("dare.trainer.run_training", killed)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["train", D1, f"trainer.output_dir={tmp_path / 'run'}", *SMALL_RL]) == 130
    err = capsys.readouterr().err
    assert f"no checkpoint in {tmp_path / 'run'} yet" in err and err.endswith("\ninterrupted\n")
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the caller's again


@pytest.mark.parametrize("command", [["generate", "--model", "tiny:llada", "--prompt", "hi"], ["train", D1]])
def test_sigterm_while_torch_is_imported_says_interrupted(command, tmp_path, capsys, monkeypatch):
    """Before: a SIGTERM that came while the command was still importing torch (before any handler of the
    command's own) ended it without a word. Every command now answers it from its start as Ctrl-C."""

    def killed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
        raise AssertionError("SIGTERM did not interrupt the command")

    monkeypatch.setattr("dare.rollout.engine.check_environment", killed)  # the command's first torch import
    before = signal.getsignal(signal.SIGTERM)
    assert main(command) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_resume_past_max_steps_is_refused_and_config_yaml_kept(tmp_path, capsys):
    """Before: max_steps=1 on a finished 2-step run resumed at step 2, trained nothing and rewrote config.yaml to
    say max_steps 1 beside step-2 weights."""
    out = tmp_path / "run"
    assert main(["train", D1, f"trainer.output_dir={out}", *SMALL_RL, "trainer.max_steps=2"]) == 0
    config = (out / "config.yaml").read_text()
    said = (f"error: trainer.max_steps=1 is below the step of the checkpoint the run resumes from "
            f"({out / 'checkpoints' / 'step_00000002'}, step 2): nothing would train; give a larger trainer.max_steps, "
            "another trainer.output_dir, or trainer.resume=never to start over")
    for extra in ([], ["--dry-run"]):
        assert one_line_error(capsys, "train", D1, f"trainer.output_dir={out}", *SMALL_RL, "trainer.max_steps=1",
                              *extra) == said
    assert (out / "config.yaml").read_text() == config


def test_tensorboard_drops_the_interrupted_runs_later_events_on_resume(tmp_path, monkeypatch):
    """Before: the resumed run's writer kept the events of steps it logs again (two values per step)."""
    opened = []

    class Writer:
        def __init__(self, log_dir, purge_step=None):
            self.log_dir = log_dir
            opened.append(purge_step)

        def add_scalar(self, *args):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    from dare.trainer.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path, tensorboard=True)
    logger.log({"step": 1, "loss": 1.0})
    logger.log({"step": 2, "loss": 0.5})
    logger.truncate_after(1)  # resumed from the checkpoint of step 1
    assert opened == [None, 2]
    assert [line.count('"step": 1') for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    """Before: every resume started a new W&B run, so a run's curves were split across runs."""
    inits = []

    class Run:
        def log(self, values, step=None):
            pass

        def finish(self):
            pass

    def init(**kwargs):
        inits.append(kwargs)
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    out = tmp_path / "run"
    common = ["train", D1, f"trainer.output_dir={out}", *SMALL_RL, "trainer.wandb=true", "trainer.save_every=1"]
    assert main([*common, "trainer.max_steps=1"]) == 0
    assert main([*common, "trainer.max_steps=2"]) == 0  # resumes from step 1
    assert main([*common, "trainer.max_steps=2", "trainer.resume=never"]) == 0  # starts over: a new W&B run
    first, resumed, again = inits
    assert "resume" not in first and resumed["id"] == first["id"] and resumed["resume"] == "allow"
    assert again["id"] != first["id"] and "resume" not in again
