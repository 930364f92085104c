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


def merge_adapter(adapter: str, out_dir: str, base: str | None = None, dtype="auto") -> Path:
    """Merge a LoRA adapter into its base and write a full HF checkpoint that ``AutoModel`` loads strictly.

    ``base`` defaults to the base model recorded in the adapter. The tokenizer is written too.
    """
    from dare.models.loading import adapter_base, load_model, load_tokenizer, loading_errors

    base = base or adapter_base(adapter)
    with loading_errors(base, adapter):  # e.g. an adapter trained on another family: one line
        model = load_model(base, adapter=adapter, dtype=dtype)
    from dare.outputs import ensure_dir, publish_dir, staging_dir

    merged = model.merge_and_unload()
    out = Path(out_dir)
    ensure_dir(out.parent, "merge output directory")
    tmp = staging_dir(out)  # renamed to out when complete: an interrupted merge never looks finished
    merged.save_pretrained(str(tmp), safe_serialization=True)
    load_tokenizer(base).save_pretrained(str(tmp))
    return publish_dir(tmp, out)
