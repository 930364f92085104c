"""Evaluate a model on a benchmark: generation + scoring, or likelihood (MC-ELBO) for multiple choice.

```python
from dare.eval import EvalConfig, evaluate, get_benchmark
from dare.rollout import SamplerConfig
bench = get_benchmark("gsm8k")
results = evaluate(model, tokenizer, bench, bench.load("gsm8k_test.jsonl", limit=100),
                   sampler=SamplerConfig(sampler="fastdllm", cache="dual", gen_length=256),
                   config=EvalConfig(shots=4, batch_size=16, seed=0))
results.metrics["accuracy"]; results.write("results.json")
```

Generation goes only through :func:`dare.rollout.generate` with a :class:`~dare.rollout.SamplerConfig`, so
every registered sampler (block-diffusion ones included) works unchanged. Prompts are sorted by token length
(longest first) and decoded in batches; every row samples from its own stream seeded by ``(seed, example
id)``, so predictions do not depend on the batch size or order. Completions end at the family's first stop
id (EOS/EOT, ``RolloutOutput.completion_mask``) and then at the template's first stop string.

Likelihood mode (multiple choice) scores every option's continuation with
:func:`dare.eval.likelihood.continuation_elbo` and predicts the argmax.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dare.errors import ConfigError, InputError, check_config_object, unknown_choice
from dare.eval.arguments import (
    check_benchmark_arg, check_mapping_arg, check_samples_arg, check_text_arg, check_tokenizer_arg,
)
from dare.eval.benchmark import Benchmark, Sample, get_benchmark
from dare.eval.likelihood import LikelihoodConfig, LikelihoodStats, Request, continuation_elbo, normalise
from dare.eval.results import EvalResults
from dare.eval.scoring import score_predictions
from dare.models.loading import check_model_object, evaluating
from dare.rewards import RewardFailed
from dare.rollout import SamplerConfig
from dare.rollout.engine import kernel_settings

log = logging.getLogger("dare.eval")

MODES = {
    "auto": "likelihood for multiple-choice benchmarks, generate otherwise",
    "generate": "decode completions with a sampler, extract and score the answers",
    "likelihood": "score each option by its MC-ELBO and predict the best (multiple choice only)",
}


@dataclass
class EvalConfig:
    """Settings of one evaluation besides the sampler / likelihood estimator."""

    mode: str = "auto"
    """``auto`` | ``generate`` | ``likelihood`` (see :data:`MODES`)."""
    shots: int | None = None
    """Few-shot exemplars per prompt (None: the benchmark's default)."""
    template: str | None = None
    """Prompt template for generation (None: ``few_shot`` when shots > 0 and the benchmark has it, else its
    default). Likelihood scoring always uses the benchmark's ``likelihood`` prompt."""
    chat: bool | None = None
    """Apply the tokenizer's chat template (None: yes for generation when the tokenizer has one, no for
    likelihood scoring, as lm-eval does)."""
    num_samples: int = 1
    """Completions per problem (pass@k needs n >= k and temperature > 0)."""
    batch_size: int = 8
    """Prompts per ``generate`` call; corrupted rows per forward in likelihood mode."""
    seed: int = 0
    """Seeds few-shot selection, sampling (replaces ``SamplerConfig.seed``) and the MC corruptions."""
    ks: tuple[int, ...] | None = None
    """pass@k values (None: 1, 5, 10, ... up to n)."""

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EvalConfig:
        """Build from a mapping; an unknown key or a value of the wrong type is a one-line :class:`ConfigError`."""
        from dare.config import from_dict

        return from_dict(cls, dict(values), prefix="EvalConfig.")

    def check(self) -> None:
        """One-line :class:`ConfigError` for a field of the wrong type (``shots='2'``, ``ks=5``, ``chat='yes'``) or
        a bad count (before any model is loaded or any token generated)."""
        from dare.config import check_seed

        EvalConfig.from_dict(dataclasses.asdict(self))  # the types, as a mapping of these values would be checked
        check_seed(self.seed, "EvalConfig.seed", cli="--seed")
        for name, flag in (("num_samples", "--num-samples"), ("batch_size", "--batch-size")):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"EvalConfig.{name} must be >= 1; got {value}",
                                  cli=f"{flag} must be >= 1; got {value}")
        for k in self.ks or ():
            if not 1 <= k <= self.num_samples:
                needs = f"pass@{k} needs 1 <= k <= num_samples (completions per problem"
                raise ConfigError(f"EvalConfig.ks: {needs}); got num_samples={self.num_samples}",
                                  cli=f"{needs}, -n); got num_samples={self.num_samples}")

    def resolve_mode(self, benchmark: Benchmark) -> str:
        if self.mode not in MODES:
            raise unknown_choice("evaluation mode", self.mode, MODES)
        if self.mode == "auto":
            return "likelihood" if benchmark.kind == "choice" else "generate"
        if self.mode == "likelihood" and benchmark.kind != "choice":
            needs = f"needs a multiple-choice benchmark; {benchmark.name} is free-form"
            raise ConfigError(f"EvalConfig.mode 'likelihood' {needs}", cli=f"--mode likelihood {needs}")
        return self.mode

    def resolve_template(self, benchmark: Benchmark, shots: int) -> str:
        if self.template is not None:
            benchmark.template(self.template)  # unknown name -> one-line error
            return self.template
        if shots > 0 and benchmark.default_template == "zero_shot" and "few_shot" in benchmark.templates:
            return "few_shot"
        return benchmark.default_template


def load_for_eval(path: str, adapter: str | None, device: str | None, dtype: str | None,
                  compile_blocks: bool = False, tokenizer: str | None = None):
    """``(model, tokenizer, model_info)``; a missing or unreadable checkpoint is a one-line error. The tokenizer comes
    from ``tokenizer`` (a directory or hub name) when given, else from the LoRA ``adapter`` directory when it holds one
    (LoRA training saves the run's tokenizer there, without its chat template when the run trained without it:
    :func:`~dare.models.loading.adapter_tokenizer`), else from ``path``; where it came from is recorded in
    ``model_info`` when it is not ``path``. Its files are checked first, so a checkpoint without one fails before its
    weights load. With ``compile_blocks`` every transformer block is compiled in place (recorded in ``model_info``)."""
    from dare.devices import resolve_device
    from dare.models.loading import check_model_tokenizer, load_model, loading_errors, tokenizer_for_model

    device = resolve_device(device)
    dtype = dtype or ("bfloat16" if device.type == "cuda" else "float32")
    source = check_model_tokenizer(path, tokenizer, adapter)  # a checkpoint without one fails before its weights load
    with loading_errors(path, adapter):
        model = load_model(path, adapter, dtype=dtype, device=device)
    text_tokenizer = tokenizer_for_model(path, tokenizer, adapter)  # one-line errors of its own
    if compile_blocks:
        from dare.models.compile import compile_blocks as compile_model_blocks

        compile_model_blocks(model)
    info = {"path": path, "adapter": adapter, "requested_dtype": dtype, "compile_blocks": compile_blocks}
    if tokenizer is not None or source != path:
        info["tokenizer"] = source
    from dare.eval.weights_origin import weights_origin

    for key, where in (("origin", path), ("adapter_origin", adapter)):  # which weights, and which run wrote them
        origin = weights_origin(where)
        if origin is not None:
            info[key] = origin
    return model, text_tokenizer, info


def model_record(model, **extra: Any) -> dict[str, Any]:
    """What the results file says about the model: family, dtype, device, parameter count (+ ``extra``)."""
    from dare.models.spec import family_of

    param = next(model.parameters())
    return {**extra, "family": family_of(model).name, "dtype": str(param.dtype).removeprefix("torch."),
            "device": str(param.device), "parameters": sum(p.numel() for p in model.parameters())}


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a rendered prompt (a chat-templated text already holds its special tokens)."""
    return list(tokenizer(text, add_special_tokens=not chat)["input_ids"])


EVALUATED_DATA = "evaluated data"
"""``prompt.fewshot_source`` of a results file whose exemplars were drawn from the evaluated problems."""


def _shots(benchmark: Benchmark, sample: Sample, pool: Sequence[Sample], k: int, seed: int) -> list[Sample]:
    """The exemplars of ``sample``: never the problem itself (matched by its question, not by its id, which
    another file's rows may share without being the same problem)."""
    return benchmark.fewshot(pool, k, seed=seed, question=sample.question)


def fewshot_record(shots: int, source: str | None) -> dict[str, Any]:
    """``{"fewshot_source": ...}`` for the results' prompt settings when prompts have exemplars, else nothing."""
    return {"fewshot_source": source} if shots > 0 else {}


def check_mode_settings(bench: Benchmark, mode: str, sampler, likelihood, config: EvalConfig) -> None:
    """One-line :class:`ConfigError` for a setting the resolved ``mode`` would drop (a sampler in likelihood mode,
    a likelihood config, n > 1 or a template in likelihood mode; ``dare eval run`` refuses the same flags), and a
    warning for a sampler seed that ``config.seed`` replaces."""
    if mode == "likelihood":
        given = [name for name, unused in (("sampler", sampler is not None), ("num_samples > 1", config.num_samples > 1),
                                           ("template", config.template is not None)) if unused]
        if given:
            raise ConfigError(f"{given[0]} applies to generation; {bench.name} is scored by likelihood here (pass "
                              "config=EvalConfig(mode='generate'))")
    elif likelihood is not None:
        raise ConfigError(f"likelihood applies to EvalConfig.mode 'likelihood' (multiple-choice benchmarks); "
                          f"{bench.name} is evaluated by generation here")
    if sampler is not None and sampler.seed not in (0, config.seed):
        log.warning(f"warning: ignoring sampler.seed={sampler.seed}: evaluation seeds everything with "
                    f"EvalConfig.seed ({config.seed})")


def check_evaluate_args(model, tokenizer, benchmark, samples, *, sampler, likelihood, config, fewshot_pool,
                        fewshot_source, reward_options, model_info, data_info) -> None:
    """One-line errors for arguments of :func:`evaluate` of the wrong type (:mod:`dare.eval.arguments`): a model or
    tokenizer path, rows instead of Samples, a dict where a config object belongs (pointed to its ``from_dict``)."""
    check_model_object(model)
    check_tokenizer_arg(tokenizer)
    check_benchmark_arg(benchmark)
    check_samples_arg("samples", samples)
    check_config_object("sampler", sampler, SamplerConfig,
                        "pick a sampler with SamplerConfig(sampler={value!r}, gen_length=...)")
    check_config_object("likelihood", likelihood, LikelihoodConfig)
    check_config_object("config", config, EvalConfig)
    if fewshot_pool is not None:
        check_samples_arg("fewshot_pool", fewshot_pool)
    check_text_arg("fewshot_source", fewshot_source)
    check_mapping_arg("reward_options", reward_options, ConfigError)
    check_mapping_arg("model_info", model_info)
    check_mapping_arg("data_info", data_info)


def check_samples_fit(bench: Benchmark, samples: Sequence[Sample], reward) -> None:
    """One-line :class:`InputError` for samples of another benchmark's kind: a multiple-choice benchmark's sample
    has choices and ``target["labels"]``, a generation benchmark's has none, and each target holds the fields the
    benchmark's ``reward`` (built: :meth:`Benchmark.scorer`) scores against (:func:`dare.rewards.reward_fields`;
    before: a bare KeyError, or accuracy 0 scored silently)."""
    from dare.rewards import reward_fields

    needs = reward_fields(reward)
    load = f"load them with get_benchmark({bench.name!r}).load(...)"
    for i, sample in enumerate(samples):
        target = sample.target if isinstance(sample.target, dict) else {}
        multiple_choice = bool(sample.choices) and "labels" in target
        where = f"samples[{i}] (id {sample.id})"
        if bench.kind == "choice" and not multiple_choice:
            raise InputError(f"{where} is no multiple-choice sample (no choices and target labels), as "
                             f"{bench.name} needs: {load}")
        if bench.kind != "choice" and multiple_choice:
            raise InputError(f"{where} is a multiple-choice sample; {bench.name} generates answers: {load}")
        missing = [(key, name) for key, name in needs if key not in target]
        if missing:
            key, name = missing[0]
            raise InputError(f"{where} lacks target['{key}'], which {bench.name}'s reward '{name}' needs: {load}")


@torch.no_grad()
def evaluate(model, tokenizer, benchmark: Benchmark | str, samples: Sequence[Sample], *,
             sampler=None, likelihood: LikelihoodConfig | None = None, config: EvalConfig | None = None,
             fewshot_pool: Sequence[Sample] | None = None, fewshot_source: str | None = None,
             reward_options: dict[str, Any] | None = None, model_info: dict[str, Any] | None = None,
             data_info: dict[str, Any] | None = None, progress: bool = False) -> EvalResults:
    """Evaluate ``model`` on ``samples`` of ``benchmark`` and score the predictions.

    Args:
        model / tokenizer: an in-memory DARE model (possibly peft-wrapped) and its tokenizer.
        benchmark: a :class:`Benchmark` or its name.
        samples: the problems (``benchmark.load(...)``).
        sampler: :class:`dare.rollout.SamplerConfig` for generation (None: the defaults); its unset ``sampler`` is
            the family's default sampler, its unset ``gen_length`` the benchmark's ``max_new_tokens``.
        likelihood: :class:`LikelihoodConfig` for likelihood mode (None: defaults).
        config: :class:`EvalConfig` (mode, shots, template, chat, n, batch size, seed, ks).
        fewshot_pool: exemplars for few-shot prompts (None: ``samples``, with a warning: other evaluated problems
            then show in prompts with their answers; a problem is never its own exemplar).
        fewshot_source: where ``fewshot_pool`` comes from, recorded as ``prompt.fewshot_source`` when prompts have
            exemplars (None: ``"evaluated data"`` without a pool, else ``"fewshot_pool"``).
        reward_options: passed to the benchmark's reward (``workers``, ``timeout`` for code).
        model_info / data_info: recorded in the results file (path, adapter / source, split, limit).
        progress: show progress bars on stderr.
    Returns the :class:`EvalResults` (``mode`` and ``timings`` included); write it with ``.write(path)``.
    """
    check_evaluate_args(model, tokenizer, benchmark, samples, sampler=sampler, likelihood=likelihood, config=config,
                        fewshot_pool=fewshot_pool, fewshot_source=fewshot_source, reward_options=reward_options,
                        model_info=model_info, data_info=data_info)
    bench = get_benchmark(benchmark) if isinstance(benchmark, str) else benchmark
    config = config or EvalConfig()
    config.check()
    mode = config.resolve_mode(bench)
    if not samples:
        raise ConfigError(f"{bench.name}: no samples to evaluate")
    # the reward built before any work: an unknown one (a plug-in's typo) or option fails now, not after the run
    check_samples_fit(bench, samples, bench.scorer(**(reward_options or {})))
    check_mode_settings(bench, mode, sampler, likelihood, config)
    shots = bench.default_shots if config.shots is None else config.shots
    if shots < 0:
        raise ConfigError(f"EvalConfig.shots must be >= 0; got {shots}")
    if fewshot_pool is None and shots > 0:
        log.warning(f"warning: the {shots}-shot exemplars come from the evaluated samples: prompts show other "
                    "evaluated problems with their answers; pass a fewshot_pool (e.g. the train split) or shots=0")
    pool = list(samples) if fewshot_pool is None else list(fewshot_pool)
    source = fewshot_source or (EVALUATED_DATA if fewshot_pool is None else "fewshot_pool")
    info = {"model": model_record(model, **(model_info or {})), "data": dict(data_info or {}),
            "fewshot": fewshot_record(shots, source)}
    with evaluating(model):
        if mode == "likelihood":
            return _likelihood(model, tokenizer, bench, samples, pool, shots, likelihood or LikelihoodConfig(),
                               config, info, progress)
        return _generation(model, tokenizer, bench, samples, pool, shots, sampler, config, info, reward_options,
                           progress)


# ------------------------------------------------------------------------------------ generation

def _generation(model, tokenizer, bench, samples, pool, shots, sampler, config, info, reward_options, progress):
    from dare.models.spec import family_of
    from dare.rollout import generate, resolve_config

    stop_ids = family_of(model).token_ids(model.config).stop_ids
    template = config.resolve_template(bench, shots)
    defaults = bench.generation_defaults(template)
    sampler = sampler or SamplerConfig()
    if sampler.gen_length is None:
        sampler = sampler.replace(gen_length=defaults.max_new_tokens)
    resolved = resolve_config(sampler.replace(seed=config.seed), model)
    kernels = kernel_settings()  # before decoding: a misspelt switch fails now, not after the run
    n = config.num_samples
    if n > 1 and resolved.temperature == 0 and resolved.confidence != "random":
        log.warning("warning: %d samples per problem with temperature 0 are identical; pass@k needs temperature > 0", n)
    chat = config.chat
    if chat is None:
        chat = getattr(tokenizer, "chat_template", None) is not None

    prompts = [bench.render(s, tokenizer, _shots(bench, s, pool, shots, config.seed), template, chat=chat)
               for s in samples]
    encoded = [encode(tokenizer, text, chat) for text in prompts]
    rows = [(i, j) for i in range(len(samples)) for j in range(n)]  # example id = i * n + j
    order = sorted(range(len(rows)), key=lambda r: -len(encoded[rows[r][0]]))
    completions: list[dict[str, Any]] = [{} for _ in rows]
    nfe = generated = 0
    bar = None
    if progress:
        from dare.progress import progress_bar

        bar = progress_bar(len(rows), f"{bench.name} ({resolved.sampler})", unit="sample")
    start = time.perf_counter()
    for b in range(0, len(order), config.batch_size):
        batch = order[b:b + config.batch_size]
        out = generate(model, [encoded[rows[r][0]] for r in batch], config=resolved,
                       example_ids=[rows[r][0] * n + rows[r][1] for r in batch])
        nfe += out.nfe
        for k, r in enumerate(batch):
            keep = out.completion_mask[k]
            tokens = out.completion[k][keep].tolist()
            generated += len(tokens)
            completions[r] = _finish(tokenizer, tokens, stop_ids, defaults.stop, int(out.num_steps[k]))
        if bar is not None:
            bar.update(len(batch))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()

    predictions = [[completions[i * n + j]["text"] for j in range(n)] if n > 1 else completions[i]["text"]
                   for i in range(len(samples))]
    scoring_start = time.perf_counter()
    try:
        results = score_predictions(
            bench, samples, predictions, prompts=prompts, ks=config.ks, reward_options=reward_options,
            model=info["model"], sampler={"name": resolved.sampler, "settings": dataclasses.asdict(resolved),
                                          "kernels": kernels},
            seed=config.seed, prompt={"template": template, "shots": shots, "chat": chat, "fewshot_seed": config.seed,
                                      "stop": list(defaults.stop), **info["fewshot"]},
            data=info["data"],
        )  # fmt: skip
    except RewardFailed as err:  # a plug-in reward's bug: the generations are not lost (dare eval run saves them)
        err.predictions = [{"id": s.id, "prediction": p, "answer": s.answer}
                           for s, group in zip(samples, predictions) for p in ([group] if n == 1 else group)]
        raise
    for record, done in zip(results.samples, completions):  # records are ordered (problem, sample) like rows
        record.update(tokens=done["tokens"], steps=done["steps"], finish=done["finish"])
    results.mode = "generate"
    results.timings = {
        "generation_seconds": round(seconds, 4),
        "scoring_seconds": round(time.perf_counter() - scoring_start, 4),
        "generated_tokens": generated,
        "tokens_per_second": round(generated / seconds, 2) if seconds > 0 else None,
        "nfe": nfe,
        "batches": -(-len(rows) // config.batch_size),
        "mean_steps": round(sum(c["steps"] for c in completions) / len(completions), 2),
        "finished_by_length": sum(c["finish"] == "length" for c in completions),
    }
    cut = results.timings["finished_by_length"]
    if cut:  # their answers may be cut off: the accuracy then measures the budget as much as the model
        why = ("with suppress_eos a completion ends only at a stop string or the length" if resolved.suppress_eos
               else "a larger --gen-length lets them finish")
        log.warning(f"warning: {bench.name}: {cut} of {len(completions)} completions used all {resolved.gen_length} "
                    f"positions without a stop (finish=length): their answers may be cut off; {why}")
    return results


def _finish(tokenizer, tokens: list[int], stop_ids: Sequence[int], stop: Sequence[str], steps: int) -> dict[str, Any]:
    """Decode a completion (already cut after its first stop id) and cut it at the first stop string.
    ``finish``: ``stop`` (ended by a stop id), ``stop_string`` or ``length`` (ran out of positions)."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    finish = "stop" if tokens and tokens[-1] in stop_ids else "length"
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut >= 0:
        text, finish = text[:cut], "stop_string"
    return {"text": text, "tokens": len(tokens), "steps": steps, "finish": finish}


# ------------------------------------------------------------------------------------ likelihood

def choice_requests(tokenizer, bench: Benchmark, samples: Sequence[Sample], pool: Sequence[Sample], shots: int,
                    seed: int, chat: bool, first_group: int = 0):
    """``(prompts, requests, spans, chars)``: the scored prompt per sample, one :class:`Request` per option
    (group = the sample's index, so its options share corruptions), each sample's ``(start, end)`` in the
    request list, and each option's character length."""
    prompts, requests, spans, chars = [], [], [], []
    for index, sample in enumerate(samples):
        exemplars = _shots(bench, sample, pool, shots, seed)
        if chat:
            prompt = tokenizer.apply_chat_template(bench.messages(sample, exemplars, "likelihood"), tokenize=False,
                                                   add_generation_prompt=True)
        else:
            prompt = bench.choice_prompt(sample, exemplars)
        prompts.append(prompt)
        start = len(requests)
        for option in bench.continuations(sample):
            context, continuation = split_whitespace(prompt, option if not chat else option.lstrip())
            context_ids = encode(tokenizer, context, chat)
            whole = encode(tokenizer, context + continuation, chat)
            if whole[:len(context_ids)] == context_ids and len(whole) > len(context_ids):
                continuation_ids = whole[len(context_ids):]
            else:  # the tokenizer merged across the boundary: encode the option on its own
                continuation_ids = list(tokenizer(continuation, add_special_tokens=False)["input_ids"])
            requests.append(Request(context_ids, continuation_ids, first_group + index))
            chars.append(len(option.lstrip()))  # lm-eval's acc_norm: the choice's own characters, no delimiter
        spans.append((start, len(requests)))
    return prompts, requests, spans, chars


def split_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """Move the context's trailing whitespace to the continuation (as lm-eval does)."""
    stripped = context.rstrip()
    return stripped, context[len(stripped):] + continuation


def _likelihood(model, tokenizer, bench, samples, pool, shots, likelihood, config, info, progress):
    likelihood = likelihood.validated()
    kernels = kernel_settings()
    chat = bool(config.chat)
    prompts, requests, spans, chars = choice_requests(tokenizer, bench, samples, pool, shots, config.seed, chat)
    stats = LikelihoodStats()
    start = time.perf_counter()
    terms = continuation_elbo(model, requests, likelihood, seed=config.seed, batch_size=config.batch_size,
                              progress=f"{bench.name} (likelihood)" if progress else False, stats=stats)
    seconds = time.perf_counter() - start
    elbo = terms.mean(1)
    tokens = [len(r.continuation) for r in requests]

    predictions, per_sample = [], []
    hits = {"acc": 0, "acc_norm": 0}
    for sample, (a, b) in zip(samples, spans):
        labels = sample.target["labels"]
        scores = normalise(elbo[a:b], tokens[a:b], chars[a:b], likelihood.length_norm)
        best = int(torch.argmax(scores))
        predictions.append(labels[best])
        gold = sample.target.get("index")
        for name, norm in (("acc", "none"), ("acc_norm", "chars")):
            hits[name] += int(gold is not None and int(torch.argmax(normalise(elbo[a:b], tokens[a:b], chars[a:b], norm))) == gold)
        per_sample.append({"choice_elbo": [round(float(x), 6) for x in elbo[a:b]],
                           "choice_scores": [round(float(x), 6) for x in scores],
                           "choice_tokens": tokens[a:b], "choice_chars": chars[a:b], "predicted_index": best})

    results = score_predictions(
        bench, samples, predictions, prompts=prompts, ks=config.ks,
        model=info["model"], sampler={"name": "mc_elbo", "settings": dataclasses.asdict(likelihood),
                                      "kernels": kernels},
        seed=config.seed, prompt={"template": "likelihood", "shots": shots, "chat": chat, "fewshot_seed": config.seed,
                                  **info["fewshot"]},
        data=info["data"],
    )  # fmt: skip
    for record, extra in zip(results.samples, per_sample):
        record.update(extra)
    if all(s.target.get("index") is not None for s in samples):
        results.metrics["acc"] = hits["acc"] / len(samples)
        results.metrics["acc_norm"] = hits["acc_norm"] / len(samples)
    results.mode = "likelihood"
    results.timings = {
        "likelihood_seconds": round(seconds, 4),
        "options": stats.requests, "mc_terms": stats.mc_terms, "rows": stats.rows, "forwards": stats.forwards,
        "tokens_per_second": round(stats.tokens / seconds, 2) if seconds > 0 else None,
    }
    return results


__all__ = ["MODES", "EvalConfig", "choice_requests", "encode", "evaluate", "model_record", "split_whitespace"]
