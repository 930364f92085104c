"""An RL data record without the field its reward scores against (or holding null there) is a one-line error when
the prompts load, naming the record's file and line, not a failure mid-run when the record is first scored (or a
null scored as the text 'None')."""

import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.errors import InputError
from dare.rewards import get_reward
from dare.trainer.config import DataConfig
from dare.trainer.prompts import prompt_records

ROOT = Path(__file__).resolve().parents[1]
D1 = str(ROOT / "configs/llada/d1_tiny.yaml")


def prompts_file(path: Path, bad: dict | None, at: int = 8, n: int = 64) -> Path:
    """``n`` prompt/answer records, record ``at`` replaced by ``bad``."""
    records = [{"prompt": f"reverse {i}", "answer": str(i)[::-1]} for i in range(n)]
    if bad is not None:
        records[at] = bad
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("bad, said", [
    ({"prompt": "x"}, "record 8 lacks 'answer', which reward 'char_closeness' needs (keys: prompt)"),
    ({"prompt": "x", "answer": None}, "record 8 holds null in 'answer', which reward 'char_closeness' needs"),
])
def test_a_record_without_its_rewards_field_is_refused_with_its_file_and_line(tmp_path, bad, said):
    path = prompts_file(tmp_path / "p.jsonl", bad)
    with pytest.raises(InputError) as err:
        prompt_records(DataConfig(path=str(path), num_examples=None), reward=get_reward("char_closeness"))
    assert str(err.value) == f"{path}:9: {said}"
    assert len(prompt_records(DataConfig(path=str(path), num_examples=None))) == 64  # no reward: nothing to check


def test_every_part_of_a_combined_reward_is_checked(tmp_path):
    path = prompts_file(tmp_path / "p.jsonl", None, n=4)
    data = DataConfig(path=str(path), num_examples=None)
    assert len(prompt_records(data, reward=get_reward({"char_closeness": 1.0, "exact_match": 0.5}))) == 4
    with pytest.raises(InputError) as err:  # d1_countdown: itself a combined reward, whose countdown part needs more
        prompt_records(data, reward=get_reward({"char_closeness": 1.0, "d1_countdown": 1.0}))
    assert str(err.value) == (f"{path}:1: record 0 lacks 'numbers', which reward 'countdown' needs (keys: answer, "
                              "prompt)")


def test_the_run_refuses_the_record_before_training(tmp_path, capsys):
    path = prompts_file(tmp_path / "p.jsonl", {"prompt": "x", "answer": None})
    line = one_line_error(capsys, "train", D1, f"trainer.output_dir={tmp_path / 'run'}", "trainer.max_steps=2",
                          f"data.path={path}", "data.num_examples=null", "trainer.progress=false")
    assert line == f"error: {path}:9: record 8 holds null in 'answer', which reward 'char_closeness' needs"
    assert not (tmp_path / "run" / "final").exists()


def test_the_dry_run_reads_the_prompt_records_too(tmp_path, capsys):
    """The dry run used to pass a file whose record the run refuses on loading; it reads the records now."""
    path = prompts_file(tmp_path / "p.jsonl", {"prompt": "x"})
    args = ("train", D1, f"trainer.output_dir={tmp_path / 'run'}", f"data.path={path}", "data.num_examples=null",
            "--dry-run")
    assert one_line_error(capsys, *args) == (
        f"error: {path}:9: record 8 lacks 'answer', which reward 'char_closeness' needs (keys: prompt)")
    prompts_file(path, None)
    from dare.cli import main

    assert main(list(args)) == 0
    assert not (tmp_path / "run").exists()  # the dry run creates nothing
