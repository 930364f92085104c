"""A damaged checkpoint directory (truncated weights, config.json without model_type or not JSON, a missing shard) is
one line naming the path and the damage, from the Python API and every command, never a traceback; the check that
finds it (:func:`dare.models.loading.check_checkpoint_path`) reads config.json and safetensors headers, no weights."""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import lora_adapter

from dare.errors import ConfigError, DareError, InputError
from dare.models.loading import check_checkpoint_path, family_of_path, load_model

ROOT = Path(__file__).resolve().parents[1]
KNOWN = ("DARE loads model_type Dream, llada, llada2_moe, lladamoe, sdar or sdar_moe "
         "(families dream, llada, llada2, llada_moe, sdar, sdar_moe)")


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    from dare.models.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint("llada", tmp_path_factory.mktemp("good") / "ck")


def weights_header(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    return length, json.loads(data[8:8 + length])


def truncated_header(ck: Path) -> None:  # the user's `head -c 1000`
    (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes()[:1000])


def truncated_data(ck: Path) -> None:  # an interrupted copy: the header is whole, the tensors are not
    (ck / "model.safetensors").write_bytes((ck / "model.safetensors").read_bytes()[:-1000])


def no_model_type(ck: Path) -> None:
    (ck / "config.json").write_text("{}")


def not_json(ck: Path) -> None:
    (ck / "config.json").write_text('{"model_type": "llada",\n')


def misspelt_model_type(ck: Path) -> None:
    (ck / "config.json").write_text(json.dumps({**json.loads((ck / "config.json").read_text()), "model_type": "lada"}))


def a_list(ck: Path) -> None:
    (ck / "config.json").write_text("[]")


def damaged(good: Path, tmp_path: Path, damage) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(good, ck)
    damage(ck)
    return ck


def expected(ck: Path, damage) -> str:
    size = os.path.getsize(ck / "model.safetensors")
    return {
        truncated_header: f"model {ck}: model.safetensors is not a readable safetensors file (invalid header length); "
                          "the file may be truncated",
        truncated_data: f"model {ck}: model.safetensors is not a readable safetensors file (its header describes "
                        f"{size + 1000} bytes, the file has {size}); the file may be truncated",
        no_model_type: f"model {ck}: config.json has no model_type; {KNOWN}",
        not_json: f"model {ck}: config.json is not valid JSON (line 2 column 1: Expecting property name enclosed in "
                  "double quotes)",
        misspelt_model_type: f"model {ck}: config.json has model_type 'lada', not a DARE model (did you mean "
                             f"'llada'?); {KNOWN}",
        a_list: f"model {ck}: config.json must hold a JSON object; got a list ([])",
    }[damage]


DAMAGES = [truncated_header, truncated_data, no_model_type, not_json, misspelt_model_type, a_list]
CLI_DAMAGES = [truncated_header, no_model_type, not_json]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_python_api_names_the_damage_in_one_line(good, tmp_path, damage):
    ck = damaged(good, tmp_path, damage)
    message = expected(ck, damage)
    for load in (load_model, check_checkpoint_path, family_of_path):
        with pytest.raises(ConfigError) as err:
            load(str(ck))
        assert str(err.value) == message, load.__name__


def test_a_sound_checkpoint_passes_and_the_check_reads_no_tensor_data(good, tmp_path, tiny_dirs):
    for family, path in tiny_dirs.items():  # every family's released model_type (LLaDA-MoE ships "llada")
        assert check_checkpoint_path(str(path)) == path, family
    ck = tmp_path / "ck"
    shutil.copytree(good, ck)
    weights = ck / "model.safetensors"
    length, _ = weights_header(weights)
    data = weights.read_bytes()
    weights.write_bytes(data[:8 + length] + b"\xff" * (len(data) - 8 - length))  # garbage tensors, sound header
    assert check_checkpoint_path(str(ck)) == ck
    assert check_checkpoint_path("some-owner/some-model") is None  # a hub name: left to the hub


def test_damage_only_safetensors_sees_is_still_one_line(good, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(good, ck)
    weights = ck / "model.safetensors"
    length, header = weights_header(weights)
    name = next(key for key in header if key != "__metadata__")
    header[name]["dtype"] = "F99"
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= length
    data = weights.read_bytes()
    weights.write_bytes(data[:8] + raw.ljust(length) + data[8 + length:])
    assert check_checkpoint_path(str(ck)) == ck  # a well-formed header: the cheap check passes
    with pytest.raises(InputError) as err:
        load_model(str(ck))
    message = str(err.value)
    assert message.startswith(f"cannot load model {ck}: Error while deserializing header")
    assert message.endswith("; a .safetensors file may be truncated or corrupt") and "\n" not in message


def test_a_shard_missing_from_the_index_is_one_line(good, tmp_path):
    sharded = tmp_path / "sharded"
    load_model(str(good)).save_pretrained(str(sharded), max_shard_size="100KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and check_checkpoint_path(str(sharded)) == sharded
    assert load_model(str(sharded)) is not None
    shards[1].unlink()
    with pytest.raises(ConfigError, match=rf"^model {sharded}: model.safetensors.index.json names {shards[1].name}, "
                                          r"which is missing; the checkpoint is incomplete$"):
        load_model(str(sharded))


def test_the_hub_is_still_asked_and_a_non_dare_hub_model_is_one_line(monkeypatch):
    from types import SimpleNamespace

    from transformers import AutoModel

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(AutoModel, "from_pretrained", offline)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ConfigError, match=r"^model nobody/no-such-dllm: no such local directory, and the hub did not "
                                          r"provide it \(We couldn't connect.*\); without a network, HF_HUB_OFFLINE=1 "
                                          r"skips the retries$"):
        load_model("nobody/no-such-dllm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # already offline: no advice
    with pytest.raises(ConfigError, match=r"load the files\)$"):
        load_model("nobody/no-such-dllm")
    monkeypatch.setattr(AutoModel, "from_pretrained",
                        lambda *a, **k: SimpleNamespace(config=SimpleNamespace(model_type="qwen2"), to=lambda d: None))
    with pytest.raises(DareError) as err:
        load_model("Qwen/Qwen2-0.5B")
    assert str(err.value) == f"model Qwen/Qwen2-0.5B: config.json has model_type 'qwen2', not a DARE model; {KNOWN}"


def cli(*args: str, cwd: Path) -> subprocess.Popen:
    """``dare ARGS`` started in a fresh interpreter (as a user runs it; several run at once to save start-up time)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "dare.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=env)


def assert_one_line(process: subprocess.Popen, message: str) -> None:
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines() == [f"error: {message}"], stderr


@pytest.mark.parametrize("damage", CLI_DAMAGES, ids=lambda d: d.__name__)
def test_generate_and_train_print_one_line(good, tmp_path, damage, capsys):
    from dare.cli import main

    ck = damaged(good, tmp_path, damage)
    message = expected(ck, damage)
    train = [str(ROOT / "configs" / "llada" / "sft_tiny.yaml"), f"model.path={ck}",
             f"trainer.output_dir={tmp_path / 'run'}"]
    processes = [cli("generate", "--model", str(ck), "--prompt", "hi", cwd=tmp_path),
                 cli("train", *train, cwd=tmp_path)]
    for process in processes:
        assert_one_line(process, message)
    assert main(["train", *train, "--dry-run"]) == 2  # the dry run makes the same check
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]


@pytest.mark.parametrize("damage", CLI_DAMAGES, ids=lambda d: d.__name__)
def test_eval_and_merge_print_the_same_line(good, tmp_path, damage, capsys):
    from dare.cli import main

    ck = damaged(good, tmp_path, damage)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n")
    adapter = lora_adapter(tmp_path / "adapter", base=str(ck))  # a sound adapter: the base is what is damaged
    for args in (["eval", "run", "--model", str(ck), "--benchmark", "gsm8k", "--data", str(data), "--gen-length", "4"],
                 ["merge-lora", "--adapter", str(adapter), "--out", str(tmp_path / "merged")]):
        assert main(args) == 2, args
        assert capsys.readouterr().err.strip().splitlines() == [f"error: {expected(ck, damage)}"], args
