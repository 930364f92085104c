"""The demo's outputs: ``report.json``, ``curves.png`` (needs matplotlib, the ``plot`` extra) and a table."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from dare.demo.settings import BASELINE, second_phase

SCHEMA = "dare.demo.report/1"
"""``schema`` of ``report.json``."""
QUICK_NOTE = ("note: --quick is a smoke test, too short for RL to show a gain ({steps} RL steps); the full "
              "`dare demo` measures it (d1: +30 to +56 points on seeds 0-2, README)")
"""What a quick run with an RL algorithm says after its result (the README's table of the full demo's gains)."""
REWARD_WINDOW = 5
"""Rollout batches averaged for the first / last reward in the table (fewer when there are under twice as many,
so the two windows never share a batch)."""


def curve(records: Sequence[dict], key: str) -> list[list[float]]:
    """``[[step, value], ...]`` of the records that hold ``key``."""
    return [[r["step"], float(r[key])] for r in records if r.get(key) is not None]


def build_report(settings: dict, phases, totals: dict) -> dict:
    initial, sft, rl = phases
    rewards = curve(rl.records, "rollout/reward")
    heldout = [[0, sft.accuracy], *curve(rl.records, "eval/heldout_accuracy"), [rl.steps, rl.accuracy]]
    return {
        "schema": SCHEMA,
        "settings": settings,
        "accuracy": {"init": initial.accuracy, "sft": sft.accuracy, "rl": rl.accuracy},
        "improvement": rl.accuracy - sft.accuracy,
        "reward": reward_change(rewards),
        "curves": {
            "sft_loss": curve(sft.records, "loss"),
            "sft_validation_accuracy": curve(sft.records, "eval/validation_accuracy"),
            "rl_loss": curve(rl.records, "loss"),
            "rl_reward": rewards,
            "rl_rollout_accuracy": curve(rl.records, "rollout/accuracy"),
            "rl_heldout_accuracy": heldout,
        },
        "phases": [{"name": p.name, "steps": p.steps, "accuracy": p.accuracy, "seconds": round(p.seconds, 2),
                    "cpu_seconds": round(p.cpu_seconds, 2), "results_file": p.results_file} for p in phases],
        "timings": {k: round(v, 2) for k, v in totals.items()},
    }


def reward_change(rewards: list[list[float]]) -> dict | None:
    """``{"first", "last"}``: mean reward of the first and of the last rollout batches, at most ``REWARD_WINDOW``
    each and never the same batch in both (one batch: its reward twice); None without rewards."""
    if not rewards:
        return None
    window = max(1, min(REWARD_WINDOW, len(rewards) // 2))
    return {"first": _mean(rewards[:window]), "last": _mean(rewards[-window:])}


def _mean(points: list[list[float]]) -> float | None:
    return sum(v for _, v in points) / len(points) if points else None


def plot_curves(report: dict, path: Path) -> Path | None:
    """Two panels (SFT loss + validation accuracy; RL reward + held-out accuracy); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    c = report["curves"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    _plot(left, c["sft_loss"], "SFT loss", "tab:gray")
    left.set_title(f"SFT ({len(c['sft_loss'])} steps)")
    left.set_xlabel("SFT step")
    left.set_ylabel("loss")
    twin = left.twinx()
    _plot(twin, c["sft_validation_accuracy"], "validation accuracy", "tab:blue", marker="o")
    twin.set_ylim(-0.02, 1.02)
    twin.set_ylabel("accuracy")
    _legend(left, twin)

    algorithm = report["settings"]["algorithm"]["name"]
    _plot(right, c["rl_reward"], "rollout reward (mean)", "tab:orange")
    _plot(right, c["rl_heldout_accuracy"], "held-out accuracy (greedy)", "tab:blue", marker="o")
    right.set_ylim(-0.02, 1.02)
    right.set_title(f"RL: {algorithm}")
    right.set_xlabel("RL step")
    right.legend(loc="lower right")
    fig.suptitle(f"dare demo: held-out accuracy {report['accuracy']['sft']:.1%} after SFT -> "
                 f"{report['accuracy']['rl']:.1%} after {algorithm}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot(axis, points, label: str, color: str, marker: str | None = None) -> None:
    if points:
        xs, ys = zip(*points)
        axis.plot(xs, ys, label=label, color=color, marker=marker, markersize=3)


def _legend(*axes) -> None:
    handles, labels = [], []
    for axis in axes:
        h, lab = axis.get_legend_handles_labels()
        handles += h
        labels += lab
    axes[0].legend(handles, labels, loc="center right")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    algorithm = report["settings"]["algorithm"]["name"]
    table = Table(title=f"dare demo: reverse {report['settings']['task']['digits']}-digit numbers, "
                        f"{report['settings']['task']['test']} held-out problems (GSM8K scorer)")
    for column in ("phase", "steps", "held-out accuracy", "rollout reward", "time (s)", "CPU (s)"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    reward = report["reward"]
    second = "continued SFT" if algorithm == BASELINE else f"RL ({algorithm})"
    names = {"init": "random init", "sft": "SFT", "rl": second}
    for phase in report["phases"]:
        shown = "-"
        if phase["name"] == "rl" and reward:
            shown = f"{reward['first']:.3f} -> {reward['last']:.3f}"
        table.add_row(names[phase["name"]], str(phase["steps"]), f"{phase['accuracy']:.1%}", shown,
                      f"{phase['seconds']:.0f}", f"{phase['cpu_seconds']:.0f}")
    Console().print(table)


def write_report(out: Path, settings: dict, phases, totals: dict, *, log: Callable[[str], None] = print,
                 quick: bool = False) -> dict:
    """Write report.json and curves.png, print the table; returns the report. ``quick``: a ``--quick`` run, whose RL
    result gets a line saying that it is no measurement (:data:`QUICK_NOTE`)."""
    report = build_report(settings, phases, totals)
    plot = plot_curves(report, out / "curves.png")
    report["files"] = {"report": str(out / "report.json"), "curves": str(plot) if plot else None,
                       "data": str(out / "data"), "sft_model": str(out / "sft" / "final"),
                       "rl_model": str(out / "rl" / "final")}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print_table(report)
    algorithm = settings["algorithm"]["name"]
    log(f"{second_phase(algorithm)} changed held-out accuracy by {report['improvement'] * 100:+.1f} points "
        f"({report['accuracy']['sft']:.1%} -> {report['accuracy']['rl']:.1%}); total {totals['seconds']:.0f} s")
    if quick and algorithm != BASELINE:
        log(QUICK_NOTE.format(steps=phases[2].steps))
    log(f"wrote {out / 'report.json'}" + (f" and {plot}" if plot else
                                          " (no curves.png: pip install 'dare-dllm[plot]' for matplotlib)"))
    return report
