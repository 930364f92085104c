"""Reading ``dare eval score --predictions``: JSON Lines of ``{"id"|"question", "prediction", "answer"}`` objects
(or the benchmark's native fields), or one JSON array of such objects.

A file that is one JSON document of another kind is a one-line error saying what it is and what the command expects:
a results file of ``dare eval run`` / ``score`` (already scored: its ``metrics`` field holds the scores), or one
object spread over several lines."""

from __future__ import annotations

import json

from dare.errors import InputError

EXPECTED = 'JSON Lines, one {"id"|"question", "prediction", "answer"} object per line (or a JSON array of them)'
"""What ``--predictions`` holds, as the one-line errors name it."""


def read_predictions(path: str) -> list[tuple[str, int, dict]]:
    """``(where, number, object)`` for every prediction: ``where`` locates it in error messages (``FILE:LINE``, or
    ``FILE: item N`` in a JSON array), ``number`` is its line or item number (1-based). A malformed entry is a
    one-line :class:`~dare.errors.InputError`."""
    lines = read_lines(path)
    document = whole_document(lines)
    if document is not None:
        entries = entries_of_document(path, document)
    else:
        entries = []
        for lineno, line in lines:
            try:
                entries.append((f"{path}:{lineno}", lineno, json.loads(line)))
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{lineno}: invalid JSON ({err.msg}); --predictions expects {EXPECTED}") \
                    from None
    for where, _, obj in entries:
        check_prediction(where, obj)
    if not entries:
        raise InputError(f"{path}: no predictions")
    return entries


def read_lines(path: str) -> list[tuple[int, str]]:
    """``(line number, text)`` of every non-empty line; a line that is not UTF-8 is a one-line error."""
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise InputError(f"cannot read predictions {path}: {err.strerror}") from None
    lines = []
    with handle:
        for lineno, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 (byte {err.start + 1} of the line)") from None
            if line.strip():
                lines.append((lineno, line))
    return lines


def whole_document(lines: list[tuple[int, str]]):
    """The file parsed as one JSON document when it is one: an array, or an object spread over several lines (a
    results file, a pretty-printed object); None for JSON Lines (and for text that is no JSON document at all,
    whose first bad line the caller reports)."""
    if not lines:
        return None
    first = lines[0][1].lstrip()
    if not first.startswith("["):
        if not first.startswith("{") or parses(first):
            return None
    try:
        return json.loads("".join(line for _, line in lines))
    except json.JSONDecodeError:
        return None


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def entries_of_document(path: str, document) -> list[tuple[str, int, dict]]:
    """The predictions of a file that is one JSON document: the items of an array; anything else is a one-line
    error naming what the file is."""
    from dare.eval.results import SCHEMA

    if isinstance(document, list):
        return [(f"{path}: item {number}", number, obj) for number, obj in enumerate(document, 1)]
    if isinstance(document, dict) and document.get("schema") == SCHEMA:
        raise InputError(f"{path} is a results file of dare eval run/score, already scored{scores_of(document)}; "
                         f"--predictions expects {EXPECTED}")
    kind = "one JSON object over several lines" if isinstance(document, dict) else f"a JSON {type(document).__name__}"
    raise InputError(f"{path} holds {kind}; --predictions expects {EXPECTED}")


def scores_of(results: dict) -> str:
    """`` (gsm8k: its "metrics" field holds accuracy=0.5, ...)`` for a results document, as far as it says."""
    metrics = results.get("metrics")
    shown = ", ".join(f"{key}={value}" for key, value in list(metrics.items())[:3]) if isinstance(metrics, dict) else ""
    more = ", ..." if isinstance(metrics, dict) and len(metrics) > 3 else ""
    benchmark = f"{results['benchmark']}: " if isinstance(results.get("benchmark"), str) else ""
    return f" ({benchmark}its \"metrics\" field holds {shown}{more})" if shown else ""


def check_prediction(where: str, obj) -> None:
    """One-line :class:`~dare.errors.InputError` unless ``obj`` is an object with a ``prediction`` that is a string
    or a non-empty list of strings (``n`` completions)."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prediction" not in obj:
        raise InputError(f"{where}: missing \"prediction\" (keys: {', '.join(sorted(obj)) or 'none'})")
    pred = obj["prediction"]
    if not isinstance(pred, str) and not (isinstance(pred, list) and pred and all(isinstance(p, str) for p in pred)):
        raise InputError(f"{where}: \"prediction\" must be a string or a non-empty list of strings")
