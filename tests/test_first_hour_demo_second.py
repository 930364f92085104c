"""A new user's first hour with ``dare demo``, second pass: every error names the flag the user typed, ``--help``
says what ``--quick`` uses, and ``--device auto`` / ``--threads 0`` count as the device and thread count they
resolve to (so ``--device cpu`` on a CPU machine is the default run, not one of "other settings")."""

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.demo import DemoConfig
from dare.demo.pipeline import check_config, run_settings
from dare.errors import ConfigError


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """Run ``dare demo`` in ``tmp_path`` with its work replaced by a stub that records each run's config (the
    checks of the settings and of ``--out`` run before it)."""
    from dare.demo import pipeline

    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(pipeline, "_run", lambda config, log: calls.append(config) or {})
    return calls


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine has no CUDA (whatever the test machine has)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ------------------------------------------------------------------------------------------------ 1, 4. flags
@pytest.mark.parametrize("flags, message", [
    (["--rl-steps", "0"], "--rl-steps must be >= 1; got 0"),
    (["--rl-steps", "-3"], "--rl-steps must be >= 1; got -3"),
    (["--quick", "--rl-steps", "0"], "--rl-steps must be >= 1; got 0"),
    (["--sft-max-steps", "0"], "--sft-max-steps must be >= 1; got 0"),
    (["--quick", "--sft-max-steps", "-1"], "--sft-max-steps must be >= 1; got -1"),
    (["--sft-target", "1.5"], "--sft-target must be in (0, 1]; got 1.5"),
    (["--sft-target", "0"], "--sft-target must be in (0, 1]; got 0.0"),
    (["--sft-target", "nan"], "--sft-target must be in (0, 1]; got nan"),
    (["--rl-lr", "0"], "--rl-lr must be a positive finite number; got 0.0"),
    (["--rl-lr", "-0.001"], "--rl-lr must be a positive finite number; got -0.001"),
    (["--rl-lr", "nan"], "--rl-lr must be a positive finite number; got nan"),  # was accepted: nan <= 0 is False
    (["--rl-lr", "inf"], "--rl-lr must be a positive finite number; got inf"),
    (["--seed", "-1"], "--seed must be in [0, 4294967295]; got -1"),
    (["--seed", "99999999999999999999"], "--seed must be in [0, 4294967295]; got 99999999999999999999"),  # traceback
    (["--threads", "-1"], "--threads must be >= 1 (or 0 = torch's choice); got -1"),
    (["--algorithm", "nope"], "--algorithm: unknown demo algorithm 'nope'"),
    (["--algorithm", "vrpo"], "--algorithm vrpo trains on preference pairs, not rollouts"),
])
def test_a_bad_demo_value_is_one_line_naming_the_flag(flags, message, no_work, tmp_path, capsys):
    line = one_line_error(capsys, "demo", *flags)
    assert line.startswith(f"error: {message}"), line
    field = message.split()[0].rstrip(":")[2:].replace("-", "_")
    assert "_" not in field or field not in line  # not the Python field (rl_steps) either
    assert not no_work and not (tmp_path / "runs").exists()  # before any work


@pytest.mark.parametrize("flag, value, kind", [
    ("--rl-steps", "abc", "int"), ("--rl-steps", "2.5", "int"), ("--sft-max-steps", "ten", "int"),
    ("--seed", "x", "int"), ("--threads", "one", "int"), ("--sft-target", "30%", "float"), ("--rl-lr", "fast", "float"),
])
def test_a_non_numeric_demo_value_is_one_line_naming_the_flag(flag, value, kind, no_work, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["demo", flag, value])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and not no_work
    assert f"argument {flag}: invalid {kind} value: '{value}'" in lines[0]


def test_python_callers_see_the_field_names():
    for config, message in [(DemoConfig(rl_steps=0), "rl_steps must be >= 1; got 0"),
                            (DemoConfig(sft_target=2.0), "sft_target must be in (0, 1]; got 2.0"),
                            (DemoConfig(rl_lr=float("nan")), "rl_lr must be a positive finite number; got nan"),
                            (DemoConfig(sft_lr=0.0), "sft_lr must be a positive finite number; got 0.0"),
                            (DemoConfig(seed=-1), "seed must be in [0, 4294967295]; got -1"),
                            (DemoConfig(layers=0), "layers must be >= 1; got 0"),
                            (DemoConfig(rl_steps="5"), "rl_steps must be an integer; got the string '5'"),
                            (DemoConfig(rl_steps=True), "rl_steps must be an integer; got a bool (True)"),
                            (DemoConfig(algorithm="vrpo"), "algorithm 'vrpo' trains on preference pairs")]:
        with pytest.raises(ConfigError) as err:
            check_config(config)
        assert str(err.value).startswith(message), str(err.value)


# ------------------------------------------------------------------------------------------------ 2. --help
def help_text(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_says_what_quick_uses_for_each_value_quick_changes(capsys):
    from dare.demo.pipeline import QUICK

    text = help_text(capsys)
    for flag, key in [("--sft-max-steps", "sft_max_steps"), ("--sft-target", "sft_target"), ("--rl-steps", "rl_steps")]:
        full, quick = getattr(DemoConfig(), key), QUICK[key]
        assert f"(default {full:g}; {quick:g} with --quick)" in text, (flag, text)
    assert "(default 0.0003)" in text and "(default 0)" in text  # --rl-lr, --seed: --quick keeps them
    assert f"(default: {DemoConfig().out_dir}; {QUICK['out_dir']} with --quick)" in text
    assert f"{QUICK['digits']}-digit numbers" in text and f"{QUICK['layers']}-layer" in text


def test_help_reads_the_values_it_shows_from_the_settings_themselves(capsys, monkeypatch):
    from dare.demo import pipeline

    monkeypatch.setitem(pipeline.QUICK, "rl_steps", 7)  # one source of truth: help follows the values
    text = help_text(capsys)
    assert f"(default {DemoConfig().rl_steps}; 7 with --quick)" in text


def test_flags_left_out_take_the_settings_defaults(no_work):
    assert main(["demo"]) == 0 and main(["demo", "--quick"]) == 0
    full, quick = no_work
    assert full == DemoConfig(out_dir=full.out_dir) and quick == DemoConfig.quick()
    assert main(["demo", "--threads", "0", "--out", "t"]) == 0 and no_work[-1].threads is None  # torch's choice


# ------------------------------------------------------------------------------------------------ 3. devices
def mark(out, **overrides):
    """``out`` as an earlier demo run of these settings left it."""
    from dare.outputs import mark_output

    mark_output(out, "demo", settings=run_settings(DemoConfig(**overrides)))


@pytest.mark.usefixtures("cpu_only")
@pytest.mark.parametrize("before, now", [("cpu", "auto"), ("auto", "cpu")])
def test_device_auto_on_a_cpu_machine_is_the_same_run_as_device_cpu(before, now, no_work, tmp_path, capsys):
    out = tmp_path / "demo"
    mark(out, device=before)
    assert main(["demo", "--out", str(out), "--device", now]) == 0 and len(no_work) == 1
    assert "replacing the earlier demo run there (same settings)" in capsys.readouterr().out
    assert run_settings(DemoConfig(device="auto"))["device"] == "cpu"  # recorded as the device it ran on


@pytest.mark.usefixtures("cpu_only")
def test_a_marker_recording_auto_is_read_as_the_device_auto_resolves_to(no_work, tmp_path, capsys):
    import json

    from dare.outputs import OUTPUT_MARKER

    out = tmp_path / "demo"
    mark(out)
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    marker["settings"]["device"] = "auto"  # as a demo before this fix recorded `--device auto`
    (out / OUTPUT_MARKER).write_text(json.dumps(marker))
    assert main(["demo", "--out", str(out)]) == 0 and len(no_work) == 1


def test_device_auto_on_a_cuda_machine_differs_from_device_cpu(no_work, tmp_path, capsys, monkeypatch):
    import torch

    out = tmp_path / "demo"
    mark(out, device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    line = one_line_error(capsys, "demo", "--out", out, "--device", "auto")
    assert "other settings (--device cpu -> cuda)" in line and not no_work


def test_threads_0_counts_as_the_thread_count_torch_chooses(no_work, tmp_path, monkeypatch, capsys):
    import torch

    out = tmp_path / "demo"
    mark(out)  # --threads 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert main(["demo", "--out", str(out), "--threads", "0"]) == 0 and len(no_work) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    line = one_line_error(capsys, "demo", "--out", out, "--threads", "0")
    assert "other settings (--threads 1 -> 4)" in line and len(no_work) == 1


def test_other_settings_are_named_by_their_flags(no_work, tmp_path, capsys):
    out = tmp_path / "demo"
    mark(out)
    line = one_line_error(capsys, "demo", "--out", out, "--rl-steps", "2", "--seed", "3")
    assert f"holds a demo run with other settings (--rl-steps {DemoConfig().rl_steps} -> 2, --seed 0 -> 3)" in line
    line = one_line_error(capsys, "demo", "--out", out, "--quick")  # settings no flag sets keep their names
    assert "a full demo run (not --quick) with other settings (digits 5 -> 3," in line and not no_work
