"""lm-evaluation-harness model ``dare``: run DARE diffusion models (any family, any registered sampler) in lm-eval.

```bash
pip install "dare-dllm[lm-eval]"
dare eval lm-eval --model dare --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,sampler=fastdllm,cache=dual \\
    --tasks gsm8k --batch_size 8
```

``dare eval lm-eval ARGS...`` registers the model and runs lm-eval's own CLI with ``ARGS``; lm-eval versions that
load ``lm_eval.models`` entry points find it on their own (``lm_eval --model dare ...``), and in Python
``import dare.eval.lm_harness`` registers it. Model args (``--model_args k=v,...``): ``pretrained`` (checkpoint
directory, hub name or ``tiny:FAMILY[:SEED]``), ``adapter``, ``tokenizer`` (a tokenizer directory or hub name, for
a checkpoint saved without tokenizer files), ``dtype``, ``seed`` (default: torch's seed when the model
is made, which lm-eval sets from ``--seed`` before it makes the model; 1234 by default), ``mc_batch_size``, plus any
:class:`~dare.rollout.SamplerConfig` field (decoding) and any :class:`~dare.eval.likelihood.LikelihoodConfig` field
(MC-ELBO). An unknown one is a one-line error. ``device`` and ``batch_size`` come from lm-eval's ``--device`` and
``--batch_size``, which its CLI passes to the model itself (``dare eval lm-eval`` refuses them in ``--model_args``,
where they would reach the model twice); in Python they are keyword arguments.

Requests are answered exactly as ``dare eval run`` answers them, so the two give the same predictions:

* ``generate_until``: :func:`dare.rollout.generate` in batches of ``batch_size`` prompts (longest first); row
  ``j`` of document ``d`` samples from the stream seeded by ``(seed, d * repeats + j)``, so predictions do not
  depend on the batch size or order. ``gen_length`` is the model arg if given, else the request's
  ``max_gen_toks`` (rounded up to whole blocks, the text cut back to that many tokens); the request's ``temperature`` /
  ``top_p`` / ``top_k`` / ``do_sample`` apply unless the model args set them (a model arg that overrides a
  request's different value is warned about once). ``do_sample=True`` without a temperature samples at
  temperature 1.0 (as lm-eval's vLLM model does), ``do_sample=True`` with ``temperature=0`` is an error,
  ``do_sample=False`` decodes greedily; other ``gen_kwargs`` (``num_beams``, ``repetition_penalty``, ...) are not
  applied (a warning names them once). The completion ends at the family's stop ids and at the request's
  ``until`` strings.
* ``loglikelihood``: the MC-ELBO of :func:`dare.eval.likelihood.continuation_elbo` (block-causal families use
  their ``[noisy ; clean]`` forward); the options of one document share their corruptions (noise group = the
  document id). ``is_greedy`` is always False (a diffusion LM has no left-to-right greedy continuation).
* ``loglikelihood_rolling``: the MC-ELBO of the whole text given BOS, a lower bound of ``log p(text)`` (so
  perplexities are upper bounds).

Every resolved setting (the model record, each distinct resolved sampler with the request settings that
produced it, the likelihood settings, seed and batch size) is returned by :meth:`DareLM.get_model_info`, which
lm-eval stores under ``config`` in its results file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from typing import Any

from dare.errors import ConfigError

try:  # lm-eval is optional: the model class subclasses its LM only when it is installed.
    from lm_eval.api.model import LM as _LM
    from lm_eval.api.registry import register_model as _register_model
except ImportError as _err:  # pragma: no cover - depends on the environment
    _LM = object
    _IMPORT_ERROR: ImportError | None = _err

    def _register_model(*names):
        return lambda cls: cls
else:
    _IMPORT_ERROR = None

OWN_ARGS = ("pretrained", "adapter", "dtype", "device", "batch_size", "max_batch_size", "seed", "mc_batch_size",
            "trust_remote_code", "compile_blocks")
"""Model args that are not SamplerConfig / LikelihoodConfig fields (``trust_remote_code`` is accepted and
ignored: DARE's models are native)."""
SAMPLING_KEYS = ("temperature", "top_p", "top_k")
"""Request ``gen_kwargs`` that set the sampler when the model args do not."""
REQUEST_KEYS = ("until", "max_gen_toks", "do_sample", *SAMPLING_KEYS)
"""The request ``gen_kwargs`` DARE applies; any other one (an HF-only ``num_beams``, ...) is warned about once."""
DO_SAMPLE_TEMPERATURE = 1.0
"""The temperature of ``do_sample=True`` without one (lm-eval's vLLM model leaves vLLM's default, 1.0)."""

log = logging.getLogger("dare.eval")


def require_lm_eval() -> None:
    if _IMPORT_ERROR is not None:
        raise ConfigError(f"the lm-eval model needs lm-eval (pip install 'dare-dllm[lm-eval]'): {_IMPORT_ERROR}")


@_register_model("dare")
class DareLM(_LM):
    """lm-eval ``LM`` backed by a DARE model, :func:`dare.rollout.generate` and the MC-ELBO (module docstring)."""

    def __init__(self, pretrained: str | None = None, adapter: str | None = None, dtype: str | None = None,
                 device: str | None = None, batch_size: int | str = 8, seed: int | str | None = None,
                 mc_batch_size: int | str | None = None, compile_blocks: bool | str = False, model=None, tokenizer=None,
                 **options: Any):
        require_lm_eval()
        super().__init__()
        import torch

        from dare.eval.harness import boolean, positive_int, seed_number, split_options
        from dare.eval.likelihood import LikelihoodConfig
        from dare.rollout import SamplerConfig
        from dare.rollout.engine import check_environment

        check_environment()  # a misspelt DARE_* switch fails now, not when lm-eval asks for the model info at the end

        if pretrained is None and model is None:
            raise ConfigError("the dare lm-eval model needs pretrained=CHECKPOINT|HUB_NAME|tiny:FAMILY in --model_args")
        if str(batch_size).startswith("auto"):
            raise ConfigError("--batch_size auto is not supported by the dare model; give a number")
        self.batch_size = positive_int("batch_size", batch_size)
        self.mc_batch_size = positive_int("mc_batch_size", mc_batch_size or self.batch_size)
        # without a seed model arg: torch's, which lm-eval's --seed set before it made the model (read now: loading
        # a tiny model reseeds torch)
        self.seed = torch.initial_seed() % 2**32 if seed is None else seed_number("seed", seed)
        self._warned: set[tuple] = set()  # warnings given once per model
        compile_blocks = boolean("compile_blocks", compile_blocks)
        self.sampler_fields, likelihood = split_options(options, OWN_ARGS, "dare model arg")
        SamplerConfig.from_dict(self.sampler_fields).check_values()  # names, types and ranges before the model loads
        if "sampler" in self.sampler_fields:
            SamplerConfig.from_dict({**self.sampler_fields, "seed": self.seed}).resolved()
        self.likelihood = LikelihoodConfig.from_dict(likelihood)
        info = {"path": pretrained, "adapter": adapter}
        if model is None:
            from dare.eval.run import load_for_eval

            if str(device or "").startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"  # lm-eval's CLI asks for cuda:0 unless told otherwise

            tokenizer_path = tokenizer if isinstance(tokenizer, str) else None  # model_args tokenizer=PATH
            model, tokenizer, info = load_for_eval(str(pretrained), adapter, device, dtype, tokenizer=tokenizer_path)
        elif tokenizer is None:
            raise ConfigError("DareLM(model=...) needs its tokenizer too")
        self.model = model.eval()
        if compile_blocks:
            from dare.models.compile import compile_blocks as compile_model_blocks

            compile_model_blocks(self.model)
        self.tokenizer = tokenizer
        self.model_info = {**info, "compile_blocks": compile_blocks}
        self.chat_applied = False
        self.resolved_samplers: list[dict[str, Any]] = []

    # ------------------------------------------------------------------------------ lm-eval hooks

    @property
    def device(self):
        from dare.rollout.samplers import model_device

        return model_device(self.model)

    @property
    def eot_token_id(self) -> int:
        from dare.models.spec import family_of

        return family_of(self.model).token_ids(self.model.config).eos

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.model_info.get("path")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """lm-eval's ``--apply_chat_template``: the tokenizer's chat template (prompts then hold their special
        tokens, so they are encoded without adding any, as ``dare eval run --chat`` does)."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ConfigError("--apply_chat_template: this tokenizer has no chat template")
        self.chat_applied = True
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def get_model_info(self) -> dict[str, Any]:
        """Stored by lm-eval under ``config``: the model record, every resolved decoding setting and the plug-ins
        this process imported (``imports``, as DARE's own results files record them)."""
        from dare.eval.run import model_record
        from dare.plugins import imported
        from dare.rollout.engine import kernel_settings

        return {"dare": {
            "model": model_record(self.model, **self.model_info),
            "samplers": self.resolved_samplers,
            "sampler_args": dict(self.sampler_fields),
            "likelihood": dataclasses.asdict(self.likelihood),
            "kernels": kernel_settings(),
            "seed": self.seed, "batch_size": self.batch_size, "mc_batch_size": self.mc_batch_size,
            "chat_template_applied": self.chat_applied, "imports": imported(),
        }}

    # ---------------------------------------------------------------------------------- tokens

    def _encode(self, text: str) -> list[int]:
        from dare.eval.run import encode

        return encode(self.tokenizer, text, self.chat_applied)

    # ------------------------------------------------------------------------------- generation

    def _warn_once(self, key: tuple, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def _warn_unapplied(self, gen_kwargs: dict[str, Any]) -> None:
        """One line naming the request keys DARE does not apply (each key once per model) and the ones it does."""
        new = [k for k in gen_kwargs if k not in REQUEST_KEYS and ("gen_kwargs", k) not in self._warned]
        if new:
            self._warned.update(("gen_kwargs", k) for k in new)
            log.warning(f"warning: dare model: ignoring gen_kwargs {', '.join(f'{k}={gen_kwargs[k]!r}' for k in new)}: "
                        f"DARE applies {', '.join(REQUEST_KEYS)} (set decoding with SamplerConfig fields in "
                        "--model_args)")

    def _warn_overridden(self, gen_kwargs: dict[str, Any], do_sample: bool | None) -> None:
        """Once per overridden request setting: a model arg wins over the request's different value."""
        model = self.sampler_fields
        overrides = []
        if "gen_length" in model and gen_kwargs.get("max_gen_toks") is not None \
                and not _same(model["gen_length"], gen_kwargs["max_gen_toks"]):
            overrides.append(("gen_length", "max_gen_toks"))
        overrides += [(key, key) for key in SAMPLING_KEYS
                      if key in model and gen_kwargs.get(key) is not None and not _same(model[key], gen_kwargs[key])]
        temperature = _number(model.get("temperature"))
        if temperature is not None and do_sample is not None and (temperature > 0) != do_sample:
            overrides.append(("temperature", "do_sample"))
        for model_key, key in overrides:
            self._warn_once(("override", key, repr(gen_kwargs[key])),
                            f"warning: dare model arg {model_key}={model[model_key]} overrides the request's "
                            f"{key}={gen_kwargs[key]} (gen_kwargs; model args win)")

    def _sampler(self, gen_kwargs: dict[str, Any]):
        """The resolved sampler of one request's ``gen_kwargs`` (recorded once per distinct result)."""
        from dare.eval.harness import boolean, request_sampler
        from dare.rollout import default_sampler

        do_sample = None if gen_kwargs.get("do_sample") is None else boolean("do_sample", gen_kwargs["do_sample"])
        self._warn_unapplied(gen_kwargs)
        self._warn_overridden(gen_kwargs, do_sample)
        fields = dict(self.sampler_fields)
        for key in SAMPLING_KEYS:
            if key in gen_kwargs and key not in fields and gen_kwargs[key] is not None:
                fields[key] = gen_kwargs[key]
        if "temperature" not in self.sampler_fields:
            if do_sample is False:
                fields["temperature"] = 0.0
            elif do_sample is True and "temperature" not in fields:
                fields["temperature"] = DO_SAMPLE_TEMPERATURE
            elif do_sample is True and _number(fields["temperature"]) == 0:
                raise ConfigError(f"gen_kwargs do_sample=True and temperature={gen_kwargs['temperature']} contradict "
                                  "each other: give a temperature > 0 to sample, or do_sample=False to decode greedily")
        config = request_sampler(fields, default_sampler(self.model), gen_kwargs.get("max_gen_toks"), self.seed,
                                 model=self.model)
        record = {"request": {k: v for k, v in gen_kwargs.items() if k != "until"},
                  "settings": dataclasses.asdict(config)}
        if record not in self.resolved_samplers:
            self.resolved_samplers.append(record)
        return config

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        import torch

        from dare.eval.harness import completion_text
        from dare.progress import progress_bar
        from dare.rollout import generate

        seen: dict[tuple, int] = defaultdict(int)
        example_ids = []
        for req in requests:  # lm-eval repeats an instance `repeats` times: row j of document d
            key = (req.task_name, req.doc_id)
            example_ids.append(int(req.doc_id or 0) * int(req.repeats or 1) + seen[key])
            seen[key] += 1
        groups: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[json.dumps(req.args[1], sort_keys=True, default=str)].append(i)
        results: list[str] = [""] * len(requests)
        bar = progress_bar(len(requests), "dare generate_until", disable=disable_tqdm or self.rank != 0)
        for members in groups.values():
            gen_kwargs = dict(requests[members[0]].args[1])
            until = gen_kwargs.get("until") or []
            stops = [until] if isinstance(until, str) else list(until)
            config = self._sampler(gen_kwargs)
            limit = None if "gen_length" in self.sampler_fields else gen_kwargs.get("max_gen_toks")
            prompts = {i: self._encode(requests[i].args[0]) for i in members}
            order = sorted(members, key=lambda i: -len(prompts[i]))
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                with torch.no_grad():
                    out = generate(self.model, [prompts[i] for i in batch], config=config,
                                   example_ids=[example_ids[i] for i in batch])
                for row, i in enumerate(batch):
                    results[i] = completion_text(self.tokenizer, out, row, stops, limit)
                    self.cache_hook.add_partial("generate_until", requests[i].args, results[i])
                bar.update(len(batch))
        bar.close()
        return results

    # ------------------------------------------------------------------------------- likelihood

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of ``(context, continuation)`` as ``dare eval run`` scores options: the context's trailing
        whitespace moves to the continuation, and the continuation is the tail of the whole text's ids."""
        from dare.eval.run import split_whitespace

        context, continuation = split_whitespace(context, continuation)
        context_ids = self._encode(context)
        whole = self._encode(context + continuation)
        if whole[:len(context_ids)] == context_ids and len(whole) > len(context_ids):
            return context_ids, whole[len(context_ids):]
        return context_ids, list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])

    def _elbo(self, requests, disable_tqdm: bool) -> list[float]:
        from dare.eval.likelihood import continuation_elbo

        terms = continuation_elbo(self.model, requests, self.likelihood, seed=self.seed,
                                  batch_size=self.mc_batch_size, progress=not disable_tqdm and self.rank == 0)
        return terms.mean(1).tolist()

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        from dare.eval.likelihood import Request

        scored = [Request(*self._pair(*req.args[:2]), int(req.doc_id or 0)) for req in requests]
        results = [(value, False) for value in self._elbo(scored, disable_tqdm)]
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from dare.eval.likelihood import Request

        scored = []
        for req in requests:
            ids = self._encode(req.args[0])
            bos = getattr(self.tokenizer, "bos_token_id", None)
            cut = 1 if ids and bos is not None and ids[0] == bos else 0
            if len(ids) <= cut:
                raise ConfigError(f"loglikelihood_rolling: document {req.doc_id} has no tokens to score")
            scored.append(Request(ids[:cut], ids[cut:], int(req.doc_id or 0)))
        results = self._elbo(scored, disable_tqdm)
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, result)
        return results


def _number(value: Any) -> float | None:
    """``value`` as a float, None when it is None or no number (the sampler config reports that one)."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _same(a: Any, b: Any) -> bool:
    """Whether a model arg and a request value are the same setting (``16`` and ``16.0`` are)."""
    x, y = _number(a), _number(b)
    return x == y if x is not None and y is not None else a == b


__all__ = ["OWN_ARGS", "DareLM", "require_lm_eval"]
