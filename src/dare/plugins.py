"""User plug-ins: the researcher's own modules that register rewards, algorithms, samplers, benchmarks or model
families.

A plug-in is an ordinary Python module whose import registers something (``@register_reward("my_reward")``,
``@register_algorithm``, ``register_sampler(...)``, ``register_benchmark(...)``, ``register_family(...)``). Three ways
bring one in, each imported once per process, in order, before the names of a config are checked (so ``dare train
--dry-run`` and ``--show-config`` see them too):

* ``dare train``: the recipe key ``imports: [...]`` (or the override ``imports=[my_reward.py]``, which replaces the
  recipe's list); every torchrun rank loads its config, hence its plug-ins.
* ``dare generate``, ``dare eval run/sweep/score``, ``dare tiny``, ``dare merge-lora``: ``--import MODULE_OR_FILE``
  (repeatable).
* installed packages: every entry point of the group ``dare.plugins`` (:data:`ENTRY_POINT_GROUP`) has its module
  imported, without any setting, at the same moments (before the items above, so a setting may build on them).

An item is a module name (``my_pkg.rewards``: found on ``sys.path``, then in the current directory) or a ``.py``
file (an item ending in ``.py``, holding a ``/``, or naming an existing file; relative to the current directory).
A file is imported under a name derived from its absolute path (:func:`file_module_name`), so the same file is
the same module in every process, and its directory is *appended* to ``sys.path``: modules next to it import
(``from my_helpers import f``) while it never shadows an installed package or DARE's own modules.

Mistakes are one-line :class:`~dare.errors.ConfigError` s naming the item: a module or file that does not exist, or
a plug-in that raises while importing (the innermost line of the plug-in's own code and the exception's first
line; the message says how to see the whole traceback). A reward's helper process
(:class:`dare.rewards.worker.BoundedWorker`) imports the same plug-ins first (:func:`child_setup`), so a function
defined in a plug-in file runs there too. Nothing here imports torch; ``import dare`` and ``dare --help`` load no
entry points.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import re
import shlex
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dare.errors import ConfigError, closest_name, described, first_line

ENTRY_POINT_GROUP = "dare.plugins"
"""The entry-point group an installed package declares its plug-in module in (``pyproject.toml``:
``[project.entry-points."dare.plugins"]`` then ``my_rewards = "my_pkg.dare_rewards"``)."""

FILE_MODULE_PREFIX = "dare_plugin_"
"""How the module name of a plug-in file begins (:func:`file_module_name`)."""

MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Plugin:
    """One imported plug-in."""

    spec: str
    """The item as given (``my_reward.py``, ``my_pkg.rewards``); an entry point's: its module name."""
    module: str
    """Its name in ``sys.modules``."""
    path: str | None = None
    """A plug-in file's absolute path (None for a module imported by name)."""
    root: str | None = None
    """The ``sys.path`` entry its imports need (a file's directory; the folder a module was found in)."""


_LOADED: dict[str, Plugin] = {}
"""The plug-ins this process imported, by module name, in import order."""
_ENTRY_POINTS_LOADED = False
_REGISTRATIONS = 0
"""Registrations made by code outside DARE (:func:`count_registration`)."""


def count_registration() -> None:
    """Called by each ``register_*`` function of DARE's registries: counts a registration that the calling module
    (two frames up: the plug-in's module body, or its decorator line) makes from outside DARE, so that a plug-in
    whose import registered nothing gets a note (:func:`_note_if_nothing_registered`)."""
    global _REGISTRATIONS
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller != "dare" and not caller.startswith("dare."):
        _REGISTRATIONS += 1


def _note_if_nothing_registered(where: str, label: str, before: int) -> None:
    """One ``note:`` line on stderr (rank 0 under torchrun) when importing plug-in ``label`` registered nothing: a
    forgotten decorator would otherwise show only later, as an unknown name."""
    if _REGISTRATIONS != before or int(os.environ.get("RANK", "0")) != 0:
        return
    print(f"note: {where}: {label} registered nothing (no register_reward, register_algorithm, register_sampler, "
          "register_benchmark or register_family call ran while it was imported)", file=sys.stderr)


def load_plugins(specs: Sequence[str] | None = (), where: str = "imports") -> list[Plugin]:
    """Import the installed ``dare.plugins`` entry points, then ``specs`` (module names or ``.py`` files), each once
    per process; return the plug-ins of ``specs``. ``where`` names the setting in errors (``imports``,
    ``--import``)."""
    load_entry_points()
    return load_imports(specs, where)


def load_imports(specs: Sequence[str] | None, where: str = "imports") -> list[Plugin]:
    """Import each of ``specs`` in order (once per process: an item imported before is not run again)."""
    return [load_one(spec, where) for spec in check_specs(specs, where)]


def check_specs(specs: Any, where: str = "imports") -> list[str]:
    """``specs`` as a list of strings (None: none); a single string or another type is a one-line error."""
    if specs is None:
        return []
    if isinstance(specs, str):
        raise ConfigError(f"{where} must be a list of modules or .py files; got {described(specs)} (write "
                          f"{where}=[{specs}], or in a recipe {where}: [{specs}])")
    if not isinstance(specs, (list, tuple)):
        raise ConfigError(f"{where} must be a list of modules or .py files; got {described(specs)}")
    for index, spec in enumerate(specs):
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"{where}[{index}] must be a module name (my_pkg.rewards) or a .py file; got "
                              f"{described(spec)}")
    return [str(spec).strip() for spec in specs]


def load_one(spec: str, where: str = "imports") -> Plugin:
    """Import one item: a ``.py`` file (:func:`is_file_spec`) or a module name."""
    return import_file(spec, where) if is_file_spec(spec) else import_module(spec, where)


def is_file_spec(spec: str) -> bool:
    """True when ``spec`` names a file: it ends in ``.py``, holds a path separator, or is an existing file."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec or Path(spec).is_file()


def file_module_name(path: Path) -> str:
    """The module name a plug-in file is imported under: ``dare_plugin_<stem>_<hash of its absolute path>``, the
    same in every process (a helper process finds ``module:function`` of the file by it)."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"{FILE_MODULE_PREFIX}{stem}_{digest}"


def import_file(spec: str, where: str = "imports") -> Plugin:
    """Import the ``.py`` file ``spec`` (relative to the current directory) under :func:`file_module_name`; its
    directory is appended to ``sys.path`` (its sibling modules import; nothing installed is shadowed)."""
    path = Path(os.path.abspath(os.path.expanduser(spec)))
    if not path.is_file():
        raise ConfigError(f"{where}: {missing_file(spec, path)}")
    if path.suffix != ".py":
        raise ConfigError(f"{where}: {spec} is not a .py file (give a Python file or a module name)")
    name = file_module_name(path)
    if name in _LOADED and name in sys.modules:
        return _LOADED[name]
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # before it runs: dataclasses, pickle and helper processes look it up by name
    alias = plain_alias(path)
    if alias:  # a sibling plug-in's `from my_reward import X` gets this module, not a second run of the file
        sys.modules[alias] = module
    before = _REGISTRATIONS
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # SystemExit: script code run at import (argparse, sys.exit)
        sys.modules.pop(name, None)
        if alias:
            sys.modules.pop(alias, None)
        raise ConfigError(failure(where, spec, err, [path], f"python {shlex.quote(spec)}")) from err
    _note_if_nothing_registered(where, spec, before)
    return _record(Plugin(spec, name, str(path), str(path.parent)))


def plain_alias(path: Path) -> str | None:
    """The plain module name (the file's stem) under which ``import stem`` would load this very file from
    ``sys.path``, when no module holds that name yet; None otherwise (a stdlib or installed module of that name, or a
    stem that is no identifier, is never shadowed)."""
    stem = path.stem
    if not stem.isidentifier() or stem in sys.modules:
        return None
    try:
        found = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        return None
    same = found is not None and found.origin is not None and Path(found.origin).resolve() == path.resolve()
    return stem if same else None


def missing_file(spec: str, path: Path) -> str:
    """Why ``spec`` (absolute: ``path``) is no plug-in file: a directory, or no such file (with the ``.py`` file of
    its folder whose name it mistypes, if any: :func:`~dare.errors.closest_name`)."""
    if path.is_dir():
        return f"{spec} is a directory (give a .py file, or the package's module name)"
    where = "" if Path(spec).is_absolute() else f" in {Path.cwd()}"
    others = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
    hint = closest_name(path.name, others)
    return f"no file {spec}{where}" + (f" (did you mean {Path(spec).parent / hint}?)" if hint else "")


def import_module(spec: str, where: str = "imports", label: str | None = None) -> Plugin:
    """Import module ``spec`` by name: from ``sys.path``, then from the current directory (appended to
    ``sys.path``). ``label``: how errors name it (default ``spec``)."""
    label = label or spec
    if spec in _LOADED and spec in sys.modules:
        return _LOADED[spec]
    if not MODULE_NAME.match(spec):
        raise ConfigError(f"{where}: no module named {spec!r} (and no file {spec})")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    before, imported_before = _REGISTRATIONS, spec in sys.modules
    try:
        module = importlib.import_module(spec)
    except ModuleNotFoundError as err:
        if err.name and (spec == err.name or spec.startswith(err.name + ".")):
            raise ConfigError(f"{where}: no module named {spec!r} (and no file {spec})") from None
        raise ConfigError(failure(where, label, err, own_files(spec), f"python -c 'import {spec}'")) from err
    except (Exception, SystemExit) as err:  # SystemExit: script code run at import (argparse, sys.exit)
        raise ConfigError(failure(where, label, err, own_files(spec), f"python -c 'import {spec}'")) from err
    if not imported_before:  # a module some other import brought in earlier registered what it registers then
        _note_if_nothing_registered(where, label, before)
    return _record(Plugin(spec, spec, None, module_root(module, spec)))


def own_files(spec: str) -> list[Path]:
    """The files (or package folder) that make up module ``spec``'s top-level package, for locating the failing line
    in a traceback: its folder for a package, its file for a single module; none when not found."""
    top = spec.split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if found is None:
        return []
    if found.submodule_search_locations:
        return [Path(p) for p in found.submodule_search_locations]
    return [Path(found.origin)] if found.origin else []


def module_root(module: Any, spec: str) -> str | None:
    """The ``sys.path`` entry module ``spec`` (``module``) was found under, or None (a built-in module)."""
    top = sys.modules.get(spec.split(".")[0], module)
    where = getattr(top, "__file__", None)
    if where is None:
        paths = list(getattr(top, "__path__", []))
        return str(Path(paths[0]).parent) if paths else None
    where = Path(where)
    return str(where.parent.parent if where.name == "__init__.py" else where.parent)


def failure(where: str, label: str, err: BaseException, files: Sequence[Path], how: str) -> str:
    """The one-line message of a plug-in ``label`` that raised ``err`` while importing: the innermost line of its own
    ``files`` (a file, or a package folder) that the traceback passes, the exception's type and first line, and
    ``how`` to see the whole traceback."""
    kind = type(err).__name__
    if isinstance(err, SyntaxError) and err.filename:
        spot = f"{shown(Path(err.filename), label, files)} line {err.lineno}: "
        return f"{where}: {spot}{kind}: {err.msg} ({how} shows the traceback)"
    frame = innermost_own_frame(err, files)
    spot = f"{label} raised" if frame is None else f"{shown(Path(frame[0]), label, files)} line {frame[1]} raised"
    return f"{where}: {spot} {kind}: {first_line(err)} ({how} shows the traceback)"


def innermost_own_frame(err: BaseException, files: Sequence[Path]) -> tuple[str, int] | None:
    """``(file, line)`` of the innermost frame of ``err``'s traceback inside ``files``, or None."""
    found = None
    for frame in traceback.extract_tb(err.__traceback__):
        if is_inside(frame.filename, files):
            found = (frame.filename, frame.lineno)
    return found


def is_inside(filename: str, files: Sequence[Path]) -> bool:
    """True when ``filename`` is one of ``files`` or lies in one of them (a package folder)."""
    path = Path(os.path.abspath(filename))
    return any(path == own or path.is_relative_to(own) for own in (Path(os.path.abspath(f)) for f in files))


def redefined_in_main(registered, cls) -> bool:
    """True when class ``cls`` is ``registered`` defined again in ``__main__`` (a notebook cell or script run again
    in one interpreter): registering it again replaces the old definition instead of being a name clash."""
    return (cls.__module__ == "__main__" and getattr(registered, "__module__", None) == "__main__"
            and getattr(registered, "__qualname__", None) == cls.__qualname__)


def runtime_failure(err: BaseException) -> str | None:
    """The one-line message of ``err`` raised at run time inside the code of a plug-in this process imported (an
    algorithm's hook, a sampler's ``run``, a benchmark's ``parse``: its bug, or a contract it broke), or None when
    the traceback passes no plug-in (then it is DARE's, and keeps its traceback): the plug-in's innermost line, the
    exception's type and first line, and how to see the whole traceback (``DARE_TRACEBACK=1``)."""
    owners = [(plugin, [Path(plugin.path)] if plugin.path else own_files(plugin.spec)) for plugin in _LOADED.values()]
    frame = innermost_own_frame(err, [f for _, files in owners for f in files])
    if frame is None:
        return None
    plugin, files = next((plugin, files) for plugin, files in owners if is_inside(frame[0], files))
    return failure("plug-in", plugin.spec, err, files, "DARE_TRACEBACK=1")


def shown(path: Path, label: str, files: Sequence[Path]) -> str:
    """How a message names ``path``: ``label`` when it is the plug-in file itself, else ``LABEL: PATH`` with the path
    relative to the current directory when inside it."""
    path = Path(os.path.abspath(path))
    if len(files) == 1 and path == Path(os.path.abspath(files[0])) and files[0].suffix == ".py":
        return label
    try:
        text = str(path.relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return f"{label}: {text}"


def load_entry_points() -> list[Plugin]:
    """Import the module of every entry point of :data:`ENTRY_POINT_GROUP` (by name; once per process)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return []
    from importlib.metadata import entry_points

    loaded = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
        dist = getattr(getattr(point, "dist", None), "name", None)
        where = f"{ENTRY_POINT_GROUP} entry point '{point.name}'" + (f" of {dist}" if dist else "")
        try:
            loaded.append(import_module(point.module, where, label=point.module))
        except ConfigError as err:  # every command loads it: say how to get the commands back
            fix = f"pip uninstall {dist}" if dist else f"remove the package declaring '{point.name}'"
            raise ConfigError(f"{err}; it loads in every dare command: fix it, or {fix}") from err
    _ENTRY_POINTS_LOADED = True
    return loaded


def _record(plugin: Plugin) -> Plugin:
    _LOADED.setdefault(plugin.module, plugin)
    return _LOADED[plugin.module]


def imported() -> list[str]:
    """The plug-ins this process imported, in order (entry points: their modules; files: their absolute paths, which
    read the same from any directory); what results files record."""
    return [plugin.path or plugin.spec for plugin in _LOADED.values()]


def recorded(specs: Sequence[str]) -> list[str]:
    """``imports`` items as a run records them: a file as its absolute path (a relative one is relative to the
    directory the run started in, which the recorded config does not say), a module name as given."""
    return [os.path.abspath(spec) if is_file_spec(spec) else spec for spec in specs]


def child_setup() -> dict[str, list[str]]:
    """What another process needs to import this process's plug-ins (:func:`load_in_child`): the ``sys.path``
    entries they were found under and the items (absolute paths for files); ``{}`` when there are none."""
    if not _LOADED:
        return {}
    roots = [p.root for p in _LOADED.values() if p.root]
    return {"path": list(dict.fromkeys(roots)), "imports": [p.path or p.module for p in _LOADED.values()]}


def load_in_child(setup: dict[str, list[str]]) -> None:
    """In a helper process: import the plug-ins of :func:`child_setup`'s ``setup`` (the same module names)."""
    for root in setup.get("path", []):
        if root not in sys.path:
            sys.path.append(root)
    load_imports(setup.get("imports", []))


def add_import_argument(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE_OR_FILE`` (repeatable) of the commands that read rewards, samplers or benchmarks."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import your own plug-in first (repeatable): a module name (my_pkg.rewards) or a .py "
                             "file that registers rewards, samplers, benchmarks or model families (installed "
                             "dare.plugins entry points load by themselves)")


__all__ = ["ENTRY_POINT_GROUP", "Plugin", "add_import_argument", "check_specs", "child_setup", "count_registration",
           "file_module_name",
           "imported", "load_entry_points", "load_imports", "load_in_child", "load_plugins"]
