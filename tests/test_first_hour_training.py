"""A new user's first hour with `dare train`, second round: a group of one rollout under group-relative advantages is
an error, every run ends with a resumable checkpoint, the dry run checks LoRA target patterns against the model's
modules, data errors name the file and line, record-key settings no record uses are warned, non-text fields are
errors (integers are their digits), and a missing or broken tokenizer is one line."""

import json
import logging
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.algorithms import ALGORITHMS
from dare.cli import main
from dare.data.sft import build_sft_dataset
from dare.data.tokenizer import EOS_ID, build_byte_tokenizer
from dare.errors import ConfigError, InputError
from dare.trainer.config import DataConfig, load_train_config
from dare.trainer.prompts import prompt_records

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
LORA = str(ROOT / "configs/llada/sft_lora_tiny.yaml")
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")
SMALL = ["trainer.progress=false", "data.num_examples=8", "data.max_length=32", "trainer.batch_size=4",
         "trainer.micro_batch_size=4", "trainer.max_steps=1"]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def messages_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning:")]


# ---- 1. a group of one rollout ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(n for n, cls in ALGORITHMS.items() if cls.needs.rollout))
def test_a_group_of_one_rollout_is_refused_where_advantages_are_relative_to_the_group(name):
    cls = ALGORITHMS[name]
    with pytest.raises(ConfigError, match=f"rollout.group_size=1 trains nothing with algorithm {name}: .*; use "
                                          r"rollout.group_size >= 2$"):
        cls.check_group_size(cls.config_class(), 1)
    cls.check_group_size(cls.config_class(), 2)


def test_group_size_1_is_a_one_line_error_at_validation_unless_the_advantage_is_the_raw_reward(tmp_path, capsys):
    line = one_line_error(capsys, "train", D1, "rollout.group_size=1", f"trainer.output_dir={tmp_path}", "--dry-run")
    assert line == ("error: rollout.group_size=1 trains nothing with algorithm d1: its advantages are relative to the "
                    "group (algorithm.advantage=mean: reward minus the group's mean), so one rollout per prompt gives "
                    "no learning signal; use rollout.group_size >= 2")
    assert load_train_config(D1, ["rollout.group_size=1", "algorithm.advantage=none"]).rollout.group_size == 1
    with pytest.raises(ConfigError, match="algorithm wd1: its weights are softmaxes"):  # wd1: whatever the advantage
        load_train_config(D1, ["algorithm.name=wd1", "rollout.group_size=1", "algorithm.advantage=none"])


# ---- 2. the final checkpoint ---------------------------------------------------------------------------------------
def test_a_run_without_periodic_saves_still_ends_with_a_checkpoint_a_rerun_resumes_from(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", SFT, f"trainer.output_dir={out}", *SMALL, "trainer.save_every=null"]
    assert main(args) == 0, capsys.readouterr().err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000001"] and (out / "final").is_dir()
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"resumed from {out / 'checkpoints' / 'step_00000001'} at step 1" in printed
    assert "no checkpoint" not in printed
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]


# ---- 3. LoRA target patterns ---------------------------------------------------------------------------------------
def test_the_dry_run_finds_a_lora_pattern_that_matches_no_module_as_the_run_does(tmp_path, capsys):
    args = ["train", LORA, "lora.target_modules=q_proj", f"trainer.output_dir={tmp_path / 'run'}"]
    line = one_line_error(capsys, *args, "--dry-run")
    assert line.startswith("error: lora.target_modules='q_proj' matches no module of the model (the pattern must "
                           "match a whole module path); its LoRA-adaptable modules include "
                           "model.transformer.blocks.0.q_proj, model.transformer.blocks.0.k_proj, ")
    assert one_line_error(capsys, *args, *SMALL) == line  # the run's own check, on the loaded model
    line = one_line_error(capsys, "train", LORA, r"lora.target_modules=.*\.(ln_f|q_proj)", "--dry-run",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line.startswith(r"error: lora.target_modules='.*\\.(ln_f|q_proj)' matches modules LoRA cannot adapt: "
                           "model.transformer.ln_f (RMSNorm); LoRA adapts linear and embedding layers, e.g. ")


def test_the_dry_run_checks_lora_patterns_against_a_checkpoint_directory(tmp_path, capsys):
    from dare.models.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint("llada", tmp_path / "model")
    capsys.readouterr()  # its progress bars
    common = ["train", LORA, f"model.path={model}", f"trainer.output_dir={tmp_path / 'run'}", "--dry-run"]
    assert main([*common, r"lora.target_modules=.*\.q_proj"]) == 0
    assert capsys.readouterr().err.startswith("dry run: the checks passed")
    assert "matches no module" in one_line_error(capsys, *common, r"lora.target_modules=.*\.qproj")


# ---- 4. and 6. data files ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, message", [
    ("d.csv", "prompt,response\na,b\n", "data file {path}: CSV is not supported; convert it to JSONL"),
    ("d.tsv", "prompt\tresponse\na\tb\n", "data file {path}: TSV is not supported; convert it to JSONL"),
    ("README", "notes\n", "data file {path}: unsupported file type 'README'; expected .jsonl, .json or .parquet"),
    ("d.txt", '{"prompt": "a", "response": "b"}\n', "data file {path}: unsupported file type '.txt'"),
    ("d.json", '[{"prompt": "a",\n "response": }]', "{path}:2: invalid JSON (Expecting value)"),
    ("d.jsonl", '{"prompt": "a", "response": "b"}\n\n[1, 2]\n', "{path}:3: record 1 is list, not an object of fields"),
])
def test_data_file_errors_name_the_file_and_line(name, text, message, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(text)
    line = one_line_error(capsys, "train", SFT, f"data.path={path}", f"trainer.output_dir={tmp_path / 'run'}", *SMALL)
    assert line.startswith("error: " + message.format(path=path))


def test_record_errors_name_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}, {"question": "a", "answer": "b"}])
    path.write_text(path.read_text().replace("\n", "\n\n", 1))  # a blank line: the record is on line 3
    with pytest.raises(InputError) as err:
        build_sft_dataset(DataConfig(path=str(path)), build_byte_tokenizer(), EOS_ID)
    assert str(err.value) == (f"{path}:3: record 1 has neither 'messages' nor 'prompt'/'response' (keys: answer, "
                              "question; data.messages_key, data.prompt_key and data.response_key name them)")
    with pytest.raises(InputError, match=f"^{path}:3: record 1 has neither 'prompt' nor 'messages'"):
        prompt_records(DataConfig(path=str(path)))
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "text": "hi"}]}])
    with pytest.raises(InputError, match=f"^{chat}:1: record 0: field 'messages' must be a list of"):
        build_sft_dataset(DataConfig(path=str(chat)), build_byte_tokenizer(), EOS_ID)


@pytest.mark.parametrize("chat_template", [True, False])
def test_an_integer_response_is_its_digits_and_other_non_text_values_are_errors(chat_template, tmp_path):
    tok = build_byte_tokenizer()
    number = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "6*7=", "response": 42}])
    text = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "6*7=", "response": "42"}])
    assert build_sft_dataset(DataConfig(path=str(number), chat_template=chat_template), tok, EOS_ID).examples == \
        build_sft_dataset(DataConfig(path=str(text), chat_template=chat_template), tok, EOS_ID).examples
    for value, kind in ((1.50, "a non-integer number (1.5)"), (True, "true/false (true)"), (None, "null (null)"),
                        ([1, 2], "a list ([1, 2])")):
        path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "response": "a"},
                                                    {"prompt": "q", "response": value}])
        with pytest.raises(InputError) as err:
            build_sft_dataset(DataConfig(path=str(path), chat_template=chat_template), tok, EOS_ID)
        assert str(err.value) == (f"{path}:2: record 1: field 'response' is {kind}, not text; write it as a JSON "
                                  "string holding exactly the text to train on")
    prompt = write_jsonl(tmp_path / "p.jsonl", [{"prompt": 7, "answer": 7}, {"prompt": 0.5, "answer": 1}])
    with pytest.raises(InputError, match=f"^{prompt}:2: record 1: field 'prompt' is a non-integer number"):
        prompt_records(DataConfig(path=str(prompt)))


# ---- 5. record-key settings ----------------------------------------------------------------------------------------
def test_key_settings_no_record_is_read_through_are_warned(tmp_path, caplog):
    tok = build_byte_tokenizer()
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": "yo"}]}])
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "response": "yo"}])
    with caplog.at_level(logging.WARNING, logger="dare.data"):
        build_sft_dataset(DataConfig(path=str(chat), prompt_key="question"), tok, EOS_ID)
        build_sft_dataset(DataConfig(path=str(pairs), messages_key="conversation"), tok, EOS_ID)
        prompt_records(DataConfig(path=str(chat), prompt_key="question"))
        build_sft_dataset(DataConfig(path=str(pairs)), tok, EOS_ID)  # defaults: nothing to say
        build_sft_dataset(DataConfig(path=str(chat), prompt_key="question"), tok, EOS_ID, warn=False)
    assert messages_of(caplog) == [
        f"warning: ignoring data.prompt_key=question: every record of {chat} holds a 'messages' chat "
        "(data.messages_key), which the run reads instead",
        f"warning: ignoring data.messages_key=conversation: every record of {pairs} holds no 'conversation' chat, so "
        "the run reads 'prompt'",
        f"warning: ignoring data.prompt_key=question: every record of {chat} holds a 'messages' chat "
        "(data.messages_key), which the run reads instead"]


def test_generated_data_ignores_the_key_settings_with_a_warning(tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="dare"):
        assert main(["train", SFT, "data.prompt_key=question", f"trainer.output_dir={out}", *SMALL,
                     "optim.warmup_steps=0"]) == 0  # the recipe's warm-up of 5 would be warned at 1 step
    assert messages_of(caplog) == ["warning: ignoring data.prompt_key: data.path=synthetic:reverse makes its own "
                                   "records (these keys name the fields of a data file's records)"]
    assert (out / "final").is_dir()  # trained: the generated records are read whatever the key settings


# ---- 7. tokenizers -------------------------------------------------------------------------------------------------
def test_a_model_directory_without_a_tokenizer_is_one_line_in_the_dry_run_and_the_run(tmp_path, capsys):
    from dare.models.tiny import write_tiny_checkpoint

    model = write_tiny_checkpoint("llada", tmp_path / "model")
    for file in model.iterdir():
        if file.name.startswith(("tokenizer", "chat_template")):
            file.unlink()
    capsys.readouterr()  # the checkpoint's progress bars
    message = (f"error: model.path {model} holds no tokenizer files (none of tokenizer_config.json, tokenizer.json, "
               "tokenizer.model, vocab.json, vocab.txt, spiece.model); set model.tokenizer to its tokenizer's "
               "directory or hub name")
    args = ["train", SFT, f"model.path={model}", f"trainer.output_dir={tmp_path / 'run'}", *SMALL]
    assert one_line_error(capsys, *args, "--dry-run") == message
    assert one_line_error(capsys, *args) == message


@pytest.mark.parametrize("files, reason", [
    ({"tokenizer.json": "{}"}, "(no 'added_tokens' entry in its files)"),
    ({"tokenizer_config.json": "{}"}, "(Couldn't instantiate the backend tokenizer from one of: (1) a `tokenizers` "
                                      "library serialization file, (2) "),
])
def test_a_tokenizer_transformers_cannot_load_is_one_readable_line(files, reason, tmp_path, capsys):
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    for name, text in files.items():
        (tokenizer / name).write_text(text)
    line = one_line_error(capsys, "train", SFT, *SMALL, f"model.tokenizer={tokenizer}",
                          f"trainer.output_dir={tmp_path / 'run'}")
    assert line.startswith(f"error: model.tokenizer={tokenizer}: cannot load a tokenizer {reason}")
    assert line.endswith("; a tokenizer directory holds tokenizer.json or tokenizer_config.json with the vocabulary "
                         "files it names")


# 8. a diverged run stops before its update --------------------------------------------------------------------------

def test_a_non_finite_loss_stops_the_run_before_its_update_and_exports_nothing(tmp_path, capsys):
    """float16 weights on CPU overflow at the first update: the run went on with ``loss=nan`` and exported all-NaN
    weights as ``final/``. Now the first non-finite loss or gradient norm is a one-line error, before the update."""
    out = tmp_path / "run"
    line = one_line_error(capsys, "train", SFT, "model.dtype=float16", "trainer.max_steps=4", "trainer.save_every=null",
                          f"trainer.output_dir={out}", "trainer.progress=false")
    assert line.startswith("error: step 2: the loss is nan; training stopped before the update") and \
        "try bfloat16 or float32" in line
    assert not (out / "final").exists() and not (out / "checkpoints").exists()
    steps = [json.loads(row)["step"] for row in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]


# 9. an export carries the chat template only when the run used it ------------------------------------------------

@pytest.mark.parametrize("chat_template", [False, True])
def test_an_export_carries_the_chat_template_only_when_the_run_trained_with_it(chat_template, tmp_path, capsys):
    """``dare demo``'s model (``data.chat_template: false``) was exported with its tokenizer's chat template, so
    ``dare generate`` / ``dare eval run`` wrapped prompts in a template the model never saw (demo accuracy 0.16 with
    ``--no-chat``, 0.0 without)."""
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    assert main(["train", SFT, *SMALL, f"trainer.output_dir={out}", f"data.chat_template={str(chat_template).lower()}"]) == 0
    capsys.readouterr()
    exported = AutoTokenizer.from_pretrained(str(out / "final"))
    assert bool(getattr(exported, "chat_template", None)) is chat_template
