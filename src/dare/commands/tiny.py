"""``dare tiny --family F --out DIR``: write a tiny random checkpoint.

``--out`` must be a new or empty directory, or an earlier ``dare tiny`` output (rewritten): random weights never
land on a trained model or a user's files (:func:`dare.models.tiny.write_tiny_checkpoint` checks it)."""

from __future__ import annotations

import argparse

HELP = "write a tiny random HF checkpoint (2 layers, hidden 64) with DARE's byte tokenizer"


def configure(parser: argparse.ArgumentParser) -> None:
    from dare.plugins import add_import_argument

    parser.add_argument("--family", required=True, help="model family: llada, dream, llada_moe, sdar, sdar_moe, llada2 "
                                                        "(see dare.FAMILIES), or a plug-in's (--import)")
    parser.add_argument("--out", required=True,
                        help="output directory: new, empty, or an earlier `dare tiny` output (rewritten)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype of the written checkpoint (default float32)")
    add_import_argument(parser)


def run(args: argparse.Namespace) -> int:
    import shlex

    import torch

    from dare.config import check_seed
    from dare.models.tiny import write_tiny_checkpoint
    from dare.plugins import load_plugins

    load_plugins(args.imports, "--import")  # a plug-in's model family, before --family is checked
    check_seed(args.seed, "--seed")
    # --out is checked there (new, empty or an earlier tiny checkpoint), and the family, before anything is written
    path = write_tiny_checkpoint(args.family, args.out, seed=args.seed, dtype=getattr(torch, args.dtype), what="--out")
    print(f"wrote {path}: a tiny random {args.family} checkpoint (seed {args.seed}, {args.dtype}) with DARE's "
          "byte-level tokenizer (264 tokens)")
    imports = "".join(f" --import {shlex.quote(spec)}" for spec in args.imports)
    print(f"try it: dare generate{imports} --model {shlex.quote(str(path))} --prompt Hi --gen-length 16")
    return 0
