"""The docs a clone needs are in the repository: every relative link resolves, nothing points outside it."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_design_notes_are_in_the_repository():
    assert {p.name for p in (ROOT / "docs").glob("*.md")} >= {"architecture.md", "algorithms.md", "models.md"}
    readme = (ROOT / "README.md").read_text()
    for name in ("architecture.md", "algorithms.md", "models.md"):
        assert f"(docs/{name})" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    text = page.read_text()
    assert "../shared" not in text
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        resolved = (page.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), (page.name, target)
        assert resolved.exists(), (page.name, target)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_block_filled_by_its_first_forward_costs_one_forward(cache):
    """The NFE convention the docs describe: DARE skips the extra cached forward on a block that its
    cache-building forward already filled (threshold 0: every masked token is committed at once)."""
    from dare.rollout import SamplerConfig, generate
    from dare.models.tiny import tiny_model

    model = tiny_model("llada", seed=0).eval()
    config = SamplerConfig(sampler="fastdllm", cache=cache, gen_length=16, block_length=4, threshold=1e-9,
                           temperature=0.0, eos_early_stop=False)
    out = generate(model, [[5, 6, 7]], config=config)
    assert int(out.completion_mask.numel()) == 16 and out.nfe == 4


def test_the_nfe_difference_to_fast_dllm_is_documented_where_nfe_is_reported():
    readme = (ROOT / "README.md").read_text()
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    output = (ROOT / "src" / "dare" / "rollout" / "output.py").read_text()
    assert "one more cached forward" in readme and "NFE here vs Fast-dLLM" in results
    assert "Fast-dLLM's prefix/dual loops" in output


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of every ```bash block (continuation lines joined, comments dropped)."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        blocks.append([line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()])
    return blocks


def test_the_readme_cpu_smoke_test_reads_a_shipped_file():
    from dare.eval import get_benchmark

    readme = (ROOT / "README.md").read_text()
    smoke = next(line for line in readme.splitlines() if "# CPU smoke test" in line)
    data = re.search(r"--data (\S+)", smoke).group(1)
    assert (ROOT / data).is_file(), data
    assert len(get_benchmark("gsm8k").load(str(ROOT / data), limit=8)) == 8


def test_train_commands_of_one_readme_block_write_different_runs():
    import yaml

    for commands in bash_blocks((ROOT / "README.md").read_text()):
        outputs = []
        for command in commands:
            words = command.split()
            if words[:2] != ["dare", "train"] or not words[2].endswith(".yaml"):
                continue
            given = [w.split("=", 1)[1] for w in words[3:] if w.startswith("trainer.output_dir=")]
            outputs.append(given[-1] if given else yaml.safe_load((ROOT / words[2]).read_text())["trainer"]["output_dir"])
        assert len(outputs) == len(set(outputs)), outputs  # a second run into the same directory fails


def test_the_readme_says_how_to_skip_the_hub_when_offline():
    assert "HF_HUB_OFFLINE=1" in (ROOT / "README.md").read_text()
