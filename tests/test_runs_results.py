"""dare runs with ``dare eval`` results files: their metrics side by side and the settings in which they differ.
Before: ``dare runs evals/a.json evals/b.json`` said ``no such directory`` and ``dare runs evals/`` not a training
run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]
EVAL = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data",
        str(ROOT / "configs/lm_eval/data/tiny_gen.jsonl"), "--limit", "2", "--gen-length", "4", "--no-chat",
        "--no-progress"]


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """Two results files written by the real CLI, differing in one decoding setting (the temperature); the second's
    metrics edited so that they differ too (the tiny model scores 0 either way) and it has one metric more."""
    root = tmp_path_factory.mktemp("evals")
    greedy, warm = root / "greedy.json", root / "sub" / "warm.json"
    warm.parent.mkdir()
    assert main([*EVAL, "--out", str(greedy)]) == 0
    assert main([*EVAL, "--temperature", "0.7", "--out", str(warm)]) == 0
    data = json.loads(warm.read_text())
    data["metrics"] = {**data["metrics"], "accuracy": 0.5, "pass@2": 1.0}
    warm.write_text(json.dumps(data))
    return greedy, warm


def test_two_results_files_show_every_metric_and_only_the_settings_that_differ(evals, capsys):
    greedy, warm = evals
    capsys.readouterr()
    assert main(["runs", str(greedy), str(warm)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"| metric | {greedy} | {warm} |"
    assert "| accuracy | 0 | 0.5 |" in out
    assert "| reward | 0 | 0 |" in out
    assert "| pass@2 | missing | 1 |" in out  # in one file only
    assert f"| setting | {greedy} | {warm} |" in out
    assert "| sampler.settings.temperature | 0 | 0.7 |" in out
    settings = [line.split(" | ")[0] for line in out[out.index(f"| setting | {greedy} | {warm} |") + 2:]]
    assert settings == ["| sampler.settings.temperature"]  # equal settings, timings, command, created: not shown
    assert not any(key in line for line in out for key in ("gen_length", "benchmark", "created", "command", "timings"))


def test_results_json_output(evals, capsys):
    greedy, warm = evals
    capsys.readouterr()
    assert main(["runs", str(greedy), str(warm), "--json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["results"] == [str(greedy), str(warm)]
    assert data["metrics"] == {"accuracy": [0.0, 0.5], "reward": [0.0, 0.0], "pass@2": [None, 1.0]}
    assert data["settings"] == {"sampler.settings.temperature": [0.0, 0.7]}
    assert main(["runs", str(greedy), str(warm), "--json", "--metrics", "accuracy"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"] == {"accuracy": [0.0, 0.5]}


def test_a_directory_of_results_files(evals, capsys):
    """Every results file below it at any depth, by path; other JSON files there are passed over."""
    greedy, warm = evals
    root = greedy.parent
    (root / "notes.json").write_text('{"not": "results"}')
    (root / "data.jsonl").write_text('{"question": "1+1"}\n')
    capsys.readouterr()
    assert main(["runs", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["results"] == [str(greedy), str(warm)]
    assert data["settings"] == {"sampler.settings.temperature": [0.0, 0.7]}
    assert main(["runs", str(root)]) == 0
    assert "| sampler.settings.temperature | 0 | 0.7 |" in capsys.readouterr().out


def test_files_that_are_not_results_files_and_mixed_kinds_are_one_line_errors(evals, tmp_path, capsys):
    greedy, _ = evals
    other = tmp_path / "config.json"
    other.write_text('{"model_type": "llada"}')
    assert one_line_error(capsys, "runs", greedy, other) == (
        f"error: {other}: not a DARE results file (schema None, not 'dare.eval.results/1'); give dare eval "
        "run/score --out files or dare train output directories")
    text = tmp_path / "broken.json"
    text.write_text("{nope")
    assert one_line_error(capsys, "runs", greedy, text).startswith(f"error: {text}: not a DARE results file (not JSON")
    assert one_line_error(capsys, "runs", tmp_path / "missing.json") == (
        f"error: {tmp_path / 'missing.json'}: no such file (give dare eval run/score --out results files, or dare "
        "train output directories)")
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("optim:\n  lr: 0.1\n")
    assert one_line_error(capsys, "runs", run, greedy) == (
        f"error: training runs ({run}) and results files ({greedy}) given together: compare one kind at a time")
    assert one_line_error(capsys, "runs", greedy, "--metrics", "nope").startswith(
        "error: --metrics nope: in no results file (metrics: accuracy, reward)")


def test_comparing_results_files_imports_no_torch(evals):
    code = ("import sys; from dare.cli import main; assert main(['runs', *sys.argv[1:]]) == 0; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, evals)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_dare_runs_knows_the_results_schema_dare_eval_writes():
    from dare.eval.results import SCHEMA
    from dare.runs import RESULTS_SCHEMA

    assert RESULTS_SCHEMA == SCHEMA
