"""``dare runs RUN [RUN ...]``: compare training runs side by side: each run's metrics (first -> last) and the
settings in which the runs differ; or ``dare runs FILE.json [FILE.json ...]``: ``dare eval`` results files, their
metrics and the settings in which they differ. Reads files only: no torch, no transformers (:data:`LIGHT`)."""

from __future__ import annotations

import argparse

HELP = ("compare dare train runs: their metrics first -> last and the settings in which they differ (dare runs "
        "runs/a runs/b, or dare runs runs/ for every run in it); or dare eval results files the same way (dare runs "
        "evals/a.json evals/b.json, or dare runs evals/)")

LIGHT = True
"""The ``dare`` command runs this one without its torch-side environment checks (see :func:`dare.cli.main`)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a dare train output directory (trainer.output_dir), or a directory holding several "
                             "(every directory below it with a config.yaml, at any depth: runs/demo/sft, runs/demo/rl); "
                             "a run still training is read as far as it got. Or a dare eval run/score --out results "
                             "file, or a directory holding no run but results files (every *.json results file below "
                             "it); one kind at a time")
    parser.add_argument("--metrics", nargs="+", metavar="KEY", default=None,
                        help="metrics.jsonl keys to show (default: loss, rollout/reward, rollout/accuracy where "
                             "logged, and every eval/* key); first -> last are means of the first / last min(5, half of "
                             "the) logged values. For results files: their metrics keys (default: every one in any "
                             "file)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    import json

    from dare import runs as compare
    from dare.commands.train import print_quietly
    from dare.runs import comparison, comparison_text, shown_metrics

    kind, runs = compare.read_compared(args.runs)
    if kind == "results":  # dare eval results files
        metrics = compare.shown_results_metrics(runs, args.metrics)
        if args.json:
            print_quietly(json.dumps(compare.results_comparison(runs, metrics), indent=1, default=str,
                                     allow_nan=False) + "\n")
        else:
            print_quietly(compare.results_comparison_text(runs, metrics) + "\n")
        return 0
    metrics = shown_metrics(runs, args.metrics)
    if args.json:
        print_quietly(json.dumps(comparison(runs, metrics), indent=1, default=str, allow_nan=False) + "\n")
    else:
        print_quietly(comparison_text(runs, metrics) + "\n")
    return 0
