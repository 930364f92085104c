"""docs/metrics.md documents every key `dare train` logs: tiny runs of SFT, RL (d1; TraceRL with its value model),
DPO, and every metric name spelled in the source, checked against the first column of its tables (``NAME/*``
patterns allowed), so the reference cannot go stale."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from dare.trainer import Trainer, load_train_config

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"
PREFIXES = ("rollout", "policy", "value", "dpo", "igpo", "distill", "time", "eval")
"""Prefixes of the metric names looked for in the source (string literals such as ``"policy/kl"``)."""


def documented() -> set[str]:
    """Keys and ``*`` patterns of the first column of the doc's tables."""
    return set(re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), re.MULTILINE))


def undocumented(keys) -> list[str]:
    names = documented()
    return sorted(k for k in keys if k not in names and not any(fnmatchcase(k, n) for n in names if "*" in n))


def test_the_doc_is_linked_from_the_readme_and_rejects_unknown_keys():
    assert "(docs/metrics.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert undocumented(["loss", "policy/kl", "rollout/dynamic/filled"]) == []
    assert undocumented(["no_such_metric", "policy/no_such"]) == ["no_such_metric", "policy/no_such"]


@pytest.mark.parametrize("recipe, steps", [("llada/sft_tiny", 1), ("llada/d1_tiny", 2), ("sdar/tracerl_tiny", 2),
                                           ("llada/vrpo_tiny", 1)])
def test_every_key_a_tiny_run_logs_is_documented(recipe, steps, tmp_path):
    config = load_train_config(str(ROOT / f"configs/{recipe}.yaml"), [
        f"trainer.output_dir={tmp_path}", f"trainer.max_steps={steps}", "trainer.batch_size=8",
        "trainer.micro_batch_size=8", "trainer.progress=false", "trainer.export=false"])
    record = Trainer(config).train()
    logged = {key for line in (tmp_path / "metrics.jsonl").read_text().splitlines() for key in json.loads(line)}
    assert "grad_norm" in logged and "loss" in logged
    assert undocumented(logged | set(record)) == []  # the returned record's summary keys too


def test_every_metric_named_in_the_source_is_documented():
    pattern = re.compile(r"[\"']((?:%s)/[a-z0-9_/]+)[\"']" % "|".join(PREFIXES))
    named = {name for path in (ROOT / "src" / "dare").rglob("*.py")
             for name in pattern.findall(path.read_text(encoding="utf-8"))}
    assert {"policy/kl", "rollout/reward", "igpo/replaced"} <= named  # the scan finds them
    assert undocumented(named) == []


def test_a_rollout_step_that_log_every_skips_is_carried_into_the_next_logged_record(tmp_path):
    """Before: log_every=4 with inner_steps=2 logged steps 4 and 6, neither holding a rollout/* key (the rollouts
    were made on steps 1, 3 and 5), so no reward reached metrics.jsonl."""
    config = load_train_config(str(ROOT / "configs/llada/d1_tiny.yaml"), [
        f"trainer.output_dir={tmp_path}", "trainer.max_steps=6", "trainer.batch_size=8", "algorithm.inner_steps=2",
        "trainer.micro_batch_size=8", "trainer.progress=false", "trainer.export=false", "trainer.log_every=4"])
    Trainer(config).train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 6]
    assert [r.get("rollout/step") for r in records] == [3, 5]
    assert all(isinstance(r["rollout/reward"], float) for r in records)
    config.trainer.log_every = 1
    config.trainer.output_dir = str(tmp_path / "every")
    Trainer(config).train()
    every = [json.loads(line) for line in (tmp_path / "every" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in every if "rollout/reward" in r] == [1, 3, 5]  # logged where made, nothing carried
    assert not any("rollout/step" in r for r in every)
    assert [every[2]["rollout/reward"], every[4]["rollout/reward"]] == [r["rollout/reward"] for r in records]
