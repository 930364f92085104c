"""Finished or running ``dare train`` runs read from their output directories (``config.yaml``, ``metrics.jsonl``),
to compare them side by side (``dare runs``); likewise ``dare eval run/score --out`` results files (their metrics and
the settings in which they differ). Reads files only: no torch. Results files are read as plain JSON (this module is
below :mod:`dare.eval`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from dare.config import flatten
from dare.errors import InputError

WINDOW = 5
"""``first -> last`` values are means of the first / last ``min(WINDOW, half the records)`` records, as the
end-of-run summary of ``dare train`` computes its reward (single records are noisy)."""
DEFAULT_METRICS = ("loss", "rollout/reward", "rollout/accuracy")
"""Metrics shown when none are asked for (those some run logged), with every ``eval/*`` metric."""
NO_SUCH_KEY = "n/a"
"""How the settings table shows a key that a run's config does not have (another algorithm's setting)."""
NOT_SETTINGS = ("trainer.output_dir",)
"""Config keys that differ between any two runs by construction."""
RESULTS_SCHEMA = "dare.eval.results/1"
"""The ``schema`` of a results file (:data:`dare.eval.results.SCHEMA`, repeated here: no :mod:`dare.eval` import)."""
NOT_RESULTS_SETTINGS = ("schema", "created", "command", "metrics", "samples", "timings")
"""Top-level keys of a results file that are not settings: its metrics, per-sample records, and bulky or volatile
fields (timings, the command line, the creation time)."""


@dataclass
class Run:
    """One training output directory: its resolved settings and its logged metrics records."""

    path: Path
    settings: dict
    records: list[dict] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        return str(self.settings.get("algorithm.name", "?"))

    @property
    def last_step(self) -> int:
        return max((int(r.get("step", 0)) for r in self.records), default=0)

    def series(self, key: str) -> list[float]:
        """The logged values of ``key`` in step order (records without it skipped)."""
        return [float(r[key]) for r in self.records if isinstance(r.get(key), (int, float))]


def is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def runs_below(directory: Path) -> list[Path]:
    """The runs inside ``directory`` at any depth, in path order (``runs/a``, ``runs/demo/rl``, ``runs/demo/sft``:
    ``dare demo`` writes a run per phase). A run's own directories (checkpoints, exports) are not searched, nor
    hidden directories, directories reached through a symbolic link (a run linked there is found) or unreadable
    ones."""
    try:
        children = sorted(child for child in directory.iterdir() if child.is_dir())
    except OSError:
        return []
    found = []
    for child in children:
        if is_run(child):
            found.append(child)
        elif not child.name.startswith(".") and not child.is_symlink():
            found += runs_below(child)
    return found


def find_runs(paths: list[str]) -> list[tuple[Path, bool]]:
    """The run directories named by ``paths``, each with whether it was named itself: a run (it holds
    ``config.yaml``), or a directory of runs (the runs below it at any depth, :func:`runs_below`; e.g. ``runs/``).
    Anything else is a one-line :class:`InputError`."""
    found = []
    for given in paths:
        path = Path(given)
        if not path.is_dir():
            raise InputError(f"{given}: no such directory (give dare train output directories, e.g. runs/my_run)")
        if is_run(path):
            found.append((path, True))
            continue
        children = runs_below(path)
        if not children:
            raise InputError(f"{given}: not a training run (no config.yaml) and holds none: give dare train output "
                             "directories (trainer.output_dir)")
        found.extend((child, False) for child in children)
    return found


def read_runs(paths: list[str]) -> list[Run]:
    """:func:`read_run` of every run :func:`find_runs` names. A run found inside a directory of runs that cannot be
    read is left out with a warning (the others are still compared); a run named itself is a one-line error."""
    import logging

    runs = []
    for path, named in find_runs(paths):
        try:
            runs.append(read_run(path))
        except InputError as err:
            if named:
                raise
            logging.getLogger("dare").warning(f"warning: leaving out {path}: {err}")
    if not runs:
        raise InputError("no readable training run among " + ", ".join(paths))
    return runs


def read_config(config: Path, text: str | None = None) -> dict:
    """The settings a ``dare train`` run recorded in ``config`` (its ``config.yaml``; ``text``: its contents when
    already read). One-line :class:`InputError` naming the file when it cannot be read, is not YAML, or is not a
    mapping of sections."""
    import yaml

    try:
        settings = yaml.safe_load(config.read_text(encoding="utf-8") if text is None else text)
    except OSError as err:
        raise InputError(f"{config}: cannot be read ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise InputError(f"{config}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(settings, dict) or not settings:
        raise InputError(f"{config}: not a dare train config (a mapping of sections)")
    return settings


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a checkpoint directory as ``dare train`` names it (``step_00000012`` -> 12); None for another
    name."""
    match = re.fullmatch(r"step_(\d+)", Path(path).name)
    return int(match.group(1)) if match else None


def read_run(path: Path) -> Run:
    """A run's settings (``config.yaml``, flattened) and metrics records (``metrics.jsonl``; none yet is fine; a
    line that is not JSON, e.g. the last one of a run being written, is skipped)."""
    settings = read_config(path / "config.yaml")
    records = []
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return Run(path, flatten(settings), records)


@dataclass
class Results:
    """One ``dare eval`` results file: its metrics and its settings (everything else but
    :data:`NOT_RESULTS_SETTINGS`), both flattened to dotted keys (``sampler.settings.temperature``)."""

    path: Path
    metrics: dict
    settings: dict


def _results_json(path: Path) -> dict | None:
    """The JSON object in ``path`` when it is a results file (``schema`` :data:`RESULTS_SCHEMA`), else None."""
    try:
        with open(path, "rb") as handle:
            if handle.read(1).strip() not in (b"{", b""):  # JSONL, binaries: not parsed whole
                return None
            handle.seek(0)
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == RESULTS_SCHEMA else None


def results_below(directory: Path) -> list[Path]:
    """The results files (``*.json`` with the results ``schema``) inside ``directory`` at any depth, in path order;
    other JSON files are passed over, as are hidden directories, directories reached through a symbolic link and
    unreadable ones (as :func:`runs_below`)."""
    try:
        children = sorted(directory.iterdir())
    except OSError:
        return []
    found = []
    for child in children:
        if child.is_dir():
            if not child.name.startswith(".") and not child.is_symlink():
                found += results_below(child)
        elif child.suffix == ".json" and _results_json(child) is not None:
            found.append(child)
    return found


def read_results(path: Path) -> Results:
    """A results file's metrics and settings (flattened); a file that is not JSON or not a results file is a
    one-line :class:`InputError` naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from None
    except ValueError as err:
        raise InputError(f"{path}: not a DARE results file (not JSON: {str(err).splitlines()[0]}); give dare eval "
                         "run/score --out files or dare train output directories") from None
    if not isinstance(data, dict) or data.get("schema") != RESULTS_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"{path}: not a DARE results file (schema {schema!r}, not {RESULTS_SCHEMA!r}); give dare "
                         "eval run/score --out files or dare train output directories")
    metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
    settings = {k: v for k, v in data.items() if k not in NOT_RESULTS_SETTINGS}
    return Results(Path(path), flatten(metrics), flatten(settings))


def find_compared(paths: list[str]) -> tuple[str, list[tuple[Path, bool]]]:
    """What ``dare runs PATH ...`` compares: ``("runs", ...)`` as :func:`find_runs`, or ``("results", ...)``:
    results files named themselves, or found in a directory that holds no training run (:func:`results_below`); each
    with whether it was named itself. Training runs and results files together are a one-line :class:`InputError`
    (one kind at a time), as is a directory holding neither."""
    found: dict[str, list[tuple[Path, bool]]] = {"runs": [], "results": []}
    for given in paths:
        path = Path(given)
        if path.is_file():
            found["results"].append((path, True))
        elif not path.is_dir():
            if path.suffix == ".json":
                raise InputError(f"{given}: no such file (give dare eval run/score --out results files, or dare "
                                 "train output directories)")
            find_runs([given])  # its one-line error
        elif is_run(path) or runs_below(path):
            found["runs"] += find_runs([given])
        elif results := results_below(path):
            found["results"] += [(child, False) for child in results]
        else:
            find_runs([given])  # its one-line error: neither runs nor results files below
    if found["runs"] and found["results"]:
        runs, results = found["runs"][0][0], found["results"][0][0]
        raise InputError(f"training runs ({runs}) and results files ({results}) given together: compare one kind at "
                         "a time")
    kind = "results" if found["results"] else "runs"
    return kind, found[kind]


def read_compared(paths: list[str]) -> tuple[str, list]:
    """``("runs", [Run, ...])`` (:func:`read_runs`) or ``("results", [Results, ...])`` for ``dare runs PATH ...``
    (:func:`find_compared`)."""
    kind, found = find_compared(paths)
    if kind == "runs":
        return kind, read_runs(paths)
    return kind, [read_results(path) for path, _ in found]


def shown_results_metrics(results: list[Results], asked: list[str] | None) -> list[str]:
    """``asked`` (as :func:`shown_metrics`: a key in no file is a warning, or an error when none is), else every
    metric key present in any file, in first-seen order."""
    present = list(dict.fromkeys(k for r in results for k in r.metrics))
    if not asked:
        return present
    return check_asked(asked, present, "in no results file", "metrics")


def _plain(value):
    """``value`` for strict JSON: a non-finite float is None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def results_comparison(results: list[Results], metrics: list[str]) -> dict:
    """The comparison as plain data: the files, each metric's value per file (null where a file lacks it, or NaN),
    and the settings that differ with each file's value."""
    return {"results": [str(r.path) for r in results],
            "metrics": {key: [_plain(r.metrics.get(key)) for r in results] for key in metrics},
            "settings": {key: [_plain(r.settings.get(key)) for r in results] for key in differing_settings(results)}}


def results_comparison_text(results: list[Results], metrics: list[str]) -> str:
    """Two Markdown tables, a column per file: the metrics (``missing`` where a file lacks one) and the settings in
    which the files differ."""
    columns = " | ".join(str(r.path).replace("|", "\\|") for r in results) + " |"
    rule = "|" + "---|" * (len(results) + 1)
    lines = ["| metric | " + columns, rule]
    for key in metrics:
        lines.append(f"| {key} | " + " | ".join("missing" if key not in r.metrics else _cell(r.metrics[key])
                                               for r in results) + " |")
    lines.append("")
    differ = differing_settings(results)
    if not differ:
        lines.append("settings: the same in every results file")
    else:
        lines += ["| setting | " + columns, rule]
        for key in differ:
            lines.append(f"| {key} | " + " | ".join(_cell(r.settings.get(key)) for r in results) + " |")
    return "\n".join(lines)


def differing_settings(runs: list[Run] | list[Results]) -> list[str]:
    """The settings keys whose values are not the same in every run or results file (sorted; a key one lacks counts
    as unset)."""
    keys = set().union(*(run.settings for run in runs)) - set(NOT_SETTINGS)
    return sorted(k for k in keys if len({json.dumps(run.settings.get(k), sort_keys=True, default=str)
                                             for run in runs}) > 1)


def first_last(values: list[float]) -> tuple[float, float] | None:
    """``(first, last)`` window means of ``values`` (:data:`WINDOW`), or None without values."""
    if not values:
        return None
    window = max(1, min(WINDOW, len(values) // 2))
    return sum(values[:window]) / window, sum(values[-window:]) / window


def shown_metrics(runs: list[Run], asked: list[str] | None) -> list[str]:
    """``asked``, else :data:`DEFAULT_METRICS` that some run logged and every ``eval/*`` metric (sorted). An asked key
    no run logged is a warning naming close ones; when none of the asked keys was logged, a one-line error."""
    logged = set().union(*(set(r) for run in runs for r in run.records)) if any(run.records for run in runs) else set()
    if not asked:
        return [k for k in DEFAULT_METRICS if k in logged] + sorted(k for k in logged if k.startswith("eval/"))
    return check_asked(asked, sorted(logged), "logged by no run", "logged keys")


def check_asked(asked: list[str], present: list[str], absent: str, listing: str) -> list[str]:
    """``asked`` (``--metrics``) against the keys ``present``: each one not among them is a warning naming close ones
    (else the first of ``listing``); when none of them is, a one-line :class:`InputError`. ``absent`` says where a
    missing key is not (``logged by no run``)."""
    import difflib
    import logging

    missing = [k for k in asked if k not in present]
    for key in missing:
        close = difflib.get_close_matches(key, present, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f" ({listing}: {', '.join(present[:8])})"
        if len(missing) < len(asked):
            logging.getLogger("dare").warning(f"warning: --metrics {key}: {absent}{hint}")
        else:
            raise InputError(f"--metrics {key}: {absent}{hint}")
    return list(asked)


def _number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def _cell(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float):
        return _number(value)
    return str(value).replace("|", "\\|")


def comparison(runs: list[Run], metrics: list[str]) -> dict:
    """The comparison as plain data: per run its path, algorithm, last step and each metric's ``first`` / ``last``
    (window means) with its number of records; the settings that differ with each run's value."""
    rows = []
    for run in runs:
        values = {}
        for key in metrics:
            pair = first_last(run.series(key))
            values[key] = None if pair is None else {"first": _plain(pair[0]), "last": _plain(pair[1]),
                                                      "records": len(run.series(key))}  # NaN: null (strict JSON)
        rows.append({"run": str(run.path), "algorithm": run.algorithm, "last_step": run.last_step, "metrics": values})
    differ = differing_settings(runs)
    return {"runs": rows, "settings": {key: [run.settings.get(key) for run in runs] for key in differ}}


def comparison_text(runs: list[Run], metrics: list[str]) -> str:
    """Two Markdown tables: the runs' metrics (``first -> last``) and the settings in which they differ."""
    data = comparison(runs, metrics)
    head = ["run", "algorithm", "steps", *(f"{key} first -> last" for key in metrics)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in data["runs"]:
        cells = [row["run"], row["algorithm"], str(row["last_step"])]
        for key in metrics:
            value = row["metrics"][key]
            cells.append("-" if value is None else " -> ".join(_number(float("nan") if v is None else v)
                                                                 for v in (value["first"], value["last"])))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if not data["settings"]:
        lines.append("settings: the same in every run (apart from trainer.output_dir)")
    else:
        lines.append("| setting | " + " | ".join(str(run.path) for run in runs) + " |")
        lines.append("|" + "---|" * (len(runs) + 1))
        for key, values in data["settings"].items():
            lines.append(f"| {key} | " + " | ".join(_cell(v) if key in run.settings else NO_SUCH_KEY
                                                   for v, run in zip(values, runs)) + " |")
        if any(key not in run.settings for key in data["settings"] for run in runs):
            lines.append(f"({NO_SUCH_KEY}: not a setting of that run's algorithm, e.g. a KL weight of an algorithm "
                         "without a KL term; unset: the setting's default, None)")
    return "\n".join(lines)


__all__ = ["DEFAULT_METRICS", "RESULTS_SCHEMA", "WINDOW", "Results", "Run", "comparison", "comparison_text",
           "differing_settings", "find_compared", "find_runs", "first_last", "read_compared", "read_results",
           "read_run", "read_runs", "results_below", "results_comparison", "results_comparison_text", "runs_below",
           "shown_metrics", "shown_results_metrics"]
