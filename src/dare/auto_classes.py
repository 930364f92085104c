"""Registering DARE's model families with transformers' Auto classes without importing transformers early.

``import dare`` stays light (the ``dare`` command starts without loading torch or transformers), yet
``import dare, transformers; transformers.AutoModel.from_pretrained(path)`` keeps working:

* transformers already imported -> :mod:`dare.models` is imported now (it registers the families);
* otherwise a one-shot import hook imports :mod:`dare.models` right after transformers' own module has run.

Importing :mod:`dare.models` (or anything that uses a model) registers the families as well.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

WATCHED = "transformers"


def register_families() -> None:
    """Import :mod:`dare.models` (its family modules register with the Auto classes)."""
    importlib.import_module("dare.models")


class _RegisteringLoader(importlib.abc.Loader):
    """transformers' own loader, plus :func:`register_families` once its module has executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            register_families()
        except Exception as err:  # never break `import transformers`; using a DARE model raises it again
            warnings.warn(f"DARE could not register its model families with transformers: {err}", stacklevel=2)

    def __getattr__(self, name):  # resource readers, get_filename, is_package, ...: the original loader's
        return getattr(self._loader, name)


class _TransformersHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers is about to be imported, wraps its loader, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != WATCHED:
            return None
        remove_hook()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


def install() -> None:
    """Register now when transformers is loaded, else when it gets imported."""
    if WATCHED in sys.modules:
        register_families()
    elif not any(isinstance(finder, _TransformersHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TransformersHook())


def remove_hook() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _TransformersHook)]
