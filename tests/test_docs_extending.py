"""docs/extending.md runs as written: every ``# file:`` example is written to a fresh directory and run by the doc's
own ``dare`` commands (tiny models, CPU, tiny settings appended to training commands), and each test checks that the
plug-in itself produced the result (its advantages, rewards, sampler settings, benchmark samples). A command whose
doc comment is ``# error: ...`` must fail with that one line."""

import dataclasses
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from dare import plugins
from dare.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "extending.md").read_text()
FILES = {name: body for body, name in re.findall(r"```python\n(# file: (\S+)\n.*?)```", DOC, re.S)}
DATA = dict(re.findall(r"`(\S+\.jsonl)`:\s*```jsonl\n(.*?)```", DOC, re.S))
TINY_SFT = ["trainer.max_steps=1", "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.progress=false"]
TINY_TRAIN = [*TINY_SFT, "algorithm.inner_steps=1", "rollout.samples_per_step=8"]
EXAMPLES = {"my_d1_rank.py", "my_reward.py", "my_sampler.py", "my_run_sampler.py", "my_bench.py", "my_family.py"}


def doc_commands() -> list[tuple[list[str], str | None]]:
    """``(argv after 'dare', expected error line or None)`` of every ``dare`` line of the doc's bash blocks."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", DOC, re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("  # ")
            if command.strip().startswith("dare "):
                expected = comment.strip() if comment.strip().startswith("error:") else None
                commands.append((shlex.split(command)[1:], expected))
    return commands


@pytest.fixture(autouse=True)
def isolated_plugins(monkeypatch, tmp_path, tmp_path_factory):
    """Each test runs in its own directory holding the doc's files, with no plug-in imported, and leaves the
    registries, sys.path and sys.modules as it found them (the examples' registrations must not leak)."""
    from dare.algorithms import ALGORITHMS
    from dare.eval.benchmark import ALIASES, BENCHMARKS
    from dare.models.spec import FAMILIES
    from dare.rewards import REWARDS
    from dare.rollout.registry import SAMPLERS

    registries = [ALGORITHMS, ALIASES, BENCHMARKS, FAMILIES, REWARDS, SAMPLERS]
    saved = [dict(r) for r in registries]
    modules, path = set(sys.modules), list(sys.path)
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_LOADED", True)  # no installed plug-in of this machine
    for name, text in {**FILES, **DATA}.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)  # the doc's commands name the files relative to the current directory
    yield
    for registry, before in zip(registries, saved):
        registry.clear()
        registry.update(before)
    temporary = str(tmp_path_factory.getbasetemp())
    for name in set(sys.modules) - modules:
        if name.startswith(plugins.FILE_MODULE_PREFIX) or \
                str(getattr(sys.modules[name], "__file__", None) or "").startswith(temporary):
            del sys.modules[name]
    sys.path[:] = path


def run_examples_of(file: str, capsys, tmp_path) -> list[tuple[list[str], str]]:
    """Run the doc's commands that use ``file``; an ``# error:`` one must fail with that line, the others succeed.
    Returns ``(argv, stdout)`` of the successful ones (training commands get TINY_TRAIN, SFT recipes TINY_SFT, and
    their own output dir)."""
    done = []
    commands = [(argv, error) for argv, error in doc_commands() if file in " ".join(argv)]
    assert commands, f"docs/extending.md runs {file} with no dare command"
    for number, (argv, expected) in enumerate(commands):
        if argv[0] == "train":
            tiny = TINY_SFT if Path(argv[1]).name.startswith("sft") else TINY_TRAIN
            argv = [*argv, *tiny, f"trainer.output_dir={tmp_path / f'run{number}'}"]
        elif argv[:2] == ["eval", "run"]:
            argv = [*argv, "--no-progress"]
        status = main(argv)
        out, err = capsys.readouterr()
        if expected is None:
            assert status == 0, (argv, err)
            done.append((argv, out))
        else:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert status == 2 and len(errors) == 1 and errors[0].startswith(expected), (argv, err)
    return done


def output_dir(argv: list[str]) -> Path:
    return Path(next(a.split("=", 1)[1] for a in argv if a.startswith("trainer.output_dir=")))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_every_example_is_a_file_run_by_a_command_of_the_doc():
    assert DOC.count("```python\n") == len(FILES), "every python block starts with '# file: NAME.py'"
    assert set(FILES) == EXAMPLES, "a new example needs its test below"
    for name in FILES:
        assert any(name in " ".join(argv) for argv, _ in doc_commands()), name


def test_the_rank_advantage_algorithm_trains_with_its_own_advantages(tmp_path, capsys):
    [(argv, _)] = run_examples_of("my_d1_rank.py", capsys, tmp_path)
    out = output_dir(argv)
    from dare.config import load_yaml

    config = load_yaml(out / "config.yaml")
    assert config["algorithm"]["name"] == "d1_rank"
    scale = float(next(a.split("=")[1] for a in argv if a.startswith("algorithm.rank_scale=")))
    assert config["algorithm"]["rank_scale"] == scale
    group = config["rollout"]["group_size"]
    rewards = [row["reward"] for row in jsonl(out / "rollouts.jsonl")]
    assert len(rewards) == 8
    expected = []  # the doc's rule, written out: centred mean rank within the group, times rank_scale
    for start in range(0, len(rewards), group):
        g = rewards[start:start + group]
        for r in g:
            rank = sum(x < r for x in g) + (sum(x == r for x in g) - 1) / 2
            expected.append(abs((rank / (group - 1) * 2 - 1) * scale))
    record = jsonl(out / "metrics.jsonl")[-1]
    assert record["rollout/advantage_abs"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    assert record["rollout/advantage_abs"] > 0.5  # d1's own mean-centred advantages of char_closeness are ~0.1


def test_the_reward_scores_every_rollout(tmp_path, capsys):
    [(argv, _)] = run_examples_of("my_reward.py", capsys, tmp_path)
    out = output_dir(argv)
    rows = jsonl(out / "rollouts.jsonl")
    assert len(rows) == 8
    for row in rows:  # synthetic:reverse: the answer is the prompt's word reversed
        answer = row["prompt"].split()[-1][::-1]
        share = len(set(answer) & set(row["completion"])) / len(set(answer))
        assert row["reward"] == pytest.approx(share) and row["correct"] == (row["completion"].strip() == answer)
    record = jsonl(out / "metrics.jsonl")[-1]
    assert record["rollout/reward"] == pytest.approx(sum(r["reward"] for r in rows) / 8, rel=1e-5)
    assert record["rollout/partial"] == pytest.approx(record["rollout/reward"], rel=1e-5)


def test_the_preset_sampler_decodes_with_its_defaults(tmp_path, capsys):
    [(_, out)] = run_examples_of("my_sampler.py", capsys, tmp_path)
    result = json.loads(out)
    assert result["sampler"] == "llada_fast4"
    assert {k: result["config"][k] for k in ("block_length", "decoder", "threshold", "gen_length")} == {
        "block_length": 4, "decoder": "threshold", "threshold": 0.8, "gen_length": 8}


def test_the_sampler_with_its_own_run_decodes_through_it_on_the_eager_engine_only(tmp_path, capsys):
    [(_, out)] = run_examples_of("my_run_sampler.py", capsys, tmp_path)  # also: engine=graph is the doc's error
    result = json.loads(out)
    assert result["sampler"] == "llada_logged" and result["config"]["block_length"] == 4
    [module] = [sys.modules[p.module] for p in plugins._LOADED.values() if p.spec == "my_run_sampler.py"]
    assert module.CALLS[0] == (1, result["nfe"])  # the generate call went through the plug-in's run


def test_the_benchmark_reads_the_local_jsonl_and_scores_with_its_reward(tmp_path, capsys):
    [(argv, _)] = run_examples_of("my_bench.py", capsys, tmp_path)
    from dare.rewards import get_reward

    results = json.loads(Path(argv[argv.index("--out") + 1]).read_text())
    words = jsonl(tmp_path / "words.jsonl")
    assert results["benchmark"] == "reverse_words" and results["num_problems"] == len(words) == 3
    assert [s["id"] for s in results["samples"]] == [w["id"] for w in words]
    assert [s["gold"] for s in results["samples"]] == [w["word"][::-1] for w in words]
    assert all(f"Reverse the word {w['word']}.\nAnswer:" in s["prompt"] for s, w in zip(results["samples"], words))
    scored = get_reward("exact_match").score([s["prediction"] for s in results["samples"]],
                                             [{"answer": s["gold"]} for s in results["samples"]])
    assert [s["reward"] for s in results["samples"]] == pytest.approx([r.reward for r in scored])
    assert results["metrics"]["reward"] == pytest.approx(sum(r.reward for r in scored) / 3)
    assert [Path(p).name for p in results["imports"]] == ["my_bench.py"]
    from dare.eval import get_benchmark  # registered by the run: a right answer scores 1 (a random model's do not)

    bench = get_benchmark("reverse_words")
    samples = bench.load("words.jsonl")
    right = bench.score([w["word"][::-1] for w in words], samples)
    assert all(r.correct and r.reward == 1.0 for r in right)
    assert not any(r.correct for r in bench.score([w["word"] for w in words], samples))


def test_the_model_family_decodes_trains_and_loads_its_checkpoints_by_its_own_names(tmp_path, capsys):
    done = run_examples_of("my_family.py", capsys, tmp_path)  # also: an unknown family is the doc's error
    import math

    from safetensors.torch import load_file, save_file

    from dare.errors import ConfigError
    from dare.models import FAMILIES, family_of, load_model, register_family
    from dare.models.tiny import tiny_model

    spec = FAMILIES["mydlm"]
    assert spec.config_class.model_type == "mydlm" and spec.attention == "full" and spec.logit_shift == 0
    model = tiny_model("mydlm")
    assert type(model) is spec.model_class and family_of(model) is spec
    assert spec.token_ids(spec.config_class()).mask == 50000  # the spec's id when config.json names none
    generated = [json.loads(out) for argv, out in done if argv[0] == "generate"]
    assert len(generated) == 2  # tiny:mydlm, then the checkpoint dare tiny wrote
    for result in generated:  # the family's default sampler, 8 tokens
        assert result["sampler"] == "mydlm" and result["config"]["block_length"] == 4
        assert [len(r["tokens"]) for r in result["results"]] == [8]
    full, lora = [output_dir(argv) for argv, _ in done if argv[0] == "train"]
    for run in (full, lora):
        [record] = jsonl(run / "metrics.jsonl")
        assert record["step"] == 1 and math.isfinite(record["loss"])
    assert json.loads((full / "final" / "config.json").read_text())["model_type"] == "mydlm"
    adapter = json.loads((lora / "final" / "adapter_config.json").read_text())
    assert adapter["target_modules"] == spec.lora_targets
    assert main(["merge-lora", "--import", "my_family.py", "--adapter", str(lora / "final"), "--out", "merged"]) == 0
    assert type(load_model("merged")) is spec.model_class
    checkpoint = load_model("mydlm_tiny")  # through AutoModel, strictly by the model's own parameter names
    assert type(checkpoint) is spec.model_class and checkpoint.token_ids.mask == model.token_ids.mask
    weights = load_file("mydlm_tiny/model.safetensors")
    weights["model.layers.0.attn.q_proj.weight"] = weights.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(weights, "mydlm_tiny/model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="does not match MyDLMModel: missing keys: model.layers.0.self_attn.q_proj"):
        load_model("mydlm_tiny")
    with pytest.raises(ValueError, match="model family 'mydlm' registered twice"):
        register_family(spec)
    with pytest.raises(ValueError, match="model_type 'mydlm' of MyDLMConfig is model family 'mydlm's"):
        register_family(dataclasses.replace(spec, name="mydlm_copy"))
    assert "mydlm_copy" not in FAMILIES and FAMILIES["mydlm"] is spec
