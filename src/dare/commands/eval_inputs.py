"""What ``dare eval run`` and ``dare eval sweep`` share: the model / data / prompt flags and the samples they
select."""

from __future__ import annotations

import argparse

GEN_LENGTH_HELP = "generated tokens (default: the benchmark's max_new_tokens, e.g. 256 for gsm8k)"


def add_model_data_arguments(run: argparse.ArgumentParser) -> None:
    """The model, data and prompt flags shared by ``dare eval run`` and ``dare eval sweep``."""
    from dare.commands.generate import add_compile_argument

    run.add_argument("--model", required=True, help="checkpoint directory / hub name, or tiny:FAMILY[:SEED]")
    run.add_argument("--adapter", default=None, help="LoRA adapter directory to apply on top of --model")
    run.add_argument("--benchmark", required=True, help="benchmark name (gsm8k, math500, humaneval, mmlu, ...)")
    run.add_argument("--data", default=None,
                     help="local file/directory in the dataset's schema, or a HF dataset name (default: packaged/HF)")
    run.add_argument("--split", default=None, help="split of a HF dataset (default: the benchmark's)")
    run.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    run.add_argument("--shots", type=int, default=None, help="few-shot exemplars (default: the benchmark's)")
    run.add_argument("--template", default=None, help="prompt template (zero_shot, few_shot, cot, ...)")
    run.add_argument("--fewshot-data", default=None,
                     help="exemplar pool (default: the benchmark's few-shot split, else the evaluated data)")
    chat = run.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the tokenizer's chat template (default: for generation when it has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="plain-text prompts")
    run.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    run.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"],
                     help="weights dtype (default: bfloat16 on GPU, float32 on CPU)")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_compile_argument(run)


def load_samples(bench, args: argparse.Namespace):
    """``(samples, fewshot pool or None, data record)``."""
    samples = bench.load(args.data, split=args.split, limit=args.limit)
    shots = bench.default_shots if args.shots is None else args.shots
    pool, pool_source = None, None
    if shots > 0:
        if args.fewshot_data:
            pool, pool_source = bench.load(args.fewshot_data), args.fewshot_data
        elif args.data is None and bench.hf is not None and bench.hf.fewshot_split and bench.packaged is None:
            pool, pool_source = bench.load(None, split=bench.hf.fewshot_split), f"{bench.hf.path}:{bench.hf.fewshot_split}"
        else:
            pool = bench.load(args.data, split=args.split)  # the whole file, not only --limit rows
            pool_source = args.data
    source = args.data or (bench.packaged() if bench.packaged else None) or (bench.hf.path if bench.hf else None)
    data = {"source": source, "split": args.split or (bench.hf.split if bench.hf and args.data is None else None),
            "limit": args.limit, "fewshot_source": pool_source}
    return samples, pool, data
