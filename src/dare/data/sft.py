"""SFT data: read records, tokenize (chat template, EOS padding), collate padded or packed micro-batches.

A micro-batch is a ``tensordict.TensorDict`` with per-token fields ``[R, S]``:

* ``input_ids`` (long), ``maskable`` (bool: response tokens incl. trained EOS padding),
  ``example_index`` (long: global example index per token, ``-1`` on padding),
* ``attention_mask`` (long, padded layout) or ``cu_seqlens`` (``[1, D + 1]``, packed layout, ``R = 1``).
"""

from __future__ import annotations

import array
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

from dare.errors import ConfigError, InputError

SYNTHETIC_PREFIX = "synthetic:"
DEFAULT_SYNTHETIC_SIZE = 512


@dataclass(frozen=True)
class Example:
    """A tokenized example: ``ids = prompt + response``; positions ``>= prompt_len`` are the answer."""

    ids: tuple[int, ...]
    prompt_len: int
    index: int

    def __len__(self) -> int:
        return len(self.ids)


def check_data_path(path: str) -> None:
    """The checks of :func:`read_records` that read nothing: a known ``synthetic:TASK``, an existing file."""
    if path.startswith(SYNTHETIC_PREFIX):
        from dare.data.synthetic import check_task

        check_task(path[len(SYNTHETIC_PREFIX):])
        return
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"data file {path} is a directory; expected a .jsonl, .json or .parquet file")
    if not file.is_file():
        raise ConfigError(f"data file {path} does not exist")


def read_records(path: str, limit: int | None = None, seed: int = 0) -> list[dict]:
    """Records from a ``.jsonl`` / ``.json`` / ``.parquet`` file or ``synthetic:TASK`` (the first ``limit``,
    a positive number or None for all)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"data.num_examples must be a positive integer or null; got {limit}")
    check_data_path(path)
    if path.startswith(SYNTHETIC_PREFIX):
        from dare.data.synthetic import synthetic_records

        return synthetic_records(path[len(SYNTHETIC_PREFIX):], limit or DEFAULT_SYNTHETIC_SIZE, seed)
    file = Path(path)
    if file.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading parquet needs pyarrow: pip install pyarrow") from None
        records = pq.read_table(file).to_pylist()
    elif file.suffix == ".json":
        records = json.loads(file.read_text())
        if not isinstance(records, list):
            raise InputError(f"{path}: expected a JSON list of records")
    else:
        records = []
        with file.open() as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise InputError(f"{path}:{number}: invalid JSON ({err.msg})") from None
    if not records:
        raise InputError(f"data file {path} holds no records")
    return records[:limit] if limit is not None else records


def _messages(record: dict, cfg, number: int) -> tuple[list[dict], str]:
    """(prompt messages, response text) of a chat or prompt/response record."""
    if cfg.messages_key in record:
        messages = record[cfg.messages_key]
        if not messages or messages[-1].get("role") != "assistant":
            raise InputError(f"record {number}: the last message must be the assistant's response")
        return list(messages[:-1]), messages[-1]["content"]
    if cfg.prompt_key in record and cfg.response_key in record:
        return [{"role": "user", "content": record[cfg.prompt_key]}], record[cfg.response_key]
    raise InputError(
        f"record {number} has neither '{cfg.messages_key}' nor '{cfg.prompt_key}'/'{cfg.response_key}' "
        f"(keys: {', '.join(sorted(record))})"
    )


def tokenize_record(record: dict, tokenizer, cfg, eos_id: int, number: int = 0) -> tuple[list[int], list[int]]:
    """``(prompt_ids, response_ids)`` of one record, response ending with EOS / EOS padding per ``cfg``."""
    prompt_messages, response = _messages(record, cfg, number)
    if cfg.chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template; set data.chat_template=false")
        prompt = list(tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
        full = list(tokenizer.apply_chat_template(prompt_messages + [{"role": "assistant", "content": response}],
                                                  tokenize=True, return_dict=False))
        if full[:len(prompt)] == prompt:
            answer = full[len(prompt):]
        else:  # templates that rewrite earlier turns: fall back to the raw response text
            answer = tokenizer(response, add_special_tokens=False).input_ids
    else:
        text = "\n".join(m["content"] for m in prompt_messages)
        prompt = tokenizer(text, add_special_tokens=True).input_ids
        answer = tokenizer(response, add_special_tokens=False).input_ids
    if cfg.append_eos and (not answer or answer[-1] != eos_id):
        answer.append(eos_id)
    if cfg.pad_response_to is not None and len(answer) < cfg.pad_response_to:
        answer += [eos_id] * (cfg.pad_response_to - len(answer))
    if not answer:
        raise InputError(f"record {number}: empty response")
    return prompt, answer


@dataclass
class SFTDataset:
    """Tokenized examples plus how many records were dropped for being longer than ``max_length``."""

    examples: list[Example]
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.examples)


def build_sft_dataset(cfg, tokenizer, eos_id: int, seed: int = 0, progress: bool = False) -> SFTDataset:
    """Read and tokenize ``cfg.path`` (a :class:`~dare.trainer.config.DataConfig`)."""
    records = read_records(cfg.path, cfg.num_examples, seed)
    iterator = records
    if progress:
        from dare.progress import progress_bar

        iterator = progress_bar(len(records), "tokenizing", leave=False, iterable=records)
    examples, dropped = [], 0
    for number, record in enumerate(iterator):
        prompt, answer = tokenize_record(record, tokenizer, cfg, eos_id, number)
        if len(prompt) + len(answer) > cfg.max_length:
            if cfg.overlong == "error":
                raise InputError(f"record {number} has {len(prompt) + len(answer)} tokens > data.max_length={cfg.max_length}")
            dropped += 1
            continue
        examples.append(Example(tuple(prompt + answer), len(prompt), len(examples)))
    if not examples:
        raise InputError(f"{cfg.path}: no usable examples ({dropped} longer than data.max_length={cfg.max_length})")
    return SFTDataset(examples, dropped)


def ids_tensor(ids) -> torch.Tensor:
    """Python token ids -> 1-D long tensor through a C array (about 3x faster than ``torch.tensor`` on a tuple)."""
    if not ids:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(array.array("q", ids), dtype=torch.long)


def collate_padded(examples: list[Example], width: int, eos_id: int, pad_id: int, eos_padding: bool) -> TensorDict:
    """Right-pad examples to ``width``; EOS fill counts as answer when ``eos_padding`` (LLaDA guideline)."""
    rows = len(examples)
    ids = torch.full((rows, width), eos_id if eos_padding else pad_id, dtype=torch.long)
    maskable = torch.zeros(rows, width, dtype=torch.bool)
    example_index = torch.full((rows, width), -1, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    for r, ex in enumerate(examples):
        n = len(ex) if not eos_padding else width
        ids[r, :len(ex)] = ids_tensor(ex.ids)
        maskable[r, ex.prompt_len:n] = True
        example_index[r, :n] = ex.index
        attention[r, :n] = 1
    return TensorDict({"input_ids": ids, "maskable": maskable, "example_index": example_index,
                       "attention_mask": attention}, batch_size=[rows])


def collate_packed(examples: list[Example], length: int | None = None, pad_id: int = 0) -> TensorDict:
    """Concatenate examples into one ``[1, T]`` row with ``cu_seqlens [1, D + 1]``.

    ``length`` pads the row to exactly that many tokens with one trailing filler document (``pad_id``, not
    maskable, ``example_index = -1``): documents never attend to each other, so real tokens never see it and
    it is never trained. Fixed-length rows give every micro-batch one shape, so compiled kernels (FlexAttention,
    ``torch.compile``) are not rebuilt for each new row length (``data.fixed_shapes``).
    """
    total = sum(len(ex) for ex in examples)
    if length is not None and total > length:
        raise InputError(f"a packed row of {total} tokens does not fit in length={length}")
    docs = list(examples)
    if length is not None and length > total:  # all prompt (never maskable), example index -1
        docs.append(Example((pad_id,) * (length - total), length - total, -1))
    flat = array.array("q")
    for ex in docs:
        flat.extend(ex.ids)
    ids = torch.frombuffer(flat, dtype=torch.long) if flat else torch.zeros(0, dtype=torch.long)
    maskable = torch.cat([torch.arange(len(ex)) >= ex.prompt_len for ex in docs])
    example_index = torch.cat([torch.full((len(ex),), ex.index, dtype=torch.long) for ex in docs])
    lengths = torch.tensor([0] + [len(ex) for ex in docs])
    cu = torch.cumsum(lengths, 0).to(torch.int32)
    return TensorDict({"input_ids": ids[None], "maskable": maskable[None], "example_index": example_index[None],
                       "cu_seqlens": cu[None]}, batch_size=[1])


def pack(examples: list[Example], pack_length: int) -> list[list[Example]]:
    """Greedy in-order packing into rows of at most ``pack_length`` tokens."""
    rows, current, used = [], [], 0
    for ex in examples:
        if len(ex) > pack_length:
            raise InputError(f"example {ex.index} has {len(ex)} tokens > data.pack_length={pack_length}")
        if current and used + len(ex) > pack_length:
            rows.append(current)
            current, used = [], 0
        current.append(ex)
        used += len(ex)
    if current:
        rows.append(current)
    return rows


def dummy_micro_batch(pad_id: int) -> TensorDict:
    """A one-token micro-batch that contributes nothing (keeps FSDP collectives aligned across ranks)."""
    return TensorDict({"input_ids": torch.full((1, 1), pad_id, dtype=torch.long),
                       "maskable": torch.zeros(1, 1, dtype=torch.bool),
                       "example_index": torch.full((1, 1), -1, dtype=torch.long),
                       "attention_mask": torch.ones(1, 1, dtype=torch.long)}, batch_size=[1])
