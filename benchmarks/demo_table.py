"""Markdown table of ``dare demo`` runs: ``python benchmarks/demo_table.py RUN_DIR [RUN_DIR ...]``.

One row per ``RUN_DIR/report.json``: algorithm, seed, SFT steps, held-out accuracy after SFT and after the
second phase, the margin, the first / last mean rollout reward, and the phase wall times plus the RL phase's
process CPU time (comparable when runs share the cores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("algorithm", "seed", "SFT steps", "acc. after SFT", "acc. after RL", "margin (points)",
           "rollout reward first -> last", "SFT s", "RL s", "RL CPU s", "total s")


def row(report: dict) -> list[str]:
    from dare.demo import DemoConfig

    acc, phases, reward = report["accuracy"], {p["name"]: p for p in report["phases"]}, report["reward"]
    name, lr = report["settings"]["algorithm"]["name"], report["settings"]["demo"]["rl_lr"]
    if lr != DemoConfig.rl_lr:
        name += f" (lr {lr:g})"
    return [name, str(report["settings"]["seed"]), str(phases["sft"]["steps"]),
            f"{acc['sft']:.1%}", f"{acc['rl']:.1%}", f"{100 * report['improvement']:+.1f}",
            f"{reward['first']:.2f} -> {reward['last']:.2f}" if reward else "-",
            f"{phases['sft']['seconds']:.0f}", f"{phases['rl']['seconds']:.0f}", f"{phases['rl']['cpu_seconds']:.0f}",
            f"{report['timings']['seconds']:.0f}"]


def main(paths: list[str]) -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for path in paths:
        print("| " + " | ".join(row(json.loads((Path(path) / "report.json").read_text()))) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
