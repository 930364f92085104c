"""``dare eval lm-eval ARGS...``: register the ``dare`` model with lm-evaluation-harness and run lm-eval's own CLI.

Every argument after ``lm-eval`` goes to lm-eval unchanged (``--model dare --model_args pretrained=... --tasks
...``; ``--help`` shows the dare model's arguments, then lm-eval's help). Errors a user can make while lm-eval
loads the model or the tasks (a wrong model arg, an unknown task, a missing data file) are one-line messages
instead of tracebacks."""

from __future__ import annotations

import argparse
import json

HELP = "run lm-evaluation-harness with the dare model registered (all further arguments go to lm-eval)"


LOADING_MESSAGES = {"Tasks not found": "check --tasks; task YAML files of your own need --include_path DIR",
                    "no model for this name found": "the DARE model is --model dare"}
"""lm-eval's ``ValueError`` for an unknown task / model name (checked with lm-eval 0.4.13) -> how to fix it."""
DATASET_HINT = ("check the task's dataset_path and dataset_kwargs (data_files); relative paths start at the "
                "directory you run from")


HELP_PREAMBLE = [
    "dare eval lm-eval: lm-evaluation-harness's command line with DARE's model registered as --model dare.",
    "  --model_args pretrained=CHECKPOINT|HUB_NAME|tiny:FAMILY[,adapter=DIR][,dtype=...][,seed=N][,mc_batch_size=N]",
    "               [,sampler=NAME][,any SamplerConfig or LikelihoodConfig field=VALUE]",
    "  the device and batch size are lm-eval's own --device and --batch_size N",
    "  --import MODULE_OR_FILE (repeatable, DARE's own, not passed on): your plug-in's sampler, imported first",
    "  e.g. dare eval lm-eval run --model dare --model_args pretrained=tiny:llada,gen_length=32 --tasks gsm8k",
    "  Every argument goes to lm-eval unchanged; lm-eval's own help follows.",
]
"""DARE's lines before lm-eval's ``--help``."""
LM_EVAL_FLAGS = {"device": "--device", "batch_size": "--batch_size", "max_batch_size": "--max_batch_size"}
"""Model args that lm-eval's CLI passes to the model from its own flags (with defaults, checked with lm-eval
0.4.13): given in ``--model_args`` too they reach the model twice (a ``TypeError``)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(lm_eval_args=[], eval_parser=parser)


def take_extra(args: argparse.Namespace, extra: list[str]) -> bool:
    args.lm_eval_args = [*args.lm_eval_args, *extra]
    return True


def loading_error(err: BaseException) -> str | None:
    """A one-line message for an exception lm-eval raises while loading tasks or data; None for anything else
    (a real failure keeps its traceback)."""
    from dare.errors import first_line

    first = first_line(err)
    if isinstance(err, FileNotFoundError):  # also datasets' DataFilesNotFoundError / DatasetNotFoundError
        return f"lm-eval could not load a dataset: {first} ({DATASET_HINT})"
    if isinstance(err, ValueError):
        hint = next((fix for marker, fix in LOADING_MESSAGES.items() if marker in first), None)
        if hint is not None:
            return f"lm-eval: {first.rstrip('. ')} ({hint})"
    return None


def flag_values(argv: list[str], flag: str) -> list[str]:
    """The values of ``flag`` in lm-eval's ``argv`` (``FLAG X`` and ``FLAG=X``)."""
    return [argv[i + 1] if item == flag else item.partition("=")[2] for i, item in enumerate(argv)
            if (item == flag and i + 1 < len(argv)) or item.startswith(flag + "=")]


def check_include_paths(argv: list[str]) -> None:
    """One-line :class:`~dare.errors.ConfigError` for an ``--include_path`` that is no directory: lm-eval would only
    say that the tasks are not found, and advise the flag that was given."""
    import os

    from dare.errors import ConfigError

    for path in flag_values(argv, "--include_path"):
        if not os.path.isdir(path):
            where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
            raise ConfigError(f"--include_path {path}: no such directory{where}")


def check_explicit_device(argv: list[str]) -> None:
    """One-line :class:`~dare.errors.ConfigError` for a CUDA ``--device`` given explicitly where CUDA is not
    available (as ``dare eval run --device cuda`` says); without ``--device`` lm-eval's own default falls back to the
    CPU (:class:`dare.eval.lm_harness.DareLM`)."""
    from dare.errors import ConfigError

    for device in flag_values(argv, "--device"):
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(f"--device {device}: CUDA is not available here (omit --device, or --device cpu, "
                                  "to run on the CPU)")


def reject_repeated_model_args(argv: list[str]) -> None:
    """One-line :class:`~dare.errors.ConfigError` for a key given twice in ``--model_args k=v,k=v``: lm-eval keeps
    the last one without a word (a JSON ``--model_args`` is lm-eval's to parse)."""
    from dare.errors import ConfigError

    for text in flag_values(argv, "--model_args"):
        if text.lstrip().startswith("{"):
            continue
        seen = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            if key in seen:
                raise ConfigError(f"--model_args sets {key} twice ({key}={seen[key]} and {key}={value}); give it once")
            seen[key] = value


def reject_lm_eval_flags_in_model_args(argv: list[str]) -> None:
    """One-line :class:`~dare.errors.ConfigError` for ``device`` / ``batch_size`` / ``max_batch_size`` in
    ``--model_args`` (``k=v`` or JSON): lm-eval gives the model its own flags' values as well, and the model would
    get the argument twice; the message names the lm-eval flag to use instead."""
    from dare.errors import ConfigError

    for text in flag_values(argv, "--model_args"):
        try:
            pairs = dict(json.loads(text)) if text.lstrip().startswith("{") else dict(
                (key.strip(), value) for key, _, value in (part.partition("=") for part in text.split(",")))
        except (ValueError, TypeError):
            continue  # lm-eval's to parse
        key = next((k for k in pairs if k in LM_EVAL_FLAGS), None)
        if key is not None:
            flag = LM_EVAL_FLAGS[key]
            raise ConfigError(f"--model_args {key}={pairs[key]} is lm-eval's own {flag}, which lm-eval passes to the "
                              f"model itself: write {flag} {pairs[key]} instead")


def parsed_limit(argv: list[str]) -> float | None:
    """lm-eval's ``--limit`` as its own parser reads ``argv`` (None when not given, or when lm-eval would reject the
    arguments: it says why itself when it runs)."""
    import contextlib
    import io

    from lm_eval._cli import HarnessCLI

    from dare.commands.passthrough import program_argv

    with program_argv("lm-eval", argv), contextlib.redirect_stderr(io.StringIO()), \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            parsed = HarnessCLI().parse_args()
        except SystemExit:
            return None
    return getattr(parsed, "limit", None)


def check_limit(argv: list[str]) -> None:
    """One-line :class:`~dare.errors.ConfigError` for ``--limit`` <= 0, before the model loads: lm-eval would load
    the model, then stop with a traceback (``task.build_requests() did not find any docs!``). A limit below 1 is
    lm-eval's fraction of each task's documents, a larger one a count."""
    from dare.errors import ConfigError

    limit = parsed_limit(argv)
    if limit is not None and limit <= 0:
        raise ConfigError(f"--limit {limit:g}: the limit must be positive (a count of documents per task, or a "
                          "fraction of them below 1); omit --limit to evaluate every document")


def run(args: argparse.Namespace) -> int:
    from dare.commands.passthrough import asks_for_help, exit_status, print_preamble, program_argv, take_imports
    from dare.errors import DareError, InputError
    from dare.eval.lm_harness import require_lm_eval
    from dare.plugins import load_plugins

    imports, lm_eval_args = take_imports(args.lm_eval_args)
    reject_repeated_model_args(lm_eval_args)
    reject_lm_eval_flags_in_model_args(lm_eval_args)
    check_include_paths(lm_eval_args)
    check_explicit_device(lm_eval_args)
    if asks_for_help(lm_eval_args):
        print_preamble(HELP_PREAMBLE)
    require_lm_eval()
    if not asks_for_help(lm_eval_args):
        check_limit(lm_eval_args)
    load_plugins(imports, "--import")  # a plug-in's sampler, before the model args name it
    import dare.eval.lm_harness  # noqa: F401  (registers the dare model)
    from lm_eval.__main__ import cli_evaluate

    with program_argv("lm-eval", lm_eval_args):
        try:
            cli_evaluate()
        except SystemExit as exit_:
            return exit_status(exit_)
        except DareError:
            raise
        except Exception as err:  # noqa: BLE001 - only loading errors are rewritten, the rest re-raised
            message = loading_error(err)
            if message is None:
                raise
            raise InputError(message) from None
    return 0
