"""``dare eval sweep``: one benchmark under several decoder settings (accuracy vs tokens per forward)."""

import importlib.util
import json
from pathlib import Path

import pytest
from rollout_helpers import single_thread  # noqa: F401  (fixture)

from dare.cli import main
from dare.commands.eval_sweep import expand_grid, parse_point
from dare.errors import ConfigError
from dare.eval.sweep import tokens_per_forward

DATA = str(Path(__file__).resolve().parents[1] / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl")


def test_points_and_grids_parse_into_sampler_fields():
    assert parse_point("sampler=fastdllm,threshold=0.7") == {"sampler": "fastdllm", "threshold": 0.7}
    assert expand_grid("sampler=llada,cache=dual:steps=8,4") == [
        {"sampler": "llada", "cache": "dual", "steps": 8}, {"sampler": "llada", "cache": "dual", "steps": 4}]
    assert expand_grid("threshold=0.5,0.9") == [{"threshold": 0.5}, {"threshold": 0.9}]
    with pytest.raises(ConfigError, match="--grid expects"):
        expand_grid("sampler=llada:steps")
    with pytest.raises(ConfigError, match="--point expects"):
        parse_point("threshold")


def test_tokens_per_forward_pools_tokens_over_steps():
    assert tokens_per_forward([{"tokens": 8, "steps": 2}, {"tokens": 4, "steps": 4}]) == 2.0
    assert tokens_per_forward([{"tokens": 0, "steps": 0}]) is None


def test_sweep_writes_a_results_file_per_point_and_a_summary(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--gen-length", "8",
                 "--template", "few_shot", "--shots", "0", "--no-chat", "--batch-size", "4", "--out", str(out),
                 "--no-progress", "--grid", "sampler=fastdllm:threshold=0.99,0.001", "--grid", "sampler=llada:steps=8,2"])
    assert code == 0
    rows = json.loads((out / "summary.json").read_text())["points"]
    assert [r["series"] for r in rows] == ["fastdllm/threshold"] * 2 + ["llada/quota"] * 2
    assert [r["settings"] for r in rows][2:] == [{"sampler": "llada", "steps": 8}, {"sampler": "llada", "steps": 2}]
    for row in rows:  # the summary is the point's own results file
        results = json.loads((out / row["results"]).read_text())
        assert results["sampler"]["settings"]["sampler"] == row["settings"]["sampler"]
        assert row["accuracy"] == results["metrics"]["accuracy"] and row["nfe"] == results["timings"]["nfe"]
        assert row["tokens_per_forward"] == tokens_per_forward(results["samples"])
    strict, loose, one_per_step, four_per_step = (r["tokens_per_forward"] for r in rows)
    assert loose > strict and four_per_step > one_per_step  # more parallel settings decode more per forward
    assert rows[3]["mean_steps"] <= 2 < rows[2]["mean_steps"] <= 8
    assert "| point | series |" in (out / "summary.md").read_text()
    assert (out / "accuracy_vs_parallelism.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
    assert "| 3 | llada/quota |" in capsys.readouterr().out


def test_sweep_errors_are_one_line(tmp_path, capsys):
    base = ["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--out", str(tmp_path)]
    for extra, message in ((["--point", "sampler=llada,stpes=4"], "unknown sampler option 'stpes'"),
                           ([], "needs at least one --point or --grid"),
                           (["--point", "sampler=nope"], "unknown sampler 'nope'")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_multiple_choice_benchmark_is_swept_as_eval_run_mode_generate_evaluates_it(tmp_path, capsys):
    """Each point of a multiple-choice sweep is ``dare eval run --mode generate`` with the point's settings: the
    same prompts, predictions and metrics."""
    data = DATA.replace("tiny_gen", "tiny_mc")
    common = ["--model", "tiny:llada", "--benchmark", "mmlu", "--data", data, "--limit", "4", "--shots", "0",
              "--gen-length", "4", "--no-progress"]
    assert main(["eval", "sweep", *common, "--out", str(tmp_path / "sweep"), "--point", "sampler=llada,steps=2"]) == 0
    assert main(["eval", "run", *common, "--mode", "generate", "--sampler", "llada", "--steps", "2",
                 "--out", str(tmp_path / "run.json")]) == 0
    point = json.loads((tmp_path / "sweep" / "points" / "00.json").read_text())
    run = json.loads((tmp_path / "run.json").read_text())
    assert point["mode"] == run["mode"] == "generate"
    for key in ("prompt", "sampler", "metrics"):
        assert point[key] == run[key], key
    assert [s["prediction"] for s in point["samples"]] == [s["prediction"] for s in run["samples"]]


@pytest.mark.parametrize("flags, message", [
    (["--limit", "0"], "error: --limit must be positive (omit it to evaluate every problem); got 0"),
    (["--batch-size", "0"], "error: --batch-size must be >= 1; got 0"),
])
def test_a_bad_limit_or_batch_size_fails_before_any_work(flags, message, tmp_path, capsys, monkeypatch):
    """Before: the sweep created --out, loaded the model and only then failed (`gsm8k: no samples to evaluate`,
    `batch_size must be >= 1`), as `dare eval run` does not."""
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "sweep"
    assert main(["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--out", str(out),
                 "--point", "steps=2", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not out.exists()


@pytest.mark.parametrize("point, data, message", [
    ("decoder=bogus", DATA, "error: point 0 (decoder=bogus): unknown decoder 'bogus'; choose from: dynamic, "
                            "entropy_bounded, factor, quota, sequential, threshold"),
    ("steps=2", "{tmp}/bad.jsonl", "invalid JSON"),
])
def test_a_point_or_data_file_found_bad_after_the_checks_leaves_no_out_directory(point, data, message, tmp_path,
                                                                                  capsys):
    """A decoder name is checked once the model says its sampler, and the data once read: the sweep used to have
    created --out by then and left it behind, empty."""
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    out = tmp_path / "new" / "sweep"
    assert main(["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data",
                 data.replace("{tmp}", str(tmp_path)), "--out", str(out), "--gen-length", "8", "--point", point]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "new").exists()


def test_an_unwritable_out_directory_still_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import dare.eval.run

    monkeypatch.setattr(dare.eval.run, "load_for_eval", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sweep"
    assert main(["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--out", str(out),
                 "--point", "steps=2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --out {out}: cannot create the directory ({tmp_path / 'file'} is a file)"]
