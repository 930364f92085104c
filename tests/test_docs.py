"""The docs a clone needs are in the repository: every relative link resolves, nothing points outside it."""

import os
import re
import sys
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


def test_every_module_is_named_in_the_architecture_layout():
    """docs/architecture.md's layout names every module under src/dare (a package's __init__.py may go unnamed),
    under its own folder (by indentation), and no module that does not exist."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"## Layout.*?```\n(.*?)```", text, re.S).group(1)
    named, folders = set(), []  # folders: (indent, path) of the enclosing folder lines
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        first = line.split()[0] if line.strip() else ""
        here = "/".join(path for _, path in folders[1:])  # below src/dare/
        if first.endswith("/"):
            folders.append((indent, first.rstrip("/")))
            continue
        if folders and folders[0][1] == "src/dare":
            named |= {f"{here}/{name}".lstrip("/") for name in re.findall(r"\b(\w+\.py)\b", line)}
    source = ROOT / "src" / "dare"
    modules = {str(p.relative_to(source)) for p in source.rglob("*.py")}
    inits = {m for m in modules if m.endswith("/__init__.py")}  # a package's own line may stand for it
    assert modules - inits - named == set(), "modules missing from docs/architecture.md's layout"
    assert named - modules == set(), "docs/architecture.md's layout names modules that do not exist"


def test_the_benchmarks_page_matches_the_registry():
    """docs/benchmarks.md has one row per registered benchmark, with its templates (default in bold), default
    dataset and split, kind and reward, and names every alias."""
    from dare.eval.benchmark import ALIASES, BENCHMARKS

    text = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = {m.group(1): m.group(0).split(" | ") for m in re.finditer(r"^\| `(\w+)` \|.*\|$", text, re.M)}
    assert set(rows) == set(BENCHMARKS)
    for name, bench in BENCHMARKS.items():
        cells = rows[name]
        templates = ", ".join(f"**{t}**" if t == bench.default_template else t for t in sorted(bench.templates))
        assert cells[4] == templates, name
        assert cells[5] == f"{bench.kind}, `{bench.reward}` |", name
        if bench.hf is None:
            assert cells[3].startswith("none"), name
        else:
            hf = bench.hf
            expected = f"`{hf.path}`" + (f" (`{hf.name}`)" if hf.name else "") + f", {hf.split}"
            expected += f"; few-shot: {hf.fewshot_split}" if hf.fewshot_split else ""
            assert cells[3] == expected, name
    aliases = text.split("Aliases:")[1].split("\n\n")[0]
    assert all(f"`{alias}`" in aliases for alias in ALIASES)
    assert "(docs/benchmarks.md)" in (ROOT / "README.md").read_text()


def test_the_readme_names_every_registered_reward_and_preset():
    import subprocess

    # a fresh interpreter: tests register rewards of their own in this process (dist_worker's dist_varied, ...)
    code = "from dare.rewards import PRESETS, REWARDS; print(' '.join([*REWARDS, *PRESETS]))"
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).stdout.split()
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Rewards (`dare.rewards`)")[1].split("\n### ")[0]
    assert names and [name for name in names if f"`{name}`" not in section] == []
