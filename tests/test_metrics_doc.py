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
