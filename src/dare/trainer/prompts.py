"""Prompt datasets for online RL and preference-pair datasets for DPO / VRPO.

RL prompt sources (``data.path``):

* a ``.jsonl`` / ``.json`` / ``.parquet`` file: each record has a prompt (``data.prompt_key``, text) or chat
  ``data.messages_key`` (a trailing assistant turn is dropped); the **whole record** is the reward's sample
  (e.g. ``answer``, ``numbers`` / ``target``, ``tests``);
* ``synthetic:copy|reverse|add`` (``dare.data.synthetic``; the response becomes ``answer``), or
  ``synthetic:countdown|sudoku|sudoku9|gsm_symbolic`` (reasoning-gym problems with the benchmark's prompt);
* ``benchmark:NAME`` or ``benchmark:NAME:PATH`` - a ``dare.eval`` benchmark's samples and prompt template
  (without ``PATH``: the problems ``dare eval`` scores the benchmark on, with a warning that the policy trains on
  them).

Pairs (``data.path`` jsonl/json/parquet): ``prompt`` (``data.prompt_key``), ``chosen`` and ``rejected``; or
``synthetic:copy|reverse|add`` (chosen = the right answer, rejected = it rotated by one character: a wrong
answer of the same length, for tests and tiny recipes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dare.errors import ConfigError, InputError, unknown_choice

log = logging.getLogger("dare.trainer")

BENCHMARK_PREFIX = "benchmark:"


@dataclass(frozen=True)
class PromptItem:
    """A tokenized RL prompt: ``ids``, the reward sample (ground truth) and its dataset index."""

    ids: tuple[int, ...]
    sample: dict
    index: int
    text: str = ""


def _benchmark_records(name: str, source: str | None, limit: int | None) -> list[tuple[list[dict], dict]]:
    from dare.eval import get_benchmark

    bench = get_benchmark(name)
    if source is None and bench.hf is not None:  # the split's name says nothing: AIME's evaluation split is 'train'
        log.warning("warning: data.path=benchmark:%s trains on the problems dare eval scores %s on (split '%s' of "
                    "%s); for a training set give its file: benchmark:%s:PATH", name, name, bench.hf.split,
                    bench.hf.path, name)
    return [(bench.messages(s), dict(s.target)) for s in bench.load(source, limit=limit)]


def _eval_synthetic(task: str, n: int, seed: int) -> list[tuple[list[dict], dict]]:
    from dare.eval import get_benchmark
    from dare.eval.benchmarks import SYNTHETIC_TASKS, synthetic

    bench = get_benchmark(SYNTHETIC_TASKS[task][1])
    return [(bench.messages(s), dict(s.target)) for s in synthetic(task, n, seed)]


def check_prompt_path(path: str) -> None:
    """The checks of :func:`prompt_records` that read nothing: a known benchmark or ``synthetic:TASK`` (every task
    named in the error), an existing file."""
    from dare.data.sft import SYNTHETIC_PREFIX, check_data_path
    from dare.data.synthetic import TASKS
    from dare.eval.benchmarks import SYNTHETIC_TASKS

    if path.startswith(BENCHMARK_PREFIX):
        from dare.eval import get_benchmark

        get_benchmark(path[len(BENCHMARK_PREFIX):].partition(":")[0])
        return
    task = path[len(SYNTHETIC_PREFIX):] if path.startswith(SYNTHETIC_PREFIX) else None
    if task is not None and task not in TASKS and task not in SYNTHETIC_TASKS:
        raise unknown_choice("synthetic task", task, [*TASKS, *SYNTHETIC_TASKS])
    if task is None:
        check_data_path(path)


def check_reward_fields(record: dict, where: str, needs: list[tuple[str, str]]) -> None:
    """One-line :class:`InputError` ``WHERE lacks 'answer', which reward 'X' needs`` (or ``holds null in``) for the
    first field of ``needs`` (:func:`dare.rewards.reward_fields`) that data record ``record`` lacks or holds as null: found when
    the prompts load, not when the record's rollouts are scored mid-run (or a null scored as the text 'None')."""
    for key, name in needs:
        if key not in record:
            raise InputError(f"{where} lacks '{key}', which reward '{name}' needs (keys: {', '.join(sorted(record))})")
        if record[key] is None:
            raise InputError(f"{where} holds null in '{key}', which reward '{name}' needs")


def prompt_records(cfg, seed: int = 0, warn: bool = True, reward=None) -> list[tuple[list[dict] | str, dict]]:
    """``(messages or text, sample)`` pairs of an RL prompt source (``cfg`` is a ``DataConfig``); ``warn``: log the
    key settings no record of a data file was read through (:func:`dare.data.sft.warn_unread_keys`); ``reward``:
    every record of a data file must hold the fields it scores against (:func:`check_reward_fields`)."""
    from dare.data.sft import (
        DEFAULT_SYNTHETIC_SIZE, SYNTHETIC_PREFIX, read_records, record_chat, record_text, warn_unread_keys,
    )
    from dare.data.synthetic import TASKS
    from dare.rewards import reward_fields

    path = cfg.path
    limit = cfg.num_examples
    check_prompt_path(path)
    if path.startswith(BENCHMARK_PREFIX):
        name, _, source = path[len(BENCHMARK_PREFIX):].partition(":")
        return _benchmark_records(name, source or None, limit)
    if path.startswith(SYNTHETIC_PREFIX) and path[len(SYNTHETIC_PREFIX):] not in TASKS:
        return _eval_synthetic(path[len(SYNTHETIC_PREFIX):], limit or DEFAULT_SYNTHETIC_SIZE, seed)
    records = read_records(path, limit, seed)
    if path.startswith(SYNTHETIC_PREFIX):
        return [(r["prompt"], {"prompt": r["prompt"], "answer": r["response"]}) for r in records]
    out, read, needs = [], set(), reward_fields(reward)
    for number, record in enumerate(records):
        where = records.where(number)
        check_reward_fields(record, where, needs)
        if cfg.messages_key in record:
            messages = record_chat(record[cfg.messages_key], cfg.messages_key, where)
            if messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]
            out.append((messages, record))
            read.add("messages")
        elif cfg.prompt_key in record:
            out.append((record_text(record[cfg.prompt_key], cfg.prompt_key, where), record))
            read.add("prompt")
        else:
            raise InputError(f"{where} has neither '{cfg.prompt_key}' nor '{cfg.messages_key}' (keys: "
                             f"{', '.join(sorted(record))}; data.prompt_key and data.messages_key name them)")
    if warn:
        warn_unread_keys(cfg, read, path, ("messages_key", "prompt_key"))
    return out


def encode_prompt(prompt: list[dict] | str, tokenizer, chat_template: bool) -> list[int]:
    """Token ids of a prompt: the chat template with the generation prompt, or the plain text."""
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template; set data.chat_template=false")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return list(tokenizer(text, add_special_tokens=True).input_ids)


def build_prompts(cfg, tokenizer, max_prompt_length: int, seed: int = 0,
                  warn: bool = True, reward=None) -> tuple[list[PromptItem], int]:
    """Tokenized prompts (those longer than ``max_prompt_length`` dropped) and the number dropped; ``warn`` and
    ``reward``: see :func:`prompt_records`."""
    items, dropped = [], 0
    for prompt, sample in prompt_records(cfg, seed, warn, reward):
        ids = encode_prompt(prompt, tokenizer, cfg.chat_template)
        if not ids:
            raise InputError("a prompt encodes to no tokens")
        if len(ids) > max_prompt_length:
            dropped += 1
            continue
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        items.append(PromptItem(tuple(ids), sample, len(items), text))
    if not items:
        raise InputError(f"{cfg.path}: no usable prompts ({dropped} longer than rollout.max_prompt_length={max_prompt_length})")
    return items, dropped


@dataclass(frozen=True)
class PairItem:
    """A tokenized preference pair sharing one prompt."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]
    index: int


def pair_records(cfg, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """``(where, prompt, chosen, rejected)`` of each preference pair of ``cfg.path`` (a ``DataConfig``): its texts
    and how errors name its record (``FILE:LINE: record N``); a record that lacks a field, or holds no text in one,
    is the one-line :class:`InputError` the run gives (``dare train --dry-run`` checks them with this too)."""
    from dare.data.sft import SYNTHETIC_PREFIX, Records, read_records, record_text

    records = read_records(cfg.path, cfg.num_examples, seed)
    if cfg.path.startswith(SYNTHETIC_PREFIX):
        records = Records([{cfg.prompt_key: r["prompt"], cfg.chosen_key: r["response"],
                            cfg.rejected_key: r["response"][1:] + r["response"][:1]
                            + ("x" if len(set(r["response"])) < 2 else "")} for r in records], cfg.path)
    out = []
    for number, record in enumerate(records):
        where = records.where(number)
        missing = [k for k in (cfg.prompt_key, cfg.chosen_key, cfg.rejected_key) if k not in record]
        if missing:
            raise InputError(f"{where} lacks {', '.join(missing)} (keys: {', '.join(sorted(record))}; "
                             "data.prompt_key, data.chosen_key and data.rejected_key name them)")
        out.append((where, *(record_text(record[key], key, where)
                             for key in (cfg.prompt_key, cfg.chosen_key, cfg.rejected_key))))
    return out


def build_pairs(cfg, tokenizer, eos_id: int, seed: int = 0) -> tuple[list[PairItem], int]:
    """Tokenized pairs (responses end with EOS per ``data.append_eos``); pairs longer than
    ``data.max_length`` (prompt + the longer response) are dropped and counted."""
    from dare.data.sft import tokenize_record

    items, dropped = [], 0
    for number, (where, prompt_text, *responses) in enumerate(pair_records(cfg, seed)):
        sides: list[Any] = []
        for response in responses:
            shim = {cfg.prompt_key: prompt_text, cfg.response_key: response}
            sides.append(tokenize_record(shim, tokenizer, cfg, eos_id, number, where))
        (prompt, chosen), (_, rejected) = sides
        if len(prompt) + max(len(chosen), len(rejected)) > cfg.max_length:
            if cfg.overlong == "error":
                raise InputError(f"{where}: the pair is longer than data.max_length={cfg.max_length}")
            dropped += 1
            continue
        items.append(PairItem(tuple(prompt), tuple(chosen), tuple(rejected), len(items)))
    if not items:
        raise InputError(f"{cfg.path}: no usable pairs ({dropped} longer than data.max_length={cfg.max_length})")
    return items, dropped


__all__ = ["PairItem", "PromptItem", "build_pairs", "build_prompts", "check_prompt_path", "check_reward_fields",
           "encode_prompt", "pair_records", "prompt_records"]
