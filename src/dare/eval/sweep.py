"""Accuracy under parallelism: one benchmark decoded under a list of decoder settings (``dare eval sweep``).

Each **point** is a set of :class:`~dare.rollout.SamplerConfig` fields on top of the sweep's common ones (e.g.
``sampler=fastdllm,threshold=0.7`` or ``sampler=llada,steps=4``). Every point is one :func:`dare.eval.evaluate`
run (same samples, prompts and seed) and writes its own results file; the sweep records per point:

* ``accuracy``: the benchmark's metric;
* ``tokens_per_forward``: generated tokens (up to and including the first stop token) divided by the
  denoising steps the rows took, summed over rows: how many tokens one forward of a sequence decodes on
  average (1 for one-token-per-step decoding; larger = more parallel);
* ``nfe``: model forwards of the whole run (a forward serves one step of every row in its batch);
* ``tokens_per_second``: generated tokens per second of decoding.

The output directory must be new, empty or an earlier sweep's (:func:`check_sweep_out`): a sweep marks it
(:func:`dare.outputs.mark_output`) and never writes into a directory of other contents. A sweep first removes what
an earlier sweep wrote into the same directory (``points/NN.json``, the summary, the plot; nothing else), so its
point files are exactly the ones its summary lists. ``summary.json`` and
``summary.md`` hold the table; ``accuracy_vs_parallelism.png`` plots accuracy against tokens
per forward, one line per series (sampler / decoder), when matplotlib is installed (the ``plot`` extra).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dare.errors import ConfigError

PLOT = "accuracy_vs_parallelism.png"
COMMAND = "eval sweep"
"""The command named in the output marker (:func:`dare.outputs.mark_output`) and in the errors."""


def tokens_per_forward(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Generated tokens over denoising steps, summed over a results file's per-sample records."""
    steps = sum(int(r.get("steps") or 0) for r in records)
    return round(sum(int(r.get("tokens") or 0) for r in records) / steps, 4) if steps else None


def point_row(index: int, fields: Mapping[str, Any], results, path: str) -> dict[str, Any]:
    """One line of the summary table from a point's :class:`~dare.eval.EvalResults`."""
    settings = results.sampler["settings"]
    return {
        "point": index,
        "series": f"{settings['sampler']}/{settings['decoder']}",
        "settings": dict(fields),
        "accuracy": results.metrics.get("accuracy"),
        "tokens_per_forward": tokens_per_forward(results.samples),
        "nfe": results.timings.get("nfe"),
        "tokens_per_second": results.timings.get("tokens_per_second"),
        "mean_steps": results.timings.get("mean_steps"),
        "results": path,
    }


def run_sweep(evaluate_point: Callable[[dict[str, Any]], Any], points: Sequence[Mapping[str, Any]],
              out_dir: str | Path, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every point (``evaluate_point(fields) -> EvalResults``), write ``points/NN.json`` per point, the
    summary (``summary.json``, ``summary.md``) and the plot; returns the summary rows. ``out_dir`` must be new,
    empty or an earlier sweep's (:func:`check_sweep_out`, before the first point); it is marked as a sweep's."""
    if not points:
        raise ConfigError("a sweep needs at least one point (points is empty)",
                          cli="a sweep needs at least one --point or --grid")
    from dare.outputs import ensure_dir, mark_output

    out = Path(out_dir)
    check_sweep_out(out, "out_dir")
    ensure_dir(out, "out_dir")
    mark_output(out, COMMAND, points=len(points))  # first: an interrupted sweep can be rerun into ``out``
    removed = clear_earlier_sweep(out)
    if removed:
        log(f"removed {len(removed)} files of an earlier sweep in {out} ({', '.join(p.name for p in removed[:4])}"
            f"{', ...' if len(removed) > 4 else ''})")
    rows = []
    for index, fields in enumerate(points):
        results = evaluate_point(dict(fields))
        path = f"points/{index:02d}.json"
        results.write(out / path)
        rows.append(point_row(index, fields, results, path))
        row = rows[-1]
        log(f"point {index}: {settings_text(fields)} -> accuracy {row['accuracy']:.4f}, "
            f"{row['tokens_per_forward']} tokens/forward, nfe {row['nfe']}")
    (out / "summary.json").write_text(json.dumps({"points": rows}, indent=1), encoding="utf-8")
    (out / "summary.md").write_text(markdown_table(rows) + "\n", encoding="utf-8")
    plot = plot_sweep(rows, out / PLOT)
    log(f"wrote {out / 'summary.md'}" + (f" and {plot}" if plot else
                                         f" (no {PLOT}: pip install 'dare-dllm[plot]' for matplotlib)"))
    return rows


POINT_FILE = re.compile(r"\d{2,}\.json")
"""Names of the per-point results files under ``OUT/points`` (``00.json``, ``01.json``, ...)."""


def check_sweep_out(out_dir: str | Path, what: str = "out_dir",
                    inputs: Mapping[str, str | Path | None] | None = None) -> bool:
    """Check, before any work, that a sweep may write directory ``out_dir`` (``what`` names it in the one-line
    errors): True when it holds an earlier sweep (marked, or from before sweeps were marked:
    :func:`is_unmarked_sweep`), False when it is missing or empty. A file, a directory of other contents, or one
    that is or contains one of the ``inputs`` (``{description: directory}``, e.g. the model directory) is a
    :class:`~dare.errors.ConfigError`; nothing is written."""
    from dare.outputs import check_apart, check_replaceable

    check_apart(out_dir, what, {name: path for name, path in (inputs or {}).items() if path})
    out = Path(out_dir).expanduser()
    if out.is_dir() and is_unmarked_sweep(out):
        return True
    return check_replaceable(out, what, COMMAND)


def is_unmarked_sweep(out: Path) -> bool:
    """Whether ``out`` holds a sweep written before sweeps were marked: a ``summary.json`` of ``{"points": [...]}``
    rows whose results files are ``points/NN.json``."""
    try:
        rows = json.loads((out / "summary.json").read_text(encoding="utf-8"))["points"]
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(row, dict) and isinstance(row.get("results"), str) and row["results"].startswith("points/")
        and POINT_FILE.fullmatch(row["results"][len("points/"):]) is not None for row in rows)


def clear_earlier_sweep(out: Path) -> list[Path]:
    """Remove what an earlier sweep wrote into ``out`` (``points/NN.json``, the summary and the plot), so that a
    sweep with fewer points leaves no stale point files next to its summary; other files are left alone. Returns
    the removed paths."""
    points = out / "points"
    earlier = sorted(p for p in points.iterdir() if POINT_FILE.fullmatch(p.name)) if points.is_dir() else []
    earlier += [out / name for name in ("summary.json", "summary.md", PLOT)]
    removed = [path for path in earlier if path.is_symlink() or path.is_file()]
    for path in removed:
        path.unlink()
    return removed


def settings_text(fields: Mapping[str, Any]) -> str:
    """A point's settings as ``k=v, k=v`` (``(common settings)`` for a point of none)."""
    return ", ".join(f"{k}={v}" for k, v in fields.items()) or "(common settings)"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a Markdown table."""
    lines = ["| point | series | settings | accuracy | tokens / forward | NFE | tokens / s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['point']} | {r['series']} | {settings_text(r['settings'])} | {r['accuracy']:.4f} | "
                     f"{r['tokens_per_forward']} | {r['nfe']} | {r['tokens_per_second']} |")
    return "\n".join(lines)


def plot_sweep(rows: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Accuracy against tokens per forward, one line per series; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    fig, ax = plt.subplots(figsize=(6, 4))
    for number, (name, members) in enumerate(series.items()):
        members = sorted(members, key=lambda r: r["tokens_per_forward"] or 0)
        ax.plot([r["tokens_per_forward"] for r in members], [r["accuracy"] for r in members], marker="o", label=name)
        shared = {k for k in members[0]["settings"] if all(r["settings"].get(k) == members[0]["settings"][k]
                                                           for r in members)}
        side = 1 if number % 2 == 0 else -1  # series alternate above / below their points
        for index, r in enumerate(members):  # label each point by what varies within its series, neighbours staggered
            varied = {k: v for k, v in r["settings"].items() if k not in shared or len(members) == 1}
            offset = (6 if side > 0 else -11) + side * 9 * (index % 2)
            ax.annotate(settings_text(varied), (r["tokens_per_forward"], r["accuracy"]), fontsize=7,
                        textcoords="offset points", xytext=(2, offset))
    ax.set_xlabel("tokens per forward")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["COMMAND", "PLOT", "check_sweep_out", "clear_earlier_sweep", "is_unmarked_sweep", "markdown_table",
           "plot_sweep", "point_row", "run_sweep", "settings_text", "tokens_per_forward"]
