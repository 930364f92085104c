"""Output directories: `dare merge-lora`, `dare tiny` and `dare demo` write only a new or empty directory or their
own earlier output (recognised by its marker file); anything else is a one-line error that changes nothing."""

import json

import pytest
from cli_helpers import one_line_error

from dare import outputs
from dare.cli import main


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
        assert capsys.readouterr().out.startswith(f"wrote {out}: adapter {run_dir / 'final'} merged into ")
        assert outputs.read_marker(out)["written_by"] == "dare merge-lora"
        assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".*"))  # no staging or replaced directory left behind


LEGACY_MERGE = {"config.json": b"{}", "generation_config.json": b"{}", "model.safetensors": b"weights",
                "tokenizer.json": b"{}", "tokenizer_config.json": b"{}", "special_tokens_map.json": b"{}"}
"""What a merge-lora from before outputs were marked left: a merged checkpoint and no .dare-output.json."""


def legacy_merge(drop: tuple[str, ...] = (), **extra: bytes) -> dict:
    """:data:`LEGACY_MERGE` without the files ``drop`` and with the ``extra`` ones."""
    return {**{name: data for name, data in LEGACY_MERGE.items() if name not in drop}, **extra}


def write_files(directory, files: dict):
    """Write ``{relative path: bytes}`` under ``directory``; returns it."""
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return directory


def test_merge_lora_replaces_an_unmarked_merge_of_an_older_dare_with_a_warning(run_dir, tmp_path, capsys, caplog):
    """Before: a merge written before outputs were marked was refused like a user's directory."""
    out = write_files(tmp_path / "merged", LEGACY_MERGE)
    assert main(merge("--adapter", str(run_dir / "final"), "--out", str(out))) == 0
    assert outputs.read_marker(out)["written_by"] == "dare merge-lora" and (out / "tokenizer.json").is_file()
    assert (out / "model.safetensors").read_bytes() != b"weights" and not (out / "special_tokens_map.json").exists()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("dare") and r.levelname == "WARNING"]
    assert said == [(f"warning: --out {out}: replacing a merged checkpoint without a marker (an earlier "
                     "`dare merge-lora` output, from before outputs were marked)")]


@pytest.mark.parametrize("name, files", [
    ("merged", legacy_merge(**{"notes.txt": b"mine"})),  # a user's file beside the checkpoint
    ("merged", legacy_merge(**{"adapter_config.json": b"{}", "adapter_model.safetensors": b"w"})),  # an adapter
    ("merged", legacy_merge(**{"config.yaml": b"model: {}", "metrics.jsonl": b""})),  # a training run
    ("merged", legacy_merge(**{"checkpoints/step-1/config.json": b"{}"})),  # a sub-directory
    ("merged", legacy_merge(**{"README.md": b"# model card"})),  # a downloaded model
    ("merged", legacy_merge(**{outputs.OUTPUT_MARKER: b'{"written_by": "dare tiny"}'})),  # another command's
    ("merged", legacy_merge(drop=("model.safetensors",))),  # no weights
    ("merged", legacy_merge(drop=("model.safetensors",), **{"pytorch_model.bin": b"w"})),  # not a merge's weights
    ("merged", legacy_merge(drop=("config.json",))),
    ("final", legacy_merge()),  # a full fine-tune's export: the same files
    ("run/checkpoints/step-2", legacy_merge()),
])
def test_merge_lora_refuses_unmarked_directories_other_than_an_older_merge(run_dir, tmp_path, capsys, name, files):
    from dare.models.lora import is_unmarked_merge_output

    assert is_unmarked_merge_output(write_files(tmp_path / "legacy", LEGACY_MERGE))  # only the merge's files
    out = write_files(tmp_path / name, files)
    before = snapshot(out)
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", out))
    assert line == (f"error: --out {out}: the directory is not empty and is not an earlier `dare merge-lora` "
                    "output; give a new or empty directory (nothing was written)")
    assert snapshot(out) == before


def test_an_unmarked_checkpoint_of_symlinks_is_not_an_older_merge(tmp_path):
    """A hub cache snapshot links its files to blobs: never taken for a merge to replace."""
    from dare.models.lora import is_unmarked_merge_output

    blobs = write_files(tmp_path / "blobs", LEGACY_MERGE)
    snapshot_dir = tmp_path / "snapshot"
    snapshot_dir.mkdir()
    for name in LEGACY_MERGE:
        (snapshot_dir / name).symlink_to(blobs / name)
    assert is_unmarked_merge_output(blobs) and not is_unmarked_merge_output(snapshot_dir)
    assert not is_unmarked_merge_output(tmp_path / "missing") and not is_unmarked_merge_output(blobs / "config.json")


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a model is loaded (the output checks come first)."""
    from dare.models import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the output path was checked")

    monkeypatch.setattr(loading, "load_model", refuse)


def test_merge_lora_into_a_broken_symlink_is_one_line_before_loading(run_dir, tmp_path, capsys, no_loading):
    """Before: the merge ran, then renaming its staging directory onto the link raised NotADirectoryError."""
    link = tmp_path / "dl"
    link.symlink_to(tmp_path / "nonexistent" / "z")
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", link))
    assert line == (f"error: --out {link}: is a broken symbolic link (to {tmp_path / 'nonexistent' / 'z'}); remove "
                    "it or give another directory (nothing was written)")
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["dl"]  # no staging directory


PROC = pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux /proc")


@PROC
def test_merge_lora_under_a_directory_nothing_can_be_written_in_is_one_line_before_loading(run_dir, capsys,
                                                                                          no_loading):
    """/proc: its permission bits let root write (os.access says yes) but every write fails; before, the merge ran
    and creating the staging directory raised FileNotFoundError."""
    line = one_line_error(capsys, *merge("--adapter", run_dir / "final", "--out", "/proc/dare-x"))
    assert line.startswith("error: --out /proc/dare-x: cannot write in /proc: the directory is not writable")


@PROC
@pytest.mark.parametrize("command", [
    ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--limit", "1"],
    ["eval", "score", "--benchmark", "gsm8k", "--predictions", "{predictions}"],
])
def test_eval_results_under_a_directory_nothing_can_be_written_in_are_one_line(command, tmp_path, capsys,
                                                                               no_loading):
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": 0, "prediction": "#### 1", "answer": "#### 1"}) + "\n")
    args = [part.format(predictions=predictions) for part in command]
    line = one_line_error(capsys, *args, "--out", "/proc/dare-y.json")
    assert line.startswith("error: --out /proc/dare-y.json: cannot write in /proc: the directory is not writable")


def test_can_write_in_probes_and_leaves_nothing(tmp_path):
    assert outputs.can_write_in(tmp_path) is None and not list(tmp_path.iterdir())
    assert outputs.can_write_in(tmp_path / "missing") is not None


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
    assert "unknown model family 'lada'" in line and not (tmp_path / "typo").exists()  # nothing written


def test_write_tiny_checkpoint_from_python_never_writes_over_a_trained_model(tmp_path):
    """Before: the command checked --out, but the function it calls wrote random weights into any directory."""
    from dare.errors import ConfigError
    from dare.models.tiny import write_tiny_checkpoint

    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"trained weights")
    with pytest.raises(ConfigError, match=f"^out_dir {final}: the directory is not empty and is not an earlier "
                                          "`dare tiny` output"):
        write_tiny_checkpoint("llada", final)
    assert snapshot(final) == {"model.safetensors": b"trained weights"}
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        write_tiny_checkpoint("llada", tmp_path / "notes.txt", what="--init")
    with pytest.raises(ConfigError, match="unknown model family 'lada'"):
        write_tiny_checkpoint("lada", tmp_path / "typo")
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "typo").exists()


def test_write_tiny_checkpoint_rewrites_its_own_output_from_python_and_the_command(tmp_path, capsys):
    from dare.models.tiny import write_tiny_checkpoint

    out = write_tiny_checkpoint("llada", tmp_path / "tiny", seed=0)
    first = (out / "model.safetensors").read_bytes()
    assert outputs.read_marker(out) == {"written_by": "dare tiny", "family": "llada"}
    assert write_tiny_checkpoint("sdar", out, seed=1) == out and outputs.read_marker(out)["family"] == "sdar"
    assert main(["tiny", "--family", "llada", "--out", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == first


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
    assert line == (f"error: --out {out} holds a demo run with other settings (--seed 0 -> 1); give another --out "
                    f"(e.g. --out {out}_2), or delete {out} to replace it")
    assert (out / "report.json").read_bytes() == report


def test_demo_rerun_replaces_an_init_checkpoint_written_before_tiny_checkpoints_were_marked(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", *SMALL, "--out", str(out)]) == 0
    (out / "init" / outputs.OUTPUT_MARKER).unlink()  # as an older DARE left it
    assert main(["demo", *SMALL, "--out", str(out)]) == 0
    assert outputs.read_marker(out / "init")["written_by"] == "dare tiny"


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
    assert "(--seed 0 -> 2)" in one_line_error(capsys, "demo", "--out", tmp_path, "--seed", "2") and len(no_work) == 1
