"""``dare demo``: the end-to-end job on CPU with no downloads (see :mod:`dare.demo`)."""

from __future__ import annotations

import argparse

HELP = ("train a tiny LLaDA from scratch on CPU (SFT to partial competence, then RL) and evaluate it on a held-out "
        "split with the GSM8K scorer; writes DIR/report.json and DIR/curves.png")


HELP_ALGORITHMS = ("d1", "wd1", "coupled_grpo", "cj_grpo", "mdpo", "spg", "bgpo", "tracerl", "justgrpo", "espo",
                   "dtreerpo", "gdpo", "igpo")
"""Named in ``--help`` without importing the registry (``dare --help`` stays fast); a test keeps it complete."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help="output directory (default: runs/demo, with --quick runs/demo-quick); a run with the same "
                             "settings there is replaced, one with other settings is an error (give another --out)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--algorithm", default="d1",
                        help="RL algorithm: any registered rollout algorithm for full-attention models ("
                             + ", ".join(HELP_ALGORITHMS) + "), or sft to continue SFT instead (default d1)")
    parser.add_argument("--quick", action="store_true",
                        help="the shortened CI variant (tiny model, a few steps; default --out runs/demo-quick)")
    parser.add_argument("--sft-max-steps", type=int, help="upper bound of SFT steps (default 400)")
    parser.add_argument("--sft-target", type=float,
                        help="SFT stops once validation accuracy reaches this fraction (default 0.3)")
    parser.add_argument("--rl-steps", type=int, help="RL optimizer steps (default 120)")
    parser.add_argument("--rl-lr", type=float, help="RL learning rate (default 3e-4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1, pinned: the results depend on the thread count through "
                             "float rounding; 0 = torch's choice)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="where to train and evaluate (default cpu, the demo's reference setting)")


def run(args: argparse.Namespace) -> int:
    from dare.demo import DemoConfig, run_demo
    from dare.errors import ConfigError

    if args.threads < 0:
        raise ConfigError(f"--threads must be >= 1 (or 0 = torch's choice); got {args.threads}")
    overrides = {"seed": args.seed, "algorithm": args.algorithm, "device": args.device,
                 "threads": args.threads or None}
    for key in ("sft_max_steps", "sft_target", "rl_steps", "rl_lr"):  # unset: the (quick) demo's default
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.out is not None:  # unset: runs/demo, or runs/demo-quick for --quick (the two runs never collide)
        overrides["out_dir"] = args.out
    config = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    run_demo(config)
    return 0
