"""SFT data: read records, tokenize (chat template, EOS padding), collate padded or packed micro-batches.

A micro-batch is a ``tensordict.TensorDict`` with per-token fields ``[R, S]``:

* ``input_ids`` (long), ``maskable`` (bool: response tokens incl. trained EOS padding),
  ``example_index`` (long: global example index per token, ``-1`` on padding),
* ``attention_mask`` (long, padded layout) or ``cu_seqlens`` (``[1, D + 1]``, packed layout, ``R = 1``).
"""

from __future__ import annotations

import array
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

from dare.errors import ConfigError, InputError

SYNTHETIC_PREFIX = "synthetic:"
DEFAULT_SYNTHETIC_SIZE = 512
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
"""The data file types :func:`read_records` reads."""

log = logging.getLogger("dare.data")


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
    if file.suffix.lower() in (".csv", ".tsv"):
        raise ConfigError(f"data file {path}: {file.suffix[1:].upper()} is not supported; convert it to JSONL (one "
                          '{"prompt": ..., "response": ...} object per line), .json or .parquet')
    if file.suffix not in DATA_SUFFIXES:
        raise ConfigError(f"data file {path}: unsupported file type '{file.suffix or file.name}'; expected "
                          f"{', '.join(DATA_SUFFIXES[:-1])} or {DATA_SUFFIXES[-1]}")


class Records(list):
    """The records of a data source, knowing where each one is read from, so that an error names the file (and the
    line of a JSONL file): ``lines[n]`` is the line of record ``n`` (None: not a JSONL file)."""

    def __init__(self, records, path: str, lines: list[int] | None = None):
        super().__init__(records)
        self.path, self.lines = path, lines

    def where(self, number: int) -> str:
        """``FILE:LINE: record N`` (JSONL) or ``FILE: record N`` for record ``number`` (0-based): an error's subject."""
        line = f":{self.lines[number]}" if self.lines is not None else ""
        return f"{self.path}{line}: record {number}"


def read_records(path: str, limit: int | None = None, seed: int = 0) -> Records:
    """Records from a ``.jsonl`` / ``.json`` / ``.parquet`` file or ``synthetic:TASK`` (the first ``limit``,
    a positive number or None for all); other file types are refused (:func:`check_data_path`)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"data.num_examples must be a positive integer or null; got {limit}")
    check_data_path(path)
    if path.startswith(SYNTHETIC_PREFIX):
        from dare.data.synthetic import synthetic_records

        return Records(synthetic_records(path[len(SYNTHETIC_PREFIX):], limit or DEFAULT_SYNTHETIC_SIZE, seed), path)
    file, lines = Path(path), None
    if file.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading parquet needs pyarrow: pip install pyarrow") from None
        records = pq.read_table(file).to_pylist()
    elif file.suffix == ".json":
        try:
            records = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text (a .json file holds a JSON list of records)") from None
        if not isinstance(records, list):
            raise InputError(f"{path}: expected a JSON list of records")
    else:
        records, lines = [], []
        with file.open(encoding="utf-8") as handle:
            try:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        records.append(json.loads(line))
                        lines.append(number)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}:{number}: invalid JSON ({err.msg})") from None
            except UnicodeDecodeError:
                raise InputError(f"{path}: not UTF-8 text (a .jsonl file holds one JSON object per line)") from None
    if not records:
        raise no_records(path)
    records = Records(records[:limit], path, lines[:limit] if lines is not None else None)
    for number, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"{records.where(number)} is {type(record).__name__}, not an object of fields")
    return records


def no_records(path: str) -> InputError:
    """The error for data file ``path`` holding no record (:func:`read_records`, and the dry run's count)."""
    return InputError(f"data file {path} holds no records")


def count_records(path: str, limit: int | None = None, enough: int | None = None) -> int | None:
    """How many records :func:`read_records` gives for ``path`` and ``limit`` (``data.num_examples``), told without
    reading the whole source: ``synthetic:TASK`` makes ``limit`` (default 512), a JSONL file holds one per non-blank
    line (read up to ``enough`` records: a larger file is not read through), a parquet file's metadata holds its row
    count. None where only reading it all tells (a ``.json`` list) and where a line read is no JSON object or the
    file cannot be read: :func:`read_records` names the file and line."""
    if path.startswith(SYNTHETIC_PREFIX):
        return limit or DEFAULT_SYNTHETIC_SIZE
    stop = min((n for n in (limit, enough) if n is not None), default=None)
    file = Path(path)
    try:
        if file.suffix == ".jsonl":
            count = 0
            with file.open("rb") as handle:
                for line in handle:
                    if not line.strip():
                        continue
                    if not isinstance(json.loads(line), dict):
                        return None
                    count += 1
                    if count == stop:
                        break
        elif file.suffix == ".parquet":
            import pyarrow.parquet as pq

            count = pq.ParquetFile(file).metadata.num_rows
        else:
            return None
    except Exception:  # noqa: BLE001 - the run reads the file and names what is wrong with it
        return None
    return count if limit is None else min(count, limit)


def record_text(value, key: str, where: str) -> str:
    """The text of field ``key`` of a record (``where`` names the record in errors): a string, or an integer's
    digits (the same text). Anything else is a one-line error: a float (its JSON spelling, e.g. ``1.50``, is lost
    once parsed), true/false, null, a list or an object have no text the model should learn."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    kind = ("null" if value is None else "true/false" if isinstance(value, bool) else
            "a non-integer number" if isinstance(value, float) else f"a {type(value).__name__}")
    shown = json.dumps(value, default=str)[:40]
    raise InputError(f"{where}: field '{key}' is {kind} ({shown}), not text; write it as a JSON string holding "
                     "exactly the text to train on")


def record_chat(messages, key: str, where: str) -> list[dict]:
    """A record's chat (field ``key``): a list of ``{"role", "content"}`` messages with text contents."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                 for m in messages):
        raise InputError(f"{where}: field '{key}' must be a list of {{\"role\": ..., \"content\": ...}} messages")
    return [{**m, "content": record_text(m["content"], f"{key}[{i}].content", where)} for i, m in enumerate(messages)]


def warn_unread_keys(cfg, read: set[str], path: str,
                     keys: tuple[str, ...] = ("messages_key", "prompt_key", "response_key")) -> None:
    """One warning for the record-key settings among ``keys`` of ``cfg`` (a ``DataConfig``) that differ from their
    defaults and that no record of ``path`` was read through: ``read`` holds ``messages`` when some record gave its
    chat (``data.messages_key``), ``prompt`` when some record gave its prompt (``data.prompt_key``; SFT:
    and ``data.response_key``) instead."""
    if not dataclasses.is_dataclass(cfg):
        return
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    routes = {"messages_key": "messages", "prompt_key": "prompt", "response_key": "prompt"}
    unread = [key for key in keys if getattr(cfg, key) != defaults[key] and routes[key] not in read]
    if not unread:
        return
    settings = ", ".join(f"data.{key}={getattr(cfg, key)}" for key in unread)
    held = (f"a '{cfg.messages_key}' chat (data.messages_key), which the run reads instead" if "messages" in read
            else f"no '{cfg.messages_key}' chat, so the run reads '{cfg.prompt_key}'")
    log.warning(f"warning: ignoring {settings}: every record of {path} holds {held}")


def _messages(record: dict, cfg, where: str) -> tuple[list[dict], str]:
    """(prompt messages, response text) of a chat or prompt/response record (``where`` names it in errors)."""
    if cfg.messages_key in record:
        messages = record_chat(record[cfg.messages_key], cfg.messages_key, where)
        if not messages or messages[-1]["role"] != "assistant":
            raise InputError(f"{where}: the last message must be the assistant's response")
        return messages[:-1], messages[-1]["content"]
    if cfg.prompt_key in record and cfg.response_key in record:
        return ([{"role": "user", "content": record_text(record[cfg.prompt_key], cfg.prompt_key, where)}],
                record_text(record[cfg.response_key], cfg.response_key, where))
    raise InputError(
        f"{where} has neither '{cfg.messages_key}' nor '{cfg.prompt_key}'/'{cfg.response_key}' "
        f"(keys: {', '.join(sorted(record))}; data.messages_key, data.prompt_key and data.response_key name them)"
    )


def tokenize_record(record: dict, tokenizer, cfg, eos_id: int, number: int = 0,
                    where: str | None = None) -> tuple[list[int], list[int]]:
    """``(prompt_ids, response_ids)`` of one record, response ending with EOS / EOS padding per ``cfg``; errors name
    the record as ``where`` (:meth:`Records.where`), else as ``record NUMBER``."""
    where = where or f"record {number}"
    prompt_messages, response = _messages(record, cfg, where)
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
        raise InputError(f"{where}: empty response")
    return prompt, answer


@dataclass
class SFTDataset:
    """Tokenized examples plus how many records were dropped for being longer than ``max_length``."""

    examples: list[Example]
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.examples)


def sft_records(cfg, seed: int = 0) -> Records:
    """The records an SFT run reads from ``cfg.path`` (a :class:`~dare.trainer.config.DataConfig`): a data file's,
    or ``synthetic:TASK``'s under the configured prompt and response keys."""
    records = read_records(cfg.path, cfg.num_examples, seed)
    if cfg.path.startswith(SYNTHETIC_PREFIX):  # generated records: the key settings apply to data files
        records = Records([{cfg.prompt_key: r["prompt"], cfg.response_key: r["response"]} for r in records], cfg.path)
    return records


def check_sft_records(cfg, seed: int = 0, warn: bool = True) -> None:
    """``dare train --dry-run``'s read of an SFT run's data: every record it would train on holds a chat or a
    prompt and a response of text, with the run's ``FILE:LINE: record N`` errors (:func:`build_sft_dataset`'s own
    checks, without a tokenizer); ``warn``: log the key settings no record was read through."""
    records, read = sft_records(cfg, seed), set()
    for number, record in enumerate(records):
        read.add("messages" if cfg.messages_key in record else "prompt")
        _messages(record, cfg, records.where(number))
    if warn and not cfg.path.startswith(SYNTHETIC_PREFIX):
        warn_unread_keys(cfg, read, cfg.path)


def build_sft_dataset(cfg, tokenizer, eos_id: int, seed: int = 0, progress: bool = False,
                      warn: bool = True) -> SFTDataset:
    """Read and tokenize ``cfg.path`` (a :class:`~dare.trainer.config.DataConfig`); ``warn``: log the key settings
    no record was read through (:func:`warn_unread_keys`)."""
    records = sft_records(cfg, seed)
    generated = cfg.path.startswith(SYNTHETIC_PREFIX)
    iterator = records
    if progress:
        from dare.progress import progress_bar

        iterator = progress_bar(len(records), "tokenizing", leave=False, iterable=records)
    examples, dropped, read = [], 0, set()
    for number, record in enumerate(iterator):
        read.add("messages" if cfg.messages_key in record else "prompt")
        prompt, answer = tokenize_record(record, tokenizer, cfg, eos_id, number, records.where(number))
        if len(prompt) + len(answer) > cfg.max_length:
            if cfg.overlong == "error":
                raise InputError(f"{records.where(number)} has {len(prompt) + len(answer)} tokens > "
                                 f"data.max_length={cfg.max_length}")
            dropped += 1
            continue
        examples.append(Example(tuple(prompt + answer), len(prompt), len(examples)))
    if not examples:
        raise InputError(f"{cfg.path}: no usable examples ({dropped} longer than data.max_length={cfg.max_length})")
    if warn and not generated:
        warn_unread_keys(cfg, read, cfg.path)
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
