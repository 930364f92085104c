"""``lora.target_modules`` against a model's module paths, before peft sees it (peft's own error for a pattern that
matches nothing names no module of the model).

The option is a regex matched against whole module paths, as peft matches a string, or a list of module names as
peft takes a list (:func:`target_pattern`). A peft-style name written as the regex (``q_proj``,
``q_proj,v_proj``) matches no whole path: its error shows the regex that adapts those modules, and every error lists
the names of the modules LoRA can adapt.
"""

from __future__ import annotations

import re

from dare.errors import ConfigError

LORA_LAYERS = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "MultiheadAttention", "Conv1D")
"""Class names of the modules peft's LoRA can adapt (``torch.nn`` layers and transformers' ``Conv1D``)."""
SHOWN_NAMES = 12
"""At most this many module names in an error."""
PLAIN_NAME = re.compile(r"[\w.]+")
"""A module name or dotted path suffix, as peft's list form takes one (no regex syntax)."""
NAME_SEPARATORS = re.compile(r"[\s,|\[\]()'\"]+")
"""What separates the names of a list written as one string (``q_proj,v_proj``, ``[q_proj, v_proj]``,
``q_proj|v_proj``)."""


def target_pattern(targets: str | list[str] | tuple[str, ...] | None) -> str | None:
    """``lora.target_modules`` as the regex peft matches against whole module paths (None: unset). A string is that
    regex; a list of module names (peft's list form, ``[q_proj, v_proj]``) adapts every module whose path is one of
    them or ends in ``.NAME``, as peft reads a list."""
    if targets is None or isinstance(targets, str):
        return targets
    names = "|".join(re.escape(str(name)) for name in targets)
    return rf"(.*\.)?({names})"


def check_lora_targets(targets: str | list[str] | None, model, option: str = "lora.target_modules") -> None:
    """One-line error unless ``lora.target_modules`` (``targets``; None: the model family's default) matches at least
    one module path of ``model`` in full, as peft matches it, and every module it matches is a layer LoRA can adapt
    (:data:`LORA_LAYERS`); a list must name modules of the model, each of them. The message names a few real module
    paths and the names of the adaptable modules; for a pattern written as peft-style names, the regex that adapts
    them. ``model`` None: nothing to check. ``option`` names the setting in messages (``target_modules`` for
    :func:`dare.models.lora.apply_lora`)."""
    from dare.models.loading import unwrap
    from dare.models.spec import family_of

    if model is None:
        return
    model = unwrap(model)
    modules = [(name, type(module).__name__) for name, module in model.named_modules() if name]
    summary = adaptable_summary(modules)
    if isinstance(targets, (list, tuple)):
        check_listed_names(list(targets), modules, summary, option)
    pattern = target_pattern(targets) or family_of(model).lora_targets
    key = f"{option}={targets!r}" if targets else f"the family's default LoRA targets {pattern!r}"
    matched = [(name, kind) for name, kind in modules if re.fullmatch(pattern, name)]
    if not matched:
        hint = suggested_targets(targets, modules, option) if isinstance(targets, str) else ""
        raise ConfigError(f"{key} matches no module of the model (the pattern must match a whole module path); "
                          f"its LoRA-adaptable modules include {summary}{hint}")
    wrong = [f"{name} ({kind})" for name, kind in matched if kind not in LORA_LAYERS]
    if wrong:
        raise ConfigError(f"{key} matches modules LoRA cannot adapt: {', '.join(wrong[:3])}"
                          f"{', ...' if len(wrong) > 3 else ''}; LoRA adapts linear and embedding layers, e.g. "
                          f"{summary}")


def adaptable_summary(modules: list[tuple[str, str]]) -> str:
    """Two real paths of the modules LoRA can adapt (linear layers first), their number and their names (the last
    part of each path, first seen first): ``model.blocks.0.q_proj, model.blocks.0.k_proj, ... (16 in all; module
    names: q_proj, k_proj, ...)``."""
    adaptable = [name for name, kind in sorted(modules, key=lambda m: m[1] != "Linear") if kind in LORA_LAYERS]
    if not adaptable:
        return "none (the model has no linear or embedding layer)"
    names = list(dict.fromkeys(name.rpartition(".")[2] for name in adaptable))
    shown = ", ".join(names[:SHOWN_NAMES]) + (", ..." if len(names) > SHOWN_NAMES else "")
    return f"{', '.join(adaptable[:2])}, ... ({len(adaptable)} in all; module names: {shown})"


def named_modules(name: str, modules: list[tuple[str, str]]) -> list[str]:
    """Kinds of the modules that module name ``name`` stands for in peft's list form: the path itself or a path
    ending in ``.NAME``."""
    return [kind for path, kind in modules if path == name or path.endswith(f".{name}")]


def adapts(name: str, modules: list[tuple[str, str]]) -> bool:
    """Whether ``name`` (peft's list form) stands for at least one module, each of them one LoRA can adapt."""
    kinds = named_modules(name, modules)
    return bool(kinds) and all(kind in LORA_LAYERS for kind in kinds)


def check_listed_names(names: list, modules: list[tuple[str, str]], summary: str,
                       option: str = "lora.target_modules") -> None:
    """One-line error for a ``lora.target_modules`` list that is empty or holds a name standing for no module LoRA
    can adapt (peft would adapt the others and say nothing)."""
    if not names:
        raise ConfigError(f"{option}=[] lists no module name; leave it unset (null) for the family's "
                          f"default targets, or list some of the model's LoRA-adaptable modules: {summary}")
    missing = [str(name) for name in names if not adapts(str(name), modules)]
    if missing:
        verb = "names" if len(missing) == 1 else "name"
        raise ConfigError(f"{option}={names!r} lists {', '.join(missing)}, which {verb} no module LoRA can "
                          f"adapt; its LoRA-adaptable modules include {summary}")


def suggested_targets(written: str, modules: list[tuple[str, str]], option: str = "lora.target_modules") -> str:
    """For a ``lora.target_modules`` pattern written as peft-style module names (``q_proj``, ``q_proj,v_proj``,
    ``q_proj|v_proj``) that matches no whole module path: the clause naming the regex that adapts those of them
    standing for modules of the model (and which do not); empty when it is no list of plain names or none of them
    stands for an adaptable module."""
    pieces = list(dict.fromkeys(p for p in NAME_SEPARATORS.split(written) if p))
    if not pieces or not all(PLAIN_NAME.fullmatch(p) for p in pieces):
        return ""
    usable = [p for p in pieces if adapts(p, modules)]
    if not usable:
        return ""
    escaped = [re.escape(p) for p in usable]
    regex = rf".*\.{escaped[0]}" if len(escaped) == 1 else rf".*\.({'|'.join(escaped)})"
    count = sum(1 for path, _ in modules if re.fullmatch(regex, path))
    if not count:
        return ""
    unusable = [p for p in pieces if p not in usable]
    skipped = ""
    if unusable:
        skipped = f"; {', '.join(unusable)} {'names' if len(unusable) == 1 else 'name'} no module LoRA can adapt"
    return (f"; to adapt every {' and '.join(usable)} module use {option}='{regex}' (it matches {count} "
            f"modules){skipped}")


__all__ = ["LORA_LAYERS", "adaptable_summary", "check_listed_names", "check_lora_targets", "suggested_targets",
           "target_pattern"]
