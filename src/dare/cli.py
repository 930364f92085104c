"""The ``dare`` command.

Each sub-command is a module in :mod:`dare.commands` with ``HELP``, ``configure(parser)`` and
``run(args) -> int``; heavy imports happen inside ``run`` so ``dare --help`` stays fast. User errors
(:class:`~dare.errors.DareError`) are printed as one line (``error: ...``, exit status 2), never as a
stack trace.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dare.errors import DareError

COMMANDS = {
    "demo": "dare.commands.demo",
    "generate": "dare.commands.generate",
    "tiny": "dare.commands.tiny",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dare", description="DARE: post-train and evaluate diffusion LLMs")
    parser.add_argument("--version", action="version", version="dare 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.configure(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return module.run(args) or 0
    except DareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
