"""The demo task: reverse the digits of a number, posed and scored as a GSM8K problem.

``Reverse 38271.`` -> ``17283``. Numbers use the digits 1-9 (no zeros, so every answer is a plain number
that GSM8K's numeric comparison reads exactly). Every split is written in the format its consumer reads:

* ``sft.jsonl`` - demonstrations ``{"prompt", "response"}`` for ``dare train`` (``algorithm.name=sft``);
* ``prompts.jsonl`` - RL prompts ``{"prompt", "answer"}`` (the whole record is the reward's sample);
* ``validation.jsonl`` / ``test.jsonl`` - GSM8K's own schema ``{"question", "answer": "#### 17283"}``, read back
  with ``get_benchmark("gsm8k").load(path)``.

Prompts are GSM8K's ``few_shot`` template with zero exemplars (``Question: ...\\nAnswer:``) rendered by the
benchmark itself, so SFT, RL and evaluation see byte-identical prompts. The validation and test splits are fixed
(independent of the run's seed) and disjoint from each other and from the training problems.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from dare.errors import ConfigError

BENCHMARK = "gsm8k"
TEMPLATE = "few_shot"
DIGITS = "123456789"


@dataclass(frozen=True)
class TaskData:
    """Where the demo's splits were written, and the evaluation splits as benchmark samples."""

    sft: Path
    prompts: Path
    validation_path: Path
    test_path: Path
    validation: list
    """``dare.eval.Sample`` list (GSM8K benchmark) used to stop SFT at partial competence."""
    test: list
    """``dare.eval.Sample`` list: the held-out split every reported accuracy is measured on."""


def problem(number: str) -> tuple[str, str]:
    """The question and answer for ``number``."""
    return f"Reverse {number}.", number[::-1]


def draw_numbers(rng: random.Random, digits: int, count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct numbers of ``digits`` digits (1-9) not in ``exclude``."""
    available = len(DIGITS) ** digits - len(exclude)
    if count > available:
        raise ConfigError(f"cannot draw {count} distinct {digits}-digit problems (only {available} left)")
    out: list[str] = []
    seen = set(exclude)
    while len(out) < count:
        number = "".join(rng.choice(DIGITS) for _ in range(digits))
        if number not in seen:
            seen.add(number)
            out.append(number)
    return out


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_task(out_dir: str | Path, *, digits: int, train_size: int, validation_size: int, test_size: int,
               seed: int) -> TaskData:
    """Generate the splits into ``out_dir`` (training problems depend on ``seed``; evaluation splits do not)."""
    from dare.eval import get_benchmark

    if digits < 2:
        raise ConfigError(f"the demo task needs at least 2 digits; got {digits}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bench = get_benchmark(BENCHMARK)
    fixed = random.Random(f"dare-demo:reverse:{digits}")
    held_out = draw_numbers(fixed, digits, validation_size + test_size, set())
    validation, test = held_out[:validation_size], held_out[validation_size:]
    train = draw_numbers(random.Random(f"dare-demo:reverse:{digits}:{seed}"), digits, train_size, set(held_out))

    def gsm8k_rows(numbers: list[str]) -> list[dict]:
        return [{"question": q, "answer": f"#### {a}"} for q, a in map(problem, numbers)]

    validation_path = _write_jsonl(out / "validation.jsonl", gsm8k_rows(validation))
    test_path = _write_jsonl(out / "test.jsonl", gsm8k_rows(test))
    train_samples = [bench.parse_row(row, i) for i, row in enumerate(gsm8k_rows(train))]
    prompts = [render_prompt(bench, s) for s in train_samples]
    sft = _write_jsonl(out / "sft.jsonl", [{"prompt": p, "response": f" {s.answer}"}
                                           for p, s in zip(prompts, train_samples)])
    rl = _write_jsonl(out / "prompts.jsonl",
                      [{"prompt": p, "answer": s.answer} for p, s in zip(prompts, train_samples)])
    return TaskData(sft=sft, prompts=rl, validation_path=validation_path, test_path=test_path,
                    validation=bench.load(str(validation_path)), test=bench.load(str(test_path)))


def render_prompt(bench, sample) -> str:
    """The model input of a sample: the benchmark's ``few_shot`` template, no exemplars, no chat template."""
    return bench.render(sample, template=TEMPLATE, chat=False)
