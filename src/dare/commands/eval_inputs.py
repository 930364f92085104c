"""What ``dare eval run`` and ``dare eval sweep`` share: the model / data / prompt flags and the samples they
select."""

from __future__ import annotations

import argparse
import logging
import os

log = logging.getLogger("dare.eval")

GEN_LENGTH_HELP = "generated tokens (default: the benchmark's max_new_tokens, e.g. 256 for gsm8k)"


def add_model_data_arguments(run: argparse.ArgumentParser) -> None:
    """The model, data and prompt flags shared by ``dare eval run`` and ``dare eval sweep``."""
    from dare.commands.generate import add_compile_argument, add_dtype_argument, add_model_arguments

    add_model_arguments(run)
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
    add_dtype_argument(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_compile_argument(run)


def check_limit(args: argparse.Namespace) -> None:
    """``--limit`` is positive: a one-line error before any work (``--limit 0`` would evaluate nothing)."""
    from dare.errors import ConfigError

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be positive (omit it to evaluate every problem); got {args.limit}")


def load_samples(bench, args: argparse.Namespace):
    """``(samples, fewshot pool or None, fewshot source or None, data record)``. Warns once when the exemplars
    come from the evaluated data (or share problems with it) and when ``--fewshot-data`` is not used; a pool too
    small for the shots is a one-line error before the model is loaded."""
    from dare.errors import ConfigError

    samples = bench.load(args.data, split=args.split, limit=args.limit)
    shots = bench.default_shots if args.shots is None else args.shots
    if shots < 0:
        raise ConfigError(f"--shots must be >= 0; got {shots}")
    source = args.data or (bench.packaged() if bench.packaged else None) or (bench.hf.path if bench.hf else None)
    data = {"source": source, "split": args.split or (bench.hf.split if bench.hf and args.data is None else None),
            "limit": args.limit}
    if args.data and os.path.isfile(args.data):  # a local file: where it was and what it held
        from dare.eval.results import file_digest

        data.update(path=os.path.abspath(args.data), digest=file_digest(args.data))
    if shots == 0:
        if args.fewshot_data:
            default = f" ({bench.name}'s default)" if args.shots is None else ""
            log.warning(f"warning: ignoring --fewshot-data {args.fewshot_data}: prompts are 0-shot{default}; pass "
                        "--shots N to use N exemplars from it")
        return samples, None, None, data
    pool, pool_source = fewshot_pool(bench, args)
    if samples:  # a pool too small for the shots fails before the model is loaded
        bench.fewshot(pool, shots, seed=args.seed or 0, question=samples[0].question)
    warn_evaluated_exemplars(bench, args, shots, samples, pool, pool_source)
    return samples, pool, pool_source, data


def fewshot_pool(bench, args: argparse.Namespace):
    """``(exemplar pool, its source for the results file)``: ``--fewshot-data``, else the benchmark's few-shot split
    (default data only), else the whole evaluated data (``"evaluated data"``, not only the ``--limit`` rows)."""
    from dare.eval.run import EVALUATED_DATA

    if args.fewshot_data:
        return bench.load(args.fewshot_data), args.fewshot_data
    if args.data is None and bench.hf is not None and bench.hf.fewshot_split and bench.packaged is None:
        return bench.load(None, split=bench.hf.fewshot_split), f"{bench.hf.path}:{bench.hf.fewshot_split}"
    return bench.load(args.data, split=args.split), EVALUATED_DATA


def warn_evaluated_exemplars(bench, args: argparse.Namespace, shots: int, samples, pool, pool_source: str) -> None:
    """One warning when the exemplars are evaluated problems: other problems' answers then show in the prompts
    (a problem is never its own exemplar)."""
    from dare.eval.run import EVALUATED_DATA

    if pool_source == EVALUATED_DATA:
        default = f" ({bench.name}'s default)" if args.shots is None else ""
        log.warning(f"warning: the {shots}-shot exemplars{default} come from the evaluated data "
                    f"({args.data or 'the default data'}): prompts may show other evaluated problems with their "
                    "answers; pass --fewshot-data FILE (e.g. the train split) or --shots 0")
        return
    evaluated = {sample.question for sample in samples}
    shared = sum(1 for sample in pool if sample.question in evaluated)
    if shared:
        log.warning(f"warning: {shared} of the {len(pool)} few-shot problems ({pool_source}) are also evaluated: "
                    "prompts show them with their answers; pass a --fewshot-data FILE without evaluated problems "
                    "(e.g. the train split)")


def reject_option_seed(options: dict, where: str = "-o") -> None:
    """``seed`` among ``-o`` items (or a sweep point's settings): a one-line error pointing to ``--seed``, the
    evaluation's one seed (sampling, few-shot selection, likelihood corruptions), instead of dropping it silently."""
    from dare.errors import ConfigError

    if "seed" in options:
        seed = options["seed"]
        raise ConfigError(f"{where} seed={seed} is not used by dare eval: pass --seed {seed} (one seed for the whole "
                          "run: sampling, few-shot selection and the likelihood corruptions)")


def eval_sampler_values(args: argparse.Namespace, bench, config) -> dict:
    """The :class:`~dare.rollout.SamplerConfig` fields of ``dare eval run`` / ``sweep``'s flags: ``-o seed`` refused
    (:func:`reject_option_seed`), the seed left to ``config`` (:class:`~dare.eval.EvalConfig`), and ``gen_length``
    by default the benchmark's ``max_new_tokens`` for the prompt template the run uses."""
    from dare.commands.generate import parse_options, sampler_values

    values = sampler_values(args)
    reject_option_seed(parse_options(args.option))
    if getattr(args, "sampler_of", None):
        values = {**run_sampler_values(args.sampler_of), **values}
    values.pop("seed", None)  # EvalConfig.seed seeds everything
    if "gen_length" not in values:
        template = config.resolve_template(bench, bench.default_shots if args.shots is None else args.shots)
        values["gen_length"] = bench.generation_defaults(template).max_new_tokens
    return values


def run_sampler_values(run: str) -> dict:
    """The rollout sampler a ``dare train`` run recorded (``RUN/config.yaml``'s ``rollout.sampler``, or that of a
    ``config.yaml`` given itself) as :class:`~dare.rollout.SamplerConfig` fields for ``dare eval run --sampler-of``;
    one-line errors for a path that is no run and for a run without rollouts (SFT, DPO)."""
    from pathlib import Path

    from dare.errors import ConfigError, InputError
    from dare.runs import read_config

    path = Path(run).expanduser()
    config = path / "config.yaml" if path.is_dir() else path
    if not config.is_file():
        raise ConfigError(f"--sampler-of {run}: no {config} (give a dare train output directory or its config.yaml)")
    try:
        settings = read_config(config)
    except InputError as err:
        raise ConfigError(f"--sampler-of {run}: {err}") from None
    rollout, algorithm = settings.get("rollout"), settings.get("algorithm")
    sampler = (rollout.get("sampler") if isinstance(rollout, dict) else None) or {}
    algorithm = algorithm.get("name") if isinstance(algorithm, dict) else None
    if not isinstance(sampler, dict) or not sampler.get("sampler"):
        raise ConfigError(f"--sampler-of {run}: the run (algorithm {algorithm}) records no rollout sampler: it "
                          "trained without rollouts")
    return {key: value for key, value in sampler.items() if value is not None}
