"""``dare tiny --family F --out DIR``: write a tiny random checkpoint."""

from __future__ import annotations

import argparse
import json

HELP = "write a tiny random HF checkpoint (2 layers, hidden 64) with DARE's byte tokenizer"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, help="model family: llada, dream, llada_moe, sdar, sdar_moe, llada2 (see dare.FAMILIES)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights dtype of the written checkpoint (default float32)")


def run(args: argparse.Namespace) -> int:
    from dare.outputs import ensure_dir

    ensure_dir(args.out, "--out")
    import torch

    from dare.models.tiny import write_tiny_checkpoint

    path = write_tiny_checkpoint(args.family, args.out, seed=args.seed, dtype=getattr(torch, args.dtype))
    print(json.dumps({"family": args.family, "path": str(path), "tokenizer": "dare byte-level (264 tokens)"}))
    return 0
