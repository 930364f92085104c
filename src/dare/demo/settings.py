"""The demo's settings: :class:`DemoConfig`, what ``--quick`` changes (:data:`QUICK`), the ``dare demo`` flag of each
setting (:data:`FLAGS`), the checks of their values, and the device and thread count a run resolves to.

The defaults live here only: ``dare demo --help`` reads them (:func:`default`), the command passes only the flags
given. An error about a setting with a flag names the field for Python callers (``rl_steps must be >= 1``) and the
flag on the command line (``--rl-steps must be >= 1``; :func:`setting_error`). Light: no torch at import (``dare
--help`` imports the command, which reads the defaults).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from dare.config import SEEDS
from dare.errors import ConfigError, described

BASELINE = "sft"
"""The ``--algorithm`` that continues SFT instead of RL: the baseline the RL algorithms are compared with."""


def second_phase(algorithm: str) -> str:
    """How the output names the second phase: ``RL`` or, for the ``sft`` baseline, ``continued SFT``."""
    return "continued SFT" if algorithm == BASELINE else "RL"


@dataclass
class DemoConfig:
    """Settings of one demo run (``dare demo`` flags set the most useful ones)."""

    out_dir: str = "runs/demo"
    """Output directory: data/, init/, sft/, rl/, recipes, report.json, curves.png (:meth:`quick`'s default:
    ``runs/demo-quick``)."""
    seed: int = 0
    """Seed of the model initialisation, the training problems, data order, corruption noise and rollouts."""
    algorithm: str = "d1"
    """RL algorithm of the second phase (any registered rollout algorithm; ``sft`` continues SFT instead)."""
    digits: int = 5
    """Digits of the numbers to reverse."""
    train_size: int = 4096
    """Training problems (SFT demonstrations and RL prompts)."""
    validation_size: int = 128
    """Validation problems (decide when SFT has reached partial competence)."""
    test_size: int = 256
    """Held-out test problems (every reported accuracy)."""
    layers: int = 4
    """Transformer blocks of the LLaDA model."""
    hidden: int = 128
    """Model width (d_model)."""
    heads: int = 4
    """Attention heads."""
    mlp: int = 256
    """MLP hidden size."""
    sft_max_steps: int = 400
    """Upper bound of SFT optimizer steps."""
    sft_target: float = 0.3
    """SFT stops at the first validation check whose accuracy reaches this (partial competence)."""
    sft_check_every: int = 5
    """SFT steps between validation checks."""
    sft_batch_size: int = 64
    """SFT examples per step."""
    sft_lr: float = 1e-3
    """SFT learning rate (constant after 20 warm-up steps; in a phase of 20 steps or fewer, one step less than the
    phase: :func:`dare.demo.pipeline.warmup_steps`). The ``sft`` baseline's continued SFT trains at it too."""
    rl_steps: int = 120
    """Optimizer steps of the RL phase."""
    group_size: int = 8
    """Rollouts per prompt (G)."""
    prompts_per_step: int = 16
    """Prompts per rollout batch (rollouts per step = G x prompts)."""
    rl_lr: float = 3e-4
    """RL learning rate (constant). Not with the ``sft`` baseline, which trains at ``sft_lr``: an error there, as are
    the other RL-only settings (:data:`dare.demo.pipeline.RL_ONLY`)."""
    temperature: float = 1.0
    """Sampling temperature of the RL rollouts (evaluation is greedy)."""
    eval_every: int = 20
    """RL steps between held-out evaluations (the accuracy curve)."""
    algorithm_options: dict = field(default_factory=dict)
    """Extra ``algorithm.*`` settings, on top of the demo's per-algorithm defaults."""
    imports: list = field(default_factory=list)
    """Your own plug-ins (``--import``: module names or ``.py`` files, :mod:`dare.plugins`), imported before
    ``algorithm`` is checked, so that it may name an algorithm of your own; the RL recipe records them."""
    device: str = "cpu"
    """``cpu`` (the demo's reference setting), ``cuda`` or ``auto`` (CUDA when available)."""
    threads: int | None = 1
    """torch CPU threads during the run (restored afterwards). Pinned because float rounding, and so every number
    of the run, depends on the thread count; None = torch's choice (results then vary between machines)."""

    @classmethod
    def quick(cls, **overrides) -> DemoConfig:
        """The shortened CI variant (about 15 s on 2 cores): 3-digit numbers, a 2-layer width-64 model trained to
        partial competence (about 120 SFT steps), then 4 RL steps. Its default output directory is
        ``runs/demo-quick``, so that it never meets the full demo's ``runs/demo``."""
        return cls(**{**QUICK, **overrides})


QUICK = dict(out_dir="runs/demo-quick", digits=3, train_size=512, validation_size=32, test_size=64, layers=2,
             hidden=64, mlp=128, sft_max_steps=150, sft_target=0.2, sft_check_every=10, sft_batch_size=32,
             rl_steps=4, group_size=4, prompts_per_step=4, eval_every=2)
"""What :meth:`DemoConfig.quick` changes: the output directory and a smaller task, model and run."""
QUICK_SIZE = ("digits", "train_size", "validation_size", "test_size", "layers", "hidden", "mlp")
"""The quick demo's task and model sizes, which no flag changes: they tell a quick run's settings apart."""
DEVICES = ("cpu", "cuda", "auto")
"""``--device`` choices."""
FLAGS = {"out_dir": "--out", "seed": "--seed", "algorithm": "--algorithm", "sft_max_steps": "--sft-max-steps",
         "sft_target": "--sft-target", "rl_steps": "--rl-steps", "rl_lr": "--rl-lr", "threads": "--threads",
         "device": "--device", "imports": "--import"}
"""The ``dare demo`` flag of each setting that has one."""


def default(name: str, quick: bool = False):
    """The value of setting ``name`` when no flag sets it: the full demo's, or with ``quick`` the quick demo's."""
    if quick and name in QUICK:
        return QUICK[name]
    spec = next(f for f in fields(DemoConfig) if f.name == name)
    return spec.default if spec.default is not MISSING else spec.default_factory()


def setting_error(name: str, problem: str) -> ConfigError:
    """``NAME PROBLEM``, naming the flag instead on the command line when the setting has one."""
    flag = FLAGS.get(name)
    return ConfigError(f"{name} {problem}", cli=f"{flag} {problem}" if flag else None)


POSITIVE_REALS = ("sft_lr", "rl_lr")
"""Float settings that must be positive and finite (``sft_target`` and ``temperature`` are checked on their own)."""


def check_values(config: DemoConfig) -> None:
    """One-line errors for settings of the wrong type or out of range (the algorithm and the device are checked by
    :func:`dare.demo.pipeline.check_config`)."""
    for spec in fields(DemoConfig):
        value = getattr(config, spec.name)
        if spec.type in ("int", "int | None") and not (value is None and spec.type == "int | None"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise setting_error(spec.name, f"must be an integer; got {described(value)}")
            if spec.name == "seed":
                if not SEEDS[0] <= value <= SEEDS[1]:
                    raise setting_error("seed", f"must be in [{SEEDS[0]}, {SEEDS[1]}]; got {value}")
            elif value < 1:
                raise setting_error(spec.name, f"must be >= 1; got {value}")
        elif spec.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise setting_error(spec.name, f"must be a number; got {described(value)}")
    if not 0 < config.sft_target <= 1:
        raise setting_error("sft_target", f"must be in (0, 1]; got {config.sft_target}")
    for name in POSITIVE_REALS:
        value = getattr(config, name)
        if not (math.isfinite(value) and value > 0):
            raise setting_error(name, f"must be a positive finite number; got {value}")


def resolved_device(name: str) -> str:
    """The device a run of ``--device NAME`` uses: ``auto`` is ``cuda`` where CUDA is available, else ``cpu``."""
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def resolved_threads(threads: int | None) -> int:
    """The CPU threads a run of ``--threads`` uses: None (``--threads 0``, torch's choice) is torch's current
    count, which the demo then leaves alone."""
    import torch

    return torch.get_num_threads() if threads is None else threads


def resolved(settings: dict) -> dict:
    """Recorded demo settings with ``device`` and ``threads`` as the run uses them: ``--device auto`` on a CPU
    machine is the run of ``--device cpu``, so the two compare equal."""
    out = dict(settings)
    if "device" in out:
        out["device"] = resolved_device(out["device"])
    if "threads" in out:
        out["threads"] = resolved_threads(out["threads"])
    return out
