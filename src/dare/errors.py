"""User-facing errors.

Every mistake a user can make (a typo in a config key, an unknown family, a mask id outside the
vocabulary, ...) raises a :class:`DareError` subclass with a one-line message. The CLI prints the
message and exits with status 2 instead of showing a stack trace.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DareError(Exception):
    """Base class of errors caused by user input; the message is one line."""


class ConfigError(DareError):
    """A configuration (YAML recipe, model config.json, CLI flag) is invalid."""


class InputError(DareError):
    """Tensors or data passed to DARE are malformed."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (stripped), or its type name when it has none: how a one-line error
    quotes the exception it replaces."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def and_join(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (lists in one-line messages)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def closest(name: str, choices: Iterable[str]) -> str | None:
    """Return the choice most similar to ``name`` (for 'did you mean' hints), or None."""
    matches = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def unknown_choice(kind: str, name: str, choices: Iterable[str]) -> ConfigError:
    """Build the error for an unknown registry entry, suggesting the closest valid name."""
    choices = sorted(choices)
    hint = closest(name, choices)
    did_you_mean = f" (did you mean '{hint}'?)" if hint else ""
    return ConfigError(f"unknown {kind} '{name}'{did_you_mean}; choose from: {', '.join(choices)}")
