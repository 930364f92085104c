"""The ``dare`` command.

Each sub-command is a module in :mod:`dare.commands` with ``HELP``, ``configure(parser)`` and
``run(args) -> int`` (optionally ``take_extra(args, extra) -> bool`` for trailing positionals); heavy imports happen inside ``run`` so ``dare --help`` stays fast. User errors
(:class:`~dare.errors.DareError`) are printed as one line (``error: ...``, exit status 2), never as a
stack trace.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dare import __version__
from dare.errors import DareError

COMMANDS = {
    "demo": "dare.commands.demo",
    "eval": "dare.commands.eval",
    "generate": "dare.commands.generate",
    "tiny": "dare.commands.tiny",
    "train": "dare.commands.train",
    "merge-lora": "dare.commands.merge_lora",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dare", description="DARE: post-train and evaluate diffusion LLMs")
    parser.add_argument("--version", action="version", version=f"dare {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        module.configure(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command])
    if extra:  # positionals after an option (``dare train CFG --dry-run k=v``): the command may take them
        if not hasattr(module, "take_extra") or not module.take_extra(args, extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return module.run(args) or 0
    except DareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _close_progress_bars()
        print("interrupted", file=sys.stderr)
        return 130


def _close_progress_bars() -> None:
    """End any open tqdm bar's line, so "interrupted" gets a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        bar.close()


if __name__ == "__main__":
    sys.exit(main())
