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
