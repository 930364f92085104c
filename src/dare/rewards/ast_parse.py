"""``ast.parse`` that is safe to call from several threads at once.

CPython 3.11 (and 3.12 before its fixes) keeps the AST constructor's recursion depth in interpreter-wide state. When
two threads build ASTs at the same time - a thread switch can happen inside the construction, for instance while
the garbage collector runs a finalizer - each sees the other's depth, and ``ast.parse`` raises ``SystemError: AST
constructor recursion depth mismatch`` on valid code (python/cpython#106905). Code rewards parse test snippets in
the sandbox's worker threads, so scoring would crash at random.
One lock serialises the parses: they take microseconds, next to the programs they prepare.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, one thread at a time."""
    with _LOCK:
        return ast.parse(source, mode=mode)
