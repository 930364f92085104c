"""`dare eval run/score --out` and `dare eval sweep --out` never write over their own inputs or over files an
evaluation did not write: a one-line error before any work, nothing written; re-running into an earlier results
file or sweep directory still works."""

import json
import os
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main
from dare.errors import ConfigError
from dare.eval.results import SCHEMA, is_results_file
from dare.outputs import OUTPUT_MARKER

TINY_GEN = Path(__file__).resolve().parents[1] / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl"
EARLIER = "exists and is not an earlier `dare eval run`/`dare eval score` results file; give a new file name " \
          "(nothing was written)"
NOT_A_SWEEP = "the directory is not empty and is not an earlier `dare eval sweep` output; give a new or empty " \
              "directory (nothing was written)"


def cli(args) -> int:
    return main([str(a) for a in args])


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` (relative path -> bytes): what a refused command must leave as it was."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model, evaluating or scoring fails the test: a refused --out must stop the command first."""
    import dare.eval
    import dare.eval.run

    def never(*args, **kwargs):
        raise AssertionError("worked although --out is refused")

    for name in ("evaluate", "score_predictions"):
        monkeypatch.setattr(dare.eval, name, never)
    monkeypatch.setattr(dare.eval.run, "load_for_eval", never)


@pytest.fixture
def data(tmp_path) -> Path:
    """A GSM8K-style data file of the user's."""
    path = tmp_path / "tg.jsonl"
    path.write_bytes(TINY_GEN.read_bytes())
    return path


@pytest.fixture
def predictions(tmp_path) -> Path:
    """A GSM8K predictions file of the user's."""
    rows = [{"id": "a", "prediction": "The answer is 7.", "answer": "#### 7"},
            {"id": "b", "prediction": "The answer is 3.", "answer": "#### 4"}]
    path = tmp_path / "p2.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def score(predictions, *extra):
    return ["eval", "score", "--benchmark", "gsm8k", "--predictions", predictions, "--json", *extra]


def run(data, *extra):
    return ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", data, "--limit", "2",
            "--gen-length", "4", "--no-chat", "--no-progress", "--json", *extra]


def sweep(out, *extra, data=TINY_GEN):
    return ["eval", "sweep", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", data, "--limit", "1",
            "--gen-length", "4", "--shots", "0", "--no-chat", "--no-progress", "--out", out,
            "--point", "sampler=llada", *extra]


# ------------------------------------------------------------------------------ --out is one of the inputs
def test_score_refuses_to_write_over_its_predictions(predictions, tmp_path, capsys, no_work, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    os.symlink(predictions, tmp_path / "link.json")
    before = snapshot(tmp_path)
    line = one_line_error(capsys, *score(predictions, "--out", predictions))
    assert line == (f"error: --out {predictions}: is the same file as --predictions {predictions}; give another "
                    "file name (nothing was written)")
    for out in ("./sub/../p2.jsonl", "link.json"):  # another spelling of the same path, a symlink to it
        line = one_line_error(capsys, *score("p2.jsonl", "--out", out))
        assert line.startswith(f"error: --out {Path(out)}: is the same file as --predictions p2.jsonl; ")
    assert snapshot(tmp_path) == before and (tmp_path / "link.json").is_symlink()


def test_score_refuses_to_write_over_its_data(predictions, data, tmp_path, capsys, no_work):
    before = snapshot(tmp_path)
    line = one_line_error(capsys, *score(predictions, "--data", data, "--out", data))
    assert line.startswith(f"error: --out {data}: is the same file as --data {data}; ")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("flag", ["--data", "--fewshot-data"])
def test_run_refuses_to_write_over_its_data(flag, data, tmp_path, capsys, no_work):
    pool = tmp_path / "pool.jsonl"
    pool.write_bytes(data.read_bytes())
    target = data if flag == "--data" else pool
    before = snapshot(tmp_path)
    line = one_line_error(capsys, *run(data, "--fewshot-data", pool, "--shots", "1", "--out", target))
    assert line == (f"error: --out {target}: is the same file as {flag} {target}; give another file name "
                    "(nothing was written)")
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ --out is someone else's file
def test_run_never_overwrites_a_checkpoint_config(data, tmp_path, capsys, no_work):
    from dare.models.tiny import write_tiny_checkpoint

    final = write_tiny_checkpoint("llada", tmp_path / "runs" / "demo" / "rl" / "final")
    capsys.readouterr()
    before = snapshot(tmp_path)
    line = one_line_error(capsys, *run(data, "--out", final / "config.json"))
    assert line == f"error: --out {final / 'config.json'}: {EARLIER}"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("content", [b"my notes\n", b"", b'{"schema": "something else"}', b'{"a": 1}\n{"b": 2}\n',
                                     b"\x00\x01binary"])
def test_any_other_existing_file_is_refused(content, predictions, tmp_path, capsys, no_work):
    other = tmp_path / "other.json"
    other.write_bytes(content)
    before = snapshot(tmp_path)
    assert one_line_error(capsys, *score(predictions, "--out", other)) == f"error: --out {other}: {EARLIER}"
    assert snapshot(tmp_path) == before


def test_a_refused_out_creates_no_directory(predictions, tmp_path, capsys, no_work):
    (tmp_path / "taken.txt").write_text("mine")
    one_line_error(capsys, *score(predictions, "--out", tmp_path / "taken.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p2.jsonl", "taken.txt"]


# ------------------------------------------------------------------------------ earlier results are replaced
def test_score_and_run_replace_an_earlier_results_file(predictions, data, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli(score(predictions, "--out", out)) == 0
    assert is_results_file(out) and json.loads(out.read_text())["num_problems"] == 2
    assert cli(score(predictions, "--out", out)) == 0  # the same evaluation again
    assert cli(run(data, "--out", out)) == 0  # a run after a score: both write results files
    assert json.loads(out.read_text())["mode"] == "generate"
    assert cli(run(data, "--out", out)) == 0
    assert json.loads(out.read_text())["data"]["source"] == str(data)


def test_an_older_results_file_is_recognised_by_its_schema(tmp_path):
    older = tmp_path / "older.json"
    older.write_text(json.dumps({"schema": SCHEMA, "benchmark": "gsm8k", "metrics": {}, "samples": []}, indent=1))
    assert is_results_file(older)
    assert not is_results_file(tmp_path / "missing.json") and not is_results_file(tmp_path)


# ------------------------------------------------------------------------------ dare eval sweep --out
def test_sweep_never_replaces_a_users_files(tmp_path, capsys, no_work):
    out = tmp_path / "mine"
    (out / "points").mkdir(parents=True)
    (out / "summary.md").write_text("my summary\n")
    (out / "points" / "00.json").write_text('{"mine": true}\n')
    before = snapshot(tmp_path)
    assert one_line_error(capsys, *sweep(out)) == f"error: --out {out}: {NOT_A_SWEEP}"
    assert snapshot(tmp_path) == before and not (out / OUTPUT_MARKER).exists()


def test_sweep_never_replaces_the_model_or_the_data_directory(tmp_path, capsys, no_work):
    from dare.models.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint("llada", tmp_path / "model")
    earlier = tmp_path / "earlier"  # an earlier sweep now holding the data: refused too
    (earlier / "data").mkdir(parents=True)
    (earlier / OUTPUT_MARKER).write_text(json.dumps({"written_by": "dare eval sweep"}))
    (earlier / "data" / "tg.jsonl").write_bytes(TINY_GEN.read_bytes())
    capsys.readouterr()
    before = snapshot(tmp_path)
    line = one_line_error(capsys, "eval", "sweep", "--model", model, "--benchmark", "gsm8k", "--out", model,
                          "--point", "sampler=llada")
    assert line == f"error: --out {model}: is the --model directory ({model}); give another directory"
    line = one_line_error(capsys, *sweep(earlier, data=earlier / "data" / "tg.jsonl"))
    assert line == f"error: --out {earlier}: contains the --data directory ({earlier / 'data'}); give another directory"
    assert snapshot(tmp_path) == before


def test_a_sweep_marks_its_directory_and_reruns_into_it(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert cli(sweep(out, "--point", "sampler=llada,steps=2")) == 0
    assert json.loads((out / OUTPUT_MARKER).read_text())["written_by"] == "dare eval sweep"
    (out / "notes.txt").write_text("mine")
    assert cli(sweep(out)) == 0  # one point now: the earlier sweep's second point file is removed
    assert sorted(p.name for p in (out / "points").iterdir()) == ["00.json"]
    assert (out / "notes.txt").read_text() == "mine"
    assert len(json.loads((out / "summary.json").read_text())["points"]) == 1


def test_a_sweep_from_before_markers_is_still_replaced(tmp_path):
    from dare.eval.sweep import check_sweep_out, run_sweep
    from test_eval_first_hour import fake_results

    out = tmp_path / "sweep"
    run_sweep(fake_results, [{"steps": 4}, {"steps": 2}], out, log=lambda line: None)
    (out / OUTPUT_MARKER).unlink()  # as an older DARE left it
    assert check_sweep_out(out, "--out") is True
    run_sweep(fake_results, [{"steps": 1}], out, log=lambda line: None)
    assert sorted(p.name for p in (out / "points").iterdir()) == ["00.json"]
    (out / OUTPUT_MARKER).unlink()
    (out / "summary.json").write_text('{"points": [{"results": "mine.json"}]}')  # not a sweep's summary
    with pytest.raises(ConfigError, match="not an earlier `dare eval sweep` output"):
        check_sweep_out(out, "--out")


def test_the_python_api_refuses_a_directory_of_other_files(tmp_path):
    from dare.eval.sweep import run_sweep

    (tmp_path / "summary.md").write_text("mine")
    with pytest.raises(ConfigError, match=r"^out_dir .*: the directory is not empty and is not an earlier"):
        run_sweep(lambda fields: pytest.fail("evaluated a point"), [{"steps": 1}], tmp_path)
    assert (tmp_path / "summary.md").read_text() == "mine" and not (tmp_path / OUTPUT_MARKER).exists()


def test_score_records_where_its_predictions_were_and_what_they_held(predictions, tmp_path, capsys, monkeypatch):
    import hashlib

    monkeypatch.chdir(predictions.parent)
    out = tmp_path / "r.json"
    assert cli(score(predictions.name, "--out", out)) == 0  # a relative path, as users type it
    recorded = json.loads(out.read_text())["data"]
    assert recorded["predictions"] == predictions.name
    assert recorded["predictions_path"] == str(predictions)
    assert recorded["predictions_digest"] == "sha256:" + hashlib.sha256(predictions.read_bytes()).hexdigest()
    assert "digest" not in recorded  # no --data file was joined
