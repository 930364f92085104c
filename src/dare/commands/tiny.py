"""``dare tiny --family F --out DIR``: write a tiny random checkpoint.

``--out`` must be a new or empty directory, or an earlier ``dare tiny`` output (rewritten): random weights never
land on a trained model or a user's files."""

from __future__ import annotations

import argparse
import json

HELP = "write a tiny random HF checkpoint (2 layers, hidden 64) with DARE's byte tokenizer"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, help="model family: llada, dream, llada_moe, sdar, sdar_moe, llada2 (see dare.FAMILIES)")
    parser.add_argument("--out", required=True,
                        help="output directory: new, empty, or an earlier `dare tiny` output (rewritten)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype of the written checkpoint (default float32)")


def run(args: argparse.Namespace) -> int:
    from dare.outputs import check_replaceable, ensure_dir, mark_output

    check_replaceable(args.out, "--out", "tiny")  # e.g. RUN/final: a trained model is never overwritten
    out = ensure_dir(args.out, "--out")
    import torch

    from dare.models.spec import get_family
    from dare.models.tiny import write_tiny_checkpoint

    get_family(args.family)  # an unknown family is an error before the directory is marked
    mark_output(out, "tiny", family=args.family)  # first: an interrupted write can be rerun into the same --out
    path = write_tiny_checkpoint(args.family, args.out, seed=args.seed, dtype=getattr(torch, args.dtype))
    print(json.dumps({"family": args.family, "path": str(path), "tokenizer": "dare byte-level (264 tokens)"}))
    return 0
