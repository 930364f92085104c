"""Plain data across the sandbox boundary: values <-> JSON with a closed set of exact types.

The sandboxed candidate sends return values (and the test runner sends call arguments) as
``encode(value)``; the trusted side rebuilds them with ``decode``. Only ``None``, ``bool``, ``int``,
``float``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set`` and ``frozenset`` pass, checked
with ``type(x) is ...`` (a subclass with a rigged ``__eq__`` is refused), within limits on nesting
depth, item count and integer size. This file uses the standard library only: its source also runs
inside the sandbox.
"""

import json
import math

MAX_DEPTH = 64
MAX_ITEMS = 200_000
MAX_INT_DIGITS = 4000
MAX_MESSAGE_BYTES = 8 << 20


class NotPlainData(ValueError):
    """A value outside the plain types or limits."""


def encode(value, depth=0, budget=None):
    """``value`` as JSON-able data with tags for tuple/set/frozenset/bytes/dict/non-finite floats."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlainData("value too large or too deeply nested")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if value.bit_length() > MAX_INT_DIGITS * 3.33:
            raise NotPlainData("integer too large")
        return value
    if kind is float:
        return value if math.isfinite(value) else {"t": "float", "v": repr(value)}
    if kind is list:
        return [encode(v, depth + 1, budget) for v in value]
    if kind in (tuple, set, frozenset):
        items = list(value) if kind is tuple else sorted(value, key=repr)
        return {"t": kind.__name__, "v": [encode(v, depth + 1, budget) for v in items]}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1, budget), encode(v, depth + 1, budget)] for k, v in value.items()]}
    raise NotPlainData("%s is not plain data" % kind.__name__)


_TAGGED = {"tuple": tuple, "set": set, "frozenset": frozenset}


def decode(data, depth=0, budget=None):
    """The value :func:`encode` produced (raises :class:`NotPlainData` on anything else)."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlainData("value too large or too deeply nested")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, depth + 1, budget) for v in data]
    if kind is dict and set(data) == {"t", "v"}:
        tag, items = data["t"], data["v"]
        try:
            if tag in _TAGGED and type(items) is list:
                return _TAGGED[tag](decode(v, depth + 1, budget) for v in items)
            if tag == "bytes" and type(items) is str:
                return bytes.fromhex(items)
            if tag == "float" and items in ("inf", "-inf", "nan"):
                return float(items)
            if tag == "dict" and type(items) is list:
                return {decode(k, depth + 1, budget): decode(v, depth + 1, budget) for k, v in items}
        except TypeError:  # an unhashable key or set member
            raise NotPlainData("unhashable value in a set or dict key") from None
    raise NotPlainData("not an encoded plain value")


def dumps(value):
    """One JSON line (no newline inside) for a message."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def loads(line):
    """A message line back to JSON data; oversized or malformed lines raise :class:`NotPlainData`."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise NotPlainData("message too large")
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise NotPlainData("malformed message") from None
