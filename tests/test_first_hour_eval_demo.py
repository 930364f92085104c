"""A new user's first hour with ``dare eval sweep`` and ``dare demo``: a bad sweep point fails before any point
runs, ``dare demo --quick`` and ``dare demo`` keep their own directories, and transformers' own bars and info
logs stay out of DARE's output."""

import json
import logging
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.cli import main

DATA = str(Path(__file__).resolve().parents[1] / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl")
SWEEP = ["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--gen-length", "8",
         "--template", "few_shot", "--shots", "0", "--no-chat", "--batch-size", "4", "--limit", "4", "--no-progress"]


# ------------------------------------------------------------------------------------------------ dare eval sweep
@pytest.mark.parametrize("grid, message", [
    ("decoder=quota,bogus", "point 1 (decoder=bogus): unknown decoder 'bogus'"),  # the family's sampler: after load
    ("threshold=0.9,-1", "point 1 (threshold=-1): threshold must be in (0, 1]"),
    ("engine=eager,graph", "point 1 (engine=graph): rollout engine 'graph' needs CUDA"),
])
@pytest.mark.usefixtures("single_thread")
def test_a_bad_sweep_point_fails_before_the_first_point_runs(grid, message, tmp_path, capsys):
    out = tmp_path / "sweep"
    line = one_line_error(capsys, *SWEEP, "--out", out, "--grid", grid)
    assert message in line, line
    assert not (out / "points").exists()  # point 0 did not run


def test_a_bad_point_naming_its_sampler_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import dare.eval.run

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the points were checked")

    monkeypatch.setattr(dare.eval.run, "load_for_eval", no_load)
    line = one_line_error(capsys, *SWEEP, "--out", tmp_path / "sweep", "--grid", "sampler=llada:steps=8,0")
    assert "point 1 (sampler=llada, steps=0): steps must be >= 1; got 0" in line
    line = one_line_error(capsys, *SWEEP, "--out", tmp_path / "sweep", "-o", "threshold=2", "--point", "steps=4")
    assert line == "error: threshold must be in (0, 1]; got 2"  # a common flag is not blamed on a point


# ------------------------------------------------------------------------------------------------ dare demo
@pytest.fixture
def demo_calls(monkeypatch, tmp_path):
    """Run ``dare demo`` in ``tmp_path`` with its work replaced by a stub recording each run's config."""
    from dare.demo import pipeline

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(pipeline, "_run", lambda config, log: calls.append(config) or {})
    return calls


def test_the_quick_and_the_full_demo_write_their_own_default_directories(demo_calls):
    from dare.demo import DemoConfig

    assert main(["demo", "--quick"]) == 0 and main(["demo"]) == 0
    assert [config.out_dir for config in demo_calls] == ["runs/demo-quick", "runs/demo"]
    assert DemoConfig.quick().out_dir == "runs/demo-quick" and DemoConfig().out_dir == "runs/demo"
    assert main(["demo", "--quick", "--out", "elsewhere"]) == 0 and demo_calls[-1].out_dir == "elsewhere"


@pytest.mark.usefixtures("single_thread")
def test_a_full_demo_after_a_quick_one_does_not_meet_it(tmp_path, capsys, monkeypatch):
    from dare.demo import pipeline

    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quick", "--sft-max-steps", "2", "--rl-steps", "1"]) == 0  # a real (shortened) quick run
    assert (tmp_path / "runs" / "demo-quick" / "report.json").is_file()
    capsys.readouterr()
    calls = []
    monkeypatch.setattr(pipeline, "_run", lambda config, log: calls.append(config) or {})
    assert main(["demo"]) == 0 and calls[0].out_dir == "runs/demo"  # no "other settings" error
    line = one_line_error(capsys, "demo", "--out", "runs/demo-quick")  # given explicitly: says what is there
    assert line.startswith("error: --out runs/demo-quick holds a --quick demo run with other settings (digits 3 -> 5")
    assert "give another --out" in line and len(calls) == 1


# ------------------------------------------------------------------------------------------------ transformers
def test_transformers_bars_and_info_logs_are_off_inside_dare_and_restored_after(tmp_path, capsys, monkeypatch):
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    from dare.models.tiny import write_tiny_checkpoint
    from dare.progress import quiet_transformers

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    logger = hf_logging.get_logger("transformers.modeling_utils")
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_info()
    hf_logging.enable_progress_bar()
    downloads = not hub.are_progress_bars_disabled()  # off only where HF_HUB_DISABLE_PROGRESS_BARS is set
    try:
        with quiet_transformers():
            write_tiny_checkpoint("llada", tmp_path / "tiny", seed=0)  # save_pretrained: "Writing model shards"
            assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
            assert hub.are_progress_bars_disabled()  # stderr is no terminal here: no download bars either
        assert "Writing model shards" not in capsys.readouterr().err
        assert hf_logging.get_verbosity() == logging.INFO and hf_logging.is_progress_bar_enabled()
        assert hub.are_progress_bars_disabled() != downloads
        monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice wins
        with quiet_transformers():
            assert logger.isEnabledFor(logging.INFO)
    finally:
        hf_logging.set_verbosity(verbosity)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def test_a_data_directory_of_several_formats_is_one_line(tmp_path):
    """``dare eval --data DIR`` / ``benchmark:NAME:DIR``: a JSONL file beside a CSV one was read as one set of rows
    (of two schemas); a README beside the data is not data and stays ignored."""
    from dare.errors import InputError
    from dare.eval.loaders import read_rows

    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    (tmp_path / "README.md").write_text("about the data")
    assert len(read_rows(tmp_path, benchmark="gsm8k")) == 1
    (tmp_path / "extra.csv").write_text("question,answer\nq2,2\n")
    with pytest.raises(InputError, match=r"^gsm8k: .* holds data files of several formats \(csv: extra.csv; "
                                         r"jsonl: test.jsonl\); give one file or a directory of one format$"):
        read_rows(tmp_path, benchmark="gsm8k")
