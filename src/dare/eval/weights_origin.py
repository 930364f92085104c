"""Where evaluated weights come from, for the results file: a local model or adapter directory by its absolute
path and the time its files were last written, and, when a ``dare train`` run wrote it (``RUN/final``, or
``RUN/exports/step_N`` written by ``dare export``), the run, its algorithm, the step and a digest of the run's
``config.yaml``. So results stay tied to the weights they scored: two results files of one path trained twice differ
in ``modified`` (and in ``config_digest`` when the settings changed), and a results file names the algorithm and
step it measured. Hub names and ``tiny:`` models record nothing here (the path is the identity)."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

from dare.errors import InputError
from dare.runs import checkpoint_step, read_config

EXPORT_WRITER = "dare export"
"""The output marker's ``written_by`` of a ``dare export`` directory (:mod:`dare.trainer.export`)."""


def weights_origin(path: str | None) -> dict | None:
    """The origin record of model or adapter directory ``path`` (see the module); None for a hub name, a ``tiny:``
    model or no path."""
    from dare.outputs import read_marker

    local = Path(path).expanduser() if path else None
    if local is None or not local.is_dir():
        return None
    files = [f for f in local.iterdir() if f.is_file()]
    newest = max((f.stat().st_mtime for f in files), default=local.stat().st_mtime)
    origin = {"path": str(local.resolve()),
              "modified": datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).isoformat(timespec="seconds")}
    marker = read_marker(local)
    if marker.get("written_by") == EXPORT_WRITER and marker.get("run"):
        run, step = Path(marker["run"]), marker.get("step")
    elif local.name == "final" and (local.parent / "config.yaml").is_file():
        run, step = local.parent, last_checkpoint_step(local.parent)
    else:
        return origin
    return {**origin, **run_record(run, step)}


def last_checkpoint_step(run: Path) -> int | None:
    """The step of the run's latest checkpoint directory (``checkpoints/step_00000012`` -> 12): the step its
    ``final/`` export holds, since every run ends with a checkpoint; None without one."""
    steps = [step for p in (run / "checkpoints").glob("step_*") if (step := checkpoint_step(p)) is not None]
    return max(steps, default=None)


def run_record(run: Path, step: int | None) -> dict:
    """``run`` (absolute), ``step``, ``algorithm`` and ``config_digest`` (``sha256:`` of ``config.yaml``) of a run."""
    config = run / "config.yaml"
    record: dict = {"run": str(run.resolve()), "step": step}
    try:
        text = config.read_text(encoding="utf-8")
    except OSError:
        return record
    try:
        algorithm = read_config(config, text).get("algorithm")
    except InputError:  # a damaged config.yaml: the digest still tells it apart
        algorithm = None
    record["algorithm"] = algorithm.get("name") if isinstance(algorithm, dict) else None
    record["config_digest"] = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return record
