"""Ctrl-C / SIGTERM during training (trainer.save_on_interrupt): the running step finishes, a checkpoint is saved
at it and the run stops with the resume hint; the resumed run ends with the weights of an uninterrupted one. A
second signal stops at once; save_on_interrupt=false stops at once."""

import os
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from dare.cli import main
from dare.trainer.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
SMALL = ["trainer.progress=false", "trainer.max_steps=5", "trainer.batch_size=8", "trainer.micro_batch_size=8",
         "data.num_examples=64", "optim.scheduler=constant", "optim.warmup_steps=0"]


def signal_during_step(monkeypatch, step: int, signum: int, times: int = 1) -> None:
    """Send ``signum`` to this process ``times`` times inside train_step number ``step`` (1-based), before it trains:
    as a signal that arrives while a step runs."""
    real = Trainer.train_step

    def train_step(self, index, *args, **kwargs):
        if index + 1 == step:
            for _ in range(times):
                os.kill(os.getpid(), signum)
        return real(self, index, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def weights(run: Path) -> dict:
    return load_file(str(run / "final" / "model.safetensors"))


@pytest.mark.parametrize("signum, label", [(signal.SIGINT, "SIGINT (Ctrl-C)"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_finishes_the_step_saves_it_and_the_resumed_run_matches(tmp_path, capsys, monkeypatch, signum,
                                                                         label):
    """Before: with the default trainer.save_every (null) an interrupted run had no checkpoint and restarted at
    step 0."""
    out = tmp_path / "run"
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        signal_during_step(patch, 3, signum)
        assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL]) == 130
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    err = capsys.readouterr().err
    again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
    assert f"{label}: stopping after step 3 and saving a checkpoint there ({again} stops at once, without it)" in err
    saved = out / "checkpoints" / "step_00000003"
    assert f"latest checkpoint: {saved} (step 3)" in err and err.endswith("\ninterrupted\n")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000003"]
    assert not (out / "final").exists()
    steps = [line for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 3  # the stopped step is logged

    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.resume=auto"]) == 0
    assert main(["train", SFT, f"trainer.output_dir={tmp_path / 'whole'}", *SMALL]) == 0
    resumed, whole = weights(out), weights(tmp_path / "whole")
    assert resumed.keys() == whole.keys()
    assert all(resumed[name].equal(whole[name]) for name in whole)  # the step finished before the save


def test_a_second_signal_stops_at_once_without_a_checkpoint(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    signal_during_step(monkeypatch, 3, signal.SIGINT, times=2)
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL]) == 130
    err = capsys.readouterr().err
    assert f"no checkpoint in {out} yet" in err
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_save_on_interrupt_false_stops_at_once(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    signal_during_step(monkeypatch, 3, signal.SIGINT)
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.save_on_interrupt=false"]) == 130
    err = capsys.readouterr().err
    assert "stopping after step" not in err and f"no checkpoint in {out} yet" in err


def test_a_save_every_checkpoint_at_the_stopped_step_is_not_written_twice(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    saves = []
    real = Trainer.save

    def save(self):
        saves.append(self.step)
        return real(self)

    monkeypatch.setattr(Trainer, "save", save)
    signal_during_step(monkeypatch, 2, signal.SIGTERM)
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.save_every=2"]) == 130
    assert saves == [2]
    assert f"latest checkpoint: {out / 'checkpoints' / 'step_00000002'} (step 2)" in capsys.readouterr().err


def test_a_signal_in_the_last_step_ends_the_run_normally(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    signal_during_step(monkeypatch, 5, signal.SIGINT)
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL]) == 0
    assert (out / "final" / "model.safetensors").exists()
    assert "done:" in capsys.readouterr().out


def test_under_torchrun_every_rank_stops_after_the_step_one_rank_was_signalled_in(tmp_path):
    """Ranks agree on the step to stop after (one collective per step): a rank that stopped alone would leave the
    others waiting in the next step's collectives, and the checkpoint needs all of them."""
    import json
    import subprocess
    import sys

    from torchrun_helpers import worker_env

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "cli_worker.py"), "--sigterm-rank1-at", "2", "--", SFT, f"trainer.output_dir={out}",
           *SMALL]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env(), cwd=ROOT)
    assert proc.returncode != 0
    assert proc.stderr.count(f"latest checkpoint: {out / 'checkpoints' / 'step_00000002'} (step 2)") == 1, \
        proc.stderr[-3000:]  # said once, by rank 0
    # before: rank 0, which prints for the run, was not signalled and said nothing of the stop
    assert proc.stderr.count("a stop signal reached another process: stopping after step 2") == 1, proc.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL]) == 0  # one process resumes the two ranks' save
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_a_signal_between_steps_names_the_step_it_stops_after(tmp_path, capsys):
    """Before: a signal from an on_step callback (e.g. during a held-out evaluation) said 'after step 3' and
    stopped after step 2."""
    from dare.trainer import load_train_config, run_training

    def on_step(trainer, record):
        if record["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    config = load_train_config(SFT, [f"trainer.output_dir={tmp_path / 'run'}", *SMALL])
    with pytest.raises(KeyboardInterrupt):
        run_training(config, on_step=on_step)
    assert "SIGTERM: stopping after step 2 and saving a checkpoint there" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_00000002"]


def test_a_signal_during_a_scheduled_save_stops_right_after_it(tmp_path, monkeypatch):
    """Before: the loop trained one more step and saved again (under pre-emption, time it may not have)."""
    out = tmp_path / "run"
    saves, real = [], Trainer.save

    def save(self):
        saves.append(self.step)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self)

    monkeypatch.setattr(Trainer, "save", save)
    assert main(["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.save_every=2"]) == 130
    assert saves == [2]


def test_the_interrupt_message_names_the_checkpoint_a_rerun_starts_from(tmp_path):
    from dare.trainer.resume import interrupt_message

    start = tmp_path / "other" / "checkpoints" / "step_00000002"
    assert interrupt_message(tmp_path, "dare train x", str(start)) == (
        f"no checkpoint in {tmp_path} yet (trainer.save_every sets how often one is saved): a rerun resumes from "
        f"{start} again")
    assert interrupt_message(tmp_path, "dare train x").endswith("a rerun starts from step 0")
