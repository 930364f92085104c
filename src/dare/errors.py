"""User-facing errors.

Every mistake a user can make (a typo in a config key, an unknown family, a mask id outside the
vocabulary, ...) raises a :class:`DareError` subclass with a one-line message. The CLI prints the
message and exits with status 2 instead of showing a stack trace.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class DareError(Exception):
    """Base class of errors caused by user input; the message is one line.

    A message that names a setting by its Python name (``EvalConfig.shots``) can carry ``cli``, the same line
    naming the command-line flag (``--shots``): ``dare`` prints that one (:attr:`cli_message`), Python callers see
    the first."""

    def __init__(self, message: str = "", *, cli: str | None = None):
        super().__init__(message)
        self.cli = cli

    @property
    def cli_message(self) -> str:
        """What the command line prints: the ``cli`` wording when there is one, else the message."""
        return self.cli or str(self)


class ConfigError(DareError):
    """A configuration (YAML recipe, model config.json, CLI flag) is invalid."""


class InputError(DareError):
    """Tensors or data passed to DARE are malformed."""


class PluginError(DareError):
    """A plug-in of the user's own (an algorithm's hook, a sampler, a benchmark) broke its contract at run time."""


class DivergedError(DareError):
    """Training produced a non-finite loss or gradient norm (too low a precision, too high a learning rate)."""


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message (stripped), or its type name when it has none: how a one-line error
    quotes the exception it replaces."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def and_join(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (lists in one-line messages)."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


SYNONYMS = {"gpu": ("cuda", "device"), "grpo": ("d1",), "do_sample": ("temperature",)}
"""Words users give for a choice, with the choices they stand for: :func:`closest` suggests the first of them among
the choices (``--device gpu`` -> ``cuda``, not ``cpu``; the config key ``gpu`` -> ``device``; the algorithm ``grpo`` ->
``d1``, diffu-GRPO, not the preference algorithm ``vrpo``; Hugging Face's ``do_sample`` -> the sampler's
``temperature``, 0 being greedy, not ``sampler``)."""


def closest(name: str, choices: Iterable[str]) -> str | None:
    """Return the choice most similar to ``name`` (for 'did you mean' hints), or None: a synonym's choice
    (:data:`SYNONYMS`), else the one choice spelled alike but for case, else the one choice ``name`` abbreviates (``temp`` -> ``temperature``), else the most
    similar spelling. Leading dashes are not compared (``--gpu`` is not close to ``--help``)."""
    bare = {choice.lstrip("-"): choice for choice in choices}
    key = name.lstrip("-")
    synonym = next((word for word in SYNONYMS.get(key.lower(), ()) if word in bare), None)
    if synonym is not None:
        return bare[synonym]
    same_letters = [choice for bare_choice, choice in bare.items() if bare_choice.lower() == key.lower()]
    if len(same_letters) == 1:  # DTreeRPO -> dtreerpo
        return same_letters[0]
    longer = [choice for bare_choice, choice in bare.items() if bare_choice.startswith(key) and key]
    if len(longer) == 1 and key not in bare:
        return longer[0]
    matches = difflib.get_close_matches(key, list(bare), n=1, cutoff=0.5)
    return bare[matches[0]] if matches else None


CLOSE_NAME = 0.8
"""How alike (:class:`difflib.SequenceMatcher` ratio) an existing file's name must be to a missing one's for
:func:`closest_name` to suggest it, unless one typo apart: ``sft_tny.yaml`` / ``sft_tiny.yaml`` 0.96,
``my_rewardz.py`` / ``my_rewards.py`` 0.92, not names that merely share a few letters (``nope`` / ``opt`` 0.57,
``nope.py`` / ``setup.py`` 0.53)."""


def one_typo_apart(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter changed, dropped or added, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The entry among ``names`` (a folder's) that the last part ``name`` of a missing path mistypes, or None: one
    spelt alike but for case, else one a typo apart (:func:`one_typo_apart`; ``tnp`` -> ``tmp``), else the most alike
    with a ratio of at least :data:`CLOSE_NAME`. Stricter than :func:`closest`: a 'did you mean' for a path must not
    send the user to an unrelated file that happens to exist (``/nope`` -> ``/opt``, ``nope.py`` -> ``setup.py``)."""
    names = list(names)
    same_letters = [entry for entry in names if entry.lower() == name.lower()]
    if len(same_letters) == 1:
        return same_letters[0]
    typos = [entry for entry in names if len(name) >= 3 and one_typo_apart(name, entry)]
    if typos:
        return max(typos, key=lambda entry: difflib.SequenceMatcher(None, name, entry).ratio())
    matches = difflib.get_close_matches(name, names, n=1, cutoff=CLOSE_NAME)
    return matches[0] if matches else None


def unknown_choice(kind: str, name: str, choices: Iterable[str]) -> ConfigError:
    """Build the error for an unknown registry entry, suggesting the closest valid name."""
    choices = sorted(choices)
    hint = closest(str(name), choices)
    did_you_mean = f" (did you mean '{hint}'?)" if hint else ""
    return ConfigError(f"unknown {kind} '{name}'{did_you_mean}; choose from: {', '.join(choices)}")


def described(value: Any) -> str:
    """How a one-line message names a value of the wrong type: ``None``, ``the string 'llada'``, ``an int (3)``,
    ``a tuple (0, 1, 2)`` (short ones), ``a dict``, ``a SamplerConfig``."""
    if value is None:
        return "None"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    kind = with_article(type(value).__name__)
    shown = repr(value) if isinstance(value, (bool, int, float, list, tuple)) else ""
    return f"{kind} ({shown})" if shown and len(shown) <= 40 else kind


def with_article(name: str) -> str:
    """``name`` with its indefinite article: ``a dict``, ``an EvalConfig``."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def wrong_type(argument: str, value: Any, expected: str, hint: str = "",
               error: type[DareError] = InputError) -> DareError:
    """``ARGUMENT must be EXPECTED; got VALUE: HINT`` (an argument of a Python entry point with the wrong type)."""
    return error(f"{argument} must be {expected}; got {described(value)}" + (f": {hint}" if hint else ""))


def check_config_object(argument: str, value: Any, cls: type, string_hint: str = "") -> None:
    """One-line :class:`ConfigError` unless ``value`` is None or a ``cls``: a mapping is pointed to
    ``cls.from_dict(d)``, a string to ``string_hint`` (where ``{value!r}`` stands for the string)."""
    if value is None or isinstance(value, cls):
        return
    name = cls.__name__
    hint = string_hint.format(value=value) if isinstance(value, str) else ""
    if isinstance(value, Mapping):
        hint = f"build one with {name}.from_dict(d) (or {name}(**d))"
    raise wrong_type(argument, value, f"{with_article(name)} or None", hint, ConfigError)


def check_id_range(ids: Any, vocab_size: int, what: str) -> None:
    """One-line :class:`InputError` unless every id of the integer tensor ``ids`` lies in ``[0, vocab_size)``:
    ``WHAT must lie in [0, V); got values in [LOW, HIGH]``. Reads the tensor's extremes once (one host
    synchronisation on a GPU, where separate ``min()`` and ``max()`` reads would make two)."""
    if not ids.numel():
        return
    import torch

    low, high = torch.stack(torch.aminmax(ids)).tolist()
    if low < 0 or high >= vocab_size:
        raise InputError(f"{what} must lie in [0, {vocab_size}); got values in [{low}, {high}]")
