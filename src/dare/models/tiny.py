"""Tiny random checkpoints (2 layers, hidden 64) for tests, demos and CI - no downloads.

``write_tiny_checkpoint("llada", DIR)`` writes ``config.json`` (released key names and ``model_type``),
``model.safetensors`` and DARE's byte tokenizer (:mod:`dare.data.tokenizer`); the directory loads with
``transformers.AutoModel.from_pretrained(DIR)`` after ``import dare``. ``DIR`` must be new, empty or an earlier tiny
checkpoint (its :data:`~dare.outputs.OUTPUT_MARKER` says ``dare tiny``): random weights never land on a trained model
or a user's files, from Python as from ``dare tiny --out``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dare.data import tokenizer as byte_tok
from dare.models.spec import get_family
from dare.outputs import check_replaceable, ensure_dir, mark_output

COMMAND = "tiny"
"""The command named in the output marker (``dare tiny``): a tiny checkpoint written from Python is the same output."""


def tiny_config(family: str, **overrides):
    """The config object of a tiny model of ``family`` using the byte tokenizer's special ids."""
    spec = get_family(family)
    raw = spec.tiny_config(
        vocab_size=byte_tok.VOCAB_SIZE, mask_token_id=byte_tok.MASK_ID, eos_token_id=byte_tok.EOS_ID,
        pad_token_id=byte_tok.PAD_ID, **overrides,
    )
    raw.setdefault("eot_token_id", byte_tok.EOT_ID)
    if raw.get("bos_token_id") is None:  # else the family's released id, outside the byte vocabulary
        raw["bos_token_id"] = byte_tok.BOS_ID
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return spec.config_class.from_dict(fields), raw["model_type"]


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A randomly initialised tiny model (weights ~ N(0, 0.02), deterministic in ``seed``). It seeds torch's global
    random state with ``seed`` (as the trainer does with ``trainer.seed``), so that what a script draws after it
    (a LoRA adapter's initial weights, a value head) is reproducible too; seed again afterwards for other draws."""
    config, _ = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    model = get_family(family).model_class(config)
    return model.to(dtype).eval()


def write_tiny_checkpoint(family: str, out_dir: str | Path, seed: int = 0, dtype: torch.dtype = torch.float32, *,
                          what: str = "out_dir", **overrides) -> Path:
    """Write a loadable HF-format tiny checkpoint of ``family`` into ``out_dir`` and return the path.

    ``out_dir`` must be missing, empty or an earlier tiny checkpoint (rewritten); anything else (e.g. ``RUN/final``)
    is a one-line :class:`~dare.errors.ConfigError` naming ``what`` (``--out`` for the command), and so is an
    unknown family, before anything is written."""
    check_replaceable(out_dir, what, COMMAND)
    get_family(family)  # an unknown family is an error before the directory is created
    out = ensure_dir(out_dir, what)
    mark_output(out, COMMAND, family=family)  # first: an interrupted write can be rerun into the same directory
    model = tiny_model(family, seed=seed, dtype=dtype, **overrides)
    model.save_pretrained(str(out), safe_serialization=True)
    _, released_model_type = tiny_config(family, **overrides)
    config_path = out / "config.json"
    saved = json.loads(config_path.read_text())
    saved["model_type"] = released_model_type  # e.g. LLaDA-MoE ships "llada", exercising the MoE dispatch
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    byte_tok.save_byte_tokenizer(out)
    return out
