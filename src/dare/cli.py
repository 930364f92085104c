"""The ``dare`` command.

Each sub-command is a module in :mod:`dare.commands` with ``HELP``, ``configure(parser)`` and
``run(args) -> int`` (optionally ``take_extra(args, extra) -> bool`` for trailing positionals, ``precheck(args)`` for
checks that need no torch and run before the environment checks import it, and ``LIGHT = True`` for a command that
reads files only and runs without the torch-side environment checks); heavy imports happen inside
``run`` so ``dare --help`` stays fast. User errors
(:class:`~dare.errors.DareError`) are printed as one line (``error: ...``, exit status 2), never as a
stack trace.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback

from dare import __version__
from dare.errors import DareError, closest
from dare.interrupts import terminate_as_interrupt
from dare.progress import close_progress_bars, quiet_transformers

COMMANDS = {
    "demo": "dare.commands.demo",
    "eval": "dare.commands.eval",
    "generate": "dare.commands.generate",
    "tiny": "dare.commands.tiny",
    "train": "dare.commands.train",
    "recipes": "dare.commands.recipes",
    "runs": "dare.commands.runs",
    "merge-lora": "dare.commands.merge_lora",
    "export": "dare.commands.export",
}


GIVEN = "_given"
"""The namespace attribute where :class:`StoreOnce` records the options given while one parser parses."""


def _shown(value: object) -> str:
    """A parsed option value as the user typed it, near enough: ``0.5``, ``a b`` for a list (``nargs``)."""
    if isinstance(value, list):
        return " ".join(map(str, value)) or "no value"
    return str(value)


class StoreOnce(argparse._StoreAction):
    """``store`` that refuses an option given twice with different values (``--temperature 0.5 --temperature
    0.9`` would silently keep 0.9): ``argument --temperature: given twice (0.5, 0.9)``. The same value repeated
    changes nothing and is accepted, like a flag (``store_true``) given twice; positionals and ``append`` options
    (``--prompt``, ``-o``, ``--grid``) repeat as before."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if option_string is not None:
            given = vars(namespace).setdefault(GIVEN, {})
            if self.dest in given and given[self.dest] != values:
                raise argparse.ArgumentError(self, f"given twice ({_shown(given[self.dest])}, {_shown(values)}); "
                                                   "give it once")
            given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


NEGATIVE_NUMBER = re.compile(r"^-(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d[\d_]*)?$")
"""What a negative number given as a value looks like: ``-1``, ``-0.5``, ``-.5``, ``-1e-3``, ``-2.5E+4``, ``-1_000``.
Python 3.11's argparse knows only the first three and reads ``--temperature -1e-3`` as two options (Python 3.14
reads all of them as numbers)."""


class Parser(argparse.ArgumentParser):
    """``argparse`` with one-line errors: ``error: dare eval run: MESSAGE (did you mean 'X'?); see 'dare eval run
    --help'``, instead of the usage block and a bare message. The innermost (sub-)parser that parsed the command
    line is left in the namespace as ``_parser``, so that arguments only ``main`` finds unrecognised are reported
    against it. A single-valued option given twice with different values is an error (:class:`StoreOnce`, the
    default action of every (sub-)parser: sub-parsers are made by ``add_subparsers`` of a Parser, hence Parsers).
    A negative number in any notation is a value, not an option (:data:`NEGATIVE_NUMBER`: ``--rl-lr -1e-3``); any
    other value that starts with ``-`` is an error saying to write ``--flag=VALUE``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)  # shared with this parser's argument groups
        self.register("action", "store", StoreOnce)
        self._negative_number_matcher = NEGATIVE_NUMBER  # argparse's own test of "looks like a negative number"
        self._arguments: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        namespace = namespace if namespace is not None else argparse.Namespace()
        namespace._parser = self  # a sub-parser parses later and overwrites it
        self._arguments = list(sys.argv[1:] if args is None else args)  # for the hint of a missing value
        try:
            return super().parse_known_args(args, namespace)
        finally:
            vars(namespace).pop(GIVEN, None)  # this parser's record; a sub-parser keeps its own

    def error(self, message: str):
        sys.stderr.write(f"error: {self.prog}: {message}{self.hint(message)}; see '{self.prog} --help'\n")
        sys.exit(2)

    def hint(self, message: str) -> str:
        """`` (did you mean 'X'?)`` for a mistyped choice or option named in ``message``; for an option whose value
        starts with ``-`` (read as an option), how to write it; else ``""``."""
        dashed = self.dashed_value(message)
        if dashed:
            return dashed
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            guess = closest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        else:
            unknown = re.search(r"unrecognized arguments: (.*)", message)
            options = [o for action in self._actions for o in action.option_strings]
            flags = [w.split("=")[0] for w in unknown.group(1).split() if w.startswith("-")] if unknown else []
            guess = next((g for g in (closest(flag, options) for flag in flags) if g), None)
        return f" (did you mean '{guess}'?)" if guess else ""

    def dashed_value(self, message: str) -> str:
        """For argparse's ``argument --flag: expected one argument`` when the word after ``--flag`` on the command
        line starts with ``-`` (argparse took it for an option): `` (VALUE reads as an option: write
        --flag=VALUE)``; else ``""``."""
        expected = re.match(r"argument ([^:]+): expected (?:one|\d+) argument", message)
        if not expected:
            return ""
        flags = expected.group(1).split("/")
        words = self._arguments
        for flag, value in zip(words, words[1:]):
            if flag in flags and value.startswith("-") and value != "--":
                return f" ({value} reads as an option: write {max(flags, key=len)}={value})"
        return ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dare", description="DARE: post-train and evaluate diffusion LLMs")
    parser.add_argument("--version", action="version", version=f"dare {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.configure(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def print_traceback_if_asked(err: BaseException) -> None:
    """With ``DARE_TRACEBACK`` set (not 0), print the Python traceback behind a one-line ``error:`` (the way to a
    plug-in's bug behind the line)."""
    if os.environ.get("DARE_TRACEBACK", "0") not in ("", "0"):
        traceback.print_exception(err)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.command_line = ["dare", *(sys.argv[1:] if argv is None else argv)]  # as given, for the files it writes
    if args.command is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command])
    if extra:  # positionals after an option (``dare train CFG --dry-run k=v``): the command may take them
        if not hasattr(module, "take_extra") or not module.take_extra(args, extra):
            args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if getattr(module, "LIGHT", False):  # reads files only (dare recipes): no torch, no transformers
            from dare.config import unknown_environment

            for line in unknown_environment():  # a misspelt DARE_* switch, as every command says
                print(line, file=sys.stderr)
            return module.run(args) or 0
        with terminate_as_interrupt():  # kill / scancel, even while torch is imported: "interrupted", not silence
            if hasattr(module, "precheck"):  # the command's checks that need no torch: a typo answers at once
                module.precheck(args)
            from dare.rollout.engine import check_environment  # imports torch: not for --help

            check_environment()
            with quiet_transformers():  # transformers' bars and info logs stay out of the command's log
                return module.run(args) or 0
    except DareError as err:
        print_traceback_if_asked(err)
        sys.stderr.write(f"error: {err.cli_message}\n")  # one write: torchrun ranks' lines never interleave
        return 2
    except Exception as err:  # out of memory, or a plug-in's own code raised (its hook, run or parse): one line
        from dare.devices import out_of_memory
        from dare.plugins import runtime_failure

        line = out_of_memory(err, getattr(module, "MEMORY_HINT", None)) or runtime_failure(err)
        if line is None and "torch" in sys.modules:  # under torchrun: a peer that stopped first
            from dare.distributed import lost_peer

            line = lost_peer(err)
        if line is None:  # DARE's own: the traceback
            raise
        close_progress_bars()
        print_traceback_if_asked(err)
        sys.stderr.write(f"error: {line}\n")
        return 2
    except KeyboardInterrupt:
        close_progress_bars()  # "interrupted" gets a line of its own
        if os.environ.get("RANK", "0") == "0":  # under torchrun: once, from rank 0
            print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
