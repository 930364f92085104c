"""``dare export``: the weights of one training checkpoint as a model directory (dare.trainer.export)."""

from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error
from safetensors.torch import load_file

from dare.cli import main
from dare.trainer import Trainer, load_train_config


def train(out: Path, *overrides) -> dict[int, dict[str, torch.Tensor]]:
    """A 4-step tiny SFT run checkpointed every 2 steps; returns the weights after each step (taken in ``on_step``,
    the ground truth an export of that step's checkpoint must equal)."""
    config = load_train_config(None, [f"trainer.output_dir={out}", "trainer.progress=false", "data.num_examples=32",
                                      "data.max_length=48", "trainer.batch_size=8", "trainer.micro_batch_size=8",
                                      "trainer.max_steps=4", "trainer.save_every=2", "optim.lr=1e-2", *overrides])
    weights = {}

    def keep(trainer, record):
        weights[trainer.step] = {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}

    Trainer(config).train(on_step=keep)
    return weights


def test_an_intermediate_checkpoint_exports_the_weights_of_its_step(tmp_path, capsys):
    run = tmp_path / "run"
    weights = train(run)
    assert main(["export", str(run / "checkpoints" / "step_00000002")]) == 0
    out = run / "exports" / "step_00000002"
    assert f"wrote {out}: the weights of step 2 (a full checkpoint)" in capsys.readouterr().out
    exported = load_file(out / "model.safetensors")
    assert exported.keys() == weights[2].keys()
    assert all(torch.equal(exported[name], weights[2][name]) for name in exported)
    assert any(not torch.equal(exported[name], weights[4][name]) for name in exported)  # not the final weights
    assert main(["generate", "--model", str(out), "--prompt", "Hi", "--gen-length", "4"]) == 0  # it loads as a model

    # a run directory: its latest checkpoint, which is what the run's own export wrote
    assert main(["export", str(run), "--out", str(tmp_path / "latest")]) == 0
    final, latest = load_file(run / "final" / "model.safetensors"), load_file(tmp_path / "latest" / "model.safetensors")
    assert final.keys() == latest.keys() and all(torch.equal(final[name], latest[name]) for name in final)
    assert main(["export", str(run), "--out", str(tmp_path / "latest")]) == 0  # an earlier export is replaced


def test_a_lora_checkpoint_exports_the_adapter_the_run_exports(tmp_path, capsys):
    run = tmp_path / "run"
    train(run, "lora.enabled=true", "lora.r=4")
    assert main(["export", str(run / "checkpoints" / "step_00000004")]) == 0
    out = run / "exports" / "step_00000004"
    assert f"(a LoRA adapter); evaluate it with `dare eval run --adapter {out}" in capsys.readouterr().out
    final, exported = (load_file(d / "adapter_model.safetensors") for d in (run / "final", out))
    assert final and final.keys() == exported.keys()
    assert all(torch.equal(final[name], exported[name]) for name in final)
    assert (run / "final" / "adapter_config.json").read_text() == (out / "adapter_config.json").read_text()


def test_export_refuses_what_is_no_checkpoint_and_a_users_directory(tmp_path, capsys):
    run = tmp_path / "run"
    train(run)
    advice = "; give a checkpoint directory (RUN/checkpoints/step_N) or a run directory (its latest checkpoint)"
    assert one_line_error(capsys, "export", tmp_path / "nope") == f"error: {tmp_path / 'nope'} does not exist{advice}"
    assert one_line_error(capsys, "export", "latest") == f"error: latest does not exist{advice}"  # not resume's modes
    assert one_line_error(capsys, "export", run / "final") == f"error: {run / 'final'} holds no checkpoint, only exported weights{advice}"
    line = one_line_error(capsys, "export", run / "checkpoints" / "step_2")  # the step numbers are zero-padded
    assert line.startswith(f"error: {run / 'checkpoints' / 'step_2'} does not exist (did you mean "
                           f"{run / 'checkpoints' / 'step_00000002'}?)")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    line = one_line_error(capsys, "export", run, "--out", mine)
    assert line.startswith(f"error: --out {mine}: the directory is not empty and is not an earlier `dare export` output")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("target", ["checkpoint", "checkpoints"])
def test_loading_a_checkpoint_as_a_model_names_dare_export(target, tmp_path, capsys):
    run = tmp_path / "run"
    train(run)
    path = run / "checkpoints" / "step_00000002" if target == "checkpoint" else run / "checkpoints"
    line = one_line_error(capsys, "generate", "--model", path, "--prompt", "Hi")
    command = f"dare export {path}" if target == "checkpoint" else f"dare export {run / 'checkpoints' / 'step_N'}"
    assert f"`{command}` writes" in line


def test_starting_over_deletes_the_earlier_runs_exports_unless_the_run_reads_one(tmp_path, capsys):
    run = tmp_path / "run"
    train(run)
    assert main(["export", str(run / "checkpoints" / "step_00000002")]) == 0
    export = run / "exports" / "step_00000002"
    common = ["train", f"trainer.output_dir={run}", "trainer.progress=false", "trainer.max_steps=1",
              "data.num_examples=8", "data.max_length=48", "trainer.batch_size=8", "trainer.resume=never"]
    line = one_line_error(capsys, *common, f"model.path={export}")  # training from the export it would delete
    assert line.startswith(f"error: trainer.resume=never would delete model.path={export}")
    assert export.is_dir()
    assert main(common) == 0
    assert "removing checkpoints/, final/, exports/, metrics.jsonl" in capsys.readouterr().out
    assert not (run / "exports").exists()


def test_results_files_name_the_run_algorithm_and_step_of_the_weights_they_scored(tmp_path, capsys):
    import hashlib
    import json

    from dare.eval.weights_origin import EXPORT_WRITER
    from dare.trainer.export import EXPORT_COMMAND

    assert EXPORT_WRITER == f"dare {EXPORT_COMMAND}"
    run = tmp_path / "run"
    train(run)
    assert main(["export", str(run / "checkpoints" / "step_00000002")]) == 0
    digest = "sha256:" + hashlib.sha256((run / "config.yaml").read_bytes()).hexdigest()
    data = Path(__file__).resolve().parents[1] / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl"
    origins = {}
    for name, model in (("export", run / "exports" / "step_00000002"), ("final", run / "final"), ("tiny", "tiny:llada")):
        out = tmp_path / f"{name}.json"
        assert main(["eval", "run", "--model", str(model), "--benchmark", "gsm8k", "--data", str(data), "--limit", "1",
                     "--gen-length", "4", "--no-chat", "--no-progress", "--out", str(out)]) == 0
        origins[name] = json.loads(out.read_text())["model"].get("origin")
    assert origins["export"]["path"] == str(run / "exports" / "step_00000002")
    assert {key: origins["export"][key] for key in ("run", "step", "algorithm", "config_digest")} == {
        "run": str(run), "step": 2, "algorithm": "sft", "config_digest": digest}
    assert origins["final"]["step"] == 4 and origins["final"]["run"] == str(run) and "modified" in origins["final"]
    assert origins["tiny"] is None  # a tiny: model (or a hub name) is its own identity
