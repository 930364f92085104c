"""Turn test snippets into (call, expected) pairs the trusted parent can check itself.

``assert f(1, x=[2]) == 3`` becomes ``CallCase("f", (1,), {"x": [2]}, 3)``; HumanEval's
``def check(candidate): assert candidate(...) == ...`` followed by ``check(entry)`` becomes one case
per assert, on ``entry``. Only literal arguments and expected values qualify (``ast.literal_eval``);
any other snippet stays a script, run by the separate test runner (:mod:`dare.rewards.sandbox`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from dare.rewards.ast_parse import parse


@dataclass(frozen=True)
class CallCase:
    """Call ``name(*args, **kwargs)`` in the candidate and compare the result with ``expected``."""

    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    expected: Any = None


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _assert_case(stmt: ast.stmt, aliases: dict[str, str]) -> CallCase | None:
    """``assert NAME(literals) == literal[, msg]`` (either side) -> CallCase, else None."""
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    for call, other in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        name = aliases.get(call.func.id, call.func.id)
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        values = [_literal(a) for a in call.args]
        kwargs = {k.arg: _literal(k.value) for k in call.keywords}
        ok, expected = _literal(other)
        if ok and all(v[0] for v in values) and all(v[0] for v in kwargs.values()):
            return CallCase(name, tuple(v[1] for v in values), {k: v[1] for k, v in kwargs.items()}, expected)
    return None


def _is_inert(stmt: ast.stmt) -> bool:
    """Docstrings, ``pass``, imports and literal assignments (HumanEval's ``METADATA``)."""
    if isinstance(stmt, ast.Pass) or isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    return isinstance(stmt, ast.Assign) and _literal(stmt.value)[0]


def _check_function_cases(module: ast.Module) -> list[CallCase] | None:
    """HumanEval layout: ``def check(candidate): <asserts>`` and one top-level ``check(entry)``."""
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef)]
    calls = [s for s in module.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    others = [s for s in module.body if s not in checks and s not in calls and not _is_inert(s)]
    if len(checks) != 1 or len(calls) != 1 or others:
        return None
    check, call = checks[0], calls[0].value
    params = check.args.args
    if (len(params) != 1 or check.args.vararg or check.args.kwonlyargs or check.decorator_list
            or not isinstance(call.func, ast.Name) or call.func.id != check.name
            or len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Name)):
        return None
    aliases = {params[0].arg: call.args[0].id}
    cases = []
    for stmt in check.body:
        if _is_inert(stmt) and not isinstance(stmt, ast.Assign):
            continue
        case = _assert_case(stmt, aliases)
        if case is None:
            return None
        cases.append(case)
    return cases


def split_test(snippet: str) -> list[CallCase] | None:
    """The call cases equivalent to ``snippet`` (each one a test), or None if it must run as a script."""
    try:
        module = parse(snippet)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    body = [s for s in module.body if not _is_inert(s)]
    if body and all(isinstance(s, ast.Assert) for s in body):
        cases = [_assert_case(s, {}) for s in body]
        return None if any(c is None for c in cases) else cases
    return _check_function_cases(module)
