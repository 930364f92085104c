"""Shared helpers of the CLI tests: a user's mistake ends in exactly one ``error: ...`` line and exit status 2; a
LoRA adapter directory to pass as ``--adapter``."""

import json
from pathlib import Path

from dare.cli import main


def one_line_error(capsys, *args) -> str:
    """Run ``dare ARGS`` in-process; assert exit status 2 and one ``error:`` line on stderr; return that line."""
    assert main([str(a) for a in args]) == 2, args
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def lora_adapter(out: Path, base: str) -> Path:
    """A LoRA adapter directory as peft writes it (tiny LLaDA, r=2), recording ``base`` as its base model."""
    from peft import LoraConfig, get_peft_model

    from dare.models.spec import family_of
    from dare.models.tiny import tiny_model

    model = tiny_model("llada", seed=0)
    get_peft_model(model, LoraConfig(r=2, target_modules=family_of(model).lora_targets)).save_pretrained(str(out))
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))
    return out
