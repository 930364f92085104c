"""``dare eval run`` (evaluate a model on a benchmark) and ``dare eval score`` (score a predictions file); ``dare
eval sweep`` (:mod:`dare.commands.eval_sweep`), ``dare eval lm-eval`` (:mod:`dare.commands.eval_lm`) and ``dare eval
opencompass`` (:mod:`dare.commands.eval_oc`).

``dare eval run --model PATH|tiny:FAMILY --benchmark B [--data ...] [--sampler NAME -o key=value ...]``
generates completions (free-form benchmarks, or ``--mode generate``) or scores every option of a
multiple-choice benchmark by its MC-ELBO (``--mode likelihood``, the default there), then scores them and
prints the metrics; ``--out`` writes the full results file (settings, timings, per-sample records).

``--out`` (both commands) is a new file or an earlier results file (replaced); one of the command's inputs or any
other existing file is a one-line error before any work (:func:`dare.eval.results.check_results_out`).

``dare eval score --benchmark B --predictions FILE.jsonl``: each predictions line (or each item of one JSON array; a
results file, already scored, is a one-line error, :mod:`dare.commands.eval_predictions`) is a JSON object with
``prediction`` (a completion, or a list of ``n``
completions for pass@k) and either ``{"id"|"question", "answer"}`` or the benchmark's native fields
(e.g. HumanEval's ``task_id/prompt/test/entry_point``); with ``--data`` the lines are joined to the
benchmark's samples by ``id`` (or ``task_id``, or ``question``) instead. Code benchmarks always run the
benchmark's own tests: their lines are joined by id to ``--data`` or, without it, to the benchmark's
default data; tests carried inside the predictions file are used only with ``--trust-prediction-tests``.
"""

from __future__ import annotations

import argparse
import json
import os

HELP = ("evaluate models on benchmarks (run: generate/likelihood + score; score: score a predictions file; sweep: "
        "accuracy under several decoder settings; lm-eval: lm-evaluation-harness with the dare model; opencompass: "
        "OpenCompass with one-line loading errors)")
MEMORY_HINT = "--batch-size (default 8) or --gen-length (lm-eval and OpenCompass: their own batch size)"


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", metavar="SUBCOMMAND")
    from dare.commands import eval_lm, eval_oc, eval_sweep
    from dare.plugins import add_import_argument

    run_help = "evaluate a model on a benchmark and print the metrics as JSON"
    configure_run(sub.add_parser("run", help=run_help, description=run_help))
    eval_sweep.configure(sub.add_parser("sweep", help=eval_sweep.HELP, description=eval_sweep.DESCRIPTION))
    eval_lm.configure(sub.add_parser("lm-eval", help=eval_lm.HELP, description=eval_lm.HELP, add_help=False))
    eval_oc.configure(sub.add_parser("opencompass", help=eval_oc.HELP, description=eval_oc.HELP, add_help=False))
    score_help = "score a predictions .jsonl file and print the metrics as JSON"
    score = sub.add_parser("score", help=score_help, description=score_help)
    score.add_argument("--benchmark", required=True, help="benchmark name (gsm8k, math500, humaneval, mmlu, ...)")
    score.add_argument("--predictions", required=True, help='JSONL: {"id"|"question", "prediction", "answer"} or '
                       "native fields per line (or a JSON array of such objects)")
    score.add_argument("--data", default=None, help="benchmark data (file, directory or HF name) to join predictions with by id")
    score.add_argument("--split", default=None, help="split of --data when it is a HF dataset or a directory of split files")
    score.add_argument("--k", type=pass_k, nargs="+", default=None, help="pass@k values (default: 1,5,10,... up to n)")
    score.add_argument("--out", default=None, help="also write the full results file (per-sample records) here: a new "
                       "file or an earlier results file")
    score.add_argument("--json", action="store_true", help="print one compact JSON line instead of indented JSON")
    score.add_argument("--workers", type=int, default=None,
                       help="parallel sandboxed programs (code benchmarks; default: one per CPU)")
    score.add_argument("--timeout", type=float, default=None,
                       help="seconds per sandboxed program (code benchmarks; default 20)")
    score.add_argument("--trust-prediction-tests", action="store_true",
                       help="code benchmarks: run the tests written in the predictions file instead of the benchmark's own")
    add_import_argument(score)
    parser.set_defaults(eval_parser=parser)


def run(args: argparse.Namespace) -> int:
    if args.eval_command is None:
        args.eval_parser.print_help()
        return 2
    from dare.commands import eval_lm, eval_oc, eval_sweep

    commands = {"run": run_run, "score": run_score, "sweep": eval_sweep.run, "lm-eval": eval_lm.run,
                "opencompass": eval_oc.run}
    return commands[args.eval_command](args)


def take_extra(args: argparse.Namespace, extra: list[str]) -> bool:
    """``dare eval lm-eval`` / ``dare eval opencompass`` pass every further argument to lm-eval / OpenCompass."""
    from dare.commands import eval_lm, eval_oc

    passes = {"lm-eval": eval_lm, "opencompass": eval_oc}.get(args.eval_command)
    return passes is not None and passes.take_extra(args, extra)


# ------------------------------------------------------------------------------------------- run

def configure_run(run: argparse.ArgumentParser) -> None:
    from dare.commands.eval_inputs import GEN_LENGTH_HELP, add_model_data_arguments
    from dare.commands.generate import add_sampler_arguments
    from dare.plugins import add_import_argument

    add_model_data_arguments(run)
    run.add_argument("--mode", default="auto", choices=["auto", "generate", "likelihood"],
                     help="auto: likelihood for multiple choice, generate otherwise")
    add_sampler_arguments(
        run, default=None, seed_help="seeds sampling, few-shot selection and the ELBO corruptions (default 0)",
        option_help="any SamplerConfig field (generation) or LikelihoodConfig field (likelihood), e.g. -o cache=dual",
        gen_length_help=GEN_LENGTH_HELP)
    run.add_argument("--sampler-of", default=None, metavar="RUN",
                     help="decode with the rollout sampler of a dare train run (its output directory or config.yaml): "
                          "every setting, gen_length included; the sampler flags above override single ones")
    run.add_argument("--num-samples", "-n", type=int, default=1, help="completions per problem (pass@k)")
    run.add_argument("--k", type=pass_k, nargs="+", default=None, help="pass@k values (default: 1,5,10,... up to n)")
    run.add_argument("--mc-samples", type=int, default=None, help="likelihood: Monte-Carlo ELBO samples per option (default 32: "
                     "LikelihoodConfig.mc_samples)")
    run.add_argument("--length-norm", default=None, choices=["none", "tokens", "chars"],
                     help="likelihood: option score normalisation (default none)")
    run.add_argument("--batch-size", type=int, default=8,
                     help="prompts per generate call / corrupted rows per forward (likelihood)")
    run.add_argument("--out", default=None, help="write the full results file (settings, per-sample records) here: a "
                     "new file or an earlier results file")
    run.add_argument("--json", action="store_true", help="print one compact JSON line")
    run.add_argument("--workers", type=int, default=None,
                     help="parallel sandboxed programs (code benchmarks; default: one per CPU)")
    run.add_argument("--timeout", type=float, default=None,
                     help="seconds per sandboxed program (code benchmarks; default 20)")
    add_import_argument(run)
    run.set_defaults(eval_parser=run)


SAMPLER_FLAGS = ("sampler", "gen_length", "block_length", "steps", "block_steps", "temperature", "top_p", "top_k",
                 "threshold", "factor", "decoder", "cache")


def _run_configs(args: argparse.Namespace, bench):
    """``(EvalConfig, sampler field values or None, LikelihoodConfig or None)`` from the flags, validated
    before the model is loaded."""
    from dare.commands.eval_inputs import eval_sampler_values, reject_option_seed
    from dare.commands.generate import parse_options, reject_flag_and_option
    from dare.errors import ConfigError
    from dare.eval import EvalConfig, LikelihoodConfig

    config = EvalConfig(mode=args.mode, shots=args.shots, template=args.template, chat=args.chat,
                        num_samples=args.num_samples, batch_size=args.batch_size, seed=args.seed or 0,
                        ks=tuple(args.k) if args.k else None)
    config.check()
    mode = config.resolve_mode(bench)
    if mode == "likelihood":
        given = [f"--{f.replace('_', '-')}" for f in (*SAMPLER_FLAGS, "template", "sampler_of")
                 if getattr(args, f) is not None]
        if given or args.num_samples != 1:
            flag = given[0] if given else "--num-samples"
            raise ConfigError(f"{flag} applies to generation; {bench.name} is scored by likelihood here "
                              "(add --mode generate)")
        values = parse_options(args.option)
        reject_other_mode_options(values, mode, bench)
        flags = {k: getattr(args, k) for k in ("mc_samples", "length_norm", "seed") if getattr(args, k) is not None}
        reject_flag_and_option(flags, values)
        reject_option_seed(values)
        flags.pop("seed", None)  # EvalConfig.seed
        return config, None, LikelihoodConfig.from_dict({**values, **flags})
    if args.mc_samples is not None or args.length_norm is not None:
        flag = "--mc-samples" if args.mc_samples is not None else "--length-norm"
        raise ConfigError(f"{flag} applies to --mode likelihood (multiple-choice benchmarks)")
    reject_other_mode_options(parse_options(args.option), mode, bench)
    values = eval_sampler_values(args, bench, config)
    from dare.rollout import SamplerConfig

    check = SamplerConfig.from_dict(values)  # unknown -o keys
    check.check_values()  # types and ranges, before loading the model
    if "sampler" in values:
        check.resolved()  # unknown sampler / bad values, before loading the model
    return config, values, None


def reject_other_mode_options(options: dict, mode: str, bench) -> None:
    """A ``-o`` setting that only the other evaluation mode reads (``-o mc_samples`` while generating, ``-o
    threshold`` while scoring by likelihood): a one-line error naming the mode it belongs to and how to get there,
    instead of a did-you-mean among this mode's fields."""
    from dare.commands.generate import likelihood_only_fields
    from dare.errors import ConfigError
    from dare.eval import LikelihoodConfig
    from dare.rollout import SamplerConfig

    likelihood_only = likelihood_only_fields(LikelihoodConfig, SamplerConfig)
    if mode == "likelihood":
        sampler_only = likelihood_only_fields(SamplerConfig, LikelihoodConfig)
        key = next((k for k in options if k in sampler_only), None)
        if key is not None:
            raise ConfigError(f"-o {key} applies to generation; {bench.name} is scored by likelihood here "
                              "(add --mode generate)")
        return
    key = next((k for k in options if k in likelihood_only), None)
    if key is None:
        return
    if bench.kind == "choice":
        how = (f"{bench.name} is evaluated by generation here, as --mode generate asks (leave it out to score by "
               "likelihood)")
    else:
        how = f"{bench.name} is free-form, so it is evaluated by generation"
    raise ConfigError(f"-o {key} applies to likelihood scoring (--mode likelihood, multiple-choice benchmarks); {how}")


def pass_k(text: str) -> int:
    """One ``--k`` value: a whole number >= 1 (``--k 0`` used to fail after the whole evaluation, in pass@k)."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"pass@k takes whole numbers >= 1; got {text!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"pass@k takes whole numbers >= 1; got {k}")
    return k


def run_run(args: argparse.Namespace) -> int:
    from dare.commands.eval_inputs import check_limit, load_samples
    from dare.commands.generate import model_argument
    from dare.devices import resolve_device
    from dare.eval import evaluate, get_benchmark
    from dare.eval.results import check_results_out
    from dare.eval.run import load_for_eval
    from dare.plugins import load_plugins
    from dare.rewards import RewardFailed
    from dare.rollout import SamplerConfig, default_sampler

    load_plugins(args.imports, "--import")  # a plug-in's benchmark, reward or sampler, before the names are checked
    check_limit(args)
    model_argument(args)  # --model, or the base model --adapter records; the adapter checked before anything loads
    bench = get_benchmark(args.benchmark)
    if args.out:  # never an input, nor a file an evaluation did not write
        check_results_out(args.out, "--out", {"--data": args.data, "--fewshot-data": args.fewshot_data},
                          example=f"{bench.name}.json")
    resolve_device(args.device)  # before the data and the model are loaded
    config, sampler_values_, likelihood = _run_configs(args, bench)
    options = code_reward_options(args, bench)
    samples, pool, pool_source, data = load_samples(bench, args)
    model, tokenizer, model_info = load_for_eval(args.model, args.adapter, args.device, args.dtype,
                                                 compile_blocks=args.compile_blocks, tokenizer=args.tokenizer)
    sampler = None
    if sampler_values_ is not None:
        sampler = SamplerConfig.from_dict({"sampler": default_sampler(model), **sampler_values_})
    progress = not args.no_progress  # plain lines when stderr is not a terminal (dare.progress)
    if bench.reward == "code":
        options["progress"] = progress
    try:
        results = evaluate(model, tokenizer, bench, samples, sampler=sampler, likelihood=likelihood, config=config,
                           fewshot_pool=pool, fewshot_source=pool_source, reward_options=options,
                           model_info=model_info, data_info=data, progress=progress)
    except RewardFailed as err:  # a plug-in reward's bug after the whole generation: keep the generations
        saved = save_generations(err, args, bench.name)
        if saved is None:
            raise
        raise saved from err
    print_summary(results, args.json)
    if args.out:  # after the metrics are on screen; atomic
        write_results(results, args.out, args.command_line)
    return 0


def save_generations(err, args: argparse.Namespace, benchmark: str):
    """With ``--out``, write the generations of ``err`` (a :class:`~dare.rewards.RewardFailed` after a generation)
    to ``OUT.predictions.jsonl`` and return the error to raise instead, which says how to score them once the reward
    is fixed; None without ``--out``."""
    import json
    import shlex
    from pathlib import Path

    from dare.outputs import atomic_write_text
    from dare.rewards import RewardFailed

    predictions = getattr(err, "predictions", None)
    if not args.out or not predictions:
        return None
    path = Path(args.out).with_suffix(".predictions.jsonl")
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in predictions))
    command = shlex.join(["dare", "eval", "score", "--benchmark", benchmark, "--predictions", str(path),
                          *(["--data", args.data] if args.data else []),
                          *(word for item in args.imports for word in ("--import", item))])
    return RewardFailed(f"{err}; the {len(predictions)} generations are saved in {path} (once the reward is fixed: "
                        f"{command})")


def write_results(results, out: str, command: list[str] | None = None) -> None:
    """Write the results file ``--out`` with the command line that made it and say where, on stderr (stdout holds
    the metrics JSON alone); replacing an earlier results file is said with what it held."""
    import sys

    from pathlib import Path

    from dare.errors import InputError
    from dare.eval.results import EvalResults

    replaced = ""
    if Path(out).is_file():  # an earlier results file (anything else was refused before the run): read once
        try:
            old = EvalResults.read(out)
            replaced = f" (replaced the results of {old.model.get('path', 'a model')} on {old.benchmark} from " \
                       f"{old.created})"
        except (InputError, TypeError):  # not readable as results (write() refuses what is no results file)
            replaced = " (replaced an earlier results file)"
    if results.command is None:
        results.command = command
    results.write(out)
    print(f"wrote {out}{replaced}", file=sys.stderr)


def code_reward_options(args: argparse.Namespace, bench) -> dict:
    """``--workers`` / ``--timeout`` for the sandbox of a code benchmark, checked before any work (the sandbox
    would read ``--workers 0`` as one per CPU, a negative count as 1, and refuse ``--timeout 0`` only after the
    whole generation); on any other benchmark a one-line error (nothing would read them)."""
    from dare.errors import ConfigError

    given = {k: v for k, v in (("workers", args.workers), ("timeout", args.timeout)) if v is not None}
    if bench.reward != "code" and given:
        raise ConfigError(f"--{next(iter(given))} applies to code benchmarks (their tests run in the sandbox); "
                          f"{bench.name} is scored from its answers")
    if given.get("workers", 1) < 1:
        raise ConfigError(f"--workers must be >= 1 (leave it out for one per CPU); got {given['workers']}")
    if given.get("timeout", 1) <= 0:
        raise ConfigError(f"--timeout must be positive (seconds per sandboxed program); got {given['timeout']}")
    return given


def print_summary(results, compact: bool) -> None:
    summary = results.summary()
    print(json.dumps(summary) if compact else json.dumps(summary, indent=2), flush=True)


def samples_for(bench, lines, data_samples=None, data_name: str = "--data"):
    """Pair each prediction (``(where, number, object)`` of
    :func:`~dare.commands.eval_predictions.read_predictions`) with its Sample; predictions with the same id are
    pooled (n completions). A ``question`` joins a sample by its text as posed or, for multiple choice, as the data
    file writes it (the stem, without the options the sample's question appends)."""
    from dare.errors import InputError
    from dare.eval.benchmark import stable_id

    by_key = {}
    if data_samples is not None:
        for s in data_samples:
            by_key[s.id] = s
            by_key.setdefault(s.question, s)
        for s in data_samples:
            if s.fields.get("stem"):
                by_key.setdefault(s.fields["stem"], s)
    order, grouped, first = [], {}, {}  # first: id -> (its first sample, where it was given)
    for where, lineno, obj in lines:
        key = next((str(obj[k]) for k in ("id", "task_id") if k in obj), None)
        if data_samples is not None:
            sample = by_key.get(key) if key is not None else by_key.get(obj.get("question"))
            if sample is None:
                raise InputError(f"{where}: {not_in_data(key, obj, data_samples, data_name)}")
        else:
            try:
                if bench.is_native(obj):
                    sample = bench.parse_row(obj, lineno)
                elif "answer" in obj:
                    sid = key or stable_id(obj.get("question", lineno))
                    sample = bench.from_answer(obj["answer"], id=sid, question=str(obj.get("question", "")), row=obj)
                else:
                    raise InputError(f"needs \"answer\" or the native fields ({', '.join(bench.native_keys)})")
            except InputError as err:
                raise InputError(f"{where}: {err}") from None
            if key is not None:
                sample.id = key
        preds = [obj["prediction"]] if isinstance(obj["prediction"], str) else obj["prediction"]
        if sample.id not in grouped:
            order.append(sample)
            grouped[sample.id] = []
            first[sample.id] = (sample, where)
        elif data_samples is None and sample.target != first[sample.id][0].target:  # two problems under one id
            earlier, line = first[sample.id]
            raise InputError(f"{where}: id {sample.id!r} was given before ({line}) with another answer "
                             f"({earlier.answer!r}, here {sample.answer!r}); lines of one id are samples of one "
                             "problem: give each problem its own id")
        grouped[sample.id].extend(preds)
    return order, [grouped[s.id] for s in order]


def not_in_data(key: str | None, obj: dict, data_samples, data_name: str) -> str:
    """Why a prediction line joins no sample: its id (or question) is not in the data; shows the data's first ids
    and the id the line probably means (``gsm8k/0`` for ``0``)."""
    ids = [s.id for s in data_samples]
    what = f"id {key!r}" if key is not None else f"question {str(obj.get('question', ''))[:40]!r}"
    if not ids:
        return f"{what}: {data_name} holds no samples"
    shown = ", ".join(repr(i) for i in ids[:3]) + (", ..." if len(ids) > 3 else "")
    meant = [i for i in ids if key is not None and i != key and i.rpartition("/")[2] == key]
    hint = f" (did you mean '{meant[0]}'?)" if len(meant) == 1 else ""
    return f"{what} is not in {data_name}; its ids look like {shown}{hint}"


def scored_files(args: argparse.Namespace) -> dict:
    """What ``dare eval score`` records of its inputs: the paths as given and, for local files, their absolute
    paths and ``sha256`` digests (which predictions and data were scored, wherever they lie later)."""
    from dare.eval.results import file_digest

    files = {"source": args.data, "split": args.split, "predictions": args.predictions,
             "predictions_path": os.path.abspath(args.predictions), "predictions_digest": file_digest(args.predictions)}
    if args.data and os.path.isfile(args.data):
        files.update(path=os.path.abspath(args.data), digest=file_digest(args.data))
    return files


def run_score(args: argparse.Namespace) -> int:
    from dare.commands.eval_predictions import read_predictions
    from dare.errors import ConfigError
    from dare.eval import get_benchmark, score_predictions
    from dare.eval.results import check_results_out
    from dare.plugins import load_plugins

    load_plugins(args.imports, "--import")  # a plug-in's benchmark or reward, before the name is checked
    bench = get_benchmark(args.benchmark)
    if args.out:  # never an input, nor a file an evaluation did not write
        check_results_out(args.out, "--out", {"--predictions": args.predictions, "--data": args.data},
                          example=f"{bench.name}.json")
    options = code_reward_options(args, bench)
    if bench.reward != "code" and args.trust_prediction_tests:
        raise ConfigError(f"--trust-prediction-tests applies to code benchmarks; {bench.name} is scored from its "
                          "answers")
    if bench.reward != "code" and args.split is not None and not args.data:
        raise ConfigError("--split picks the split of --data; without --data the predictions file is scored as it is")
    lines = read_predictions(args.predictions)
    data = bench.load(args.data, split=args.split) if args.data else None
    data_name = "--data"
    if data is None and bench.reward == "code" and not args.trust_prediction_tests:
        data = bench.load(None, split=args.split)  # the benchmark's own tests, never ones from the predictions file
        data_name = f"the {bench.name} data (pass --data, or --trust-prediction-tests to run the file's own tests)"
    samples, predictions = samples_for(bench, lines, data, data_name)
    if bench.reward == "code":
        options["progress"] = True  # plain lines when stderr is not a terminal (dare.progress)
    results = score_predictions(
        bench, samples, predictions, ks=args.k, reward_options=options, data=scored_files(args),
    )  # fmt: skip
    print_summary(results, args.json)
    if args.out:
        write_results(results, args.out, args.command_line)
    return 0
