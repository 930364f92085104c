"""Reward plug-ins: the result type, the base class and the registry.

A reward scores a batch of completions against the ground truth carried by each sample (a mapping):
``get_reward("countdown").score(completions, samples) -> list[RewardResult]``. ``reward`` is what RL
optimises, ``correct`` is accuracy, ``partial`` is the partial credit (fraction of sudoku cells or of
code tests) reported apart from accuracy, ``components`` holds the weighted parts of a combined reward.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dare.errors import ConfigError, DareError, InputError, first_line, unknown_choice, wrong_type
from dare.plugins import count_registration, redefined_in_main


@dataclass
class RewardResult:
    """The verdict on one completion."""

    reward: float
    """Scalar optimised by RL (weighted sum of the components for a combined reward)."""
    correct: bool
    """Accuracy: the completion solves the task."""
    partial: float | None = None
    """Partial credit in [0, 1] where the task defines one (sudoku cells, code tests), else None."""
    extracted: Any = None
    """The answer read from the completion (number, expression, grid, code), None if none was found."""
    components: dict[str, float] = field(default_factory=dict)
    """Named parts of the reward (e.g. ``{"code": 2.0, "code_format": 0.5}``), already weighted."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form details (why it failed, sandbox status, ...)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "correct": self.correct,
            "partial": self.partial,
            "extracted": self.extracted if isinstance(self.extracted, (str, int, float, type(None))) else str(self.extracted),
            "components": dict(self.components),
            "info": dict(self.info),
        }


class Reward:
    """Base class of reward plug-ins; subclasses implement :meth:`score_one` (or :meth:`score`)."""

    name: ClassVar[str] = ""
    required_fields: ClassVar[tuple[str, ...]] = ()
    """Ground-truth keys every sample must carry (checked with a one-line error)."""

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        raise NotImplementedError

    def score(self, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        """Score ``completions[i]`` against ``samples[i]``."""
        self.check(completions, samples)
        return [self.score_one(c, s) for c, s in zip(completions, samples)]

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> list[float]:
        """Plain rewards (what RL consumes)."""
        return [r.reward for r in self.score(completions, samples)]

    def check(self, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> None:
        if isinstance(completions, str):
            raise InputError(f"reward '{self.name}': completions must be a list of strings; got one string (wrap it "
                             "in a list)")
        if not isinstance(completions, Collection):
            raise wrong_type(f"reward '{self.name}': completions", completions, "a list of strings")
        if isinstance(samples, Mapping):
            raise InputError(f"reward '{self.name}': samples must be a list of mappings; got one mapping (wrap it in "
                             "a list)")
        if isinstance(samples, str) or not isinstance(samples, Collection):
            raise wrong_type(f"reward '{self.name}': samples", samples, "a list of mappings (one per completion)")
        if len(completions) != len(samples):
            raise InputError(f"reward '{self.name}': {len(completions)} completions for {len(samples)} samples")
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                target = " (a benchmark Sample: pass its .target)" if hasattr(sample, "target") else ""
                raise InputError(f"reward '{self.name}': sample {i} is a {type(sample).__name__}, expected a mapping of "
                                 f"its fields{target}")
            missing = [k for k in self.required_fields if k not in sample]
            if missing:
                raise InputError(
                    f"reward '{self.name}': sample {i} lacks {', '.join(missing)} (has: {', '.join(sorted(sample)) or 'nothing'})"
                )
        for i, completion in enumerate(completions):
            if not isinstance(completion, str):
                raise InputError(f"reward '{self.name}': completion {i} is {type(completion).__name__}, expected str")


REWARDS: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable[[type[Reward]], type[Reward]]:
    """Class decorator adding a reward plug-in to the registry under ``name``."""
    if not isinstance(name, str) or not name:  # @register_reward without its name: the class came as the name
        given = getattr(name, "__name__", repr(name))
        raise ValueError(f"register_reward needs the reward's name: @register_reward(\"my_reward\") (got {given})")

    def wrap(cls: type[Reward]) -> type[Reward]:
        if name in REWARDS and not redefined_in_main(REWARDS[name], cls):  # a notebook cell run again replaces it
            raise ValueError(f"reward '{name}' registered twice")
        count_registration()
        cls.name = name
        REWARDS[name] = cls
        return cls

    return wrap


def score_checked(reward: Reward, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]
                  ) -> list[RewardResult]:
    """``reward.score(completions, samples)``, where a reward of the user's own (its class defined outside DARE: a
    plug-in) that raises, or that returns anything but one :class:`RewardResult` with a finite numeric ``reward`` per
    completion, is a one-line :class:`RewardFailed` naming the reward and the line of its own code that raised
    (``DARE_TRACEBACK=1`` prints the traceback). DARE's own rewards (a combined reward checks its parts) pass as they
    are: their errors keep their tracebacks."""
    if type(reward).__module__.split(".")[0] == "dare":
        return reward.score(completions, samples)
    name = getattr(reward, "name", "") or type(reward).__name__
    try:
        results = reward.score(completions, samples)
    except DareError:
        raise
    except Exception as err:  # noqa: BLE001 - the plug-in's own bug: one line naming its own file and line
        raise RewardFailed(f"reward '{name}': {_raised_at(reward, err)} raised {type(err).__name__}: "
                           f"{first_line(err)} (DARE_TRACEBACK=1 shows the traceback)") from err
    if not isinstance(results, (list, tuple)) or len(results) != len(completions):
        count = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
        raise RewardFailed(f"reward '{name}': score returned {count} for {len(completions)} completions (a list of "
                           "one RewardResult per completion)")
    for index, result in enumerate(results):
        if not isinstance(result, RewardResult):
            raise RewardFailed(f"reward '{name}' returned {type(result).__name__} {result!r:.40} for completion "
                               f"{index}: score_one returns RewardResult(reward=..., correct=...)")
        value = result.reward
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardFailed(f"reward '{name}' returned reward={value!r:.40} for completion {index}: a reward is a "
                               "finite number")
    return list(results)


class RewardFailed(InputError):
    """A reward of the user's own raised while scoring, or returned something else than its results
    (:func:`score_checked`)."""


def _raised_at(reward: Reward, err: BaseException) -> str:
    """``FILE line N``: the innermost line of ``reward``'s own source file in ``err``'s traceback
    (:func:`dare.plugins.innermost_own_frame`; the file alone when the traceback does not pass it)."""
    import inspect
    import os
    from pathlib import Path

    from dare.plugins import innermost_own_frame

    try:
        source = inspect.getsourcefile(type(reward))
    except TypeError:
        source = None
    if not source:
        return "its code"
    relative = os.path.relpath(source)
    shown = source if relative.startswith("..") else relative
    frame = innermost_own_frame(err, [Path(source)])
    return shown if frame is None else f"{shown} line {frame[1]}"


class WeightedSum(Reward):
    """``reward = Σ w_i · r_i``; ``correct``/``partial``/``extracted`` come from the first reward."""

    def __init__(self, parts: Sequence[tuple[str, float, Reward]]):
        if not parts:
            raise ConfigError("a combined reward needs at least one part")
        self.parts = list(parts)
        self.name = "+".join(name for name, _, _ in parts)

    def score(self, completions, samples):
        per_part = [(name, weight, score_checked(reward, completions, samples)) for name, weight, reward in self.parts]
        out = []
        for i in range(len(completions)):
            first = per_part[0][2][i]
            components = {name: weight * results[i].reward for name, weight, results in per_part}
            info = {name: results[i].info for name, _, results in per_part if results[i].info}
            out.append(
                RewardResult(
                    reward=sum(components.values()),
                    correct=first.correct,
                    partial=first.partial,
                    extracted=first.extracted,
                    components=components,
                    info=info,
                )
            )
        return out


PRESETS: dict[str, dict[str, Any]] = {
    # Coupled-GRPO / DiffuCoder recipes/config_coupled_code.yaml: reward_funcs [code, code_format],
    # weights [2.0, 0.5]; tests only run for a well-formed single ```python block.
    "coupled_grpo_code": {"code": {"weight": 2.0, "require_format": True}, "code_format": 0.5},
    # d1 / SPG diffu_grpo_train.py for gsm8k: xmlcount + soft + strict format + int + correctness (2.0).
    "d1_gsm8k": {"gsm8k": 2.0, "xml_count": 1.0, "soft_format": 0.5, "strict_format": 0.5, "integer_answer": 0.5},
    # d1 / SPG for math: correctness (2.0) + 0.5 * boxed_in_answer.
    "d1_math": {"math": 2.0, "boxed_format": 0.5},
    # d1 / SPG countdown and sudoku use a single reward each.
    "d1_countdown": {"countdown": 1.0},
    "d1_sudoku": {"sudoku": 1.0},
}


def reward_fields(reward) -> list[tuple[str, str]]:
    """``(field, reward name)`` for every field a sample must hold for ``reward`` (its ``required_fields``; every
    part's of a combined :class:`WeightedSum`); none for no reward. RL prompts (:mod:`dare.trainer.prompts`) and
    ``dare.eval.evaluate``'s samples are checked against them before any rollout."""
    if isinstance(reward, WeightedSum):
        return [need for _, _, part in reward.parts for need in reward_fields(part)]
    return [(key, getattr(reward, "name", "") or type(reward).__name__)
            for key in getattr(reward, "required_fields", ())]


def get_reward(spec: str | Mapping[str, Any], **options: Any) -> Reward:
    """Build a reward from a registered name, a preset name, or ``{name: weight | {weight, **options}}``.

    ``get_reward("math")``; ``get_reward("code", timeout=5)``; ``get_reward("coupled_grpo_code")``;
    ``get_reward({"math": 2.0, "boxed_format": 0.5})``.
    """
    import dare.rewards  # noqa: F401  (registers the built-in plug-ins)

    if isinstance(spec, str):
        if spec in REWARDS:
            try:
                return REWARDS[spec](**options)
            except TypeError as err:
                raise ConfigError(f"reward '{spec}': {err}") from None
        if spec in PRESETS:
            return get_reward(PRESETS[spec])
        raise unknown_choice("reward", spec, [*REWARDS, *PRESETS])
    if not isinstance(spec, Mapping):
        hint = ""
        if isinstance(spec, Reward) or (isinstance(spec, type) and issubclass(spec, Reward)) or callable(spec):
            hint = " (register your reward with @register_reward(\"my_reward\") and give its name)"
        raise ConfigError(f"reward must be a name or a mapping {{name: weight}}; got {spec!r}{hint}")
    parts = []
    for name, value in spec.items():
        opts = dict(value) if isinstance(value, Mapping) else {"weight": value}
        weight = opts.pop("weight", 1.0)
        try:
            if isinstance(weight, bool):  # float() would take YAML's true / false as 1 / 0
                raise TypeError(weight)
            weight = float(weight)
        except (TypeError, ValueError):
            hint = " (YAML needs a space after the colon: {name: weight})" if ":" in str(name) else ""
            raise ConfigError(f"reward '{name}': the weight must be a number; got {value!r}{hint}") from None
        parts.append((name, weight, get_reward(name, **opts)))
    return WeightedSum(parts)
