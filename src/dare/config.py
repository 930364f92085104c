"""Typed configs: ``@dataclass`` trees loaded from YAML + ``key=value`` overrides.

* Every field has a type annotation and an attribute docstring (the string literal under it);
  :func:`describe` lists them (``dare train --show-config``).
* Unknown keys are errors naming the closest valid key of the whole config (``unknown config key 'lr' (did you
  mean 'optim.lr'?)``); values are checked against the annotation (``int``, ``float`` (finite), ``bool``, ``str``,
  ``X | None``, ``list[X]``, ``dict``, nested dataclasses).
* ``key=value`` overrides are read as YAML, but a ``str`` field keeps the text as given (``0123`` is not octal 83,
  ``12:30`` not 750) and a switch is spelt ``true``/``false`` (:data:`BOOLEANS`), as ``dare generate -o`` spells it.
* A field annotated ``Any`` keeps its raw mapping; the owner resolves it (e.g. the algorithm section,
  whose schema depends on ``algorithm.name``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import numbers
import os
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from dare.errors import ConfigError, closest, first_line


ENVIRONMENT = {
    "DARE_DECODE_ATTENTION": "decode attention kernel: auto (Triton for masked steps on CUDA), triton or sdpa",
    "DARE_FUSE_PROJECTIONS": "0 decodes with the model's own weights (default 1: fused q/k/v and gate/up copies, or "
                             "a LoRA policy's adapters copied in the autocast dtype)",
    "DARE_FUSE_MAX_ROWS": "largest step, in rows, decoded with fused projections",
    "DARE_COMPILE_SAMPLING": "0 keeps the graph engine's sampling tensor ops eager (default 1: compiled on CUDA; "
                             "steps the proposal kernel serves use it unless DARE_PROPOSAL_KERNEL=0)",
    "DARE_PROPOSAL_KERNEL": "0 leaves the graph engine's token proposals to compiled tensor ops (default 1: one-pass kernel)",
    "DARE_TOP_P_KERNEL": "0 sorts the vocabulary for the graph engine's top-p filter (default 1: sort-free kernel on CUDA)",
    "DARE_STATIC_COMPILE": "0 lets the rollout engine's steps call dynamically compiled blocks (model.compile) as "
                           "they are (default 1: a static compilation of each block, one graph per step shape)",
    "DARE_FUSE_CACHE_WRITES": "0 leaves static steps' KV-cache writes to the cache instead of each block (default 1)",
    "DARE_PROGRESS_INTERVAL": "seconds between two progress lines when stderr is not a terminal (default 30; "
                              "0: every update; inf: only each bar's final line)",
    "DARE_TRACEBACK": "1: a command's one-line error (error: ...) also prints the Python traceback that led to it "
                      "(a plug-in of your own that raised)",
    "DARE_KILL_AT_STEP": "test seam: the trainer SIGKILLs itself after saving step N",
    "DARE_OPENCOMPASS_ENV": "where .ci/run makes the OpenCompass environment",
}
"""Every environment variable DARE reads, with what it does; the ``dare`` command warns about any other ``DARE_*``
name (a misspelt switch would otherwise be ignored without a word)."""


def unknown_environment(environ: typing.Mapping[str, str] | None = None) -> list[str]:
    """One warning line per ``DARE_*`` variable in ``environ`` (default ``os.environ``) that DARE does not read."""
    environ = os.environ if environ is None else environ
    lines = []
    for name in sorted(n for n in environ if n.startswith("DARE_") and n not in ENVIRONMENT):
        hint = closest(name, ENVIRONMENT)
        lines.append(f"warning: {name} is not a DARE setting and is ignored"
                     + (f" (did you mean {hint}?)" if hint else f"; DARE reads {', '.join(ENVIRONMENT)}"))
    return lines


def env_switch(name: str, default: bool) -> bool:
    """The ``0``/``1`` environment switch ``name`` (``default`` when unset or empty); any other value is a one-line
    ``ConfigError``, so that a misspelt switch fails before the work it would have changed."""
    value = os.environ.get(name) or ("1" if default else "0")
    if value not in ("0", "1"):
        raise ConfigError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


BOOLEANS = {"true": True, "false": False}
"""How a switch is spelt in text (any case): a ``key=value`` override, ``dare generate -o``, ``--point`` ... one
spelling each way; ``yes``/``no``/``on``/``off``/``0``/``1`` are refused, not read as YAML 1.1 or Python would."""


def parse_boolean(text: str) -> bool | None:
    """``True``/``False`` for a spelling of :data:`BOOLEANS`, None for any other text."""
    return BOOLEANS.get(text.strip().lower())


class Text(str):
    """A scalar's text as written in a recipe or an override, carrying YAML's reading of it (``parsed``): a ``str``
    field keeps the text (``0123``, ``12:30``, ``1.50``), any other field takes the reading (:func:`_coerce`). The
    reading is the text itself where YAML 1.1 would misread it: octal ``0123`` (83), sexagesimal ``12:30`` (750),
    ``yes``/``no``/``on``/``off`` (switches are spelt ``true``/``false``, :data:`BOOLEANS`)."""

    parsed: Any

    def __new__(cls, text: str, parsed):
        self = super().__new__(cls, text)
        self.parsed = parsed
        return self


def plain(value):
    """``value`` with every :class:`Text` inside replaced by its reading (for fields that keep raw values)."""
    if isinstance(value, Text):
        return value.parsed
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def _reading(text: str, value):
    """YAML's reading ``value`` of plain scalar ``text`` where it reads as written, else the text (see :class:`Text`):
    a number must be the number Python reads in the text (``0123`` is 123 there, 83 in YAML 1.1), a switch must be
    spelt ``true``/``false``."""
    if isinstance(value, bool):
        return value if parse_boolean(text) is not None else text
    if isinstance(value, float) and not math.isfinite(value):
        return value  # .inf / .nan: the float field's own error says it must be finite
    if isinstance(value, (int, float)):
        try:
            return value if type(value)(text) == value else text
        except ValueError:
            return text
    return value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value, tp, key: str, known: typing.Sequence[str] = ()):
    """Check ``value`` against annotation ``tp``; return the (possibly converted) value. ``known``: every key of the
    config tree being built (for an unknown key's hint)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return plain(value)
    if isinstance(value, Text) and tp is not str and origin not in (typing.Union, types.UnionType):
        value = value.parsed  # a str field keeps the text as given, any other takes its reading
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"config key '{key}' must not be null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, known)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"config key '{key}': invalid value {value!r}")
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = closest(str(value), [str(c) for c in choices])
            extra = f" (did you mean '{hint}'?)" if hint else ""
            raise ConfigError(f"config key '{key}': '{value}' is not one of {', '.join(map(str, choices))}{extra}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {value!r}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, inner, f"{key}[{i}]", known) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {value!r}")
        return plain(dict(value))
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if value is None:  # an empty YAML section
            return tp()
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.", known=known)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # numpy's too (a sweep's np.arange)
            return int(value)
        raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads ``3e-3`` (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None and math.isfinite(number):
            return number
        raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    return value


def config_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of config tree ``cls``: its sections and their fields (``optim``, ``optim.lr``, ...)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in (f for f in dataclasses.fields(cls) if f.init):
        keys.append(prefix + f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += config_keys(hints[f.name], f"{prefix}{f.name}.")
    return keys


def closest_key(key: str, known: typing.Iterable[str]) -> str | None:
    """The key of ``known`` (every dotted key of a config) that ``key`` most likely stands for: one with the same last
    part (``lr`` and ``trainer.lr`` -> ``optim.lr``), else a sibling with the closest last part (``optim.lrr`` ->
    ``optim.lr``), else any key with the closest last part (``temprature`` -> ``rollout.sampler.temperature``); the
    shallowest of several."""
    known = list(known)
    parent, _, part = key.rpartition(".")
    siblings = [k for k in known if k.rpartition(".")[0] == parent]

    def named(name: str | None, keys: list[str]) -> str | None:
        return min((k for k in keys if k.rpartition(".")[2] == name), key=lambda k: k.count("."), default=None)

    def near(keys: list[str]) -> str | None:
        return named(closest(part, {k.rpartition(".")[2] for k in keys}), keys)

    return named(part, known) or near(siblings) or near(known)


def from_dict(cls, data: dict | None, prefix: str = "", known: typing.Sequence[str] | None = None):
    """Build dataclass ``cls`` from a mapping; unknown keys and ill-typed values raise :class:`ConfigError`. An
    unknown key's hint comes from ``known``, every key of the whole config (default: ``cls``'s tree)."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    known = config_keys(cls, prefix) if known is None else known
    for key in data:
        if key not in names:
            hint = closest_key(f"{prefix}{key}", known)
            extra = f" (did you mean '{hint}'?)" if hint else f"; valid keys: {', '.join(prefix + n for n in names)}"
            raise ConfigError(f"unknown config key '{prefix}{key}'{extra}")
    factories = {f.name: f.default_factory for f in dataclasses.fields(cls)
                 if f.init and f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(hints[f.name])}
    kwargs = {}
    for name in (n for n in names if n in data):
        value = data[name]
        if name in factories and (value is None or isinstance(value, dict)):
            # a partial (or empty) section starts from the field's own default, e.g. RL rollouts' temperature 1
            default = factories[name]()
            value = {**{f.name: getattr(default, f.name) for f in dataclasses.fields(default) if f.init},
                     **(value or {})}
        kwargs[name] = _coerce(value, hints[name], f"{prefix}{name}", known)
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field without default
        raise ConfigError(f"{prefix or cls.__name__}: {err}") from None


def flatten(tree: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves): a config as plain data, by dotted key."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def to_dict(obj) -> Any:
    """Plain (YAML-ready) data of a config tree."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _override_value(raw: str):
    """The value of one override's text, read as a recipe's plain scalar is (:class:`Text`): ``null`` / ``~`` None,
    lists and mappings YAML's, quoted or tagged text YAML's, any other scalar a :class:`Text`; malformed YAML (or a
    comment, ``#x``) is kept as text."""
    from omegaconf import OmegaConf

    text = raw.strip()
    if not text:
        return ""
    if parse_boolean(text) is not None:  # any case: tRuE as well
        return Text(text, parse_boolean(text))
    try:
        value = OmegaConf.to_container(OmegaConf.create(f"v: {text}"))["v"]
    except Exception:  # malformed YAML value: keep the text
        return raw
    if isinstance(value, (list, dict)) or text[0] in "'\"!":  # a list, a mapping, quoted or tagged text
        return value
    if value is None:
        return None if text.lower() == "null" or text == "~" else text
    return Text(text, _reading(text, value))


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> nested dict with YAML-typed values (``1`` is an int, ``null`` is None; text that YAML
    1.1 would misread stays text, :func:`_override_value`). A key given twice takes its last value, so that a script
    can put shared overrides first and its own after them; a section given as a mapping (``"optim={lr: 1}"``) merges
    into the keys earlier overrides gave it, as later dotted keys merge into it (:func:`_assign_override`)."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override '{item}' must look like key=value")
        key, raw = item.split("=", 1)
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}' conflicts with another override of '{part}'")
        _assign_override(node, parts[-1], _override_value(raw))
    return tree


def _assign_override(node: dict, key: str, value) -> None:
    """Set ``node[key]`` to one override's ``value``: a mapping deep-merges into the mapping earlier overrides built
    there (a leaf both give takes this, the later, value), anything else replaces what was there."""
    if isinstance(value, dict) and isinstance(node.get(key), dict):
        node[key] = merge(node[key], value)
    else:
        node[key] = value


SEEDS = (0, 2**32 - 1)
"""The seeds a run (``trainer.seed``, ``dare demo --seed``) takes: per-epoch seeds are derived as
``seed * 1_000_003 + epoch``, which must fit torch's 64-bit seeds."""


def check_seed(value: int, name: str, cli: str | None = None) -> None:
    """One-line :class:`ConfigError` ``NAME must be in [0, 4294967295]; got VALUE`` for a seed outside :data:`SEEDS`:
    the one check of every seed a user gives (``trainer.seed``, each command's ``--seed``, ``EvalConfig.seed``);
    ``cli``: the flag the command line names instead of ``name`` (:attr:`DareError.cli`)."""
    if not SEEDS[0] <= value <= SEEDS[1]:
        rule = f"must be in [{SEEDS[0]}, {SEEDS[1]}]; got {value}"
        raise ConfigError(f"{name} {rule}", cli=f"{cli} {rule}" if cli is not None else None)


OVERRIDE_FORMS = ("a list of 'key=value' strings, one 'key=value' string or a mapping {key: value} (dotted keys "
                  "or nested sections)")
"""What :func:`override_tree` accepts, as its one-line error names it."""


def override_tree(overrides, argument: str = "overrides") -> dict:
    """The nested dict of ``overrides`` given in any of the forms of :data:`OVERRIDE_FORMS`: a list (or tuple) of
    ``key=value`` strings (:func:`parse_overrides`), one such string, or a mapping whose values are taken as they are
    (``{"optim.lr": 1e-4}`` or ``{"optim": {"lr": 1e-4}}``). Anything else (or a list item that is not a string) is a
    one-line :class:`ConfigError` naming ``argument`` and the accepted forms."""
    from dare.errors import described

    if overrides is None:
        return {}
    if isinstance(overrides, str):
        return parse_overrides([overrides])
    if isinstance(overrides, typing.Mapping):
        return _mapping_tree(overrides, argument)
    if isinstance(overrides, (list, tuple)):
        for index, item in enumerate(overrides):
            if not isinstance(item, str):
                raise ConfigError(f"{argument}[{index}] must be a 'key=value' string; got {described(item)}")
        return parse_overrides(list(overrides))
    raise ConfigError(f"{argument} must be {OVERRIDE_FORMS}; got {described(overrides)}")


def _mapping_tree(overrides: typing.Mapping, argument: str) -> dict:
    """``{"a.b": 1, "c": {"d": 2}}`` -> ``{"a": {"b": 1}, "c": {"d": 2}}`` (values as given; a key given both as a
    value and as a section, ``{"optim": None, "optim.lr": 1}``, is a one-line error)."""
    tree: dict = {}
    for key, value in overrides.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{argument}: every key must be a config key such as 'optim.lr'; got {key!r}")
        branch = value
        for part in reversed(key.strip().split(".")):
            branch = {part: branch}
        _merge_into(tree, branch, f"{argument}: {{}} is given twice (again by the key '{key}')")
    return tree


def _merge_into(tree: dict, branch: dict, conflict: str, prefix: str = "") -> None:
    """Merge ``branch`` into ``tree`` in place; a key both hold, unless both as sections, is the error ``conflict``
    (its ``{}`` is the dotted key)."""
    for key, value in branch.items():
        if key not in tree:
            tree[key] = value
        elif isinstance(tree[key], dict) and isinstance(value, dict):
            tree[key] = dict(tree[key])
            _merge_into(tree[key], value, conflict, f"{prefix}{key}.")
        else:
            raise ConfigError(conflict.format(f"{prefix}{key}"))


def merge(base: dict, update: dict) -> dict:
    """Recursive dict merge (``update`` wins; nested mappings are merged)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _reject_repeated_keys(loader, node, path: tuple = (), visited: set | None = None) -> None:
    """:class:`ConfigError` ``KEY.PATH is given twice (lines A and B); keep one`` for a key given twice in one mapping
    of the composed YAML ``node`` (PyYAML keeps the last one silently); the caller adds the file name. Keys compare
    as ``loader`` constructs them; the keys of a ``<<: *anchor`` merge may be overridden."""
    import yaml

    visited = set() if visited is None else visited
    if id(node) in visited:  # an alias of a node already checked (or a recursive one)
        return
    visited.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_repeated_keys(loader, item, (*path[:-1], f"{path[-1]}[{index}]") if path else (f"[{index}]",),
                                  visited)
    if not isinstance(node, yaml.MappingNode):
        return
    seen, hashable = {}, True
    for key_node, value_node in node.value:
        if hashable and key_node.tag != "tag:yaml.org,2002:merge":
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: construction reports it
                hashable = False
            else:
                if first is not key_node:
                    raise ConfigError(f"{'.'.join(map(str, (*path, key)))} is given twice (lines "
                                      f"{first.start_mark.line + 1} and {key_node.start_mark.line + 1}); keep one")
        _reject_repeated_keys(loader, value_node, (*path, getattr(key_node, "value", "?")), visited)


@functools.cache
def _recipe_loader():
    """A YAML 1.1 safe loader whose plain booleans, numbers and dates are :class:`Text` (read as overrides are)."""
    import yaml

    class RecipeLoader(yaml.SafeLoader):
        pass

    def scalar(loader, node):
        text = node.value
        base = yaml.SafeLoader.yaml_constructors[node.tag](loader, node)
        return base if node.style is not None else Text(text, _reading(text, base))

    for tag in ("bool", "int", "float", "timestamp"):
        RecipeLoader.add_constructor(f"tag:yaml.org,2002:{tag}", scalar)
    return RecipeLoader


def load_yaml(path: str | Path, texts: bool = False) -> dict:
    """Read a YAML mapping (one-line error for a missing file, bad YAML, an empty file or one holding only comments,
    and a key given twice in one mapping: a section or a setting). Plain scalars YAML 1.1 would misread (``0123``,
    ``12:30``, ``yes``) are their text; ``texts``: every plain boolean, number and date a :class:`Text`, for a typed
    config (:func:`from_dict`: a ``str`` field keeps the text as written)."""
    import yaml

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    loader = _recipe_loader()(path.read_text())
    try:
        node = loader.get_single_node()
        if node is not None:
            _reject_repeated_keys(loader, node)
        data = None if node is None else loader.construct_document(node)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{where} ({problem or first_line(err)})") from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(f"{path} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data if texts else plain(data)


def yaml_text(data: dict) -> str:
    """``data`` as YAML (keys in their order)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def save_yaml(data: dict, path: str | Path) -> None:
    """Write ``data`` as YAML atomically (a reader never sees half a file)."""
    from dare.outputs import atomic_write_text

    atomic_write_text(path, yaml_text(data))


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right under each field), inherited ones included (a
    subclass's own docstring for a field wins)."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def describe(cls, prefix: str = "") -> list[str]:
    """``key (type) = default  # doc`` lines for every field of a config tree."""
    lines = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines += describe(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        lines.append(f"{prefix}{f.name} ({_type_name(tp)}) = {default!r}  # {docs.get(f.name, '')}")
    return lines
