"""``dare demo``: the end-to-end job on CPU with no downloads (see :mod:`dare.demo`)."""

from __future__ import annotations

import argparse

HELP = ("train a tiny LLaDA from scratch on CPU (SFT to partial competence, then RL) and evaluate it on a held-out "
        "split with the GSM8K scorer; writes DIR/report.json and DIR/curves.png")


HELP_ALGORITHMS = ("d1", "wd1", "coupled_grpo", "cj_grpo", "mdpo", "spg", "bgpo", "tracerl", "justgrpo", "espo",
                   "dtreerpo", "gdpo", "igpo")
"""Named in ``--help`` without importing the registry (``dare --help`` stays fast); a test keeps it complete."""


def defaults(name: str) -> str:
    """``default V`` of setting ``name``, with ``; Q with --quick`` where ``--quick`` changes it (read from the
    settings themselves, :func:`dare.demo.settings.default`)."""
    from dare.demo.settings import default

    full, quick = default(name), default(name, quick=True)
    return f"default {_shown(full)}" + (f"; {_shown(quick)} with --quick" if quick != full else "")


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def configure(parser: argparse.ArgumentParser) -> None:
    from dare.demo.settings import DEVICES, QUICK, SEEDS, default

    # no argparse defaults: a flag left out is the (quick) demo's own default, which the help text reads
    parser.add_argument("--out", help=f"output directory (default: {default('out_dir')}; "
                                      f"{default('out_dir', quick=True)} with --quick); a run with the same settings "
                                      "there is replaced, one with other settings is an error (give another --out)")
    parser.add_argument("--seed", type=int, help=f"random seed, {SEEDS[0]} to {SEEDS[1]} ({defaults('seed')})")
    parser.add_argument("--algorithm",
                        help="RL algorithm: any registered rollout algorithm for full-attention models ("
                             + ", ".join(HELP_ALGORITHMS) + ", or your own with --import), or sft to continue SFT "
                             f"instead ({defaults('algorithm')})")
    parser.add_argument("--quick", action="store_true",
                        help=f"the shortened CI variant ({QUICK['digits']}-digit numbers, a {QUICK['layers']}-layer "
                             f"width-{QUICK['hidden']} model, fewer steps: see each flag's default; default --out "
                             f"{QUICK['out_dir']})")
    parser.add_argument("--sft-max-steps", type=int, help=f"upper bound of SFT steps ({defaults('sft_max_steps')})")
    parser.add_argument("--sft-target", type=float,
                        help=f"SFT stops once validation accuracy reaches this fraction ({defaults('sft_target')})")
    parser.add_argument("--rl-steps", type=int, help=f"RL optimizer steps ({defaults('rl_steps')})")
    parser.add_argument("--rl-lr", type=float,
                        help=f"RL learning rate ({defaults('rl_lr')}); an error with --algorithm sft, whose continued "
                             "SFT trains at the SFT learning rate")
    parser.add_argument("--threads", type=int,
                        help=f"torch CPU threads ({defaults('threads')}, pinned: the results depend on the thread "
                             "count through float rounding; 0 = torch's choice)")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import your own plug-in first (repeatable): a module name or a .py file that registers "
                             "the --algorithm (or a reward it uses); the RL recipe records it")
    parser.add_argument("--device", choices=DEVICES,
                        help=f"where to train and evaluate ({defaults('device')}, the demo's reference setting; "
                             "auto = cuda where available, else cpu)")


OPTIONS = ("seed", "algorithm", "sft_max_steps", "sft_target", "rl_steps", "rl_lr", "threads", "device")
"""The flags that set a :class:`~dare.demo.DemoConfig` field of the same name (``--out`` sets ``out_dir``)."""


def run(args: argparse.Namespace) -> int:
    from dare.demo import DemoConfig, run_demo
    from dare.errors import ConfigError

    if args.threads is not None and args.threads < 0:
        raise ConfigError(f"--threads must be >= 1 (or 0 = torch's choice); got {args.threads}")
    # a flag left out: the (quick) demo's default; --out left out: runs/demo, or runs/demo-quick for --quick
    overrides = {key: getattr(args, key) for key in OPTIONS if getattr(args, key) is not None}
    if args.threads == 0:
        overrides["threads"] = None  # torch's choice
    if args.out is not None:
        overrides["out_dir"] = args.out
    if args.imports:
        from dare.plugins import load_plugins, recorded

        load_plugins(args.imports, "--import")  # errors name the items as given
        overrides["imports"] = recorded(args.imports)
    config = DemoConfig.quick(**overrides) if args.quick else DemoConfig(**overrides)
    run_demo(config)
    return 0
