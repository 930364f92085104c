"""Model directories from a run: the weights a ``dare train`` run exports (``RUN/final``), and those of any one of
its checkpoints (``dare export``), so that an intermediate step can be evaluated like the final one.

A checkpoint holds the model, the optimizer and the trainer state in torch.distributed.checkpoint shards, which no
model loader reads. :func:`export_checkpoint` builds the run's model as the run built it (its recorded
``model.path`` and dtype, with its LoRA adapter), loads only the weights of the checkpoint (under any layout the
run trained with: shards of any number of processes, sequence or expert parallelism) and writes what the run's own
export writes: a HF checkpoint for a full fine-tune, a peft adapter for a LoRA run, with the tokenizer either way.
An algorithm's auxiliary models (e.g. a value model) are not written: the export is for generation and evaluation.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from dare.errors import ConfigError

EXPORT_COMMAND = "export"
"""The command name recorded in an export's output marker (an earlier ``dare export`` output may be replaced)."""


def save_model_dir(model, tokenizer, out: Path, state: dict, *, adapter: bool, chat_template: bool) -> None:
    """Write ``state`` (the model's full state dict; only the trainable one with ``adapter``) into ``out``: a peft
    adapter with ``adapter``, else the full model, and the tokenizer; the tokenizer without its chat template when
    the run encoded its data without it (``chat_template=False``), so that ``dare generate`` / ``dare eval`` read
    prompts as the model was trained to."""
    from dare.models.loading import unwrap

    if adapter:  # peft adapter (embeddings are never resized: do not save them)
        model.save_pretrained(str(out), state_dict=state, safe_serialization=True, save_embedding_layers=False)
    else:
        unwrap(model).save_pretrained(str(out), state_dict=state, safe_serialization=True)
    template = getattr(tokenizer, "chat_template", None)
    if not chat_template and template is not None:
        tokenizer.chat_template = None
    try:
        tokenizer.save_pretrained(str(out))
    finally:
        if template is not None:
            tokenizer.chat_template = template


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: a checkpoint directory (``RUN/checkpoints/step_N``), or a run directory /
    its ``checkpoints/`` (their latest complete checkpoint); a one-line error for anything else."""
    from dare.trainer.resume import checkpoint_at, not_a_checkpoint

    local = Path(path).expanduser()
    found = checkpoint_at(local)
    if found is None:
        raise ConfigError(f"{path} {not_a_checkpoint(local, to_train=False)}; give a checkpoint directory "
                          "(RUN/checkpoints/step_N) or a run directory (its latest checkpoint)")
    return found


def default_export_dir(checkpoint: Path) -> Path:
    """``RUN/exports/step_N`` for ``RUN/checkpoints/step_N`` (beside the run's ``final/``, outside ``checkpoints/``,
    whose old steps the run deletes)."""
    return checkpoint.parent.parent / "exports" / checkpoint.name


def export_checkpoint(path: str | Path, out: str | Path | None = None, *, progress: bool = True) -> tuple[Path, dict]:
    """Write the weights of checkpoint ``path`` (see :func:`resolve_checkpoint`) as a model directory ``out``
    (default :func:`default_export_dir`; new, empty or an earlier ``dare export`` output, replaced); returns
    ``(out, the checkpoint's trainer state)``. Single process, on the CPU."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from dare.models.loading import load_model, load_tokenizer, resolve_dtype
    from dare.outputs import check_replaceable, ensure_dir, mark_output, publish_dir, staging_dir
    from dare.progress import hf_progress_bars
    from dare.trainer.checkpoint import SINGLE_PROCESS_WARNING, interrupts_unwrapped, read_trainer_state
    from dare.trainer.config import load_train_config

    checkpoint = resolve_checkpoint(path)
    state = read_trainer_state(checkpoint)
    if not state.get("config"):
        raise ConfigError(f"{checkpoint} records no run config (written by an older DARE): export it with the run "
                          "itself, `dare train RUN/config.yaml trainer.resume=auto trainer.export=true`")
    final = Path(out).expanduser() if out is not None else default_export_dir(checkpoint)
    check_replaceable(final, "--out", EXPORT_COMMAND)
    ensure_dir(final.parent, "--out", target=final)
    cfg = load_train_config(None, state["config"])
    adapter = cfg.lora.enabled
    with hf_progress_bars(progress):
        model = load_model(cfg.model.path, dtype=resolve_dtype(cfg.model.dtype), device=torch.device("cpu"))
        tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    if adapter:
        from dare.models.lora import apply_lora

        model = apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules)
    options = StateDictOptions(ignore_frozen_params=adapter, strict=not adapter)
    weights = get_model_state_dict(model, options=options)
    with warnings.catch_warnings(), interrupts_unwrapped():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)
        dcp.load({"model": weights}, checkpoint_id=str(checkpoint))  # the weights only, not the optimizer
    set_model_state_dict(model, weights, options=options)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=adapter))
    staged = staging_dir(final)
    save_model_dir(model, tokenizer, staged, full, adapter=adapter, chat_template=cfg.data.chat_template)
    mark_output(staged, EXPORT_COMMAND, run=str(checkpoint.parent.parent.resolve()), checkpoint=str(checkpoint.resolve()),
                step=int(state["step"]))
    return publish_dir(staged, final), state
