"""Running another tool's command line inside ``dare`` (``dare eval lm-eval``, ``dare eval opencompass``): its
``sys.argv`` and its exit status (the first line of an error it raises: :func:`dare.errors.first_line`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def program_argv(program: str, argv: list[str]):
    """``sys.argv = [program, *argv]`` for the duration (the tool parses it), then the caller's again."""
    saved = sys.argv
    sys.argv = [program, *argv]
    try:
        yield
    finally:
        sys.argv = saved


def exit_status(exit_: SystemExit) -> int:
    """The process status a ``SystemExit`` stands for: its int code, 0 for ``None``, 2 for a message."""
    return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)


def take_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """DARE's own ``--import MODULE_OR_FILE`` (or ``--import=...``, repeatable) taken out of the tool's ``argv``
    (before any ``--``): ``(the plug-ins to import, the arguments the tool gets)``. A ``--import`` without a value
    is a one-line error."""
    from dare.errors import ConfigError

    imports, rest, items = [], [], iter(argv)
    for item in items:
        if item == "--":
            rest += [item, *items]
            break
        if item == "--import":
            value = next(items, None)
            if value is None or value.startswith("-"):
                raise ConfigError("--import needs a module name or a .py file (--import my_sampler.py)")
            imports.append(value)
        elif item.startswith("--import="):
            imports.append(item.partition("=")[2])
        else:
            rest.append(item)
    return imports, rest


def asks_for_help(argv: list[str]) -> bool:
    """Whether the tool's ``argv`` asks for its help (``-h`` / ``--help`` before any ``--``)."""
    for item in argv:
        if item == "--":
            return False
        if item in ("-h", "--help"):
            return True
    return False


def print_preamble(lines: list[str]) -> None:
    """DARE's part of a pass-through command's help, printed before the tool's own help."""
    print("\n".join(lines) + "\n", flush=True)
