"""``dare demo``: the end-to-end job on CPU with no downloads."""

from __future__ import annotations

import argparse

HELP = "run the end-to-end demo on CPU with tiny models (no downloads); writes DIR/report.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="dare_demo", help="output directory (default: dare_demo)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from dare.demo import run_demo

    return run_demo(out_dir=args.out, seed=args.seed)
