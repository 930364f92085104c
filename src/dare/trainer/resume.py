"""When a run may continue from the weights already in its output directory.

``trainer.resume=auto`` continues a run only when the saved run's **training-relevant settings** equal the new
ones: every key of the resolved config except the :data:`FREE_KEYS` (where files go, logging, checkpoint cadence,
device placement, speed options and the process layout, none of which changes the numbers a step computes:
checkpoints reshard to another number of processes or sequence- / expert-parallel degree). ``trainer.max_steps`` and
``trainer.epochs`` are free too (extend or shorten a run) unless the learning-rate schedule depends on the total
number of steps (cosine / linear decay, or ``optim.warmup_ratio``), where they change the weights of every step.
The ``rollout`` section is free for algorithms that make no rollouts (SFT, DPO/VRPO).

Otherwise resuming is a one-line :class:`~dare.errors.ConfigError` naming the keys that differ, with the two ways
out: another ``trainer.output_dir``, or ``trainer.resume=never`` to start over. So a run's ``config.yaml`` always
describes what produced its weights.

``trainer.resume=never`` deletes the output directory's ``checkpoints/``, ``final/`` and ``exports/`` (:data:`START_OVER_DIRS`)
before training: it is refused when a path the run reads (``model.path``, ``model.tokenizer``, ``data.path``) lies
inside them (:func:`check_start_over`), and the error above then only suggests another output directory.
"""

from __future__ import annotations

from pathlib import Path

from dare.config import flatten
from dare.errors import ConfigError, closest

FREE_KEYS = frozenset({
    "trainer.output_dir", "trainer.log_every", "trainer.save_every", "trainer.keep_last", "trainer.save_on_interrupt",
    "trainer.resume", "trainer.export", "trainer.progress", "trainer.tensorboard", "trainer.wandb", "trainer.wandb_project",
    "trainer.micro_batch_size",  # gradients are sums over micro-batches: the split does not change them
    "distributed.backend", "distributed.device", "distributed.fsdp", "distributed.reshard_after_forward",
    "distributed.sequence_parallel", "distributed.expert_parallel",  # layouts: the same loss (checkpoints reshard)
    "model.gradient_checkpointing", "model.compile", "model.compile_backend", "model.logits_chunk_size",
    "model.attn_backend",
    "rollout.chunk_size", "rollout.samples_file", "rollout.samples_per_step",
    # where the plug-in code lives, not what it computes: a plug-in file moved or renamed (or a module given by path
    # instead of by name) must not block a resume; the names it registers (rollout.reward, algorithm.name, ...)
    # are compared as every other key
    "imports",
})
"""Keys that may differ between a checkpoint and the run resuming from it."""
LENGTH_KEYS = ("trainer.max_steps", "trainer.epochs")
"""Free unless the learning-rate schedule depends on the total number of steps."""
SHOWN = 4
"""Differing keys named in the error (then "and N more")."""
START_OVER_DIRS = ("checkpoints", "final", "exports")
"""What ``trainer.resume=never`` deletes from the output directory before training."""
RESUME_VALUES = ("auto", "never")
"""The ``trainer.resume`` modes (or a checkpoint directory, ``OUTPUT_DIR/checkpoints/step_00000012``, or a run
directory: its latest checkpoint)."""


NOT_PATHS = ("tiny:", "synthetic:")
"""Prefixes of model / data settings that name no file."""


def schedule_depends_on_length(settings: dict) -> bool:
    """True when the learning rate of a step depends on the run's total number of steps."""
    optim = settings.get("optim", {})
    return optim.get("scheduler", "constant") != "constant" or (
        not optim.get("warmup_steps") and bool(optim.get("warmup_ratio")))


def makes_rollouts(settings: dict) -> bool:
    """True unless the config's algorithm is a registered one that makes no rollouts (SFT, DPO/VRPO): its
    ``rollout`` section then changes nothing."""
    from dare.algorithms import ALGORITHMS

    name = (settings.get("algorithm") or {}).get("name")
    return name not in ALGORITHMS or ALGORITHMS[name].needs.rollout


def relevant(settings: dict) -> dict:
    """The training-relevant keys of a resolved config (as plain data), flattened. ``data.eos_padding`` is free in a
    packed run (``data.packing``): packed rows carry no EOS padding either way."""
    free = set(FREE_KEYS)
    if not schedule_depends_on_length(settings):
        free.update(LENGTH_KEYS)
    if (settings.get("data") or {}).get("packing"):
        free.add("data.eos_padding")
    rollouts = makes_rollouts(settings)
    return {key: value for key, value in flatten(settings).items()
            if key not in free and (rollouts or not key.startswith("rollout."))}


def differing_keys(saved: dict, new: dict) -> list[str]:
    """Keys relevant to training on either side whose values differ (or exist on one side only), sorted. A key that
    is null on one side and absent on the other (a field of another algorithm's section) is unset on both: not a
    difference; nor is a key relevant on one side only with the same value on both (``trainer.epochs`` when only
    the new run's schedule depends on the run length)."""
    keys = relevant(saved).keys() | relevant(new).keys()
    a, b = flatten(saved), flatten(new)
    return sorted(k for k in keys if a.get(k) != b.get(k))


def _show(value) -> str:
    return "unset" if value is None else str(value)


def check_same_settings(saved: dict, new: dict, where: str, ways_out: str) -> None:
    """Raise the one-line error when ``saved`` (the run in ``where``) and ``new`` differ in a relevant key."""
    keys = differing_keys(saved, new)
    if not keys:
        return
    keys.sort(key=lambda k: k not in ("model.path", "algorithm.name"))  # another model / algorithm: say so first
    flat_saved, flat_new = flatten(saved), flatten(new)
    shown = ", ".join(f"{k} ({_show(flat_saved.get(k))} -> {_show(flat_new.get(k))})" for k in keys[:SHOWN])
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    why = ""
    if any(k in LENGTH_KEYS for k in keys[:SHOWN]):  # free otherwise: say why the run length counts here
        optim = new.get("optim", {})
        setting = (f"optim.scheduler={optim.get('scheduler')}" if optim.get("scheduler", "constant") != "constant"
                   else f"optim.warmup_ratio={optim.get('warmup_ratio')}")
        why = f" (the run length counts: the learning-rate schedule depends on it, {setting})"
    raise ConfigError(f"{where} was trained with other settings: {shown}{more}{why}; {ways_out}")


def saved_settings(output_dir: Path, checkpoint: Path | None) -> dict | None:
    """The settings that produced the weights in ``output_dir``: those stored in ``checkpoint`` (the one to resume
    from), else the run's ``config.yaml`` when the directory holds weights (a checkpoint or ``final/``); None for
    a directory without weights."""
    if checkpoint is not None:
        from dare.trainer.checkpoint import read_trainer_state

        stored = read_trainer_state(checkpoint).get("config")
        if stored is not None:
            return stored
    has_weights = checkpoint is not None or (output_dir / "final").is_dir()
    config_file = output_dir / "config.yaml"
    if not has_weights or not config_file.is_file():
        return None
    from dare.config import load_yaml

    return load_yaml(config_file)


def _local_path(value) -> str | None:
    """The file system path in a ``model.path`` / ``model.tokenizer`` / ``data.path`` value (None for ``tiny:``,
    ``synthetic:`` and a ``benchmark:NAME`` without a file)."""
    if not value or str(value).startswith(NOT_PATHS):
        return None
    value = str(value)
    if value.startswith("benchmark:"):
        return value[len("benchmark:"):].partition(":")[2] or None
    return value


def input_paths(settings: dict) -> dict[str, str]:
    """``{key: path}`` of the local paths a run with resolved ``settings`` reads (model, tokenizer, data)."""
    model, data = settings.get("model") or {}, settings.get("data") or {}
    values = {"model.path": model.get("path"), "model.tokenizer": model.get("tokenizer"), "data.path": data.get("path")}
    return {key: path for key, value in values.items() if (path := _local_path(value)) is not None}


def _inside(path: Path, folder: Path) -> bool:
    """True when ``path`` is ``folder`` or lies under it (symbolic links and ``..`` resolved)."""
    path, folder = path.expanduser().resolve(), folder.expanduser().resolve()
    return path == folder or folder in path.parents


def start_over_blocker(output_dir: Path, settings: dict) -> str | None:
    """``"KEY=PATH (in DIR)"`` for the first path the run reads that ``trainer.resume=never`` would delete (it lies in
    the output directory's :data:`START_OVER_DIRS`), else None."""
    for name in START_OVER_DIRS:
        folder = Path(output_dir) / name
        if not folder.exists():
            continue
        for key, path in input_paths(settings).items():
            if _inside(Path(path), folder):
                where = "" if _inside(folder, Path(path)) else f" (in {folder})"
                return f"{key}={path}{where}"
    return None


def check_start_over(output_dir: Path, settings: dict) -> None:
    """One-line error when ``trainer.resume=never`` would delete a path the run reads (see :func:`start_over_blocker`)."""
    blocker = start_over_blocker(output_dir, settings)
    if blocker is not None:
        raise ConfigError(f"trainer.resume=never would delete {blocker} before training from it; use another "
                          f"trainer.output_dir (or copy it out of {output_dir} first)")


def check_resume(resume: str) -> None:
    """One-line error unless ``trainer.resume`` is ``auto``, ``never``, a complete checkpoint directory or a run
    directory holding one (:func:`resume_checkpoint`)."""
    if resume not in RESUME_VALUES:
        resume_checkpoint(resume)


def resume_checkpoint(resume: str) -> Path:
    """The checkpoint ``trainer.resume=PATH`` names: a complete checkpoint directory, or the latest complete checkpoint
    of a run directory (``trainer.output_dir`` of a run) or of its ``checkpoints/`` folder. Anything else is a one-line
    error; where checkpoints are near (a deleted or misspelt ``step_...``, a run directory) it names them, since their
    step numbers are zero-padded (``step_00000012``)."""
    path = Path(resume)
    found = checkpoint_at(path)
    if found is not None:
        return found
    raise ConfigError(f"trainer.resume={resume} {not_a_checkpoint(path)}; use auto, never, a run directory (its "
                      f"latest checkpoint) or a checkpoint directory ({CHECKPOINT_EXAMPLE})")


def checkpoint_at(path: Path) -> Path | None:
    """The complete checkpoint ``path`` names: itself, or the latest one of a run directory or of its
    ``checkpoints/`` folder; None when there is none."""
    from dare.trainer.checkpoint import STATE_FILE, list_checkpoints

    if (path / STATE_FILE).is_file():
        return path
    run_dir = path.parent if path.name == "checkpoints" else path
    found = list_checkpoints(run_dir) if path.is_dir() else []
    return found[-1] if found else None


CHECKPOINT_EXAMPLE = "OUTPUT_DIR/checkpoints/step_00000012"


def not_a_checkpoint(path: Path, to_train: bool = True) -> str:
    """Why ``path`` is no checkpoint, with the complete checkpoints beside it, if any (``to_train``: a directory of
    exported weights is named as the ``model.path`` to train from)."""
    from dare.trainer.checkpoint import list_checkpoints

    beside = list_checkpoints(path.parent.parent) if path.parent.name == "checkpoints" else []
    if beside:
        names = ", ".join(p.name for p in beside)
        meant = _same_step(path.name, beside)
        hint = f" (did you mean {meant}?)" if meant is not None else ""
        problem = "is not a complete checkpoint" if path.exists() else "does not exist"
        return f"{problem}{hint}; the checkpoints in {path.parent}: {names}"
    if path.is_file():
        return "is a file, not a checkpoint directory"
    if path.is_dir():
        if path.name == "checkpoints" or (path / "checkpoints").is_dir():
            return "holds no complete checkpoint"
        if path.parent.name == "checkpoints":
            return "is not a complete checkpoint (no trainer_state.pt: its write was cut short)"
        if (path / "final").is_dir() or (path / "config.json").is_file():
            weights = path / "final" if (path / "final").is_dir() else path
            use = f" (to train from them: model.path={weights})" if to_train else ""
            return f"holds no checkpoint, only exported weights{use}"
        return "is neither a DARE checkpoint nor a run directory"
    if path.exists() or len(path.parts) > 1 or not to_train:  # a path (e.g. a deleted step_...), not a misspelt mode
        return "does not exist"
    mode = MODE_WORDS.get(str(path).lower()) or closest(str(path), RESUME_VALUES)
    return "is not a checkpoint directory" + (f" (did you mean {mode}?)" if mode else "")


MODE_WORDS = {"latest": "auto", "last": "auto", "resume": "auto", "continue": "auto", "true": "auto",
              "false": "never", "restart": "never", "scratch": "never", "fresh": "never", "none": "never"}
"""Words users write for a ``trainer.resume`` mode, with the mode they mean (the error's did-you-mean)."""


def _same_step(name: str, checkpoints: list[Path]) -> Path | None:
    """The checkpoint of ``checkpoints`` with the step number of ``name`` written another way (``step_12`` for
    ``step_00000012``), if any."""
    def step(text: str) -> int | None:
        number = text.removeprefix("step_").removesuffix(".tmp")
        return int(number) if number.isdigit() else None

    wanted = step(name)
    return next((p for p in checkpoints if wanted is not None and step(p.name) == wanted and p.name != name), None)


def _ways_out(output_dir: Path, settings: dict) -> str:
    """How to train with other settings than the run in ``output_dir``: starting over there only when that deletes
    nothing the run reads."""
    blocker = start_over_blocker(output_dir, settings)
    if blocker is None:
        return "use another trainer.output_dir, or trainer.resume=never to start over"
    return f"use another trainer.output_dir (trainer.resume=never would delete {blocker})"


def check_steps_ahead(checkpoint: Path | None, max_steps: int | None) -> None:
    """One-line :class:`ConfigError` for a resume from a checkpoint past ``trainer.max_steps``: nothing would train,
    and config.yaml would then record a run length that did not produce the weights there."""
    if checkpoint is None or not max_steps:
        return
    from dare.runs import checkpoint_step

    step = checkpoint_step(checkpoint)
    if step is not None and step > max_steps:
        raise ConfigError(f"trainer.max_steps={max_steps} is below the step of the checkpoint the run resumes from "
                          f"({checkpoint}, step {step}): nothing would train; give a larger "
                          "trainer.max_steps, another trainer.output_dir, or trainer.resume=never to start over")


def resume_point(output_dir: Path, resume: str, settings: dict) -> Path | None:
    """The checkpoint a run with ``settings`` continues from (None: it starts at step 0), for ``trainer.resume``
    = ``auto`` (the latest complete checkpoint in ``output_dir``), ``never``, a checkpoint directory or a run directory
    (its latest checkpoint, :func:`resume_checkpoint`); raises the one-line error when the weights there were trained
    with other training-relevant settings, or when ``never`` would delete a path the run reads
    (:func:`check_start_over`). Reads only: the dry run calls it too."""
    from dare.trainer.checkpoint import list_checkpoints

    check_resume(resume)
    if resume == "never":
        check_start_over(output_dir, settings)
        return None
    if resume == "auto":
        found = list_checkpoints(output_dir)
        checkpoint = found[-1] if found else None
        saved = saved_settings(output_dir, checkpoint)
        if saved is not None:
            check_same_settings(saved, settings, f"trainer.output_dir={output_dir}", _ways_out(output_dir, settings))
        return checkpoint
    checkpoint = resume_checkpoint(resume)  # a run directory: its latest checkpoint
    saved = saved_settings(checkpoint.parent.parent, checkpoint)
    if saved is not None:
        named = "" if checkpoint == Path(resume) else f" ({checkpoint})"
        check_same_settings(saved, settings, f"checkpoint trainer.resume={resume}{named}",
                            "resume from a checkpoint of this recipe, or set trainer.resume=never")
    return checkpoint


def interrupt_message(output_dir, resume_command: str | None = None, resume: str = "auto") -> str:
    """The line ``dare train`` prints after Ctrl-C (before the CLI's ``interrupted``): the latest complete checkpoint
    in ``output_dir`` (if any) and how to continue from it (``resume_command``: the command line with
    ``trainer.resume=auto``). ``resume``: the run's ``trainer.resume`` (a checkpoint or run directory it started
    from is where a rerun starts again while ``output_dir`` holds none)."""
    from dare.runs import checkpoint_step
    from dare.trainer.checkpoint import list_checkpoints

    found = list_checkpoints(Path(output_dir))
    if not found:
        rerun = "starts from step 0" if resume in RESUME_VALUES else f"resumes from {resume} again"
        return f"no checkpoint in {output_dir} yet (trainer.save_every sets how often one is saved): a rerun {rerun}"
    how = resume_command or "rerun with trainer.resume=auto"
    return f"latest checkpoint: {found[-1]} (step {checkpoint_step(found[-1])}); to resume from it: {how}"


__all__ = ["FREE_KEYS", "LENGTH_KEYS", "RESUME_VALUES", "START_OVER_DIRS", "check_resume", "check_same_settings",
           "check_start_over", "checkpoint_at", "differing_keys", "input_paths", "interrupt_message", "not_a_checkpoint",
           "relevant", "resume_checkpoint",
           "resume_point", "saved_settings", "start_over_blocker"]
