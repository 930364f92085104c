"""``dare train --dry-run`` reads an SFT data file's records and a preference run's pairs with the loaders' own
checks: a record the run refuses on loading (no chat, no prompt/response; no chosen/rejected) fails the dry run with
the run's ``FILE:LINE: record N`` error, where it used to pass."""

import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]
SFT = str(ROOT / "configs/llada/sft_tiny.yaml")
VRPO = str(ROOT / "configs/llada/vrpo_tiny.yaml")


def data_file(path: Path, good: dict, bad: dict | None, at: int = 5, n: int = 32) -> Path:
    """``n`` copies of record ``good``, record ``at`` replaced by ``bad``; a blank line first (lines count from 1)."""
    records = [good] * n
    if bad is not None:
        records[at] = bad
    path.write_text("\n" + "".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("recipe, good, bad, said", [
    (SFT, {"prompt": "p", "response": "r"}, {"question": "q", "answer": "a"},
     "record 5 has neither 'messages' nor 'prompt'/'response' (keys: answer, question; data.messages_key, "
     "data.prompt_key and data.response_key name them)"),
    (SFT, {"prompt": "p", "response": "r"}, {"prompt": "p", "response": 1.5},
     "record 5: field 'response' is a non-integer number (1.5), not text; write it as a JSON string holding exactly "
     "the text to train on"),
    (SFT, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     {"messages": [{"role": "user", "content": "q"}]}, "record 5: the last message must be the assistant's response"),
    (VRPO, {"prompt": "p", "chosen": "c", "rejected": "r"}, {"prompt": "p", "chosen": "c"},
     "record 5 lacks rejected (keys: chosen, prompt; data.prompt_key, data.chosen_key and data.rejected_key name "
     "them)"),
    (VRPO, {"prompt": "p", "chosen": "c", "rejected": "r"}, {"prompt": "p", "chosen": "c", "rejected": None},
     "record 5: field 'rejected' is null (null), not text; write it as a JSON string holding exactly the text to "
     "train on"),
])
def test_the_dry_run_refuses_a_record_the_run_refuses(tmp_path, capsys, recipe, good, bad, said):
    path = data_file(tmp_path / "d.jsonl", good, bad)
    args = ("train", recipe, f"trainer.output_dir={tmp_path / 'run'}", f"data.path={path}", "data.num_examples=null",
            "--dry-run")
    assert one_line_error(capsys, *args) == f"error: {path}:7: {said}"
    data_file(path, good, None)
    assert main(list(args)) == 0
    assert "dry run: the checks passed" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_dry_runs_error_is_the_runs(tmp_path, capsys):
    """The same line as the run gives when it loads the data (the audit's ``{"question", "answer"}`` file)."""
    path = data_file(tmp_path / "keys.jsonl", {"question": "q", "answer": "a"}, None)
    args = ("train", SFT, f"trainer.output_dir={tmp_path / 'run'}", f"data.path={path}", "trainer.max_steps=1",
            "trainer.progress=false")
    dry = one_line_error(capsys, *args, "--dry-run")
    assert dry == one_line_error(capsys, *args)
    assert dry.startswith(f"error: {path}:2: record 0 has neither 'messages' nor 'prompt'/'response'")


def test_records_past_data_num_examples_are_not_read(tmp_path, capsys):
    path = data_file(tmp_path / "d.jsonl", {"prompt": "p", "response": "r"}, {"question": "q"}, at=31)
    assert main(["train", SFT, f"trainer.output_dir={tmp_path / 'run'}", f"data.path={path}",
                 "data.num_examples=16", "--dry-run"]) == 0
