"""dare runs: training runs side by side (metrics first -> last, the settings that differ), read from their output
directories without torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.runs import first_last

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
SMALL = ["trainer.progress=false", "trainer.max_steps=4", "trainer.batch_size=8", "trainer.micro_batch_size=8",
         "data.num_examples=32", "trainer.export=false"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for lr in ("1e-3", "3e-3"):
        assert main(["train", SFT, f"trainer.output_dir={root / ('lr' + lr)}", f"optim.lr={lr}", *SMALL]) == 0
    (root / "notes").mkdir()  # not a run: skipped when the parent directory is given
    return root


def test_runs_compare_metrics_and_the_settings_that_differ(two_runs, capsys):
    a, b = two_runs / "lr1e-3", two_runs / "lr3e-3"
    capsys.readouterr()
    assert main(["runs", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    losses = [[json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (a, b)]
    assert out[0] == "| run | algorithm | steps | loss first -> last |"
    for line, run, loss in zip(out[2:4], (a, b), losses):
        first, last = first_last(loss)
        assert line == f"| {run} | sft | 4 | {first:.4g} -> {last:.4g} |"
    assert f"| setting | {a} | {b} |" in out and "| optim.lr | 0.001 | 0.003 |" in out
    assert not any(line.startswith("| trainer.output_dir") for line in out)  # differs by construction
    assert main(["runs", str(two_runs), "--json"]) == 0  # the parent directory: every run in it
    data = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in data["runs"]] == [str(a), str(b)]
    assert data["settings"] == {"optim.lr": [0.001, 0.003]}
    assert data["runs"][0]["metrics"]["loss"]["records"] == 4


def test_first_last_are_window_means():
    assert first_last([]) is None
    assert first_last([3.0]) == (3.0, 3.0)
    assert first_last([1.0, 2.0, 3.0, 4.0]) == (1.5, 3.5)  # half the records each
    assert first_last(list(range(20))) == (2.0, 17.0)  # at most 5 each


def test_bad_run_directories_are_one_line_errors(tmp_path, capsys):
    assert one_line_error(capsys, "runs", str(tmp_path / "nope")) == (
        f"error: {tmp_path / 'nope'}: no such directory (give dare train output directories, e.g. runs/my_run)")
    assert one_line_error(capsys, "runs", str(tmp_path)) == (
        f"error: {tmp_path}: not a training run (no config.yaml) and holds none: give dare train output directories "
        "(trainer.output_dir)")


def test_dare_runs_imports_no_torch(two_runs):
    """It reads files only: an answer in a fraction of a second, also where torch is slow to import."""
    code = ("import sys; from dare.cli import main; main(['runs', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(two_runs)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_unknown_metrics_bad_runs_in_a_directory_and_nan_values(two_runs, tmp_path, capsys, caplog):
    """Before: --metrics with a key no run logged printed a column of '-', one unreadable run stopped a whole
    directory's comparison, an empty config.yaml passed as a run, and a NaN loss made --json print invalid JSON."""
    import shutil

    a = two_runs / "lr1e-3"
    assert main(["runs", str(a), "--metrics", "loss", "los"]) == 0
    assert "warning: --metrics los: logged by no run (did you mean loss?)" in caplog.text
    capsys.readouterr()
    assert one_line_error(capsys, "runs", str(a), "--metrics", "nope").startswith(
        "error: --metrics nope: logged by no run (logged keys: ")
    root = tmp_path / "runs"
    shutil.copytree(a, root / "good")
    (root / "empty").mkdir()
    (root / "empty" / "config.yaml").write_text("")
    nan = root / "nan"
    shutil.copytree(a, nan)
    lines = (nan / "metrics.jsonl").read_text().splitlines()
    (nan / "metrics.jsonl").write_text("\n".join(['{"step": 1, "loss": NaN}', *lines[1:]]) + "\n")
    assert one_line_error(capsys, "runs", str(root / "empty")) == (
        f"error: {root / 'empty' / 'config.yaml'}: not a dare train config (a mapping of sections)")
    caplog.clear()
    assert main(["runs", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert [r["run"] for r in data["runs"]] == [str(root / "good"), str(nan)]
    assert f"warning: leaving out {root / 'empty'}" in caplog.text
    assert data["runs"][1]["metrics"]["loss"]["first"] is None  # the first window holds the NaN


def test_a_directory_of_runs_is_searched_at_any_depth(tmp_path, capsys):
    """``dare demo`` writes a run per phase (``runs/demo/sft``, ``runs/demo/rl``): ``dare runs runs/`` used to say
    the directory holds no run, looking one level down only. A run's own directories (a checkpoint's config.yaml)
    and hidden directories are not searched; runs are named by their paths under the directory given."""
    root = tmp_path / "runs"

    def fake_run(path, algorithm: str, lr: float) -> None:
        path.mkdir(parents=True)
        (path / "config.yaml").write_text(f"algorithm:\n  name: {algorithm}\noptim:\n  lr: {lr}\n")
        (path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')

    fake_run(root / "a", "sft", 0.1)
    fake_run(root / "demo" / "sft", "sft", 0.2)
    fake_run(root / "demo" / "rl", "d1", 0.3)
    fake_run(root / "demo" / "rl" / "checkpoints" / "step_00000002", "d1", 0.4)  # inside a run: not searched
    fake_run(root / ".trash" / "old", "sft", 0.5)
    (root / "demo" / "data").mkdir()
    assert main(["runs", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in data["runs"]] == [str(root / "a"), str(root / "demo" / "rl"), str(root / "demo" / "sft")]
    assert data["settings"]["optim.lr"] == [0.1, 0.3, 0.2]
    assert main(["runs", str(root / "demo")]) == 0
    assert f"| {root / 'demo' / 'rl'} | d1 | 2 |" in capsys.readouterr().out


def test_a_setting_another_algorithm_lacks_is_not_shown_as_unset(tmp_path, capsys):
    """bgpo has no ``kl_coef``: the table showed ``unset`` there, which reads as "left at its default"."""
    for name, algorithm in (("d1", "name: d1\n  kl_coef: 0.04\n  dual_clip: null"), ("bgpo", "name: bgpo\n  dual_clip: 3")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(f"algorithm:\n  {algorithm}\n")
        (tmp_path / name / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert main(["runs", str(tmp_path / "d1"), str(tmp_path / "bgpo")]) == 0
    out = capsys.readouterr().out
    assert "| algorithm.kl_coef | 0.04 | n/a |" in out
    assert "| algorithm.dual_clip | unset | 3 |" in out  # set to None: its default
    assert "(n/a: not a setting of that run's algorithm" in out
