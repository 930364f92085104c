"""benchmarks/scaling.py on CPU (gloo, tiny LLaDA): ``dare train`` under torchrun with 1 and 2 processes gives the
same losses and final weights for SFT and a d1 RL step, and the timings and scaling are reported; bad arguments
are one-line errors."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("scaling_benchmark", ROOT / "benchmarks" / "scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("recipe", ["sft", "d1"])
def test_two_processes_match_one(bench, recipe, tmp_path, capsys):
    out = tmp_path / "scaling.json"
    assert bench.main(["--model", "tiny", "--device", "cpu", "--nproc", "1", "2", "--steps", "2",
                       "--recipes", recipe, "--workdir", str(tmp_path / "runs"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == "scaling" and data["nproc"] == [1, 2] and data["torch"]
    single, double = data["results"]
    assert (single["recipe"], single["nproc"], double["recipe"], double["nproc"]) == (recipe, 1, recipe, 2)
    for r in (single, double):
        assert "error" not in r, r.get("error")
        assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])
        assert r["step_s"] > 0 and r["scaling"] > 0
    for ours, theirs in zip(double["losses"], single["losses"]):
        assert abs(ours - theirs) <= 1e-4 * max(abs(theirs), 1e-3)
    assert double["loss_max_rel_diff"] <= 1e-4 and double["equal_within_tolerance"]
    assert double["weights_max_rel_diff"] < 1e-3
    assert double["scaling"] == pytest.approx(double["steps_per_s"] / single["steps_per_s"])
    assert f"| {recipe} | 2 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [(["--nproc", "0"], "--nproc takes process counts >= 1"),
                                            (["--steps", "0"], "--steps takes a number >= 1"),
                                            (["--recipes", "dpo"], "invalid choice: 'dpo'")])
def test_bad_arguments_are_one_line_errors(bench, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err.strip().splitlines()[-1]


def test_a_failing_or_hung_run_is_reported_not_raised(bench):
    """A run's error: a one-line head and the end of its stderr; a run past the limit is killed."""
    import sys

    env = bench.run_env("cpu")
    error = bench.run([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], env, 60)
    assert error.splitlines()[0].startswith("exit status 3;") and error.splitlines()[-1] == "boom"
    error = bench.run([sys.executable, "-c", "import time; time.sleep(60)"], env, 1)
    assert error.startswith("killed after the hard limit of 1 s")
    assert bench.run([sys.executable, "-c", "pass"], env, 60) is None
