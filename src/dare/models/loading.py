"""Loading models, tokenizers and LoRA adapters by path - the one entry point rollout/eval/training call.

``path`` is a HF checkpoint directory (or hub name), or ``tiny:FAMILY[:SEED]`` for a tiny random model of a
registered family built on the fly (DARE's byte tokenizer; handy for tests and demos).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from dare.errors import (
    ConfigError, DareError, InputError, and_join, closest, closest_name, described, first_line, wrong_type,
)

log = logging.getLogger("dare.models")

TINY_PREFIX = "tiny:"
CHECKPOINT = "a checkpoint directory, hub name or tiny:FAMILY"
"""What the ``path`` of :func:`load_model` / :func:`load_tokenizer` names (for one-line errors)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype) -> torch.dtype | None:
    """``torch.dtype``, a name (``bfloat16``), or ``auto``/None (keep the checkpoint's dtype)."""
    if isinstance(dtype, torch.dtype) and not dtype.is_floating_point:
        raise ConfigError(f"dtype {dtype} is not a floating-point dtype (float32, bfloat16, float16)")
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise wrong_type("dtype", dtype, "a torch.dtype or its name (float32, bfloat16, float16, auto)",
                         error=ConfigError)
    if dtype == "auto":
        return None
    if dtype not in DTYPES:
        from dare.errors import unknown_choice

        raise unknown_choice("dtype", dtype, [*DTYPES, "auto"])
    return DTYPES[dtype]


@contextmanager
def loading_errors(path: str, adapter: str | None = None) -> Iterator[None]:
    """Turn what loading model ``path`` (with ``adapter``) raises into a one-line :class:`InputError`: an
    unreadable checkpoint, or an adapter whose target modules the model lacks (peft's error is a ValueError)."""
    try:
        yield
    except DareError:
        raise
    except loading_exceptions() as err:
        kind = "tiny model" if parse_tiny(path) else "model"
        with_adapter = f" with adapter {adapter}" if adapter else ""
        hint = "; a .safetensors file may be truncated or corrupt" if not isinstance(err, (OSError, ValueError)) else ""
        raise InputError(f"cannot load {kind} {path}{with_adapter}: {first_line(err)}{hint}") from None


def loading_exceptions() -> tuple[type[BaseException], ...]:
    """What loading a checkpoint raises for an unreadable one: ``OSError`` / ``ValueError`` (transformers, peft)
    and safetensors' ``SafetensorError`` (a damaged weights file; it derives from ``Exception`` alone)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - transformers requires safetensors
        return OSError, ValueError
    return OSError, ValueError, SafetensorError


def parse_tiny(path: str) -> tuple[str, int] | None:
    """``tiny:llada:3`` -> ``("llada", 3)``; None for other paths."""
    if not str(path).startswith(TINY_PREFIX):
        return None
    family, _, seed = str(path)[len(TINY_PREFIX):].partition(":")
    try:
        return family, int(seed) if seed else 0
    except ValueError:
        raise ConfigError(f"tiny model spec '{path}' must look like tiny:FAMILY or tiny:FAMILY:SEED") from None


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""What a Hugging Face hub name looks like (``name`` or ``owner/name``); other missing paths are local typos."""
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def local_path(path: str, missing: str) -> Path | None:
    """``path`` as an existing local path; None when it does not exist but looks like a hub name (transformers
    resolves it); else the one-line :class:`ConfigError` ``missing``."""
    local = Path(path).expanduser()
    if local.exists():
        return local
    if str(path).startswith((".", "/", "~")) or not HUB_NAME.fullmatch(str(path)):
        raise ConfigError(missing)
    return None


def sibling_hint(path: str) -> str:
    """`` (did you mean DIR/NAME?)`` for a missing ``path`` whose folder holds a directory of a close name (a
    training checkpoint's zero-padded one for ``checkpoints/step_40``: ``step_00000040``), else empty."""
    local = Path(path).expanduser()
    folder = local.parent
    if local.exists() or not folder.is_dir():
        return ""
    names = [entry.name for entry in folder.iterdir() if entry.is_dir()]
    step = re.fullmatch(r"step_?(\d+)", local.name)
    padded = f"step_{int(step.group(1)):08d}" if step else None
    hint = padded if padded in names else closest_name(local.name, names)
    return f" (did you mean {folder / hint}?)" if hint else ""


def check_checkpoint_path(path: str) -> Path | None:
    """One-line :class:`ConfigError` for a local checkpoint path that cannot hold a model, without reading any
    weights: the cheap check every loader (:func:`load_model`, :func:`family_of_path`) and ``dare train --dry-run``
    / ``dare eval opencompass`` make before loading.

    A local ``path`` must be a directory (not missing, not a file) with ``config.json`` and weight files; its
    ``config.json`` must parse as a JSON object naming a ``model_type`` DARE loads (:func:`check_model_type`); its
    safetensors weights (``model.safetensors``, or every shard ``model.safetensors.index.json`` names) must exist
    and have a readable header that fits the file (:func:`check_safetensors_file`). Only each file's 8-byte length
    and JSON header are read (a few KiB per file, also for an 8B checkpoint): a truncated or overwritten file is
    found, but not damage inside the tensor data (loading then says so in one line, :func:`loading_errors`).
    ``*.bin`` weights are not read.

    Returns the local directory; None when ``path`` does not exist but looks like a hub name (nothing checked: the
    hub is asked when the model loads).
    """
    local = local_path(path, f"model path {path}: no such checkpoint directory{sibling_hint(path)}")
    if local is None:
        return None
    if not local.is_dir():
        raise ConfigError(f"model path {path} is a file; expected a checkpoint directory")
    if not (local / "config.json").is_file():
        hint = cli_hint = ""
        if (local / "adapter_config.json").is_file():
            hint = (f"; it is a LoRA adapter: load it on top of its base model (load_model(BASE, adapter={str(path)!r})) "
                    f"or merge it first (dare.models.lora.merge_adapter({str(path)!r}, OUT_DIR))")
            cli_hint = (f"; it is a LoRA adapter: load it on top of its base model (dare eval run --adapter) or merge "
                        f"it first (dare merge-lora --adapter {path} --out DIR)")
        elif (local / "final").is_dir():
            hint = f"; it looks like a training run directory: its weights are in {local / 'final'}"
        else:
            training = training_checkpoint_message(path, local)
            if training:
                raise ConfigError(training)
        said = f"{path} is not a model checkpoint (no config.json)"
        raise ConfigError(f"{said}{hint}", cli=f"{said}{cli_hint or hint}")
    if not any(next(local.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ConfigError(f"{path} is not a model checkpoint (config.json but no weights: *.safetensors or *.bin)")
    check_model_type(path, read_json_file(path, local / "config.json"))
    for file in safetensors_files(path, local):
        check_safetensors_file(path, file)
    return local


TRAINER_STATE = "trainer_state.pt"
"""The file every complete ``dare train`` checkpoint (``RUN/checkpoints/step_N``) holds
(:mod:`dare.trainer.checkpoint`)."""


def training_run_of(local: Path) -> Path | None:
    """The ``dare train`` output directory that ``local`` is a resumable checkpoint of (``RUN/checkpoints/step_N``,
    or ``RUN/checkpoints`` itself, or a run without an export); None for anything else."""
    if local.name == "checkpoints" and any(local.glob(f"step_*/{TRAINER_STATE}")):
        return local.parent
    if (local / TRAINER_STATE).is_file() and local.parent.name == "checkpoints":
        return local.parent.parent
    if any((local / "checkpoints").glob(f"step_*/{TRAINER_STATE}")):
        return local
    return None


def training_checkpoint_message(path: str, local: Path) -> str | None:
    """The one-line error for a ``dare train`` checkpoint (model, optimizer and trainer state in
    torch.distributed.checkpoint shards, which no loader reads as a model) given as a model: it names the run's
    export ``RUN/final``, or the command that writes it, and ``dare export`` for the weights of one checkpoint; None
    when ``local`` is not part of a training run."""
    run = training_run_of(local)
    if run is None:
        return None
    if run == local:
        what = f"{path} is a training run directory"
    else:
        holds = "holds training checkpoints" if local.name == "checkpoints" else "is a training checkpoint"
        what = f"{path} {holds} (the state `dare train` resumes from), not a model checkpoint"
    if (local / TRAINER_STATE).is_file():
        step = f"; `dare export {path}` writes this checkpoint's weights as a model"
    else:
        step = f"; `dare export {run / 'checkpoints' / 'step_N'}` writes the weights of step N as a model"
    final = run / "final"
    if (final / "config.json").is_file():
        return f"{what}; load the run's export instead: {final} (the weights at the end of the run){step}"
    if (final / ADAPTER_CONFIG).is_file():
        return (f"{what}; load the run's export instead: {final}, a LoRA adapter (on top of the base model it "
                f"records: dare eval run --adapter {final}){step}")
    config = run / "config.yaml"
    if config.is_file():
        return (f"{what}, and the run has no export ({final}) yet: `dare train {config} trainer.resume=auto "
                f"trainer.export=true` writes it from the latest checkpoint (finishing the run first if it stopped "
                f"early){step}")
    return f"{what}; load the export of its run ({final}), which this run has not written{step}"


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
ADAPTER_CONTENTS = ("a LoRA adapter directory holds adapter_config.json and adapter_model.safetensors (or "
                    "adapter_model.bin), as LoRA training writes them to RUN/final")


def check_adapter_path(adapter: str) -> Path | None:
    """One-line :class:`ConfigError` for a local LoRA adapter path that cannot be loaded, without reading any
    weights: the cheap check :func:`load_model` (so ``dare generate`` / ``dare eval run --adapter``, the lm-eval
    model and ``dare merge-lora``) and the OpenCompass config check make before the base model loads.

    A local ``adapter`` must be a directory (not missing, not a file) holding ``adapter_config.json`` - valid JSON,
    an object naming its ``peft_type`` as peft writes it - and adapter weights (``adapter_model.safetensors``,
    whose header is checked as a checkpoint's, or ``adapter_model.bin``). A full model checkpoint or a training run
    directory given as the adapter is named as such.

    Returns the local directory; None when ``adapter`` does not exist but looks like a hub name (nothing checked:
    peft asks the hub when the adapter loads)."""

    def not_adapter(reason: str, hint: str = ADAPTER_CONTENTS) -> str:
        return f"{adapter} is not a LoRA adapter directory ({reason}); {hint}"

    local = local_path(adapter, not_adapter("no such directory"))
    if local is None:
        return None
    if not local.is_dir():
        raise ConfigError(not_adapter("it is a file"))
    config_file = local / ADAPTER_CONFIG
    if not config_file.is_file():
        if (local / "config.json").is_file():
            raise ConfigError(not_adapter(f"no {ADAPTER_CONFIG}", "it holds a full model checkpoint (config.json): "
                                                                  "load it as the model, without an adapter"))
        if (local / "final" / ADAPTER_CONFIG).is_file():
            raise ConfigError(not_adapter(f"no {ADAPTER_CONFIG}", "it looks like a training run directory: its "
                                                                  f"adapter is in {local / 'final'}"))
        run = training_run_of(local)
        if run is not None and (run / "final" / ADAPTER_CONFIG).is_file():
            raise ConfigError(not_adapter(f"no {ADAPTER_CONFIG}", "it is a training checkpoint (the state `dare "
                                                                  f"train` resumes from); the run's adapter is in "
                                                                  f"{run / 'final'}"))
        raise ConfigError(not_adapter(f"no {ADAPTER_CONFIG}"))
    config = read_json_file(adapter, config_file, kind="adapter")
    if not isinstance(config, dict):
        raise ConfigError(f"adapter {adapter}: {ADAPTER_CONFIG} must hold a JSON object; got {described(config)}")
    if not isinstance(config.get("peft_type"), str) or not config["peft_type"]:
        raise ConfigError(f"adapter {adapter}: {ADAPTER_CONFIG} names no peft_type, so it is no PEFT adapter "
                          f"config; {ADAPTER_CONTENTS}")
    weights = [local / name for name in ADAPTER_WEIGHTS if (local / name).is_file()]
    if not weights:
        raise ConfigError(not_adapter(f"{ADAPTER_CONFIG} but no adapter weights: {' or '.join(ADAPTER_WEIGHTS)}"))
    if weights[0].suffix == ".safetensors":
        check_safetensors_file(adapter, weights[0], kind="adapter")
    return local


def read_json_file(path: str, file: Path, kind: str = "model") -> Any:
    """The parsed JSON file ``file`` of ``kind`` (model, adapter) ``path``: one-line :class:`ConfigError` when it
    cannot be read or is not valid JSON (with the line and column of the first mistake)."""
    try:
        text = file.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{kind} {path}: cannot read {file.name} ({err.strerror or first_line(err)})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{kind} {path}: {file.name} is not valid JSON (not UTF-8 text)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{kind} {path}: {file.name} is not valid JSON (line {err.lineno} column {err.colno}: "
                          f"{err.msg})") from None


def known_model_types() -> list[str]:
    """The config.json ``model_type`` values DARE loads, those of its families' config classes (the released
    LLaDA-MoE config says ``llada``, dispatched to LLaDA-MoE on ``num_experts``)."""
    from dare.models.spec import FAMILIES

    return sorted({spec.config_class.model_type for spec in FAMILIES.values()}, key=str.lower)


def check_model_type(path: str, config: Any) -> None:
    """One-line :class:`ConfigError` unless ``config`` (model ``path``'s parsed config.json) is a JSON object whose
    ``model_type`` is one DARE loads (:func:`known_model_types`): the one check of a config's model type, for local
    checkpoints before loading and for hub models after."""
    if not isinstance(config, dict):
        raise ConfigError(f"model {path}: config.json must hold a JSON object; got {described(config)}")
    from dare.models.spec import FAMILIES

    types = known_model_types()
    listing = f"DARE loads model_type {', '.join(types[:-1])} or {types[-1]} (families {', '.join(sorted(FAMILIES))})"
    model_type = config.get("model_type")
    if model_type in types:
        return
    if model_type is None or model_type == "":
        raise ConfigError(f"model {path}: config.json has no model_type; {listing}")
    hint = closest(str(model_type), types) if isinstance(model_type, str) else None
    did_you_mean = f" (did you mean '{hint}'?)" if hint else ""
    shown = repr(model_type) if isinstance(model_type, str) else described(model_type)
    raise ConfigError(f"model {path}: config.json has model_type {shown}, not a DARE model{did_you_mean}; {listing}")


SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_HEADER_LIMIT = 100_000_000
"""The largest header the safetensors library reads (bytes)."""


def safetensors_files(path: str, local: Path) -> list[Path]:
    """The safetensors files transformers loads from checkpoint directory ``local``: every shard its
    ``model.safetensors.index.json`` names (one-line :class:`ConfigError` for an unreadable index or a missing
    shard), else ``model.safetensors`` when present, else none."""
    index = local / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = read_json_file(path, index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConfigError(f"model {path}: {SAFETENSORS_INDEX} has no weight_map of tensor names to files")
        shards = [local / name for name in sorted(set(weight_map.values()))]
        missing = [shard.name for shard in shards if not shard.is_file()]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            named = and_join(missing[:3] + ([f"{len(missing) - 3} more"] if len(missing) > 3 else []))
            raise ConfigError(f"model {path}: {SAFETENSORS_INDEX} names {named}, which {verb} missing; the "
                              "checkpoint is incomplete")
        return shards
    single = local / "model.safetensors"
    return [single] if single.is_file() else []


def check_safetensors_file(path: str, file: Path, kind: str = "model") -> None:
    """One-line :class:`ConfigError` unless ``file`` (a weights file of ``kind`` (model, adapter) ``path``) starts
    with a readable safetensors header - an 8-byte length, then that many bytes of JSON - whose tensors all end
    within the file. Reads the header alone, never the tensor data."""

    def unreadable(reason: str, likely: str = "truncated") -> ConfigError:
        return ConfigError(f"{kind} {path}: {file.name} is not a readable safetensors file ({reason}); the file may "
                           f"be {likely}")

    try:
        size = file.stat().st_size
        with open(file, "rb") as handle:
            prefix = handle.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else None
            if length is None or length > size - 8:
                raise unreadable("invalid header length")
            if length > SAFETENSORS_HEADER_LIMIT:
                raise unreadable("header too large", "corrupt")
            raw = handle.read(length)
    except OSError as err:
        raise ConfigError(f"{kind} {path}: cannot read {file.name} ({err.strerror or first_line(err)})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        end = max((int(e) for e in ends), default=0)
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise unreadable("invalid header", "corrupt") from None
    if 8 + length + end > size:
        raise unreadable(f"its header describes {8 + length + end} bytes, the file has {size}")


def check_path_argument(argument: str, value: Any, expected: str, optional: bool = False) -> None:
    """One-line :class:`ConfigError` unless ``value`` is a path (``str`` or ``os.PathLike``; None too when
    ``optional``): a loaded model given where its path belongs is named as such."""
    if isinstance(value, (str, os.PathLike)) or (optional and value is None):
        return
    hint = "that is a loaded model; pass the directory it was saved to" if isinstance(value, torch.nn.Module) else ""
    raise wrong_type(argument, value, f"{expected} (str or pathlib.Path)" + (" or None" if optional else ""), hint,
                     ConfigError)


def resolve_load_device(device: Any) -> torch.device | None:
    """The ``device`` argument of :func:`load_model` checked like ``--device`` (a name, a ``torch.device`` or a CUDA
    index; None leaves the model where it is built): one-line :class:`ConfigError` for anything else."""
    from dare.devices import resolve_device

    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    if isinstance(device, (str, torch.device)):
        return resolve_device(str(device), "device")  # CUDA without CUDA, a misspelt device: one line
    raise wrong_type("device", device, "a device name ('cpu', 'cuda:0'), a torch.device or None", error=ConfigError)


def check_model_object(model: Any) -> None:
    """One-line :class:`InputError` unless ``model`` is a torch module (a DARE model, possibly peft-wrapped or
    compiled): a path is pointed to :func:`load_model`, a tokenizer is named as one (arguments swapped)."""
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, (str, os.PathLike)):
        hint = f"load it first with dare.models.load_model({str(model)!r})"
    elif callable(getattr(model, "decode", None)):
        hint = "that is a tokenizer (model and tokenizer swapped?)"
    else:
        hint = "load one with dare.models.load_model(path)"
    raise wrong_type("model", model, "a DARE model", hint)


def load_model(path: str, adapter: str | None = None, *, dtype="float32", device="cpu", trainable: bool = False):
    """Load a DARE model (strictly) and optionally a peft LoRA adapter on top.

    Args:
        path: checkpoint directory / hub name, or ``tiny:FAMILY[:SEED]``.
        adapter: directory written by LoRA training (``adapter_config.json`` + weights) or a hub adapter id, or
            None; a local one is checked (:func:`check_adapter_path`) before the base model loads.
        dtype: ``torch.dtype`` or name; ``auto`` keeps the checkpoint's dtype.
        device: where to put the model.
        trainable: keep the adapter trainable (resume LoRA training); default frozen (eval/rollout).
    Returns the model in eval mode (a ``peft.PeftModel`` when ``adapter`` is given).
    """
    check_path_argument("path", path, CHECKPOINT)
    check_path_argument("adapter", adapter, "a LoRA adapter directory", optional=True)
    torch_dtype = resolve_dtype(dtype)
    device = resolve_load_device(device)
    tiny = parse_tiny(path)
    # config.json, model_type, weight files and their headers of both: one line before any weights load
    local = None if tiny is not None else check_checkpoint_path(path)
    if adapter is not None:
        check_adapter_path(adapter)
        warn_other_base(adapter, path)
    if tiny is not None:
        from dare.models.tiny import tiny_model

        model = tiny_model(tiny[0], seed=tiny[1], dtype=torch_dtype or torch.float32)
        model.config._name_or_path = str(path)
        model.name_or_path = str(path)  # peft records it as the adapter's base model
    else:
        from transformers import AutoModel

        kwargs = {"dtype": torch_dtype} if torch_dtype is not None else {"dtype": "auto"}
        from dare.progress import hf_progress_bars

        # what the cheap check cannot see (damaged tensor data, ...): one line; transformers' loading bar only on
        # a terminal (in a log its \r redraws run together)
        with loading_errors(path), hf_progress_bars(True):
            try:
                model = AutoModel.from_pretrained(str(path), **kwargs)
            except OSError as err:
                if local is not None:
                    raise
                # a hub name that cannot be fetched (offline, private, misspelt)
                offline = "" if os.environ.get("HF_HUB_OFFLINE") else \
                    "; without a network, HF_HUB_OFFLINE=1 skips the retries"
                raise ConfigError(f"model {path}: no such local directory, and the hub did not provide it "
                                  f"({first_line(err)}){offline}") from None
        if local is None:  # a hub model of a type transformers knows but DARE does not (an AR model, ...)
            check_model_type(path, {"model_type": getattr(model.config, "model_type", None)})
    model = model.to(device)
    if adapter is not None:
        from peft import PeftModel

        with loading_errors(path, adapter):  # e.g. an adapter trained on another family: one line
            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
        model = model.to(device)
    return model.eval()


def family_of_path(path: str):
    """The :class:`~dare.models.spec.FamilySpec` of the model at ``path`` (``tiny:FAMILY[:SEED]``, a checkpoint
    directory or a hub name), read from its ``config.json`` alone: no weights are loaded."""
    from dare.models.spec import family_of, get_family

    tiny = parse_tiny(path)
    if tiny is not None:
        return get_family(tiny[0])
    check_checkpoint_path(path)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as err:  # offline / private hub name, a model_type transformers does not know
        raise ConfigError(f"model {path}: cannot read its config ({first_line(err)})") from None
    return family_of(config)


def load_tokenizer(path: str):
    """The tokenizer of a model path (``tiny:*`` -> DARE's byte tokenizer); transformers' errors as they are (see
    :func:`tokenizer_for_model` for one-line ones)."""
    check_path_argument("path", path, CHECKPOINT)
    if parse_tiny(path) is not None:
        from dare.data.tokenizer import build_byte_tokenizer

        return build_byte_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
"""Files of which a tokenizer directory holds at least one."""


def adapter_tokenizer(adapter: str | None) -> Path | None:
    """The local LoRA ``adapter`` directory when it holds tokenizer files (:data:`TOKENIZER_FILES`): LoRA training
    saves the run's tokenizer next to the adapter in ``RUN/final`` - without its chat template when the run encoded
    its data without it (``data.chat_template: false``) -, so prompts are read as the run trained. None without an
    adapter, for a hub adapter, a path that is no adapter directory (:func:`check_adapter_path` names what it is when
    the adapter loads) and an adapter saved without tokenizer files (the base model's tokenizer is used)."""
    if adapter is None or not isinstance(adapter, (str, Path)):
        return None
    local = Path(adapter).expanduser()
    if not (local / ADAPTER_CONFIG).is_file() or not any((local / name).is_file() for name in TOKENIZER_FILES):
        return None
    return local


def tokenizer_for_model(path: str, tokenizer: str | None = None, adapter: str | None = None):
    """The tokenizer to decode with model ``path`` (with LoRA ``adapter`` applied when given): the one at
    ``tokenizer`` (a directory, hub name or ``tiny:FAMILY``) when given - for a checkpoint saved without its
    tokenizer files -, else the adapter directory's when it holds one (:func:`adapter_tokenizer`), else the model's
    own; checked first (:func:`check_model_tokenizer`). A tokenizer transformers cannot build is a one-line error
    (:func:`tokenizer_error`)."""
    source = check_model_tokenizer(path, tokenizer, adapter)
    try:
        return load_tokenizer(source)
    except (OSError, ValueError, KeyError) as err:
        if tokenizer is None and adapter_tokenizer(adapter) is not None:  # the one saved with the adapter
            problem = f"cannot load the tokenizer saved with it ({one_line(err)})"
            hint = "the directory or hub name of its tokenizer, e.g. its base model"
            raise ConfigError(f"adapter {adapter}: {problem}; pass tokenizer=PATH ({hint})",
                              cli=f"--adapter {adapter}: {problem}; pass --tokenizer PATH ({hint})") from None
        raise tokenizer_error(path, tokenizer, f"cannot load its tokenizer ({one_line(err)})") from None


def check_model_tokenizer(path: str, tokenizer: str | None = None, adapter: str | None = None) -> str:
    """The cheap check before model ``path``'s weights load that its tokenizer can be found: ``tokenizer`` when given,
    else the LoRA ``adapter`` directory when it holds tokenizer files (:func:`adapter_tokenizer`), else the model's
    directory, must hold tokenizer files (:data:`TOKENIZER_FILES`; hub names and ``tiny:FAMILY`` are not checked).
    The model path is checked first (:func:`check_checkpoint_path`: a training checkpoint or run directory is named
    as such, not as a directory without a tokenizer). A model directory without tokenizer files points to the
    ``tokenizer`` argument (``--tokenizer`` on the command line). Returns where the tokenizer loads from."""
    check_path_argument("path", path, CHECKPOINT)
    check_path_argument("tokenizer", tokenizer, "a tokenizer directory, hub name or tiny:FAMILY", optional=True)
    model_dir = check_checkpoint_path(path) if parse_tiny(path) is None else None
    saved = adapter_tokenizer(adapter) if tokenizer is None else None
    if saved is not None:  # the run's own tokenizer, saved next to its adapter
        return str(saved)
    source = path if tokenizer is None else tokenizer
    if parse_tiny(source) is not None:
        return source
    local = model_dir if tokenizer is None else local_tokenizer(path, tokenizer)
    if local is not None and not local.is_dir():
        raise tokenizer_error(path, tokenizer, "is a file; expected a tokenizer (or model) directory")
    if local is not None and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise tokenizer_error(path, tokenizer, f"has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)")
    return source


def local_tokenizer(path: str, tokenizer: str) -> Path | None:
    """``tokenizer`` as an existing local path; None for a hub name; a missing local path is a one-line error."""
    try:
        return local_path(tokenizer, "")
    except ConfigError:
        raise tokenizer_error(path, tokenizer, "no such directory") from None


def tokenizer_error(path: str, tokenizer: str | None, problem: str) -> ConfigError:
    """The one-line error for a tokenizer that cannot be loaded: ``tokenizer`` (``--tokenizer`` on the command line)
    when given, else model ``path``'s own, with a hint to pass one."""
    if tokenizer is not None:
        return ConfigError(f"tokenizer {tokenizer}: {problem}", cli=f"--tokenizer {tokenizer}: {problem}")
    hint = "the directory or hub name of its tokenizer, e.g. the model it was trained from"
    return ConfigError(f"model {path}: {problem}; pass tokenizer=PATH ({hint})",
                       cli=f"--model {path}: {problem}; pass --tokenizer PATH ({hint})")


def one_line(err: BaseException, limit: int = 200) -> str:
    """``err``'s whole message on one line, cut to ``limit`` characters (transformers' tokenizer errors span several
    lines, and the first alone is often a heading ending in a colon)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, KeyError):  # a damaged tokenizer file: str() is just the key
        text = f"no {text} entry in its files"
    return text if len(text) <= limit else text[:limit].rstrip() + " ..."


def recorded_base(adapter: str) -> str | None:
    """The base model recorded in the ``adapter_config.json`` of adapter directory ``adapter`` (None: none, or no
    local adapter directory: a hub adapter)."""
    config_path = Path(adapter).expanduser() / ADAPTER_CONFIG
    if not config_path.is_file():
        return None
    config = read_json_file(adapter, config_path, kind="adapter")
    return (config.get("base_model_name_or_path") if isinstance(config, dict) else None) or None


def adapter_base(adapter: str) -> str:
    """The base model recorded in an adapter's ``adapter_config.json`` (one-line errors for an adapter directory
    :func:`check_adapter_path` refuses, a hub adapter and a config without one)."""
    local = check_adapter_path(adapter)
    if local is None:
        raise ConfigError(f"adapter {adapter} is no local directory, so the base model it records is not read "
                          "here; pass --base")
    base = recorded_base(adapter)
    if not base:
        raise ConfigError(f"{local / ADAPTER_CONFIG} does not name its base model; pass --base")
    return base


def same_model(a: str, b: str) -> bool:
    """True when model paths ``a`` and ``b`` name the same model: equal ``tiny:`` family and seed (``tiny:llada`` is
    ``tiny:llada:0``), the same local directory (links and relative paths resolved), else equal names."""
    tiny_a, tiny_b = parse_tiny(a), parse_tiny(b)
    if tiny_a is not None or tiny_b is not None:
        return tiny_a == tiny_b
    local_a, local_b = Path(a).expanduser(), Path(b).expanduser()
    if local_a.exists() and local_b.exists():
        return local_a.resolve() == local_b.resolve()
    return str(a).rstrip("/") == str(b).rstrip("/")


def warn_other_base(adapter: str, path: str) -> None:
    """One warning when the LoRA adapter in ``adapter`` records another base model than ``path``: loading it there
    is allowed (a copy of the base, a fine-tuned sibling), but usually a slip that gives meaningless outputs."""
    recorded = recorded_base(adapter)
    if recorded and not same_model(str(recorded), str(path)):
        log.warning(f"warning: adapter {adapter} was trained on {recorded}; loading it on {path}")


@contextmanager
def evaluating(model):
    """Eval mode (no dropout) for the duration of the block, then the previous mode. A model already in eval
    mode is left alone (switching walks every module: ~50 ms on LLaDA-8B with LoRA adapters)."""
    if not model.training:
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        model.train()


def unwrap(model):
    """The underlying :class:`~dare.models.DiffusionLM` of a peft / compiled wrapper."""
    inner = model
    for _ in range(4):
        if hasattr(inner, "get_base_model"):
            inner = inner.get_base_model()
        elif hasattr(inner, "_orig_mod"):
            inner = inner._orig_mod
        else:
            break
    return inner
