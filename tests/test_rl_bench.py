"""benchmarks/rl_step.py end to end on CPU (tiny LLaDA): both variants run through the real workflow, every
phase is timed, the ratios and projections are consistent, and a failing variant is reported, not fatal."""

import importlib.util
import json
from pathlib import Path

import pytest

from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("rl_step_benchmark", ROOT / "benchmarks" / "rl_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rl_step_benchmark_tiny(bench, tmp_path, capsys):
    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    naive, fast = data["results"]["naive"], data["results"]["optimised"]
    for r in (naive, fast):
        assert set(r["phases_s"]) == set(bench.PHASES) and all(t > 0 for t in r["phases_s"].values())
        assert len(r["updates_s"]) == 2 and abs(sum(r["updates_s"]) - r["phases_s"]["update"]) < 1e-9
        assert abs(sum(r["phases_s"].values()) - r["cycle_s"]) < 5e-3  # the phases cover the step
        assert r["rows"] == 8 and 8 * 8 < r["decoded_tokens"] <= 8 * 16  # 2 prompts x 4 samples (EOS may stop a row)
        assert r["tokens_per_forward"] == pytest.approx(r["decoded_tokens"] / 8 / r["nfe"])
        assert r["blocks_timed"] == r["blocks"] == 2 and r["projected_full_cycle_s"] == pytest.approx(r["cycle_s"])
        assert all(k is not None for k in r["kl"])  # beta > 0: reference log-probs were used
    assert naive["nfe"] == 16 and naive["tokens_per_forward"] <= 1.0  # LLaDA sampler: one token per step
    assert fast["nfe"] <= 16 and fast["tokens_per_forward"] >= 1.0
    assert "model.attn_backend=eager" in naive["config"] and "rollout.sampler.cache=none" in naive["config"]
    assert "model.attn_backend=sdpa" in fast["config"] and "rollout.sampler.cache=dual" in fast["config"]
    summary = data["summary"]
    assert summary["cycle_x"] == pytest.approx(naive["cycle_s"] / fast["cycle_s"])
    assert summary["rollout_x"] == pytest.approx(naive["phases_s"]["rollout"] / fast["phases_s"]["rollout"])
    assert "| rollout |" in printed and "| update |" in printed and "end to end:" in printed


def test_rl_step_benchmark_reports_a_failing_variant_and_runs_full_fine_tuning(bench, tmp_path, capsys):
    bench.VARIANTS["naive"] = dict(bench.VARIANTS["naive"], attn="flex")  # flex cannot train on the CPU
    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--no-lora", "--inner-steps", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert "cannot train on CPU" in results["naive"]["error"]
    fast = results["optimised"]
    assert fast["phases_s"]["logprobs"] > 0 and len(fast["updates_s"]) == 1  # reference (frozen copy) forwards
    assert "lora.enabled=false" in fast["config"]
    assert "FAILED naive" in capsys.readouterr().out
