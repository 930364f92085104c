"""`dare train --dry-run`, second round: a metrics sink whose package is missing, a response padding longer than an
example may be, a global batch larger than the data and a peft-style LoRA target are each one line, from the dry run
and from the run before it writes or loads anything; LoRA targets may be given as peft's list of module names."""

import json
import re
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.algorithms import ALGORITHMS
from dare.cli import main
from dare.data.sft import count_records
from dare.errors import ConfigError
from dare.models.lora import apply_lora, target_pattern  # re-exported from dare.models.lora_targets
from dare.models.tiny import tiny_model
from dare.trainer.config import load_train_config
from dare.trainer.preflight import check_batch_fits, check_lora_targets, model_skeleton

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
LORA = str(ROOT / "configs/llada/sft_lora_tiny.yaml")
VRPO = str(ROOT / "configs/llada/vrpo_tiny.yaml")
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
SPG = str(ROOT / "configs/llada/spg_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4",
         "trainer.micro_batch_size=4", "trainer.max_steps=1"]


def refused_alike(capsys, out: Path, *args) -> str:
    """The one error line of ``dare train ARGS --dry-run``, which must be the run's own, given before the run makes
    its output directory ``out``."""
    line = one_line_error(capsys, "train", *args, f"trainer.output_dir={out}", "--dry-run")
    assert one_line_error(capsys, "train", *args, f"trainer.output_dir={out}") == line
    assert not out.exists()  # refused before the run wrote (or loaded) anything
    return line


# ---- 1. metrics sinks whose package is not installed -----------------------------------------------------------------
@pytest.mark.parametrize("key, package", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_a_metrics_sink_without_its_package_is_one_line_before_any_work(key, package, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # not installed (whether or not it is here)
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    line = refused_alike(capsys, tmp_path / "run", SFT, *SMALL, f"trainer.{key}=true")
    assert line == (f"error: trainer.{key}=true needs the {package} package, which is not installed: pip install "
                    f"{package} (or set trainer.{key}=false)")


def test_a_metrics_package_that_fails_to_import_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # installed, but its import fails
    line = refused_alike(capsys, tmp_path / "run", SFT, *SMALL, "trainer.tensorboard=true")
    assert line.startswith("error: trainer.tensorboard=true: importing torch.utils.tensorboard failed (")
    assert line.endswith("); repair the installation of tensorboard or set trainer.tensorboard=false")


# ---- 2. response padding longer than an example may be -------------------------------------------------------------
@pytest.mark.parametrize("recipe", [SFT, VRPO])
def test_padding_responses_beyond_max_length_is_a_config_error(recipe, tmp_path, capsys):
    line = refused_alike(capsys, tmp_path / "run", recipe, *SMALL, "data.pad_response_to=64")
    assert line == ("error: data.pad_response_to=64 is larger than data.max_length=32: every response is padded to "
                    "at least 64 tokens, so no example fits; lower data.pad_response_to or raise data.max_length")
    line = refused_alike(capsys, tmp_path / "run", SFT, *SMALL, "data.pad_response_to=32")
    assert line == ("error: data.pad_response_to=32 equals data.max_length=32: every response is padded to at least "
                    "32 tokens, leaving no room for the prompt (data.chat_template adds tokens to every prompt), so "
                    "no example fits; lower data.pad_response_to or raise data.max_length")


def test_padding_that_leaves_room_or_is_unused_still_trains(tmp_path, capsys):
    assert main(["train", SFT, *SMALL, "data.max_length=64", "data.pad_response_to=16",
                 f"trainer.output_dir={tmp_path / 'a'}"]) == 0, capsys.readouterr().err
    # no chat template: a record with an empty prompt fits exactly, so equal lengths are not refused
    assert main(["train", SFT, *SMALL, "data.pad_response_to=32", "data.chat_template=false",
                 f"trainer.output_dir={tmp_path / 'b'}", "--dry-run"]) == 0
    # RL prompts ignore both keys (warned), so they cannot contradict each other
    assert main(["train", D1, "data.pad_response_to=64", "data.max_length=32", f"trainer.output_dir={tmp_path / 'c'}",
                 "--dry-run"]) == 0


# ---- 3. a global batch larger than the data -----------------------------------------------------------------------
def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("recipe, unit", [(SFT, "examples"), (VRPO, "pairs")])
def test_a_batch_larger_than_the_dataset_is_the_runs_error_in_the_dry_run(recipe, unit, tmp_path, capsys):
    line = refused_alike(capsys, tmp_path / "run", recipe, *SMALL, "trainer.batch_size=16")
    assert line == f"error: trainer.batch_size=16 is larger than the dataset (8 {unit})"


def test_the_dry_runs_batch_error_is_the_data_sources_own():
    from dare.data.sft import Example
    from dare.trainer.sources import DatasetSource

    examples = [Example((1, 2), 1, i) for i in range(3)]
    with pytest.raises(ConfigError) as err:
        DatasetSource(examples, batch_size=4, micro_batch_size=4, eos_id=0, pad_id=0)
    with pytest.raises(ConfigError) as dry:
        check_batch_fits(load_train_config(SFT, ["data.num_examples=3", "trainer.batch_size=4"]), ALGORITHMS["sft"].needs)
    assert str(dry.value) == str(err.value)


def test_a_batch_larger_than_a_data_file_is_an_error_in_the_dry_run(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}] * 3)
    data.write_text(data.read_text() + "\n\n")  # blank lines hold no record
    line = refused_alike(capsys, tmp_path / "run", SFT, *SMALL, f"data.path={data}", "data.num_examples=null")
    assert line == "error: trainer.batch_size=4 is larger than the dataset (3 examples)"
    assert main(["train", SFT, *SMALL, f"data.path={data}", "data.num_examples=null", "trainer.batch_size=3",
                 f"trainer.output_dir={tmp_path / 'ok'}", "--dry-run"]) == 0


def test_an_empty_or_broken_data_file_gets_the_runs_own_error_not_the_batch_size(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert refused_alike(capsys, tmp_path / "run", SFT, *SMALL, f"data.path={empty}") == \
        f"error: data file {empty} holds no records"
    broken = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "a", "response": "b"}, [1, 2]])
    assert count_records(str(broken)) is None  # the run reads it and names the line
    line = one_line_error(capsys, "train", SFT, *SMALL, f"data.path={broken}", f"trainer.output_dir={tmp_path / 'r'}")
    assert line == f"error: {broken}:2: record 1 is list, not an object of fields"


def test_rl_prompts_per_step_beyond_the_prompts_is_the_runs_error_in_the_dry_run(tmp_path, capsys):
    line = refused_alike(capsys, tmp_path / "run", D1, "trainer.progress=false", "data.num_examples=3",
                         "trainer.batch_size=16", "trainer.max_steps=1")  # 16 rollouts / group of 4 = 4 prompts
    assert line == "error: 4 prompts per step but the dataset has only 3"


def test_records_are_counted_without_reading_more_than_needed(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}] * 10)
    assert count_records(str(data)) == 10
    assert count_records(str(data), limit=4) == 4
    assert count_records(str(data), enough=6) == 6  # stops reading once a batch is known to fit
    assert count_records("synthetic:copy") == 512 and count_records("synthetic:copy", limit=7) == 7
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    pq.write_table(pyarrow.table({"prompt": ["a"] * 5, "response": ["b"] * 5}), tmp_path / "d.parquet")
    assert count_records(str(tmp_path / "d.parquet")) == 5
    (tmp_path / "d.json").write_text("[]")
    assert count_records(str(tmp_path / "d.json")) is None  # only parsing tells: the run checks it


# ---- 4. peft-style LoRA targets ------------------------------------------------------------------------------------
def suggested(line: str) -> str:
    """The working value an error line suggests (``lora.target_modules='REGEX'``)."""
    found = re.search(r"use lora\.target_modules='([^']+)'", line)
    assert found, line
    return found.group(1)


@pytest.mark.parametrize("written, regex, count", [
    ("q_proj", r".*\.q_proj", 2),
    ("q_proj,v_proj", r".*\.(q_proj|v_proj)", 4),
    ("q_proj|v_proj", r".*\.(q_proj|v_proj)", 4),
    ("[q_proj, o_proj]", r".*\.q_proj", 2),
])
def test_a_peft_style_target_gets_a_working_regex_and_the_models_module_names(written, regex, count, tmp_path,
                                                                               capsys):
    args = ["train", LORA, f"lora.target_modules='{written}'", f"trainer.output_dir={tmp_path / 'run'}"]
    line = one_line_error(capsys, *args, "--dry-run")
    assert line.startswith(f"error: lora.target_modules={written!r} matches no module of the model")
    assert "module names: q_proj, k_proj, v_proj, attn_out, ff_proj, up_proj, ff_out, wte" in line
    assert suggested(line) == regex and f"(it matches {count} modules)" in line
    if "o_proj" in written:
        assert "o_proj names no module LoRA can adapt" in line
    assert main([*args[:2], f"lora.target_modules='{suggested(line)}'", *args[3:], "--dry-run"]) == 0


def test_a_target_naming_no_module_of_the_model_lists_the_names_there_are(tmp_path, capsys):
    line = one_line_error(capsys, "train", LORA, "lora.target_modules=o_proj", "--dry-run",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert "use lora.target_modules" not in line
    assert line.endswith("(16 in all; module names: q_proj, k_proj, v_proj, attn_out, ff_proj, up_proj, ff_out, wte)")


def test_a_list_of_module_names_adapts_what_peft_would():
    skeleton = model_skeleton("tiny:llada")
    check_lora_targets(["q_proj", "v_proj"], skeleton)
    with pytest.raises(ConfigError, match=r"^lora.target_modules=\['q_proj', 'o_proj'\] lists o_proj, which names no "
                                          r"module LoRA can adapt; .* module names: q_proj, k_proj"):
        check_lora_targets(["q_proj", "o_proj"], skeleton)
    with pytest.raises(ConfigError, match=r"^lora.target_modules=\[\] lists no module name"):
        check_lora_targets([], skeleton)
    assert re.fullmatch(target_pattern(["q_proj", "blocks.0.v_proj"]), "model.transformer.blocks.0.v_proj")
    adapted = apply_lora(tiny_model("llada", seed=0), r=2, target_modules=["q_proj", "v_proj"])
    wrapped = sorted(name for name, module in adapted.named_modules() if name.endswith((".q_proj", ".v_proj"))
                     and hasattr(module, "lora_A"))
    assert len(wrapped) == 4 and not any(hasattr(m, "lora_A") for n, m in adapted.named_modules()
                                         if n.endswith(".k_proj"))


def test_a_yaml_list_of_lora_targets_trains_from_the_command_line(tmp_path, capsys):
    """``lora.target_modules=[q_proj, v_proj]`` passes the config's checks (a list is module names, not a regex) and
    trains; a listed name of no module is the preflight's one-line error."""
    assert main(["train", LORA, *SMALL, "lora.target_modules=[q_proj, v_proj]", "trainer.export=false",
                 f"trainer.output_dir={tmp_path / 'ok'}"]) == 0
    line = refused_alike(capsys, tmp_path / "bad", LORA, *SMALL, "lora.target_modules=[q_proj, o_proj]")
    assert "lists o_proj, which names no module LoRA can adapt" in line


@pytest.mark.parametrize("recipe,overrides,expected", [
    (D1, ["algorithm.name=justgrpo"], "justgrpo decodes left to right, one token per step"),
    (str(ROOT / "configs/llada/dtreerpo_tiny.yaml"), ["rollout.sampler.sampler=fastdllm"],
     "dtreerpo branches at fixed denoising steps: use rollout.sampler.decoder=quota"),
    (str(ROOT / "configs/llada/justgrpo_tiny.yaml"), ["lora.enabled=true", "rollout.sampler.weights=merged"],
     "rollout.sampler.weights must be 'model'"),
    (SPG, ["algorithm.block_length=3"],
     "error: algorithm.block_length=3 must divide the generation length rollout.sampler.gen_length=8"),
    (SPG, ["algorithm.block_length=8"],
     "error: algorithm.num_t=2 exceeds the number of blocks (1 = rollout.sampler.gen_length=8 / "
     "algorithm.block_length=8)"),
    (SPG, ["rollout.sampler.weights=fp8", "distributed.device=cpu"],
     "error: rollout.sampler: weights 'fp8' decodes on the static engines; engine 'auto' is 'eager' on cpu: set "
     "engine 'static'"),
    (SPG, ["rollout.sampler.engine=graph", "distributed.device=cpu"],
     "error: rollout.sampler: rollout engine 'graph' needs CUDA (the model is on cpu); use 'static' or 'eager'"),
])
def test_the_algorithms_rollout_checks_run_in_the_dry_run(recipe, overrides, expected, tmp_path, capsys):
    """An algorithm's checks of its rollout sampler (``check_rollout``) ran only once the policy had loaded (minutes
    for an 8B model); the dry run makes them on the model's meta-device skeleton, with the run's own line."""
    line = refused_alike(capsys, tmp_path / "run", recipe, *overrides)
    assert expected in line
