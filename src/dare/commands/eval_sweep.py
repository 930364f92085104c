"""``dare eval sweep``: one benchmark over a list of decoder settings (accuracy under parallelism).

``dare eval sweep --model M --benchmark B --data FILE --out DIR --grid sampler=fastdllm:threshold=0.5,0.7,0.9
--grid sampler=llada:steps=8,4,2`` runs :func:`dare.eval.evaluate` once per point (common flags such as
``--gen-length`` or ``-o cache=dual`` apply to every point, a point's own settings win) and writes
``DIR/points/NN.json``, ``DIR/summary.{json,md}`` and ``DIR/accuracy_vs_parallelism.png`` (:mod:`dare.eval.sweep`),
replacing those of an earlier sweep in ``DIR``. ``DIR`` must be new, empty or an earlier sweep's (marked by the
sweep), and neither be nor contain the model, adapter or data files' directory: anything else is a one-line error before
any work. One ``--grid`` varies one key; a key given twice (in a point, a grid,
``-o`` or a flag and ``-o``) is a one-line error. Every point's settings are checked before the first point runs
(:func:`check_points`): a bad one is a one-line error naming the point. Every point generates (``EvalConfig(mode=
"generate")``), so a multiple-choice benchmark is evaluated as ``dare eval run --mode generate`` evaluates it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "evaluate one benchmark under several decoder settings: accuracy vs tokens per forward, NFE, tokens/s"
DESCRIPTION = (f"{HELP}. Every point decodes completions: a multiple-choice benchmark (mmlu, arc_c, ...) is evaluated "
               "as `dare eval run --mode generate` evaluates it (its answer extracted from each completion), not "
               "by likelihood.")


def configure(sweep: argparse.ArgumentParser) -> None:
    from dare.commands.eval_inputs import GEN_LENGTH_HELP, add_model_data_arguments
    from dare.commands.generate import add_sampler_arguments
    from dare.plugins import add_import_argument

    add_model_data_arguments(sweep)
    add_sampler_arguments(sweep, default=None, seed_help="seeds sampling and few-shot selection (default 0)",
                          option_help="any SamplerConfig field, common to every point, e.g. -o cache=dual",
                          gen_length_help=GEN_LENGTH_HELP)
    sweep.add_argument("--point", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE...]",
                       help="one decoder setting (SamplerConfig fields), e.g. sampler=fastdllm,threshold=0.7")
    sweep.add_argument("--grid", action="append", default=[], metavar="[KEY=VALUE,...:]KEY=V1,V2,...",
                       help="one point per value of one key, with the fixed settings before ':', e.g. "
                            "sampler=fastdllm:threshold=0.5,0.7,0.9 or sampler=llada:steps=8,4,2 (repeat --grid to "
                            "vary another key)")
    sweep.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    sweep.add_argument("--out", required=True, help="output directory (points/, summary.json, summary.md, plot): new, "
                       "empty or an earlier sweep's (its files there are replaced)")
    add_import_argument(sweep)
    sweep.set_defaults(eval_parser=sweep)


GRID_FORM = "[KEY=VALUE,...:]KEY=V1,V2,..."


def parse_point(text: str) -> dict[str, Any]:
    """``"k=v,k=v"`` -> ``{k: parsed v}`` (numbers, booleans and ``null`` parsed, as ``-o`` does); a key given
    twice is a one-line error."""
    from dare.commands.generate import parse_options
    from dare.errors import ConfigError

    items = [item for item in text.split(",") if item.strip()]
    if not items or not all("=" in item for item in items):
        raise ConfigError(f"--point expects KEY=VALUE[,KEY=VALUE...]; got '{text}'")
    return parse_options(items, what=f"--point '{text}'")


def expand_grid(text: str) -> list[dict[str, Any]]:
    """``"[k=v,...:]KEY=V1,V2,..."`` -> one point per value of ``KEY``, each with the fixed ``k=v`` settings. One
    ``--grid`` varies one key; every mistake is a one-line error about ``--grid``."""
    from dare.commands.generate import parse_options
    from dare.errors import ConfigError

    parts = text.split(":")
    if len(parts) > 2:
        raise ConfigError(grid_of_several_keys(text, parts))
    fixed_text, varied = parts if len(parts) == 2 else ("", parts[0])
    key, sep, values = varied.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key or not values.strip():
        raise ConfigError(f"--grid expects {GRID_FORM}; got '{text}'")
    values = [value.strip() for value in values.split(",") if value.strip()]
    settings = [value for value in values if "=" in value]
    if settings:
        raise ConfigError(f"--grid varies one key ({key}) after the ':'; '{settings[0]}' is a fixed setting: put it "
                          f"before the ':' ({GRID_FORM}); got '{text}'")
    fixed_items = [item for item in fixed_text.split(",") if item.strip()]
    if not all("=" in item for item in fixed_items):
        raise ConfigError(f"--grid varies one key, the one after the ':' ({GRID_FORM}); before it stand only fixed "
                          f"KEY=VALUE settings, not '{fixed_text}' (one --grid per varied key)")
    fixed = parse_options(fixed_items, what=f"--grid '{text}'")
    if key in fixed:
        raise ConfigError(f"--grid '{text}' sets {key} both before the ':' and as the varied key; give it once")
    return [{**fixed, **parse_options([f"{key}={value}"])} for value in values]


def grid_of_several_keys(text: str, parts: list[str]) -> str:
    """The message for a ``--grid`` with several ``:KEY=V1,V2`` parts: one ``--grid`` varies one key, so every
    combination is one ``--grid`` per value of the other key (an example built from ``text``)."""
    keys = [part.partition("=")[0].strip() or "?" for part in parts[1:]]
    message = (f"--grid varies one key ({GRID_FORM}); '{text}' varies {' and '.join(keys)}: give one --grid per value "
               "of the other keys, or one --point per combination")
    other_key, _, other_values = parts[2].partition("=")
    first = other_values.split(",")[0].strip()
    if len(parts) == 3 and other_key.strip() and first:
        fixed = ",".join(item for item in (parts[0].strip(), f"{other_key.strip()}={first}") if item)
        message += f", e.g. --grid {fixed}:{parts[1].strip()}"
    return message


def sweep_inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The input directories ``--out`` must neither be nor contain: the model's and the adapter's, and those of
    the data files (:func:`dare.outputs.check_apart` skips what is not an existing directory: hub names,
    ``tiny:FAMILY``, HF dataset names)."""
    from pathlib import Path

    def directory(path: str | None) -> str | None:
        return str(Path(path).expanduser().parent) if path and Path(path).expanduser().is_file() else path

    return {"the --model directory": args.model, "the --adapter directory": args.adapter,
            "the --tokenizer directory": args.tokenizer,
            "the --data directory": directory(args.data), "the --fewshot-data directory": directory(args.fewshot_data)}


def check_points(points: list[dict[str, Any]], common: dict[str, Any], model=None) -> None:
    """Check every point's decoder settings (``common`` with the point's own on top) before the first point runs,
    so that a mistake in the last point does not cost the earlier points' work. Without ``model``: the names,
    types and ranges, and the whole config of a point that names its sampler; with it: every point resolved as
    :func:`dare.eval.evaluate` resolves it (the family's default sampler, block size, decoding engine). A bad
    point is a one-line error naming it (``point N (settings): ...``, numbered as ``OUT/points/NN.json``)."""
    from dare.commands.eval_inputs import reject_option_seed
    from dare.commands.generate import reject_likelihood_options
    from dare.errors import ConfigError
    from dare.eval.sweep import settings_text
    from dare.rollout import SamplerConfig

    doing = "a sweep compares decoders"
    reject_likelihood_options(common, doing=doing)
    SamplerConfig.from_dict(common).check_values()  # a bad common flag is named as such, not as point 0's
    for index, fields in enumerate(points):
        try:
            reject_option_seed(fields, "--point/--grid")
            reject_likelihood_options(fields, "--point/--grid", doing)
            sampler = SamplerConfig.from_dict({**common, **fields})
            if model is not None:
                check_decoding(sampler, model)
            elif sampler.sampler is not None:
                sampler.resolved()
            else:
                sampler.check_values()
        except ConfigError as err:
            raise ConfigError(f"point {index} ({settings_text(fields)}): {err.cli_message}") from None


def check_decoding(sampler, model) -> None:
    """What :func:`dare.rollout.generate` checks of ``sampler`` for ``model`` before it decodes: the resolved
    config and the decoding engine on the model's device (one-line :class:`~dare.errors.ConfigError`)."""
    from dare.rollout import resolve_config
    from dare.rollout.samplers import decoding_engine, model_device

    decoding_engine(resolve_config(sampler, model), model_device(model))


def run(args: argparse.Namespace) -> int:
    from dare.commands.eval_inputs import check_limit, eval_sampler_values, load_samples
    from dare.commands.generate import model_argument
    from dare.errors import ConfigError
    from dare.eval import EvalConfig, evaluate, get_benchmark
    from dare.eval.run import load_for_eval
    from dare.eval.sweep import check_sweep_out, run_sweep
    from dare.outputs import check_dir_target, ensure_dir
    from dare.plugins import load_plugins
    from dare.rollout import SamplerConfig, default_sampler

    load_plugins(args.imports, "--import")  # a plug-in's benchmark, reward or sampler, before the names are checked
    model_argument(args)  # --model, or the base model --adapter records; the adapter checked before anything loads
    check_limit(args)
    check_sweep_out(args.out, "--out", sweep_inputs(args))  # new, empty or an earlier sweep; before any work
    bench = get_benchmark(args.benchmark)  # multiple choice included: generated, as `dare eval run --mode generate`
    points = [parse_point(p) for p in args.point] + [p for g in args.grid for p in expand_grid(g)]
    if not points:
        raise ConfigError("dare eval sweep needs at least one --point or --grid")
    config = EvalConfig(mode="generate", shots=args.shots, template=args.template, chat=args.chat,
                        batch_size=args.batch_size, seed=args.seed or 0)
    config.check()  # --batch-size, before any work
    common = eval_sampler_values(args, bench, config)
    check_points(points, common)  # every point's names and values, before the data and the model load
    check_dir_target(args.out, "--out")  # ensure_dir's errors, creating nothing yet
    samples, pool, pool_source, data = load_samples(bench, args)
    model, tokenizer, model_info = load_for_eval(args.model, args.adapter, args.device, args.dtype,
                                                 compile_blocks=args.compile_blocks, tokenizer=args.tokenizer)
    check_points(points, common, model)  # every point resolved for the model, before the first one runs
    ensure_dir(args.out, "--out")  # once everything is checked: a bad point or data file leaves no directory behind
    progress = not args.no_progress  # plain lines when stderr is not a terminal (dare.progress)

    def evaluate_point(fields):
        sampler = SamplerConfig.from_dict({"sampler": default_sampler(model), **common, **fields})
        return evaluate(model, tokenizer, bench, samples, sampler=sampler, config=config, fewshot_pool=pool,
                        fewshot_source=pool_source, model_info=model_info, data_info=data, progress=progress)

    rows = run_sweep(evaluate_point, points, args.out, log=lambda line: print(line, file=sys.stderr))
    from dare.eval.sweep import markdown_table

    print(markdown_table(rows))
    return 0
