"""``dare train CONFIG.yaml [key=value ...]``: train with a recipe (torchrun for several processes)."""

from __future__ import annotations

import argparse
import os
import sys

HELP = "train a model from a YAML recipe with key=value overrides (multi-GPU: torchrun -m dare.cli train ...)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="recipe YAML (e.g. configs/llada/sft_tiny.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. optim.lr=1e-5 trainer.max_steps=10")
    parser.add_argument("--show-config", action="store_true",
                        help="print every config key with its type, default and meaning, then exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate (config, model and data paths, rollout sampler and reward, trainer.resume; "
                             "loads nothing) and print the resolved config, then exit")
    parser.set_defaults(train_parser=parser)


def take_extra(args: argparse.Namespace, extra: list[str]) -> bool:
    """Accept ``key=value`` overrides that argparse left over (e.g. after ``--dry-run``)."""
    if not all("=" in item and not item.startswith("-") for item in extra):
        return False
    args.overrides = [*args.overrides, *extra]
    return True


def run(args: argparse.Namespace) -> int:
    from dare.config import describe, to_dict
    from dare.trainer.config import TrainConfig, load_train_config

    if args.show_config:
        from dare.algorithms import ALGORITHMS

        print("\n".join(describe(TrainConfig)))
        for name, cls in sorted(ALGORITHMS.items()):
            print(f"# algorithm.name={name}")
            print("\n".join(describe(cls.config_class, "algorithm.")))
        return 0
    config_path, overrides = args.config, list(args.overrides)
    if config_path is None and not overrides:  # no recipe: say how to give one instead of training a default model
        args.train_parser.print_help(sys.stderr)
        return 2
    if config_path is not None and "=" in config_path:
        config_path, overrides = None, [config_path, *overrides]
    config = load_train_config(config_path, overrides)
    if args.dry_run:
        import yaml

        from dare.trainer.preflight import check_run

        check_run(config)  # what a run checks before it loads the model and the data
        from pathlib import Path

        from dare.trainer.config import config_dict
        from dare.trainer.resume import resume_point

        # a run into an output directory trained with other settings is refused (reads only; creates nothing)
        resume_point(Path(config.trainer.output_dir), config.trainer.resume, config_dict(config))
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    from dare.trainer import run_training

    rewarded: dict = {}

    def remember_reward(trainer, record: dict) -> None:
        """Keep the latest step that rolled out: inner steps (algorithm.inner_steps > 1) log no reward."""
        if "rollout/reward" in record:
            rewarded.update(step=record["step"], reward=record["rollout/reward"])

    record = run_training(config, on_step=remember_reward)
    if int(os.environ.get("RANK", "0")) == 0:
        print(run_summary(config, record, rewarded or None))
    return 0


def run_summary(config, record: dict, rewarded: dict | None = None) -> str:
    """The end-of-run lines: output directory, steps, final loss / reward, where the weights are. ``rewarded``
    (``{"step", "reward"}``): the latest step with a rollout reward, when ``record`` (an inner step) has none."""
    from pathlib import Path

    out = Path(config.trainer.output_dir)
    parts = [f"step {record.get('step', 0)}"]
    if "time/elapsed_s" in record:
        parts.append(f"{record['time/elapsed_s']:.1f} s")
    if "loss" in record:
        parts.append(f"loss {record['loss']:.4f}")
    if "rollout/reward" in record:
        parts.append(f"reward {record['rollout/reward']:.4f}")
    elif rewarded is not None:
        parts.append(f"reward {rewarded['reward']:.4f} at step {rewarded['step']}")
    lines = [f"done: {out} ({', '.join(parts)}; metrics in {out / 'metrics.jsonl'})"]
    if config.trainer.export:
        kind = "LoRA adapter" if config.lora.enabled else "HF checkpoint"
        lines.append(f"final weights ({kind}): {out / 'final'}")
    fallbacks = int(record.get("rollout/engine_fallbacks", 0))
    if fallbacks:  # a 2-15x slower rollout that would otherwise show only as a log line (e.g. a failed recording)
        lines.append(f"note: the last step's rollout decoded {fallbacks} generation call(s) with the slow eager loop "
                     "instead of CUDA graphs (the log says why; metric rollout/engine_fallbacks)")
    return "\n".join(lines)
