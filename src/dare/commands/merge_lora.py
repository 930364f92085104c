"""``dare merge-lora --adapter DIR --out DIR``: merge a LoRA adapter into a full HF checkpoint.

``--out`` must be a new or empty directory, or an earlier ``dare merge-lora`` output (which is replaced; one from
before outputs were marked is recognised by its files: :func:`dare.models.lora.is_unmarked_merge_output`); never the
adapter, the base model directory or the current directory, nor one containing them (see
:func:`dare.models.lora.merge_adapter`). The merged checkpoint's tokenizer is ``--tokenizer`` when given, else the one
LoRA training saved with the adapter (``RUN/final``: without its chat template when the run trained without it, so
the merged model reads prompts as the run trained, as a full fine-tune's ``final/`` does), else the base model's."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "merge a LoRA adapter into its base model and write a full checkpoint that AutoModel loads"


def configure(parser: argparse.ArgumentParser) -> None:
    from dare.plugins import add_import_argument

    parser.add_argument("--adapter", required=True, help="adapter directory (e.g. RUN/final)")
    parser.add_argument("--out", required=True,
                        help="output checkpoint directory: new, empty, or an earlier merge-lora output (replaced)")
    parser.add_argument("--base", default=None, help="base model (default: the one recorded in the adapter)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="weights dtype of the merged checkpoint (default auto: the base checkpoint's)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer (directory or hub name) to write with the merged checkpoint (default: the one "
                             "saved with the adapter, as LoRA training does, else the base model's)")
    add_import_argument(parser)


def run(args: argparse.Namespace) -> int:
    from dare.outputs import ensure_dir
    from dare.plugins import load_plugins

    load_plugins(args.imports, "--import")  # a plug-in's model family, before its models load
    ensure_dir(Path(args.out).parent, "--out", target=args.out)  # before the models are loaded
    from dare.models.lora import merge_adapter

    out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype, what="--out",
                        tokenizer=args.tokenizer)
    from dare.models.loading import recorded_base

    base = args.base or recorded_base(args.adapter) or "its base model"
    print(f"wrote {out}: adapter {args.adapter} merged into {base} (a full checkpoint: load it with --model {out})")
    return 0
