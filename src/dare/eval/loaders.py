"""Read benchmark rows from local files (jsonl, json, parquet, csv, directories) or HF datasets."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

from dare.errors import InputError, closest, first_line

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv", ".tsv")
SPLIT_NAMES = ("train", "test", "validation", "dev", "val")
"""Names that mark a file of a directory as one split (``test.jsonl``, ``data/test-00000-of-00001.parquet``,
``validation/part-0.jsonl``)."""


def read_rows(source: str | os.PathLike | None, *, hf=None, split: str | None = None, config: str | None = None,
              benchmark: str = "benchmark") -> list[dict[str, Any]]:
    """Rows of ``source``: a local file or directory in the benchmark's native schema, ``hf:NAME`` or a
    dataset name such as ``openai/gsm8k`` (needs ``datasets``), or None for the benchmark's default."""
    if source is None:
        if hf is None:
            raise InputError(f"{benchmark}: no default dataset; pass a local file (jsonl/json/parquet/csv)")
        return load_hf(hf.path, config or hf.name, split or hf.split)
    text = str(source)
    if text.startswith("hf:"):
        return load_hf(text[3:], config or (hf.name if hf else None), split or (hf.split if hf else "test"))
    path = Path(text).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
        if not files:
            raise InputError(f"{benchmark}: no {'/'.join(s.lstrip('.') for s in SUFFIXES)} files under {path}")
        rows = []
        for file in one_format(files_of_split(files, path, split, benchmark), path, benchmark):
            rows.extend(read_file(file))
        return rows
    if path.exists():
        if split is not None:
            raise InputError(f"{benchmark}: a split applies to a HF dataset or a directory of split files; {path} is "
                             "one file (drop the split)")
        return read_file(path)
    if "/" in text and not text.startswith((".", "/", "~")) and not text.endswith(SUFFIXES):
        return load_hf(text, config or (hf.name if hf else None), split or (hf.split if hf else "test"))
    raise InputError(f"{benchmark}: no such file or directory: {text}")


def file_format(file: Path) -> str:
    """The data format of ``file`` by its suffix (``jsonl`` for ``.jsonl.gz`` too)."""
    return next(suffix for suffix in SUFFIXES if file.name.endswith(suffix)).lstrip(".").removesuffix(".gz")


def one_format(files: list[Path], root: Path, benchmark: str) -> list[Path]:
    """``files`` when they share one format; files of several formats under one directory (``test.jsonl`` beside
    ``extra.csv``, a hub snapshot's ``dataset_infos.json`` beside its parquet files) are a one-line error naming
    them, instead of rows of different schemas read as one set."""
    formats: dict[str, list[Path]] = {}
    for file in files:
        formats.setdefault(file_format(file), []).append(file)
    if len(formats) > 1:
        listed = "; ".join(f"{kind}: {', '.join(str(f.relative_to(root)) for f in group[:3])}"
                           f"{', ...' if len(group) > 3 else ''}" for kind, group in formats.items())
        raise InputError(f"{benchmark}: {root} holds data files of several formats ({listed}); give one file or a "
                         "directory of one format")
    return files


def name_tokens(relative: Path) -> set[str]:
    """The words of a file's path under its directory (folders and file name cut at ``-``, ``_`` and ``.``)."""
    return {word.lower() for part in relative.parts for word in re.split(r"[-_.]", part) if word}


def files_of_split(files: list[Path], root: Path, split: str | None, benchmark: str) -> list[Path]:
    """The data files of ``root`` that belong to ``split`` (a word of their path, e.g. ``test.jsonl``). Without a
    split every file is read, unless the names mark several splits: mixing a train split into an evaluation (or
    the reverse) is a one-line error instead."""
    words = {file: name_tokens(file.relative_to(root)) for file in files}
    if split is not None:
        chosen = [file for file in files if split.lower() in words[file]]
        if not chosen:
            present = sorted({name for file in files for name in words[file] & set(SPLIT_NAMES)})
            hint = closest(split.lower(), present)
            meant = f"did you mean '{hint}'? " if hint else ""
            raise InputError(f"{benchmark}: no file of split '{split}' under {root} ({meant}a file's path must name "
                             f"it, e.g. {split}.jsonl or {split}/...)")
        return chosen
    found = sorted({name for file in files for name in words[file] & set(SPLIT_NAMES)})
    if len(found) > 1:
        several = f"{benchmark}: {root} holds files of several splits ({', '.join(found)}): choose one"
        raise InputError(f"{several} (Benchmark.load(..., split=NAME), or the split's file itself)",
                         cli=f"{several} (--split, or the split's file itself)")
    return files


def read_file(path: Path) -> list[dict[str, Any]]:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        rows = []
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
        return rows
    if name.endswith(".json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from None
        return _json_rows(data, path)
    if name.endswith(".parquet"):
        return _read_parquet(path)
    if name.endswith((".csv", ".tsv")):
        with open(path, newline="", encoding="utf-8") as f:
            return [dict(row) for row in csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",")]
    raise InputError(f"{path}: unsupported file type (use {', '.join(SUFFIXES)})")


def _json_rows(data: Any, path: Path) -> list[dict[str, Any]]:
    if isinstance(data, list):
        if not all(isinstance(r, dict) for r in data):
            raise InputError(f"{path}: expected a list of JSON objects")
        return data
    if isinstance(data, dict):
        for key in ("data", "rows", "examples", "test"):
            if isinstance(data.get(key), list):
                return _json_rows(data[key], path)
        values = list(data.values())
        if values and all(isinstance(v, dict) for v in values):  # {id: row} (OpenCompass math.json)
            return [{"id": str(k), **v} for k, v in data.items()]
        return [data]  # one problem per file (the original MATH layout)
    raise InputError(f"{path}: expected JSON objects, got {type(data).__name__}")


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        try:
            import pandas as pd
        except ImportError:
            raise InputError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        return pd.read_parquet(path).to_dict(orient="records")
    return pq.read_table(path).to_pylist()


def load_hf(name: str, config: str | None, split: str) -> list[dict[str, Any]]:
    """Rows of a HF dataset (hub name or local dataset directory) through ``datasets``."""
    try:
        import datasets
    except ImportError:
        raise InputError(f"loading '{name}' needs the datasets library (pip install datasets), or pass a local file") from None
    try:
        if Path(name).is_dir() and (Path(name) / "dataset_info.json").exists():
            ds = datasets.load_from_disk(name)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # network, missing split/config: one line, not a stack trace
        import os

        offline = "" if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE") else \
            "; without a network, HF_HUB_OFFLINE=1 skips the retries"
        said = f"cannot load dataset '{name}' (config {config}, split {split}): {first_line(err)}"
        raise InputError(f"{said}; a local copy loads from a file (dare eval --data FILE; data.path="
                         f"benchmark:NAME:FILE in training){offline}") from None
    return [dict(row) for row in ds]
