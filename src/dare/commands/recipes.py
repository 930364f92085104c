"""``dare recipes [NAME]``: list the training recipes, or print one (``dare recipes llada/d1_8b > my.yaml``).

Reads files only: no torch, no transformers (:data:`LIGHT`)."""

from __future__ import annotations

import argparse

HELP = ("list the training recipes (dare train NAME runs one), or print one's YAML to copy and edit: dare recipes "
        "llada/d1_8b > my.yaml")

LIGHT = True
"""The ``dare`` command runs this one without its torch-side environment checks (see :func:`dare.cli.main`)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="a recipe name from the list (e.g. llada/sft_tiny): print its YAML text unchanged, to "
                             "redirect into a file of your own (dare recipes llada/d1_8b > my.yaml; then dare train "
                             "my.yaml). Without NAME: one line per recipe, grouped by family; 'cpu' marks the tiny "
                             "ones that train on a CPU in seconds. A family (llada): its recipes only")


def run(args: argparse.Namespace) -> int:
    from dare.commands.train import print_quietly
    from pathlib import Path

    from dare.recipes import FAMILIES, listing, resolve_recipe

    if args.name is None or args.name in FAMILIES:  # a family: its recipes only
        print_quietly("\n".join(listing(args.name)) + "\n")
    else:
        print_quietly(Path(resolve_recipe(args.name)).read_text())  # what dare train NAME would read
    return 0
