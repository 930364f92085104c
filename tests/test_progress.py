"""Progress bars in logs: when stderr is not a terminal (slurm output, ``2> log``, ``| tee``; pytest's capture
here) every bar writes whole ``\\n`` lines, never tqdm's ``\\r`` redraws: at most one every
``DARE_PROGRESS_INTERVAL`` seconds and a final one; on a terminal it is tqdm's bar (:mod:`dare.progress`)."""

import math
import re
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

import dare.progress as progress
from dare.cli import main
from dare.errors import ConfigError
from dare.progress import PlainProgress, close_progress_bars, progress_bar, progress_interval

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clock(monkeypatch):
    """A fake clock for the bars: set ``clock[0]`` to the time (seconds) the next reading returns."""
    now = [0.0]
    monkeypatch.setattr(progress, "monotonic", lambda: now[0])
    monkeypatch.delenv("DARE_PROGRESS_INTERVAL", raising=False)
    return now


def test_a_log_gets_rate_limited_lines_and_a_final_line_without_carriage_returns(clock, capfd):
    bar = progress_bar(512, "decoding", unit="tok", leave=False)
    assert isinstance(bar, PlainProgress)  # capfd: stderr is no terminal
    for at, n in [(10, 100), (29.9, 20), (30, 20), (45, 100), (60, 100), (70, 172)]:
        clock[0] = at
        bar.update(n)
    clock[0] = 71
    bar.close()
    bar.close()  # a second close writes nothing more
    captured = capfd.readouterr()
    assert captured.out == "" and "\r" not in captured.err
    assert captured.err.splitlines() == [
        "decoding: 140/512 tok (27%), 4.67 tok/s, 1m20s left",  # 30 s after the start, not at 10 or 29.9 s
        "decoding: 340/512 tok (66%), 5.67 tok/s, 30s left",  # 30 s after the last line, not at 45 s
        "decoding: 512/512 tok (100%), 7.21 tok/s, in 1m11s",  # at 70 s it was complete: only the final line
    ]


def test_a_transient_bar_leaves_a_final_line_only_after_a_progress_line(clock, capfd):
    """Each RL step's rollout decodes under a transient bar: a short one must not add a line per step to the log."""
    short = progress_bar(64, "decoding", unit="tok", leave=False)
    clock[0] = 12
    short.update(64)
    short.close()
    kept = progress_bar(64, "tokenizing", unit="row")  # leave=True: its final line always
    kept.update(64)
    kept.close()
    assert capfd.readouterr().err.splitlines() == ["tokenizing: 64/64 row (100%), in 0s"]
    long = progress_bar(64, "decoding", unit="tok", leave=False)
    clock[0] = 50
    long.update(10)
    clock[0] = 60
    long.update(54)
    long.close()
    assert capfd.readouterr().err.splitlines() == ["decoding: 10/64 tok (15%), 0.26 tok/s, 3m25s left",
                                                   "decoding: 64/64 tok (100%), 1.33 tok/s, in 48s"]


def test_the_interval_comes_from_the_environment(clock, capfd, monkeypatch):
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "5")
    bar = progress_bar(None, "sandbox", unit="program")  # no total: counts and rates only
    for at in (1, 4.9, 5, 9, 10, 14):
        clock[0] = at
        bar.update(2)
    bar.close()
    assert capfd.readouterr().err.splitlines() == ["sandbox: 6 program, 1.20 program/s",
                                                   "sandbox: 10 program, 1.00 program/s",
                                                   "sandbox: 12 program, 0.86 program/s, in 14s"]
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "0")  # every update
    bar = progress_bar(3, "x")
    for _ in range(3):
        clock[0] += 1
        bar.update()
    bar.close()
    assert capfd.readouterr().err.splitlines() == ["x: 1/3 it (33%), 1.00 it/s, 2s left",
                                                   "x: 2/3 it (66%), 1.00 it/s, 1s left",
                                                   "x: 3/3 it (100%), 1.00 it/s, in 3s"]


@pytest.mark.parametrize("value, seconds", [(None, 30.0), ("", 30.0), ("0", 0.0), ("2.5", 2.5), (" 10 ", 10.0),
                                            ("inf", math.inf)])
def test_valid_intervals(value, seconds, monkeypatch):
    if value is None:
        monkeypatch.delenv("DARE_PROGRESS_INTERVAL", raising=False)
    else:
        monkeypatch.setenv("DARE_PROGRESS_INTERVAL", value)
    assert progress_interval() == seconds


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "30s"])
def test_a_bad_interval_is_a_one_line_error_naming_the_variable(value, monkeypatch, capsys):
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", value)
    with pytest.raises(ConfigError) as err:
        progress_bar(10, "x")  # a bar in a log reads it
    message = str(err.value)
    assert message.startswith("DARE_PROGRESS_INTERVAL must be a number of seconds >= 0") and repr(value) in message
    # the dare command reads it before any work, as the other DARE_* switches
    line = one_line_error(capsys, "generate", "--model", "tiny:llada", "--prompt", "Hi")
    assert line == f"error: {message}"


def test_nothing_is_written_by_a_disabled_bar_or_one_that_did_nothing(clock, capfd):
    bar = progress_bar(10, "x", disable=True)  # lm-eval's disable_tqdm, ranks other than 0
    clock[0] = 100
    bar.update(10)
    bar.close()
    assert list(progress_bar(3, "x", disable=True, iterable=iter("abc"))) == ["a", "b", "c"]
    progress_bar(10, "x").close()  # closed with nothing done
    resumed = progress_bar(10, "train", initial=10)  # a resumed run with no step left
    resumed.close()
    assert capfd.readouterr().err == ""


def test_iterating_postfix_description_and_with(clock, capfd):
    bar = progress_bar(3, "sandbox", iterable=(c for c in "abc"))  # a generator: total given, as run_many does
    assert list(bar) == ["a", "b", "c"] and bar.closed  # exhausted: closed, as tqdm does
    assert progress_bar(None, "tokenizing", iterable=[1, 2]).total == 2  # a sized iterable gives the total
    with progress_bar(4, "train", initial=1) as bar:
        clock[0] = 2
        bar.set_postfix(loss="0.5000", lr=1e-4, refresh=False)
        bar.update(1)
        bar.set_description("train (stopped early at step 2)", refresh=True)
    assert bar.closed
    assert capfd.readouterr().err.splitlines() == [
        "sandbox: 3/3 it (100%), in 0s",  # no time passed on the fake clock: no rate
        "train (stopped early at step 2): 2/4 it (50%), 0.50 it/s, in 2s, loss=0.5000, lr=0.0001",
    ]


def test_an_abandoned_iteration_adds_no_line_after_the_error(clock, capfd):
    def failing():
        yield 1
        raise ValueError("bad record")

    with pytest.raises(ValueError):
        for _ in progress_bar(2, "tokenizing", iterable=failing()):
            pass
    assert capfd.readouterr().err == ""


def test_on_a_terminal_it_is_tqdm_s_bar(monkeypatch, capsys):
    from tqdm import tqdm

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "abc")  # not read for a terminal's bar
    bar = progress_bar(512, "decoding", unit="tok", leave=False, initial=3)
    try:
        assert isinstance(bar, tqdm)
        assert (bar.total, bar.desc, bar.unit, bar.leave, bar.n) == (512, "decoding", "tok", False, 3)
    finally:
        bar.close()
    bar = progress_bar(2, "sandbox", iterable=iter("ab"), dynamic_ncols=True)
    assert isinstance(bar, tqdm) and bar.dynamic_ncols and list(bar) == ["a", "b"]
    assert "\r" in capsys.readouterr().err  # tqdm's redraws (on a terminal they are the bar)


def test_close_progress_bars_closes_both_kinds(clock, capsys):
    from tqdm import tqdm

    drawn = tqdm(total=10, desc="drawn", file=sys.stderr)
    drawn.update(2)
    plain = progress_bar(10, "plain")
    clock[0] = 1
    plain.update(3)
    close_progress_bars()
    assert drawn not in tqdm._instances and plain.closed and plain not in list(progress._OPEN)
    assert capsys.readouterr().err.splitlines()[-1] == "plain: 3/10 it (30%), 3.00 it/s, in 1s"
    close_progress_bars()  # nothing left open: nothing written
    assert capsys.readouterr().err == ""


def test_interrupted_gets_a_line_of_its_own_after_a_plain_bar(clock, capsys, monkeypatch):
    import dare.commands.tiny as command

    def run(args):
        bar = progress_bar(10, "train")
        clock[0] = 2
        bar.update(3)
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "run", run)
    assert main(["tiny", "--family", "llada", "--out", "x"]) == 130
    assert capsys.readouterr().err == "train: 3/10 it (30%), 1.50 it/s, in 2s\ninterrupted\n"


def test_every_bar_is_made_by_the_factory():
    """No module draws a tqdm bar of its own (``tqdm.write`` of a message is fine)."""
    src = ROOT / "src" / "dare"
    makers = [f"{path.relative_to(src)}: {line.strip()}" for path in sorted(src.rglob("*.py"))
              if path != src / "progress.py"
              for line in path.read_text().splitlines() if re.search(r"\btqdm\s*\(", line)]
    assert makers == []


def test_dare_generate_and_train_write_plain_lines_to_a_log(tmp_path, capfd, monkeypatch):
    """The commands themselves, stderr captured: no ``\\r`` anywhere (transformers' checkpoint-writing bar
    included), each bar's final line with its counts."""
    monkeypatch.delenv("DARE_PROGRESS_INTERVAL", raising=False)
    generate = ["generate", "--model", "tiny:llada", "--prompt", "Hi", "--prompt", "Yo", "--gen-length", "16"]
    assert main(generate) == 0
    assert capfd.readouterr().err == ""  # a decoding shorter than the interval: its transient bar writes nothing
    monkeypatch.setenv("DARE_PROGRESS_INTERVAL", "0")  # a line at every update
    assert main(generate) == 0
    err = capfd.readouterr().err
    assert "\r" not in err and re.search(r"(?m)^decoding: 32/32 tok \(100%\), [\d.]+ tok/s, in \d+s\n\Z", err), err
    assert main(["train", str(ROOT / "configs/llada/sft_tiny.yaml"), f"trainer.output_dir={tmp_path / 'run'}",
                 "trainer.max_steps=3", "data.num_examples=16", "trainer.batch_size=4"]) == 0
    err = capfd.readouterr().err
    assert "\r" not in err, err
    lines = err.splitlines()
    assert re.fullmatch(r"train: 3/3 it \(100%\), [\d.]+ it/s, in \d+s, loss=[\d.]+, lr=[\d.e+-]+", lines[-1]), lines
    assert any(line.startswith("tokenizing: 16/16 it (100%)") for line in lines), lines


def test_transformers_loading_bar_stays_out_of_a_log(tiny_dirs, capfd):
    """``from_pretrained``'s "Loading weights" bar wrote its redraws into logs; it shows on a terminal only, and
    the caller's setting of transformers' bars is restored after the load."""
    from transformers.utils import logging as hf_logging

    from dare.models.loading import load_model

    assert hf_logging.is_progress_bar_enabled()
    load_model(str(tiny_dirs["llada"]))
    assert "Loading" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
