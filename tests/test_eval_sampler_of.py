"""``dare eval run --sampler-of RUN``: evaluate with the rollout sampler a training run used."""

import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from dare.cli import main

DATA = Path(__file__).resolve().parents[1] / "configs" / "lm_eval" / "data" / "tiny_gen.jsonl"


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sampler_of") / "d1"
    assert main(["train", "llada/d1_tiny", f"trainer.output_dir={out}", "trainer.max_steps=1", "trainer.progress=false",
                 "rollout.sampler.steps=4", "rollout.sampler.temperature=0.7"]) == 0
    return out


def evaluate(out: Path, *flags) -> dict:
    assert main(["eval", "run", "--benchmark", "gsm8k", "--data", str(DATA), "--limit", "1", "--no-chat",
                 "--no-progress", "--out", str(out), *map(str, flags)]) == 0
    return json.loads(out.read_text())["sampler"]["settings"]


def test_the_runs_rollout_sampler_decodes_and_flags_override_single_settings(rl_run, tmp_path):
    import yaml

    recorded = yaml.safe_load((rl_run / "config.yaml").read_text())["rollout"]["sampler"]
    used = evaluate(tmp_path / "a.json", "--model", rl_run / "final", "--sampler-of", rl_run)
    for key in ("sampler", "gen_length", "block_length", "steps", "temperature"):
        assert used[key] == recorded[key], key
    assert (used["steps"], used["temperature"]) == (4, 0.7)
    plain = evaluate(tmp_path / "b.json", "--model", rl_run / "final")  # without it: eval's own defaults
    assert (plain["steps"], plain["temperature"]) != (4, 0.7)
    override = evaluate(tmp_path / "c.json", "--model", rl_run / "final", "--sampler-of", rl_run / "config.yaml",
                        "--temperature", "0")
    assert (override["steps"], override["temperature"]) == (4, 0.0)


def test_sampler_of_refuses_what_has_no_rollout_sampler(rl_run, tmp_path, capsys):
    sft = tmp_path / "sft"
    assert main(["train", "llada/sft_tiny", f"trainer.output_dir={sft}", "trainer.max_steps=1",
                 "trainer.progress=false"]) == 0
    common = ["eval", "run", "--model", "tiny:llada", "--benchmark", "gsm8k", "--data", DATA, "--limit", "1"]
    assert one_line_error(capsys, *common, "--sampler-of", sft) == (
        f"error: --sampler-of {sft}: the run (algorithm sft) records no rollout sampler: it trained without rollouts")
    line = one_line_error(capsys, *common, "--sampler-of", tmp_path / "nowhere")
    assert line.startswith(f"error: --sampler-of {tmp_path / 'nowhere'}: no ")
    (tmp_path / "broken.yaml").write_text("rollout: [unclosed\n")
    line = one_line_error(capsys, *common, "--sampler-of", tmp_path / "broken.yaml")
    assert line.startswith(f"error: --sampler-of {tmp_path / 'broken.yaml'}: {tmp_path / 'broken.yaml'}: not YAML (")
    (tmp_path / "odd.yaml").write_text("rollout: fast\nalgorithm: 3\n")  # sections that are not mappings
    line = one_line_error(capsys, *common, "--sampler-of", tmp_path / "odd.yaml")
    assert line.endswith("the run (algorithm None) records no rollout sampler: it trained without rollouts")
    line = one_line_error(capsys, "eval", "run", "--model", "tiny:llada", "--benchmark", "mmlu", "--data", DATA,
                          "--sampler-of", rl_run)
    assert line == "error: --sampler-of applies to generation; mmlu is scored by likelihood here (add --mode generate)"
