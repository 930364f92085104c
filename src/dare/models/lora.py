"""LoRA through peft: attach (with the family's default targets), save, merge into a full checkpoint."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from dare.errors import ConfigError, first_line
from dare.models.lora_targets import check_lora_targets, target_pattern
from dare.outputs import (
    absolute_path, check_apart, check_replaceable, ensure_dir, mark_output, publish_dir, staging_dir,
)

log = logging.getLogger("dare.models")

MERGE_COMMAND = "merge-lora"
"""The command named in a merge output's marker (``dare merge-lora``)."""
UNMARKED_MERGE_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model",
    "vocab.json", "merges.txt", "vocab.txt",
})
"""Besides the weights, what a merge wrote before outputs were marked: the model's ``save_pretrained`` (config,
generation config, shard index) and the base tokenizer's."""
MERGE_WEIGHTS = re.compile(r"model(-\d+-of-\d+)?\.safetensors")
"""A merge's weight files (always safetensors): ``model.safetensors`` or its shards."""


def apply_lora(model, r: int = 16, alpha: int = 32, dropout: float = 0.0,
               target_modules: str | list[str] | None = None):
    """Wrap ``model`` in a trainable peft LoRA model (base weights frozen).

    ``target_modules`` is a regex over module paths or a list of module names (:func:`target_pattern`); default
    ``dare.family_of(model).lora_targets``.
    """
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of

    check_lora_targets(target_modules, model, "target_modules")  # the module names peft's own error leaves out
    targets = target_pattern(target_modules) or family_of(model).lora_targets
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise ConfigError(f"LoRA target_modules '{targets}' matches no module ({first_line(err)})") from None


def is_unmarked_merge_output(path: str | os.PathLike) -> bool:
    """True when directory ``path`` holds what a ``dare merge-lora`` from before outputs were marked wrote and nothing
    else: ``config.json`` and safetensors weights, besides them only tokenizer / generation-config / shard-index files
    (:data:`UNMARKED_MERGE_FILES`), all plain files (no sub-directory, no symlink as in a hub cache, no marker of
    any command). A training run's own checkpoint (``final/``, ``checkpoints/*``: a full fine-tune exports the same
    files) is never one."""
    path = absolute_path(path)
    if not path.is_dir() or path.is_symlink() or path.name == "final" or path.parent.name == "checkpoints":
        return False
    entries = list(path.iterdir())
    plain = all(entry.is_file() and not entry.is_symlink() for entry in entries)
    names = {entry.name for entry in entries}
    known = all(name in UNMARKED_MERGE_FILES or MERGE_WEIGHTS.fullmatch(name) for name in names)
    complete = "config.json" in names and any(MERGE_WEIGHTS.fullmatch(name) for name in names)
    return plain and known and complete


def check_merge_target(out_dir: str | os.PathLike, what: str) -> bool:
    """Check that a merge may write directory ``out_dir`` (``what`` names it in the errors): True when it holds an
    earlier merge output (marked, or unmarked from an older DARE: :func:`is_unmarked_merge_output`, replaced with a
    warning), False when it is missing or empty; anything else is :func:`~dare.outputs.check_replaceable`'s one-line
    :class:`~dare.errors.ConfigError`."""
    if is_unmarked_merge_output(out_dir):
        log.warning(f"warning: {what} {out_dir}: replacing a merged checkpoint without a marker (an earlier "
                    f"`dare {MERGE_COMMAND}` output, from before outputs were marked)")
        return True
    return check_replaceable(out_dir, what, MERGE_COMMAND)


def merge_adapter(adapter: str, out_dir: str, base: str | None = None, dtype="auto",
                  what: str = "merge output directory", tokenizer: str | None = None) -> Path:
    """Merge a LoRA adapter into its base and write a full HF checkpoint that ``AutoModel`` loads strictly.

    ``base`` defaults to the base model recorded in the adapter. The tokenizer is written too: ``tokenizer`` when
    given, else the one LoRA training saved with the adapter (``RUN/final``, without its chat template when the run
    trained without it: the merged model reads prompts as the run trained), else the base model's; and the
    :data:`~dare.outputs.OUTPUT_MARKER` that lets a later merge replace ``out_dir``. Before the models load,
    ``out_dir`` (named ``what`` in the one-line errors) is checked: it must be new, empty or an earlier merge
    output (:func:`check_merge_target`), and neither the adapter, the base model directory nor the current
    directory, nor contain any of them.
    Returns ``out_dir`` made absolute.
    """
    from dare.models.loading import adapter_base, load_model, loading_errors, tokenizer_for_model

    base = base or adapter_base(adapter)
    inputs = {"the adapter directory": adapter, "the base model directory": base, "the current directory": "."}
    check_apart(out_dir, what, inputs)  # replacing out_dir would delete them
    check_merge_target(out_dir, what)  # a trained model, a run or a user's files are never replaced
    out = absolute_path(out_dir)  # `--out .`: Path(".").name is empty
    ensure_dir(out.parent, what, target=out_dir)
    chosen = tokenizer_for_model(base, tokenizer, adapter)  # before the weights load: one-line errors
    with loading_errors(base, adapter):  # e.g. an adapter trained on another family: one line
        model = load_model(base, adapter=adapter, dtype=dtype)

    merged = model.merge_and_unload()
    tmp = staging_dir(out)  # renamed to out when complete: an interrupted merge never looks finished
    merged.save_pretrained(str(tmp), safe_serialization=True)
    chosen.save_pretrained(str(tmp))
    mark_output(tmp, MERGE_COMMAND, adapter=str(adapter), base=str(base))
    return publish_dir(tmp, out)
