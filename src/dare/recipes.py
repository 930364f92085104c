"""The training recipes shipped with DARE, by name.

A recipe is ``<family>/<name>.yaml`` for the families of :data:`FAMILIES` and is named ``<family>/<name>``
(``llada/sft_tiny``). An installed wheel carries them in the package (``dare/configs/``, copied there at build time
by ``setup.py``); a source or editable checkout reads the repository's ``configs/`` next to ``src/``. A recipe's
description is its first comment line. :func:`resolve_recipe` turns what a user typed (a path or a name) into the
file to read, or a one-line :class:`~dare.errors.ConfigError` naming the closest recipe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dare.errors import ConfigError, closest, closest_name, wrong_type

FAMILIES = ("dream", "llada", "llada2", "sdar")
"""The folders of ``configs/`` that hold training recipes (``configs/lm_eval`` and ``configs/opencompass`` are
harness configs, not recipes)."""

PACKAGED = "configs"
"""The folder inside the installed package that holds the recipes (``dare/configs/<family>/<name>.yaml``)."""

HARNESS_FOLDERS = {"lm_eval": "lm-evaluation-harness tasks (dare eval lm-eval --include_path configs/lm_eval)",
                   "opencompass": "OpenCompass configs (dare eval opencompass CONFIG)"}
"""The other folders of ``configs/``: evaluation-harness configs, not recipes, and not shipped in the wheel."""

DESCRIPTION_WIDTH = 110
"""The widest description :func:`listing` prints (a longer first sentence is cut at a word, with an ellipsis)."""

SUFFIXES = (".yaml", ".yml")
LISTED_BY = "dare recipes lists the recipes"


def recipes_dir() -> Path | None:
    """The folder holding the recipe families: the installed package's copy, else (a source or editable checkout)
    the repository's ``configs/`` next to ``src/``; None when neither exists."""
    package = Path(__file__).resolve().parent
    if (package / PACKAGED).is_dir():
        return package / PACKAGED
    if package.parent.name == "src" and (package.parent.parent / "configs").is_dir():
        return package.parent.parent / "configs"
    return None


def recipes() -> dict[str, Path]:
    """Every recipe: name (``llada/sft_tiny``) -> file, sorted by family and name."""
    root = recipes_dir()
    if root is None:
        return {}
    found = {f"{family}/{path.stem}": path for family in FAMILIES
             for path in (root / family).glob("*.yaml") if path.is_file()}
    return dict(sorted(found.items()))


def description(path: Path, width: int = DESCRIPTION_WIDTH) -> str:
    """The recipe's one-line description: the first sentence of its leading comment (the ``#`` lines before the first
    key, joined), cut at a word to ``width`` characters with an ellipsis when longer."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            if words or line.strip():
                break
            continue
        words += line[1:].split()
    text = " ".join(words)
    sentence = next((text[: i + 1] for i, char in enumerate(text)
                     if char == "." and (i + 1 == len(text) or text[i + 1] == " ") and not text[:i].endswith(" e.g")),
                    text)
    if len(sentence) > width:
        sentence = sentence[: width - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"
    return sentence.rstrip(":")


def recipe_key(given: str | os.PathLike) -> str:
    """The recipe name that the last two parts of ``given`` spell (``configs/llada/sft_tiny.yaml`` and
    ``llada/sft_tiny`` -> ``llada/sft_tiny``), found or not."""
    parts = Path(given).parts[-2:]
    last = parts[-1] if parts else ""
    for suffix in SUFFIXES:
        if last.lower().endswith(suffix):
            last = last[: -len(suffix)]
    return "/".join([*parts[:-1], last])


def typed_as_name(given: str | os.PathLike) -> bool:
    """True for a recipe name as typed (``llada/d1_tiny``, ``llada/d1_tiny.yaml``): two relative parts, the first a
    family, or any word without a YAML suffix; False for a path (``configs/llada/d1_tiny.yaml``)."""
    path = Path(given)
    if path.is_absolute():
        return False
    if len(path.parts) == 2 and path.parts[0] in FAMILIES:
        return True
    return not str(given).lower().endswith(SUFFIXES)


def names_shipped_layout(given: str | os.PathLike) -> bool:
    """True for a relative path spelt as the repository's layout, ``[...]/configs/<family>/<name>.yaml``: the one path
    form that may stand for a shipped recipe when it does not exist where it is typed. Any other missing path (an
    absolute one, ``myexpt/llada/sft_tiny.yaml``) is the user's own file mistyped, never replaced by a shipped one."""
    path = Path(given)
    return not path.is_absolute() and len(path.parts) >= 3 and path.parts[-3] == "configs"


def is_recipe_name(word: str) -> bool:
    """True when ``word`` is a recipe's name as typed (``llada/d1_tiny``, ``llada/d1_tiny.yaml``)."""
    return typed_as_name(word) and recipe_key(word) in recipes()


def resolve_recipe(given: str | os.PathLike) -> str | os.PathLike:
    """The recipe file that ``given`` means: ``given`` itself when it exists; the recipe it names (``llada/d1_tiny``);
    for a path that does not exist but ends in a recipe's family and file (``configs/llada/sft_tiny.yaml`` typed
    outside the repository), that recipe, after a ``note:`` line on stderr saying so. Anything else is a one-line
    :class:`ConfigError` naming the closest recipe (:func:`unknown_recipe`)."""
    found = check_recipe(given)
    if found == given:
        return given
    if not typed_as_name(given) and int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 says it once
        print(f"note: {given} does not exist here; using the recipe {recipe_key(given)} of this installation "
              f"({found})", file=sys.stderr)
    return found


def check_recipe_argument(path) -> None:
    """One-line :class:`ConfigError` for a ``path`` of :func:`load_train_config` that is no recipe path: another type
    (overrides given first), or a ``key=value`` text that is not a file."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise wrong_type("load_train_config's path", path, "a recipe path (str or Path) or None",
                         "overrides go second: load_train_config(path, ['key=value', ...])", ConfigError)
    if isinstance(path, str) and "=" in path and not Path(path).exists():
        raise ConfigError(f"load_train_config's path {path!r} looks like an override, not a recipe: "
                          f"load_train_config(None, [{path!r}]) (or load_train_config(RECIPE, [{path!r}]))")
    if isinstance(path, (str, os.PathLike)) and str(path).endswith(".py"):
        raise ConfigError(f"{path} is Python, not a YAML recipe: a plug-in of your own goes in as imports=[{path}] after "
                          "the recipe (dare train RECIPE imports=[FILE.py])")


def check_recipe(given: str | os.PathLike) -> str | os.PathLike:
    """:func:`resolve_recipe` without its ``note:``: the file ``given`` means, or its one-line error. Reads files
    only (``dare train`` answers a mistyped recipe before it imports torch)."""
    if Path(given).exists():
        return given
    found = recipes().get(recipe_key(given))
    if found is None or not (typed_as_name(given) or names_shipped_layout(given)):
        raise unknown_recipe(given)
    return found


def unknown_recipe(given: str | os.PathLike) -> ConfigError:
    """The one-line error for a recipe that is neither a file nor a recipe name: the closest recipe, written as the
    user wrote theirs (a path keeps its folders: ``did you mean configs/llada/sft_tiny.yaml?``; a name stays a name),
    and where the list is."""
    key, known = recipe_key(given), recipes()
    harness = key.partition("/")[0]
    if harness in HARNESS_FOLDERS:
        return ConfigError(f"{given} is not a training recipe: configs/{harness}/ holds {HARNESS_FOLDERS[harness]}, in "
                           f"the repository only; {LISTED_BY}")
    if key in known:  # a missing path of the user's own that spells a shipped recipe's family and name
        return ConfigError(f"config file {given} does not exist (the shipped recipe with that name is {key}: dare train "
                           f"{key})")
    spelt_as_layout = names_shipped_layout(given) or (not Path(given).is_absolute() and len(Path(given).parts) == 2)
    as_path = spelt_as_layout and not typed_as_name(given)  # suggested as a path: only a mistyped one is corrected
    near_name = closest_name if as_path else closest
    hint = near_name(key, known)
    family, _, name = key.partition("/")
    if name and family in FAMILIES:  # the family is right: compare names alone (llada/nope is not llada/spg_8b)
        near = near_name(name, [k.partition("/")[2] for k in known if k.partition("/")[0] == family])
        hint = f"{family}/{near}" if near else None
    if typed_as_name(given):
        if key in FAMILIES:  # a family alone: its recipes are family/NAME
            return ConfigError(f"{given} is a family, not a recipe: its recipes are {key}/NAME; dare recipes {key} "
                               "lists them")
        if "/" not in key:  # a bare name: every family's recipe of that (or the closest) name, or a mistyped family
            names = {name.partition("/")[2] for name in known}
            near = key if key in names else closest(key, names)
            family = closest(key, FAMILIES)
            if family and key not in names:  # lama, sdarr
                return ConfigError(f"no recipe or family named {given} (did you mean {family}?); {LISTED_BY}")
            if near:  # sft_tiny, d1_tny: every family's, not one of them at random
                hint = ", ".join(name for name in known if name.partition("/")[2] == near)
        suggestion = f" (did you mean {hint}?)" if hint else ""
        return ConfigError(f"no recipe named {given}{suggestion}; {LISTED_BY}")
    if hint and spelt_as_layout:  # configs/llada/sft_tny.yaml, lada/d1_tiny.yaml: the path as the user spells it
        suggestion = f" (did you mean {Path(Path(given).parent.parent, hint + Path(given).suffix)}?)"
    elif hint:  # a path of the user's own: the shipped recipe it may mean, by name
        suggestion = f" (did you mean the shipped recipe {hint}?)"
    else:
        suggestion = ""
    return ConfigError(f"config file {given} does not exist{suggestion}; {LISTED_BY}")


def listing(family: str | None = None) -> list[str]:
    """One line per recipe (of ``family`` only, when given), grouped by family: its name, ``cpu`` for the tiny ones
    that run on a CPU in seconds (else ``gpu``), and its description, in aligned columns."""
    found = recipes()
    if not found:
        raise ConfigError("this installation has no recipes (neither dare/configs/ in the package nor a checkout's "
                          "configs/); reinstall dare-dllm, or pass a recipe file's path")
    if family is not None:
        found = {name: path for name, path in found.items() if name.partition("/")[0] == family}
    width = max(map(len, found))
    return [f"{name:<{width}}  {'cpu' if name.endswith('_tiny') else 'gpu'}  {description(path)}"
            for name, path in found.items()]
