"""``dare eval score --benchmark B --predictions FILE.jsonl``: score predictions, print the metrics.

Each predictions line is a JSON object with ``prediction`` (a completion, or a list of ``n``
completions for pass@k) and either ``{"id"|"question", "answer"}`` or the benchmark's native fields
(e.g. HumanEval's ``task_id/prompt/test/entry_point``); with ``--data`` the lines are joined to the
benchmark's samples by ``id`` (or ``question``) instead. ``dare eval run`` (generation) is added here
as a further sub-command.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "evaluate models on benchmarks (score: score a predictions file)"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", metavar="SUBCOMMAND")
    score = sub.add_parser("score", help="score a predictions .jsonl file and print the metrics as JSON")
    score.add_argument("--benchmark", required=True, help="benchmark name (gsm8k, math500, humaneval, mmlu, ...)")
    score.add_argument("--predictions", required=True, help='JSONL: {"id"|"question", "prediction", "answer"} or native fields')
    score.add_argument("--data", default=None, help="benchmark data (file, directory or HF name) to join predictions with by id")
    score.add_argument("--split", default=None, help="split of --data when it is a HF dataset")
    score.add_argument("--k", type=int, nargs="*", default=None, help="pass@k values (default: 1,5,10,... up to n)")
    score.add_argument("--out", default=None, help="also write the full results file (per-sample records) here")
    score.add_argument("--json", action="store_true", help="print one compact JSON line instead of indented JSON")
    score.add_argument("--workers", type=int, default=None, help="parallel sandboxed programs (code benchmarks)")
    score.add_argument("--timeout", type=float, default=None, help="seconds per sandboxed program (code benchmarks)")
    parser.set_defaults(eval_parser=parser)


def run(args: argparse.Namespace) -> int:
    if args.eval_command is None:
        args.eval_parser.print_help()
        return 2
    return {"score": run_score}[args.eval_command](args)


def read_predictions(path: str) -> list[tuple[int, dict]]:
    """(line number, object) for every non-empty line; a malformed line is a one-line error."""
    from dare.errors import InputError

    try:
        handle = open(path, encoding="utf-8")
    except OSError as err:
        raise InputError(f"cannot read predictions {path}: {err.strerror}") from None
    lines = []
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            if "prediction" not in obj:
                raise InputError(f"{path}:{lineno}: missing \"prediction\" (keys: {', '.join(sorted(obj)) or 'none'})")
            pred = obj["prediction"]
            if not isinstance(pred, str) and not (isinstance(pred, list) and pred and all(isinstance(p, str) for p in pred)):
                raise InputError(f"{path}:{lineno}: \"prediction\" must be a string or a non-empty list of strings")
            lines.append((lineno, obj))
    if not lines:
        raise InputError(f"{path}: no predictions")
    return lines


def samples_for(bench, lines, path: str, data_samples=None):
    """Pair each line with its Sample; lines with the same id are pooled (n completions)."""
    from dare.errors import InputError
    from dare.eval.benchmark import stable_id

    by_key = {}
    if data_samples is not None:
        for s in data_samples:
            by_key[s.id] = s
            by_key.setdefault(s.question, s)
    order, grouped = [], {}
    for lineno, obj in lines:
        key = str(obj["id"]) if "id" in obj else None
        if data_samples is not None:
            sample = by_key.get(key) if key is not None else by_key.get(obj.get("question"))
            if sample is None:
                raise InputError(f"{path}:{lineno}: id {key or obj.get('question', '')[:40]!r} is not in --data")
        else:
            try:
                if bench.is_native(obj):
                    sample = bench.parse_row(obj, lineno)
                elif "answer" in obj:
                    sid = key or stable_id(obj.get("question", lineno))
                    sample = bench.from_answer(obj["answer"], id=sid, question=str(obj.get("question", "")))
                else:
                    raise InputError(f"needs \"answer\" or the native fields ({', '.join(bench.native_keys)})")
            except InputError as err:
                raise InputError(f"{path}:{lineno}: {err}") from None
            if key is not None:
                sample.id = key
        preds = [obj["prediction"]] if isinstance(obj["prediction"], str) else obj["prediction"]
        if sample.id not in grouped:
            order.append(sample)
            grouped[sample.id] = []
        grouped[sample.id].extend(preds)
    return order, [grouped[s.id] for s in order]


def run_score(args: argparse.Namespace) -> int:
    from dare.eval import get_benchmark, score_predictions

    bench = get_benchmark(args.benchmark)
    lines = read_predictions(args.predictions)
    data = bench.load(args.data, split=args.split) if args.data else None
    samples, predictions = samples_for(bench, lines, args.predictions, data)
    options = {}
    if bench.reward == "code":
        options = {k: v for k, v in (("workers", args.workers), ("timeout", args.timeout)) if v is not None}
        options["progress"] = sys.stderr.isatty()
    results = score_predictions(
        bench, samples, predictions, ks=args.k, reward_options=options,
        data={"source": args.data, "split": args.split, "predictions": args.predictions},
    )  # fmt: skip
    if args.out:
        results.write(args.out)
    summary = results.summary()
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 0
