"""Checks of a training run that load no model and read no data.

``dare train --dry-run`` runs them, and so does every run before it loads anything (:class:`~dare.trainer.Trainer`),
with the same functions the run uses later (the sampler and reward of :mod:`dare.trainer.rl`, the data path checks
of :mod:`dare.data.sft` / :mod:`dare.trainer.prompts`, ``trainer.resume``), so a dry run cannot pass a config that
the run rejects before its first step. Settings the run does not use (``rollout.*`` without rollouts, ``lora.*``
without ``lora.enabled``, data options of another kind of source) get one warning line per section.
"""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger("dare.trainer")

UNUSED_DATA = {
    "rollout": ("response_key", "append_eos", "pad_response_to", "eos_padding", "max_length", "overlong", "packing",
                "pack_length", "fixed_shapes", "chosen_key", "rejected_key"),
    "pairs": ("messages_key", "eos_padding", "packing", "pack_length", "fixed_shapes"),
    "dataset": ("chosen_key", "rejected_key"),
}
"""``data`` keys each kind of batch source ignores (RL prompts, preference pairs, SFT examples)."""


def check_run(config, *, model: bool = True, data: bool = True, warn: bool = True) -> None:
    """Raise the one-line error a run of ``config`` would raise for its model path, data path, rollout sampler and
    reward, or ``trainer.resume``; ``model`` / ``data``: check those sections (False when the trainer is given its
    own model / batch source); ``warn``: log the settings the run ignores."""
    from dare.algorithms import get_algorithm
    from dare.trainer.resume import check_resume

    needs = get_algorithm(config.algorithm.name).needs
    check_resume(config.trainer.resume)
    if model:
        check_model_path(config.model.path)
    if data and needs.rollout:
        from dare.trainer.prompts import check_prompt_path
        from dare.trainer.rl import check_rollout_batch, rollout_reward, rollout_sampler

        rollout_sampler(config.rollout)
        rollout_reward(config.rollout)
        check_rollout_batch(config.trainer.batch_size, config.rollout.group_size)
        check_prompt_path(config.data.path)
    elif data:
        from dare.data.sft import check_data_path

        check_data_path(config.data.path)
    if warn:
        warn_unused(config, needs)


def check_model_path(path: str) -> None:
    """The family of ``tiny:FAMILY[:SEED]``, or a local checkpoint directory (:func:`dare.models.loading.load_model`
    checks the same before loading)."""
    from dare.models.loading import check_checkpoint_path, parse_tiny
    from dare.models.spec import get_family

    tiny = parse_tiny(path)
    if tiny is not None:
        get_family(tiny[0])
    else:
        check_checkpoint_path(path)


def changed(value, default, prefix: str) -> list[str]:
    """Keys of config section ``value`` (dataclasses recursed) that differ from ``default`` (a partial nested section
    starts from its field's default, :func:`dare.config.from_dict`)."""
    keys = []
    for f in dataclasses.fields(value):
        mine, theirs = getattr(value, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(mine) and dataclasses.is_dataclass(theirs):
            keys += changed(mine, theirs, f"{prefix}{f.name}.")
        elif mine != theirs:
            keys.append(f"{prefix}{f.name}")
    return keys


def warn_unused(config, needs) -> None:
    """One warning line per section whose non-default settings this run ignores."""
    from dare.trainer.config import DataConfig, LoraConfig, RolloutConfig

    name = config.algorithm.name
    if not needs.rollout and (keys := changed(config.rollout, RolloutConfig(), "rollout.")):
        log.warning(f"warning: ignoring {', '.join(keys)}: algorithm '{name}' makes no rollouts")
    unused_lora = [k for k in changed(config.lora, LoraConfig(), "lora.") if k != "lora.enabled"]
    if not config.lora.enabled and unused_lora:
        log.warning(f"warning: ignoring {', '.join(unused_lora)}: lora.enabled is false (set lora.enabled=true "
                    "to train an adapter)")
    kind = "rollout" if needs.rollout else "pairs" if needs.pairs else "dataset"
    data = [k for k in changed(config.data, DataConfig(), "data.") if k.split(".")[1] in UNUSED_DATA[kind]]
    if data:
        what = {"rollout": "RL prompts", "pairs": "preference pairs", "dataset": "SFT examples"}[kind]
        log.warning(f"warning: ignoring {', '.join(data)}: not used by algorithm '{name}' (it trains on {what})")
    elif kind == "dataset" and config.data.pack_length is not None and not config.data.packing:
        log.warning("warning: ignoring data.pack_length: data.packing is false")


__all__ = ["UNUSED_DATA", "changed", "check_model_path", "check_run", "warn_unused"]
