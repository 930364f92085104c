"""``--adapter DIR`` is checked before any weights load (:func:`dare.models.loading.check_adapter_path`): a path
that is no LoRA adapter directory is one line naming what is missing, from ``dare generate``, ``dare eval run``,
``dare merge-lora``, the Python API and the OpenCompass config check, and the base model is never loaded for it.
Hub adapter ids are not checked (peft asks the hub)."""

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import lora_adapter, one_line_error

from dare.errors import ConfigError
from dare.models.loading import adapter_base, check_adapter_path, load_model

CONTENTS = ("a LoRA adapter directory holds adapter_config.json and adapter_model.safetensors (or "
            "adapter_model.bin), as LoRA training writes them to RUN/final")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from dare.models.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint("llada", tmp_path_factory.mktemp("base") / "ck")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, base) -> Path:
    return lora_adapter(tmp_path_factory.mktemp("adapter") / "final", base=str(base))


@pytest.fixture
def no_weights_loaded(monkeypatch):
    """Fail the test if a base model (checkpoint or tiny), an adapter's weights or a benchmark's data is loaded."""
    import transformers
    from peft import PeftModel

    import dare.commands.eval_inputs
    import dare.models.tiny

    def loaded(what):
        def fail(*args, **kwargs):
            pytest.fail(f"{what} was called before the adapter was checked")
        return fail

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", loaded("AutoModel.from_pretrained"))
    monkeypatch.setattr(dare.models.tiny, "tiny_model", loaded("tiny_model"))
    monkeypatch.setattr(PeftModel, "from_pretrained", loaded("PeftModel.from_pretrained"))
    monkeypatch.setattr(dare.commands.eval_inputs, "load_samples", loaded("load_samples"))


def missing(tmp, adapter, base):
    return tmp / "nope", "{} is not a LoRA adapter directory (no such directory); " + CONTENTS


def a_file(tmp, adapter, base):
    (tmp / "adapter.safetensors").write_bytes(b"x")
    return tmp / "adapter.safetensors", "{} is not a LoRA adapter directory (it is a file); " + CONTENTS


def empty(tmp, adapter, base):
    (tmp / "empty").mkdir()
    return tmp / "empty", "{} is not a LoRA adapter directory (no adapter_config.json); " + CONTENTS


def a_model_checkpoint(tmp, adapter, base):
    return base, ("{} is not a LoRA adapter directory (no adapter_config.json); it holds a full model checkpoint "
                  "(config.json): load it as the model, without an adapter")


def a_run_directory(tmp, adapter, base):
    shutil.copytree(adapter, tmp / "run" / "final")
    return tmp / "run", ("{} is not a LoRA adapter directory (no adapter_config.json); it looks like a training run "
                         f"directory: its adapter is in {tmp / 'run' / 'final'}")


def copied(tmp, adapter) -> Path:
    shutil.copytree(adapter, tmp / "adapter")
    return tmp / "adapter"


def not_json(tmp, adapter, base):
    (copied(tmp, adapter) / "adapter_config.json").write_text('{"peft_type": "LORA",\n')
    return tmp / "adapter", ("adapter {}: adapter_config.json is not valid JSON (line 2 column 1: Expecting "
                             "property name enclosed in double quotes)")


def a_list(tmp, adapter, base):
    (copied(tmp, adapter) / "adapter_config.json").write_text("[]")
    return tmp / "adapter", "adapter {}: adapter_config.json must hold a JSON object; got a list ([])"


def no_peft_type(tmp, adapter, base):
    (copied(tmp, adapter) / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    return tmp / "adapter", ("adapter {}: adapter_config.json names no peft_type, so it is no PEFT adapter config; "
                             + CONTENTS)


def no_weights(tmp, adapter, base):
    (copied(tmp, adapter) / "adapter_model.safetensors").unlink()
    return tmp / "adapter", ("{} is not a LoRA adapter directory (adapter_config.json but no adapter weights: "
                             "adapter_model.safetensors or adapter_model.bin); " + CONTENTS)


def truncated_weights(tmp, adapter, base):
    weights = copied(tmp, adapter) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    return tmp / "adapter", ("adapter {}: adapter_model.safetensors is not a readable safetensors file (invalid "
                             "header length); the file may be truncated")


CASES = [missing, a_file, empty, a_model_checkpoint, a_run_directory, not_json, a_list, no_peft_type, no_weights,
         truncated_weights]


@pytest.fixture
def gsm8k(tmp_path) -> Path:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n")
    return path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_a_bad_adapter_is_one_line_before_the_base_model_loads(case, base, adapter, tmp_path, gsm8k, capsys,
                                                               no_weights_loaded):
    path, message = case(tmp_path, adapter, base)
    message = message.format(path)
    for model in (str(base), "tiny:llada"):
        for command in (["generate", "--model", model, "--adapter", path, "--prompt", "Hi", "--gen-length", "4"],
                        ["eval", "run", "--model", model, "--adapter", path, "--benchmark", "gsm8k", "--data", gsm8k,
                         "--gen-length", "4"]):
            assert one_line_error(capsys, *command) == f"error: {message}", command
        with pytest.raises(ConfigError) as err:
            load_model(model, adapter=str(path))
        assert str(err.value) == message
    line = one_line_error(capsys, "merge-lora", "--adapter", path, "--out", tmp_path / "merged")
    assert line == f"error: {message}" and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("case", [missing, no_peft_type, no_weights], ids=lambda c: c.__name__)
def test_the_opencompass_check_is_the_same_check(case, base, adapter, tmp_path):
    from dare.eval.opencompass_checks import check_model_path

    path, message = case(tmp_path, adapter, base)
    with pytest.raises(ConfigError) as err:
        check_model_path(str(base), str(path))
    assert str(err.value) == message.format(path)


def test_a_sound_adapter_passes_with_either_weights_file(adapter, tmp_path):
    assert check_adapter_path(str(adapter)) == adapter
    bin_adapter = shutil.copytree(adapter, tmp_path / "bin")
    (bin_adapter / "adapter_model.safetensors").rename(bin_adapter / "adapter_model.bin")
    assert check_adapter_path(str(bin_adapter)) == bin_adapter


def test_a_hub_adapter_id_is_left_to_peft(monkeypatch, base):
    """Online users load adapters by hub id: nothing local to check, peft gets the id."""
    from peft import PeftModel

    from dare.eval.opencompass_checks import check_model_path

    asked = []

    def from_hub(model, adapter_id, **kwargs):
        asked.append(adapter_id)
        return model

    monkeypatch.setattr(PeftModel, "from_pretrained", from_hub)
    assert check_adapter_path("some-owner/some-lora") is None
    check_model_path(str(base), "some-owner/some-lora")
    assert load_model("tiny:llada", adapter="some-owner/some-lora") is not None
    assert asked == ["some-owner/some-lora"]
    with pytest.raises(ConfigError, match=r"^adapter some-owner/some-lora is no local directory, .*; pass --base$"):
        adapter_base("some-owner/some-lora")
