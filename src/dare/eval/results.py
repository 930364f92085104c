"""The results file: one JSON document per evaluation run.

Schema ``dare.eval.results/1``::

    {
      "schema": "dare.eval.results/1", "created": "2026-...Z", "dare_version": "0.1.0",
      "benchmark": "gsm8k",
      "data": {"source": "...", "split": "test", "limit": null},
      "model": {"path": "...", "family": "llada", "dtype": "bfloat16", ...},
      "sampler": {"name": "llada", "settings": {"gen_length": 256, "steps": 256, "block_length": 32,
                                               "temperature": 0.0, ...every decoding setting...}},
      "imports": ["my_reward.py"],   # user plug-ins: dare.plugins entry points' modules, then --import items
      "seed": 0, "mode": "generate",
      "prompt": {"template": "few_shot", "shots": 5, "chat": true, "fewshot_seed": 0,
                 "fewshot_source": "train.jsonl"},   # "evaluated data": exemplars drawn from the evaluated problems
      "metrics": {"accuracy": 0.79, "pass@1": ..., ...},
      "num_problems": 1319, "num_predictions": 1319,
      "timings": {"generation_seconds": ..., "tokens_per_second": ..., "nfe": ...},
      "samples": [{"id": "...", "sample_index": 0, "prompt": "...", "prediction": "...",
                   "extracted": "42", "gold": "42", "correct": true, "reward": 1.0,
                   "partial": null, "components": {...}, "info": {...},
                   "tokens": 87, "steps": 87, "finish": "stop"}, ...]   # generation; likelihood: choice_elbo, ...
    }

A results file is recognised by its ``schema`` key (:func:`is_results_file`, written by every DARE version): ``dare
eval run/score --out`` replaces one, and refuses any other existing file or one of its own inputs
(:func:`check_results_out`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dare.errors import InputError
from dare.plugins import imported

SCHEMA = "dare.eval.results/1"
EARLIER = "an earlier `dare eval run`/`dare eval score` results file"
"""What ``--out`` may replace, as the one-line error names it."""


def is_results_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a results file :meth:`EvalResults.write` wrote: a JSON object whose ``schema`` is
    :data:`SCHEMA` (false for anything unreadable or other JSON: data, predictions, a checkpoint's config.json)."""
    try:
        with open(path, "rb") as handle:
            if handle.read(1).strip() not in (b"{", b""):  # JSONL data / predictions, binaries: not parsed whole
                return False
            handle.seek(0)
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def check_results_out(path: str | os.PathLike, what: str = "--out",
                      inputs: dict[str, str | os.PathLike | None] | None = None,
                      example: str = "results.json") -> bool:
    """Check, before any work, that a results file may be written to ``path`` (``what`` names the flag): True when
    it replaces an earlier results file, False when ``path`` is new. ``path`` being one of the command's ``inputs``
    (``{flag: path}``, e.g. ``--predictions``, ``--data``), an existing file of other contents, or a directory (an
    existing one, or a path ending in ``/``: the error suggests the file ``example`` in it) is a one-line
    :class:`~dare.errors.ConfigError` (:func:`dare.outputs.check_file_replaceable`); nothing is written."""
    from dare.outputs import check_file_replaceable

    return check_file_replaceable(path, what, EARLIER, is_results_file, inputs, example=example)


def library_versions() -> dict[str, str]:
    """``{"python", "torch", "transformers"}`` as installed (read from the package metadata: nothing imported)."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in ("torch", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def file_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes: which data a results file scored, whatever its name or place."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


@dataclass
class EvalResults:
    """An evaluation run: settings, metrics and per-sample records."""

    benchmark: str
    metrics: dict[str, float]
    samples: list[dict[str, Any]]
    """Per-prediction records (id, sample_index, prompt, prediction, extracted, gold, correct, reward, ...)."""
    model: dict[str, Any] = field(default_factory=dict)
    sampler: dict[str, Any] = field(default_factory=dict)
    """``{"name": sampler, "settings": {every decoding setting}}``."""
    imports: list[str] = field(default_factory=imported)
    """The user plug-ins imported in this process, in order (:func:`dare.plugins.imported`): installed ``dare.plugins``
    entry points by module name, then the ``--import`` items as given; they may define the reward, sampler or
    benchmark."""
    seed: int | None = None
    prompt: dict[str, Any] = field(default_factory=dict)
    """``{"template", "shots", "chat", "fewshot_seed"}``, and with exemplars ``fewshot_source`` (the few-shot file
    or split, or ``"evaluated data"``)."""
    data: dict[str, Any] = field(default_factory=dict)
    """``{"source", "split", "limit"}``."""
    num_problems: int = 0
    num_predictions: int = 0
    mode: str = "score"
    """``generate`` / ``likelihood`` (``dare eval run``) or ``score`` (predictions scored from a file)."""
    timings: dict[str, Any] = field(default_factory=dict)
    """Wall-clock seconds, tokens/s, nfe / forwards of the run."""
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    dare_version: str = ""
    versions: dict[str, str] = field(default_factory=library_versions)
    """Python and the libraries whose kernels decide the numbers (torch, transformers), as installed."""
    command: list[str] | None = None
    """The command line that produced the file (``dare eval ...``; set when the CLI writes it)."""

    def __post_init__(self):
        if not self.dare_version:
            from dare import __version__

            self.dare_version = __version__

    def summary(self) -> dict[str, Any]:
        """What ``dare eval score`` prints: benchmark, counts and metrics."""
        return {
            "benchmark": self.benchmark,
            "mode": self.mode,
            "num_problems": self.num_problems,
            "num_predictions": self.num_predictions,
            "metrics": self.metrics,
            **({"timings": self.timings} if self.timings else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "created": self.created,
            "dare_version": self.dare_version,
            "versions": self.versions,
            "command": self.command,
            "benchmark": self.benchmark,
            "data": self.data,
            "model": self.model,
            "sampler": self.sampler,
            "imports": self.imports,
            "seed": self.seed,
            "mode": self.mode,
            "prompt": self.prompt,
            "metrics": self.metrics,
            "num_problems": self.num_problems,
            "num_predictions": self.num_predictions,
            "timings": self.timings,
            "samples": self.samples,
        }

    def write(self, path: str | os.PathLike) -> Path:
        """Write the JSON document (atomically: a partial file never replaces a good one). ``path`` may be new or an
        earlier results file; any other file, or a directory, is a one-line error (:func:`check_results_out`), as
        ``dare eval run --out`` says: a data file given by mistake is never replaced."""
        from dare.outputs import atomic_write_text

        check_results_out(path, "EvalResults.write")

        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, ensure_ascii=False, default=str))

    @classmethod
    def read(cls, path: str | os.PathLike) -> EvalResults:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"no such results file: {path}") from None
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: not a results file (invalid JSON: {err.msg})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InputError(f"{path}: not a DARE results file (schema {data.get('schema') if isinstance(data, dict) else None!r})")
        data.pop("schema")
        data.setdefault("imports", [])  # a file written before results recorded plug-ins
        data.setdefault("versions", {})  # ... or versions and the command line
        data.setdefault("command", None)
        return cls(**data)
