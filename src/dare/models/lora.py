"""LoRA through peft: attach (with the family's default targets), save, merge into a full checkpoint."""

from __future__ import annotations

from pathlib import Path

from dare.errors import ConfigError, first_line


def apply_lora(model, r: int = 16, alpha: int = 32, dropout: float = 0.0, target_modules: str | None = None):
    """Wrap ``model`` in a trainable peft LoRA model (base weights frozen).

    ``target_modules`` is a regex over module paths; default ``dare.family_of(model).lora_targets``.
    """
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of

    targets = target_modules or family_of(model).lora_targets
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    try:
        return get_peft_model(model, config)
    except ValueError as err:
        raise ConfigError(f"LoRA target_modules '{targets}' matches no module ({first_line(err)})") from None


def merge_adapter(adapter: str, out_dir: str, base: str | None = None, dtype="auto",
                  what: str = "merge output directory") -> Path:
    """Merge a LoRA adapter into its base and write a full HF checkpoint that ``AutoModel`` loads strictly.

    ``base`` defaults to the base model recorded in the adapter. The tokenizer is written too, and the
    :data:`~dare.outputs.OUTPUT_MARKER` that lets a later merge replace ``out_dir``. Before the models load,
    ``out_dir`` (named ``what`` in the one-line errors) is checked: it must be new, empty or an earlier merge
    output, and neither the adapter, the base model directory nor the current directory, nor contain any of them.
    Returns ``out_dir`` made absolute.
    """
    from dare.models.loading import adapter_base, load_model, load_tokenizer, loading_errors
    from dare.outputs import (
        absolute_path, check_apart, check_replaceable, ensure_dir, mark_output, publish_dir, staging_dir,
    )

    base = base or adapter_base(adapter)
    inputs = {"the adapter directory": adapter, "the base model directory": base, "the current directory": "."}
    check_apart(out_dir, what, inputs)  # replacing out_dir would delete them
    check_replaceable(out_dir, what, "merge-lora")  # a trained model, a run or a user's files are never replaced
    out = absolute_path(out_dir)  # `--out .`: Path(".").name is empty
    ensure_dir(out.parent, what)
    with loading_errors(base, adapter):  # e.g. an adapter trained on another family: one line
        model = load_model(base, adapter=adapter, dtype=dtype)

    merged = model.merge_and_unload()
    tmp = staging_dir(out)  # renamed to out when complete: an interrupted merge never looks finished
    merged.save_pretrained(str(tmp), safe_serialization=True)
    load_tokenizer(base).save_pretrained(str(tmp))
    mark_output(tmp, "merge-lora", adapter=str(adapter), base=str(base))
    return publish_dir(tmp, out)
