"""Build hook: the wheel carries the training recipes inside the package (``configs/<family>/*.yaml`` of
:data:`FAMILIES` -> ``dare/configs/<family>/*.yaml``), so that ``dare recipes`` and ``dare train llada/sft_tiny`` work
from an installed wheel, while git holds one copy of them. Everything else is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

FAMILIES = ("dream", "llada", "llada2", "sdar")
"""The recipe folders of configs/: dare.recipes.FAMILIES (tests/test_recipes.py checks that the two agree)."""

ROOT = Path(__file__).resolve().parent


def copy_recipes(configs: Path, package: Path) -> list[Path]:
    """Replace ``package/configs/`` with the recipes: ``configs/<family>/*.yaml`` of every family of
    :data:`FAMILIES`, nothing else (not configs/lm_eval or configs/opencompass). Returns the files written. A missing
    family folder is an error: a wheel without its recipes would be a silent loss."""
    target = package / "configs"
    shutil.rmtree(target, ignore_errors=True)  # no recipe left over from an earlier build
    written = []
    for family in FAMILIES:
        source = configs / family
        if not source.is_dir():
            raise FileNotFoundError(f"{source} does not exist: build the wheel from a checkout of the repository or "
                                    "from its sdist (MANIFEST.in includes the recipes)")
        (target / family).mkdir(parents=True)
        written += [Path(shutil.copyfile(path, target / family / path.name)) for path in sorted(source.glob("*.yaml"))]
    return written


class BuildPyWithRecipes(build_py):
    """``build_py`` that also copies the recipes into the built ``dare`` package. An editable install skips it: there
    :mod:`dare.recipes` reads the repository's configs/."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            copy_recipes(ROOT / "configs", Path(self.build_lib) / "dare")


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithRecipes})
