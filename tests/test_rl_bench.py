"""benchmarks/rl_step.py (tiny LLaDA, d1) and benchmarks/bd_rl_step.py (tiny SDAR, BGPO) end to end on CPU: both
variants run through the real workflow, every phase is timed, the ratios and projections are consistent, and a
failing variant is reported, not fatal."""

import dataclasses
import importlib.util
import json
import types
from pathlib import Path

import pytest

from rollout_helpers import single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[1]


def load(script: str):
    spec = importlib.util.spec_from_file_location(f"{script}_benchmark", ROOT / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench():
    return load("rl_step")


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


def test_bd_rl_step_benchmark_tiny(tmp_path, capsys):
    bench = load("bd_rl_step")
    out = tmp_path / "bd.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    naive, fast = data["results"]["naive"], data["results"]["optimised"]
    for r in (naive, fast):
        assert set(r["phases_s"]) == set(bench.PHASES) and all(t > 0 for t in r["phases_s"].values())
        assert len(r["updates_s"]) == 1  # BGPO: on-policy, one update per rollout
        assert abs(sum(r["phases_s"].values()) - r["cycle_s"]) < 5e-3
        assert r["rows"] == 8 and 0 < r["decoded_tokens"] <= 8 * 16
        assert r["blocks_timed"] == r["blocks"] == 4 and r["projected_full_cycle_s"] == pytest.approx(r["cycle_s"])
        # engine auto records per shape: warm-ups over the timed blocks, one per prompt batch, so the timed cycle
        # records nothing
        assert r["warmup_blocks"] == [1, 4, 4] and r["graph_captures"] == 0 and r["discarded_cycles"] == []
        scale = 16 / 2  # 2 MC terms timed, the recipe's 16 projected
        ph = r["phases_s"]
        assert r["projected_bgpo_mc16_s"] == pytest.approx(
            r["projected_rollout_s"] + ph["reward"] + (ph["logprobs"] + ph["update"]) * scale)
        assert 0 <= r["eos_fraction"] <= 1 and 0 < r["commit_confidence"] < 1
        assert "algorithm.name=bgpo" in r["config"] and "algorithm.mc_num=2" in r["config"]
    assert naive["row_tokens_per_step"] <= 1.0 <= fast["row_tokens_per_step"]  # one token per step vs dynamic
    for flag in ("rollout.sampler.cache=none", "rollout.sampler.decoder=quota", "rollout.sampler.full_logits=true",
                 "rollout.sampler.attn_backend=eager", "model.attn_backend=eager", "model.logits_chunk_size=0"):
        assert flag in naive["config"], flag
    for flag in ("rollout.sampler.cache=block", "rollout.sampler.decoder=dynamic", "model.attn_backend=sdpa",
                 "rollout.sampler.attn_backend=sdpa"):
        assert flag in fast["config"], flag
    assert data["summary"]["update_x"] == pytest.approx(naive["phases_s"]["update"] / fast["phases_s"]["update"])
    assert "| rollout |" in printed and "BGPO step, 16 MC terms (projected)" in printed


def test_bd_rl_step_projects_full_recompute_by_its_forward_lengths():
    bench = load("bd_rl_step")
    args = types.SimpleNamespace(prompt_length=100, prompt_spread=0, block=4)
    cached, recompute = bench.VARIANTS["optimised"], bench.VARIANTS["naive"]
    assert bench.rollout_scale(args, cached, 2, 8) == 4.0
    # block k's forwards process 100 + 4 (k + 1) tokens: 2 blocks = 212, 8 blocks = 944
    assert bench.rollout_scale(args, recompute, 2, 8) == pytest.approx(944 / 212)


def test_engine_option_is_passed_only_to_a_sampler_config_with_an_engine_field(monkeypatch):
    harness = load("bd_rl_step").rl_harness  # the script puts benchmarks/ on sys.path for the harness
    from dare.rollout import SamplerConfig

    has_engine = "engine" in {f.name for f in dataclasses.fields(SamplerConfig)}
    assert harness.engine_overrides("graph") == ({"rollout.sampler.engine": "graph"} if has_engine else {})

    @dataclasses.dataclass
    class WithEngine:
        engine: str = "auto"

    monkeypatch.setattr("dare.rollout.SamplerConfig", WithEngine)
    assert harness.engine_overrides("eager") == {"rollout.sampler.engine": "eager"}


def test_rl_step_benchmark_passes_rollout_weights_to_the_optimised_variant_only(bench, tmp_path):
    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--engine", "static", "--weights", "merged", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert "error" not in results["optimised"] and "error" not in results["naive"]
    assert "rollout.sampler.weights=merged" in results["optimised"]["config"]
    assert not any("rollout.sampler.weights" in c for c in results["naive"]["config"])


def test_warm_ups_reach_every_step_shape_of_the_timed_cycle(tmp_path, monkeypatch):
    """The static engine records one step per (kind, KV-width bucket); the timed cycle must find them all recorded.
    A row whose prompt ends inside a block decodes one block more than gen / block, so a warm-up capped at gen /
    block blocks missed the last bucket (the GPU then recorded and compiled two steps inside the timed rollout)."""
    import sys

    import dare.rollout.engine as engine
    import dare.rollout.samplers as samplers
    from dare.rollout.engine import graphs

    # the graph engine's shapes (prompt widths in multiples of 64, batch buckets) without CUDA: its StepRunner runs
    # the steps eagerly off CUDA, so 'graph' is let through on the CPU
    monkeypatch.setattr(samplers, "resolve_engine", lambda name, device: "graph" if name == "graph" else name)
    bench = load("bd_rl_step")
    harness = sys.modules["rl_harness"]
    calls, first_seen = [0], {}
    timed_step, run = harness.timed_step, graphs.StepRunner.run

    def counting_step(*args, **kwargs):
        calls[0] += 1
        return timed_step(*args, **kwargs)

    def noting_run(self, key, fn):
        first_seen.setdefault((id(self), key), calls[0])
        return run(self, key, fn)

    monkeypatch.setattr(harness, "timed_step", counting_step)
    monkeypatch.setattr(graphs.StepRunner, "run", noting_run)
    out = tmp_path / "bd.json"
    assert bench.main(["--tiny", "--variants", "optimised", "--engine", "graph", "--gen", "64", "--json",
                       str(out)]) == 0
    result = json.loads(out.read_text())["results"]["optimised"]
    warmups = len(result["warmup_blocks"])
    assert result["warmup_blocks"] == [1, 16, 16] and calls[0] == warmups + 1
    assert {key[0] for _, key in first_seen} == {"first", "inner"}
    assert max(key[-1] for _, key in first_seen) > engine.PROMPT_WIDTH_MULTIPLE + 64  # the 17th block's bucket
    late = [key for key, call in first_seen.items() if call > warmups]
    assert not late, f"steps first run in the timed cycle: {late}"


def test_profile_marks_split_a_cycle_into_the_source_phases(bench, tmp_path):
    """--profile labels the kernels between marks by the source's clock reads: one mark per read, one after each
    update; a kernel list splits at the marker kernels into those labels."""
    from rl_harness import SOURCE_PHASES, phase_segments, top_kernels

    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--variants", "optimised", "--profile", "--json", str(out)]) == 0
    profile = json.loads(out.read_text())["results"]["optimised"]["profile"]
    assert profile == {"marks": len(SOURCE_PHASES) + 2}  # mu 2: the second update follows the first's mark

    spin = ("spin_kernel(long)", 0.0, 1.0)
    kernels = [("before", 0, 1), spin, spin, ("gemm_a", 2, 5), ("gemm_a", 5, 6), spin, ("triton_b", 6, 8)]
    segments = phase_segments(kernels, ["start", "rollout"])
    assert segments == {"rollout": [("gemm_a", 2, 5), ("gemm_a", 5, 6)], "segment 2": [("triton_b", 6, 8)]}
    lines = top_kernels(segments["rollout"] + segments["segment 2"]).splitlines()
    assert "gemm_a" in lines[0] and "2 x" in lines[0] and "triton_b" in lines[1]  # most total time first
    assert "median      3.0 us, max      3.0 us" in lines[0]  # the upper median of [1, 3] us and the longest call


def test_kernel_time_is_the_union_of_intervals_and_is_held_against_the_timed_phases():
    """--profile: a phase's kernel time counts overlapping kernels once; the report sets it against the timed
    (unprofiled) phase, updates one by one, so the profiler's own host overhead does not read as idle time."""
    from rl_harness import busy_seconds, idle_against_timed

    kernels = [("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 20.0, 25.0), ("d", 21.0, 22.0)]
    assert busy_seconds(kernels) == pytest.approx(17e-6)  # [0, 12] and [20, 25]
    assert busy_seconds([]) == 0.0
    report = idle_against_timed({"rollout": 0.5, "update": 0.75, "update 2": 1.0, "logprobs": 0.2},
                                {"rollout": 1.0, "reward": 0.01, "logprobs": 0.2, "update": 2.0}, [1.0, 1.0])
    assert report.splitlines() == ["rollout: kernels 0.500 s of the timed 1.000 s (50 % idle)",
                                   "logprobs: kernels 0.200 s of the timed 0.200 s (0 % idle)",
                                   "update: kernels 0.750 s of the timed 1.000 s (25 % idle)",
                                   "update 2: kernels 1.000 s of the timed 1.000 s (0 % idle)"]


def test_a_profiled_cycle_is_held_against_the_timed_one(bench, tmp_path, monkeypatch, capsys):
    """The kernel times of the profiled cycle are logged against the timed cycle's phases."""

    def profiled(*args, **kwargs):
        return {"marks": 9, "kernel_s": {"rollout": 1e-4, "update": 1e-4}}

    monkeypatch.setattr(bench.rl_harness, "profile_cycle", profiled)
    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--variants", "optimised", "--profile", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["results"]["optimised"]
    assert result["profile"]["kernel_s"] == {"rollout": 1e-4, "update": 1e-4}
    printed = capsys.readouterr().out
    timed = result["updates_s"][0]
    assert f"update: kernels 0.000 s of the timed {timed:.3f} s" in printed and "rollout: kernels 0.000 s" in printed


def _synchronising_call(kind: str = "sync"):
    import warnings

    text = "called a synchronizing CUDA operation" if kind == "sync" else "something else"
    warnings.warn(text, UserWarning)  # a test-file frame: the site counted under roots ("/tests/",)


def test_sync_sites_count_synchronising_calls_per_phase_and_call_site(bench, monkeypatch):
    """--syncs: each synchronising-call warning is counted under the phase of its moment and its call site (the
    innermost frames under the given roots); other warnings reach the usual handler, uncounted."""
    import warnings

    from rl_harness import SyncSites

    phase = [0]
    sites = SyncSites(lambda: phase[0], depth=2, roots=("/tests/",))
    passed = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *rest, **kw: passed.append(str(message)))
    with sites.watching(cuda=False):
        phase[0] = 1
        for _ in range(3):
            _synchronising_call()
        phase[0] = 2
        _synchronising_call()
        _synchronising_call(kind="other")
    assert passed == ["something else"]
    assert sum(sites.counts.values()) == 4 and {index for index, _ in sites.counts} == {1, 2}
    site = next(iter(sites.counts))[1]
    assert site.startswith("test_rl_bench.py:") and "_synchronising_call <- test_rl_bench.py:" in site
    report = sites.report(["start", "rollout"]).splitlines()
    assert report[0] == "start: 3 synchronising calls" and report[1].strip().startswith("3  test_rl_bench.py")
    assert report[2] == "rollout: 1 synchronising calls"
    assert sites.report(["start"]).splitlines()[2] == "segment 1: 1 synchronising calls"  # beyond the labels
    assert SyncSites(lambda: 0).report([]) == "no synchronising calls"


def test_syncs_alone_runs_the_extra_cycle_without_the_profiler(bench, tmp_path, capsys):
    """--syncs without --profile: the extra cycle runs (its marks are counted), no kernel profile is attempted; on
    the CPU nothing synchronises with a GPU, said in one line."""
    from rl_harness import SOURCE_PHASES

    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--variants", "optimised", "--syncs", "--json", str(out)]) == 0
    profile = json.loads(out.read_text())["results"]["optimised"]["profile"]
    assert profile == {"marks": len(SOURCE_PHASES) + 2}  # mu 2
    printed = capsys.readouterr().out
    assert "--syncs: no CUDA device" in printed and "no kernels profiled" not in printed


def test_a_failing_profile_keeps_the_timed_result(bench, tmp_path, monkeypatch):
    """--profile runs after the timed cycle: its failure is recorded beside the result, not in place of it."""

    def broken(*args, **kwargs):
        raise RuntimeError("profiler unavailable")

    monkeypatch.setattr(bench.rl_harness, "profile_cycle", broken)
    out = tmp_path / "rl.json"
    assert bench.main(["--tiny", "--variants", "optimised", "--profile", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["results"]["optimised"]
    assert result["cycle_s"] > 0 and result["profile"] == {"error": "RuntimeError: profiler unavailable"}


def test_attention_host_benchmark_tiny(tmp_path, capsys):
    """benchmarks/attention_host.py on the CPU: every backend x block mode is timed, the JSON is the report, the
    table lists each row."""
    host = load("attention_host")
    out = tmp_path / "host.json"
    report = host.main(["--tiny", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [(r["backend"], r["blocks"]) for r in report["results"]] == [("sdpa", "eager"), ("eager", "eager")]
    assert all(r["host_ms"] > 0 and r["wall_ms"] > 0 and "block_mask_ms" not in r for r in report["results"])
    printed = capsys.readouterr().out
    assert "| sdpa | eager |" in printed and "| eager | eager |" in printed


def test_attention_host_micro_batch_and_block_mask_on_cpu():
    """The micro-batch masks the second half of every noisy row and left-pads rows 1 and 3; one forward's
    BlockMask is built (eagerly on the CPU) and timed."""
    import torch

    host = load("attention_host")
    cpu = torch.device("cpu")
    noisy, clean, mask = host.micro_batch(4, 40, cpu, mask_id=259)
    assert bool((clean < 259).all()) and bool((noisy[:, 20:] == 259).all()) and bool((noisy[:, :20] == clean[:, :20]).all())
    assert mask.sum(1).tolist() == [40, 36, 40, 39]
    assert bool((mask[1, :4] == 0).all()) and bool((mask[3, :1] == 0).all())
    assert host.block_mask_ms(types.SimpleNamespace(warmup=1, iters=2), cpu, noisy, clean, mask, 4) > 0


@pytest.mark.parametrize("argv, message", [
    (["--backends", "flex", "--layers", "2", "--length", "16"], "flex has no backward pass on the CPU"),
    (["--iters", "0"], "--layers, --batch and --iters take counts >= 1"),
    (["--layers", "0"], "--layers, --batch and --iters take counts >= 1"),
    (["--batch", "0"], "--layers, --batch and --iters take counts >= 1"),
    (["--length", "1"], "--length >= 2"),
    (["--warmup", "-1"], "--warmup >= 0"),
])
def test_attention_host_refuses_bad_options_in_one_line(argv, message, capsys):
    host = load("attention_host")
    with pytest.raises(SystemExit) as exit_:
        host.main(["--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err
