"""Output directories: `dare merge-lora`, `dare tiny` and `dare demo` write only a new or empty directory or their
own earlier output (recognised by its marker file); anything else is a one-line error that changes nothing."""

import json

import pytest

from dare import outputs
from dare.cli import main


def one_line_error(capsys, *args) -> str:
    assert main([str(a) for a in args]) == 2, args
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def snapshot(directory) -> dict:
    """Every file under ``directory``: relative path -> bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(tmp_path_factory):
    """A LoRA training run: config.yaml, metrics.jsonl and its adapter in final/ (base tiny:llada)."""
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of
    from dare.models.tiny import tiny_model

    run = tmp_path_factory.mktemp("lora") / "run"
    model = tiny_model("llada", seed=0)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=family_of(model).lora_targets))
    peft_model.save_pretrained(str(run / "final"))
    (run / "config.yaml").write_text("model:\n  path: tiny:llada\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    return run


def merge(*extra):
    return ["merge-lora", "--base", "tiny:llada", *extra]


# ------------------------------------------------------------------------------------------------ dare merge-lora
@pytest.mark.parametrize("target, relation", [("final", "is the adapter directory"),
                                              (".", "contains the adapter directory")])
def test_merge_lora_never_replaces_the_adapter_or_the_run_holding_it(run_dir, capsys, target, relation):
    before = snapshot(run_dir)
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", run_dir / target))
    assert relation in line and "--out" in line
    assert snapshot(run_dir) == before


def test_merge_lora_never_replaces_the_base_model_directory(run_dir, tmp_path, capsys):
    from dare.models.tiny import write_tiny_checkpoint

    base = write_tiny_checkpoint("llada", tmp_path / "base")
    before = snapshot(base)
    capsys.readouterr()  # the writer's progress bar
    line = one_line_error(capsys, "merge-lora", "--adapter", run_dir / "final", "--base", base, "--out", base)
    assert "is the base model directory" in line
    assert snapshot(base) == before


def test_merge_lora_refuses_a_directory_or_file_it_did_not_write(run_dir, tmp_path, capsys):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "keep.txt").write_text("mine")
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", sub))
    assert line == (f"error: --out {sub}: the directory is not empty and is not an earlier `dare merge-lora` "
                    "output; give a new or empty directory (nothing was written)")
    assert snapshot(sub) == {"keep.txt": b"mine"}
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert "exists and is not a directory" in one_line_error(capsys, *merge("--adapter", run_dir / "final",
                                                                             "--out", notes))
    assert notes.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "sub"]


def test_merge_lora_into_the_current_directory_is_one_line(run_dir, tmp_path, capsys, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # even empty: replacing it would leave the shell in a deleted directory
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", "."))
    assert line == f"error: --out .: is the current directory ({here.resolve()}); give another directory"
    assert here.is_dir() and not list(tmp_path.glob(".*"))


def test_merge_lora_writes_a_new_or_empty_directory_and_replaces_its_own_output(run_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "merged", empty, tmp_path / "merged"):  # the third replaces the first
        assert main(merge("--adapter", str(run_dir / "final"), "--out", str(out))) == 0
        assert json.loads(capsys.readouterr().out)["out"] == str(out)
        assert outputs.read_marker(out)["written_by"] == "dare merge-lora"
        assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".*"))  # no staging or replaced directory left behind


def test_publish_dir_accepts_a_relative_dot_and_still_replaces_the_directory(tmp_path, monkeypatch):
    final = tmp_path / "final"  # e.g. a training run's final/, replaced by every export
    final.mkdir()
    (final / "old.txt").write_text("old")
    monkeypatch.chdir(final)
    staged = outputs.staging_dir(".")
    assert staged == tmp_path / ".final.partial"
    (staged / "new.txt").write_text("new")
    assert outputs.publish_dir(staged, ".") == final
    assert snapshot(final) == {"new.txt": b"new"} and sorted(p.name for p in tmp_path.iterdir()) == ["final"]


# ------------------------------------------------------------------------------------------------ dare tiny
def test_tiny_never_writes_random_weights_over_a_trained_model(tmp_path, capsys):
    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"trained weights")
    (final / "config.json").write_text("{}")
    line = one_line_error(capsys, "tiny", "--family", "llada", "--out", final)
    assert "is not an earlier `dare tiny` output" in line and line.startswith(f"error: --out {final}: ")
    assert snapshot(final) == {"config.json": b"{}", "model.safetensors": b"trained weights"}


def test_tiny_writes_an_empty_directory_and_rewrites_its_own_output(tmp_path, capsys):
    out = tmp_path / "tiny"
    out.mkdir()
    assert main(["tiny", "--family", "llada", "--out", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    assert main(["tiny", "--family", "llada", "--out", str(out), "--seed", "1"]) == 0
    assert (out / "model.safetensors").read_bytes() != first
    assert outputs.read_marker(out) == {"written_by": "dare tiny", "family": "llada"}
    capsys.readouterr()
    line = one_line_error(capsys, "tiny", "--family", "lada", "--out", tmp_path / "typo")
    assert "unknown model family 'lada'" in line and not list((tmp_path / "typo").iterdir())  # left unmarked


# ------------------------------------------------------------------------------------------------ dare demo
SMALL = ["--quick", "--sft-max-steps", "2", "--rl-steps", "1"]


def test_demo_rerun_replaces_a_run_of_the_same_settings_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", *SMALL, "--out", str(out)]) == 0
    assert "replacing" not in capsys.readouterr().out
    assert main(["demo", *SMALL, "--out", str(out)]) == 0  # the README command, run twice
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"--out {out}: replacing the earlier demo run there (same settings)"
    report = (out / "report.json").read_bytes()
    line = one_line_error(capsys, "demo", *SMALL, "--out", out, "--seed", "1")
    assert line == (f"error: --out {out} holds a demo run with other settings (seed 0 -> 1); give another --out "
                    f"(e.g. --out {out}_2), or delete {out} to replace it")
    assert (out / "report.json").read_bytes() == report


@pytest.fixture
def no_work(monkeypatch):
    """Replace the demo's work by a stub that records its calls (the output checks run before it)."""
    from dare.demo import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "_run", lambda config, log: calls.append(config) or {})
    return calls


def test_demo_refuses_a_directory_it_did_not_write(tmp_path, capsys, no_work):
    (tmp_path / "keep.txt").write_text("mine")
    line = one_line_error(capsys, "demo", "--out", tmp_path)
    assert "is not an earlier `dare demo` output" in line and not no_work
    assert snapshot(tmp_path) == {"keep.txt": b"mine"}


def test_demo_recognises_a_run_written_before_outputs_were_marked_by_its_report(tmp_path, capsys, no_work):
    from dataclasses import asdict

    from dare.demo import DemoConfig
    from dare.demo.report import SCHEMA

    legacy = {"schema": SCHEMA, "settings": {"demo": asdict(DemoConfig(out_dir="elsewhere"))}}
    (tmp_path / "report.json").write_text(json.dumps(legacy))
    assert main(["demo", "--out", str(tmp_path)]) == 0 and len(no_work) == 1
    assert "replacing the earlier demo run there" in capsys.readouterr().out
    assert "(seed 0 -> 2)" in one_line_error(capsys, "demo", "--out", tmp_path, "--seed", "2") and len(no_work) == 1
