"""One-line errors for OpenCompass runs of DARE models (``dare eval opencompass``).

OpenCompass loads models and datasets in task subprocesses, so a mistake there ends as a traceback in a task
log and a summary of ``-`` cells. This module finds the mistakes before OpenCompass starts, and turns a task
that failed anyway into the one line that ended it:

* :func:`check_config`: every ``DareDiffusionModel`` entry of a loaded config (known arguments, sampler and
  likelihood fields: the model's own :func:`dare.eval.opencompass.check_model_args`; checkpoint path, adapter)
  and every dataset entry (a custom dataset's file, its ``data_type`` / ``infer_method``; an absolute ``path`` of
  a typed dataset);
* :func:`check_dataset_names`: ``--datasets NAME`` against OpenCompass's dataset config files;
* :func:`missing_base_config`: a ``with read_base(): from opencompass.configs.datasets.X import ...`` of a
  config that does not exist;
* :func:`failed_task` / :func:`task_failure_cause` / :func:`failure_message`: which tasks OpenCompass reported
  as failed, and the error in each task's log.

Everything here works on plain dicts, paths and text, with or without OpenCompass installed.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dare.errors import ConfigError, InputError, closest
from dare.eval.opencompass import (
    OPENCOMPASS_MODEL_KEYS,
    check_model_args,
    model_arguments,
)

CUSTOM_DATASET_KINDS = {"mcq": ("gen", "ppl"), "circular-mcq": ("gen", "ppl"), "qa": ("gen",)}
"""``data_type`` -> supported ``infer_method`` values of an OpenCompass custom dataset (as of OpenCompass 0.5)."""
CUSTOM_DATASET_SUFFIXES = (".jsonl", ".csv")
LAUNCHER_ERRORS = ("ChildFailedError", "CalledProcessError")
"""Errors of the process that launched a task (torchrun): the task's own error is the one before them."""


# ------------------------------------------------------------------------------------------- models

def is_dare_model(entry: Mapping[str, Any]) -> bool:
    """Whether a model entry builds :class:`dare.eval.opencompass.DareDiffusionModel` (class or name)."""
    kind = entry.get("type")
    name = kind if isinstance(kind, str) else getattr(kind, "__name__", "")
    return name.rpartition(".")[2] == "DareDiffusionModel"


def check_model_config(entry: Mapping[str, Any]) -> None:
    """A ``DareDiffusionModel`` entry of an OpenCompass config: its arguments and, without loading anything,
    that ``path`` (and ``adapter``) can be loaded."""
    name = f"OpenCompass model {entry.get('abbr') or entry.get('path') or '?'}"
    args = {k: v for k, v in entry.items() if k not in OPENCOMPASS_MODEL_KEYS}
    check_model_args(args, name)
    if args.get("model") is not None:
        return  # an in-process model: path is only recorded
    if not args.get("path"):
        raise ConfigError(f"{name}: path is required (a checkpoint directory, hub name or tiny:FAMILY)")
    try:
        check_model_path(str(args["path"]), args.get("adapter"))
    except ConfigError as err:
        raise ConfigError(f"{name}: {err}") from None


def check_model_path(path: str, adapter: str | None = None) -> None:
    """``tiny:FAMILY`` names a registered family; a local checkpoint holds a model and a local adapter directory
    a LoRA adapter (hub names are left to the hub): the loader's own checks, reading no weights."""
    from dare.models.loading import check_adapter_path, check_checkpoint_path, parse_tiny
    from dare.models.spec import get_family

    tiny = parse_tiny(path)
    if tiny is not None:
        get_family(tiny[0])
    else:
        check_checkpoint_path(path)
    if adapter is not None:
        check_adapter_path(str(adapter))


# ------------------------------------------------------------------------------------------ datasets

def dataset_name(entry: Mapping[str, Any], index: int) -> str:
    path = entry.get("path")
    return str(entry.get("abbr") or (Path(str(path)).name if path else f"#{index}"))


def check_dataset_config(entry: Mapping[str, Any], index: int = 0) -> None:
    """A dataset entry of an OpenCompass config. Custom datasets (no ``type``: OpenCompass reads the file
    itself) need an existing ``.jsonl`` / ``.csv`` file and a supported ``data_type`` / ``infer_method``;
    a typed dataset's absolute ``path`` must exist (relative ones are OpenCompass dataset ids)."""
    name = dataset_name(entry, index)
    path = entry.get("path")
    if entry.get("type") is not None:
        if isinstance(path, str) and os.path.isabs(path) and not os.path.exists(path):
            raise InputError(f"OpenCompass dataset {name}: no such file or directory: {path}")
        return
    if not path:
        raise ConfigError(f"OpenCompass dataset {name} has neither a type nor a path "
                          "(a custom dataset is dict(path='FILE.jsonl' or 'FILE.csv', ...))")
    if not str(path).endswith(CUSTOM_DATASET_SUFFIXES):
        raise ConfigError(f"OpenCompass dataset {name}: a custom dataset is a .jsonl or .csv file; got {path}")
    if not os.path.isfile(path):
        raise InputError(f"OpenCompass dataset {path}: no such file (relative paths start at the directory "
                         f"you run from, now {os.getcwd()})")
    meta = entry.get("meta_path")
    if meta and not os.path.isfile(meta):
        raise InputError(f"OpenCompass dataset {name}: meta_path {meta}: no such file")
    data_type, method = entry.get("data_type"), entry.get("infer_method")
    if data_type is not None and data_type not in CUSTOM_DATASET_KINDS:
        hint = closest(str(data_type), CUSTOM_DATASET_KINDS)
        raise ConfigError(f"OpenCompass dataset {name}: unknown data_type '{data_type}'"
                          + (f" (did you mean '{hint}'?)" if hint else "")
                          + f"; choose from: {', '.join(CUSTOM_DATASET_KINDS)}")
    methods = CUSTOM_DATASET_KINDS.get(data_type, ("gen", "ppl"))
    if method is not None and method not in methods:
        what = f"{data_type} datasets support" if data_type else "choose from"
        raise ConfigError(f"OpenCompass dataset {name}: infer_method '{method}' is not supported; "
                          f"{what}: {', '.join(methods)}")


def check_config(config: Mapping[str, Any]) -> None:
    """The ``DareDiffusionModel`` entries and the dataset entries of a loaded OpenCompass config."""
    for entry in config.get("models") or ():
        if is_dare_model(entry):
            check_model_config(entry)
    for index, entry in enumerate(config.get("datasets") or ()):
        check_dataset_config(entry, index)


def config_names(directories: Iterable[str | os.PathLike]) -> list[str]:
    """Names (file stems) of the ``.py`` config files under ``directories``."""
    names = set()
    for directory in directories:
        for _, _, files in os.walk(directory):
            names.update(f[:-3] for f in files if f.endswith(".py") and not f.startswith("__"))
    return sorted(names)


def check_dataset_names(names: Sequence[str], directories: Sequence[str | os.PathLike]) -> None:
    """``--datasets NAME[/SUFFIX]`` (a config file name, wildcards allowed, as OpenCompass matches them)."""
    known = config_names(directories)
    lowered = [n.lower() for n in known]
    for arg in names:
        name = arg.split("/", 1)[0]
        if not fnmatch.filter(lowered, name.lower()):
            hint = closest(name, known)
            raise ConfigError(f"unknown OpenCompass dataset '{name}'" + (f" (did you mean '{hint}'?)" if hint else "")
                              + "; --datasets takes the name of a dataset config file (gsm8k_gen, mmlu_ppl, ...)")


MISSING_BASE = re.compile(r"(?P<file>\S+\.py) not found!.*?from (?P<module>[\w.]+) import")


def missing_base_config(message: str, config: str) -> str | None:
    """A one-line message for mmengine's error about a ``read_base()`` import of a config file that does not
    exist (an unknown dataset or model config), with the closest existing name; None for other messages."""
    match = MISSING_BASE.search(" ".join(message.split()))
    if match is None:
        return None
    missing = Path(match["file"])
    directory = next((p for p in missing.parents if p.is_dir()), None)
    hint = None
    if directory is not None:
        stem = missing.stem if directory == missing.parent else missing.relative_to(directory).parts[0]
        hint = closest(stem, [p.stem if p.suffix == ".py" else p.name for p in directory.iterdir()
                              if not p.name.startswith("__")])
    return (f"OpenCompass config {config}: no config {match['module']} (no file {missing})"
            + (f"; did you mean '{hint}'?" if hint else ""))


# ------------------------------------------------------------------------------------- failed tasks

FAILED_TASK = re.compile(r"^task (?P<task>.+) fail, see\s+(?P<log>\S+)\s*$", re.DOTALL)
"""OpenCompass's ``LocalRunner`` message for a task that exited with an error (checked with OpenCompass 0.5.4)."""


def failed_task(message: str) -> tuple[str, str] | None:
    """``(task name, log path)`` of OpenCompass's "task ... fail, see LOG" message; None for other messages."""
    match = FAILED_TASK.match(message.strip())
    return (match["task"], match["log"]) if match else None


def task_failure_cause(log: str) -> str | None:
    """The error that ended a task, from its log: a DARE error's message, else ``Type: message`` of the last
    traceback (skipping the launcher's own error); None when the log holds no traceback."""
    lines = log.splitlines()
    errors = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            last = next((x for x in lines[i + 1:] if x.strip() and not x[0].isspace()), None)
            if last is not None:
                errors.append(last.strip())
    for error in errors:
        kind, _, text = error.partition(": ")
        if kind.startswith("dare.errors."):
            return text
    errors = [e for e in errors if e.partition(":")[0].rpartition(".")[2] not in LAUNCHER_ERRORS] or errors
    if not errors:
        return None
    kind, sep, text = errors[-1].partition(": ")
    return kind.rpartition(".")[2] + sep + text


def failure_message(failures: Sequence[tuple[str, str]]) -> str:
    """One line for the tasks OpenCompass reported as failed (``(task, log path)``, in order): the first one's
    cause (inference runs before evaluation, whose failures then follow from it) and how many more failed."""
    task, log = failures[0]
    try:
        cause = task_failure_cause(Path(log).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        cause = None
    more = len(failures) - 1
    return (f"OpenCompass task {task} failed: {cause or 'no error in its log'} (log: {log})"
            + (f"; {more} more task{'s' if more > 1 else ''} failed" if more else ""))


__all__ = ["check_config", "check_dataset_config", "check_dataset_names", "check_model_args", "check_model_config",
           "check_model_path", "failed_task", "failure_message", "is_dare_model", "missing_base_config",
           "model_arguments", "task_failure_cause"]
