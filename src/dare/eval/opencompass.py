"""OpenCompass model plug-in: run DARE diffusion models (any family, any registered sampler) in OpenCompass.

Install OpenCompass next to DARE (``pip install "dare-dllm[opencompass]"``, or in its own environment with
``pip install opencompass`` and DARE installed there), then use the class in an OpenCompass config::

    from dare.eval.opencompass import DareDiffusionModel

    models = [dict(
        type=DareDiffusionModel, abbr="llada-8b-instruct-fastdllm",
        path="GSAI-ML/LLaDA-8B-Instruct",                       # or a local checkpoint, or tiny:llada
        sampler=dict(sampler="fastdllm", cache="dual", block_length=32),   # any SamplerConfig field
        likelihood=dict(mc_samples=32),                         # any LikelihoodConfig field (ppl / ll tasks)
        imports=["my_sampler.py"],                              # your plug-ins (dare.plugins), in every task
        max_out_len=256, batch_size=8, run_cfg=dict(num_gpus=1),
    )]

(see ``configs/opencompass/``; ``dare eval opencompass CONFIG`` runs OpenCompass after checking the config, with
one-line loading errors: :mod:`dare.commands.eval_oc`). OpenCompass calls:

* ``generate(inputs, max_out_len)`` (``gen`` datasets): decoding with :func:`dare.rollout.generate`;
  ``gen_length`` is the sampler's if set, else ``max_out_len`` (rounded up to whole blocks, then cut);
  completions end at the family's stop ids and at OpenCompass's stop strings. A ``min_out_len`` (DARE's
  samplers have no minimum length) or another keyword argument is not applied: a warning names it once.
* ``get_ppl(inputs, mask_length)`` (``ppl`` datasets): ``-ELBO / tokens`` of each input after its first
  ``mask_length`` tokens (the whole text when None): an upper bound on the per-token NLL, lowest wins.
* ``get_loglikelihood(inputs, conts)`` (``ll`` datasets): the MC-ELBO of ``cont`` given the text before it.

Prompts longer than ``max_seq_len`` (less ``gen_length`` when generating, less the scored tokens when scoring) are
cut from the left, with one warning per model and kind (how many of the call's inputs were cut).

The same question scored under different labels sits at the same position of every batch, which is the
noise group of :func:`dare.eval.likelihood.continuation_elbo`: its options share corruptions.

The module imports without OpenCompass; creating the model without it raises a one-line ``ConfigError``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dare.errors import ConfigError, InputError, closest

try:  # OpenCompass is optional: the class below subclasses its BaseModel only when it is installed.
    from opencompass.models.base import BaseModel as _BaseModel
except ImportError as _err:  # pragma: no cover - depends on the environment
    _BaseModel = object
    _IMPORT_ERROR: ImportError | None = _err
else:
    _IMPORT_ERROR = None

ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
"""OpenCompass prompt roles -> chat-template roles."""
OPENCOMPASS_MODEL_KEYS = ("type", "abbr", "run_cfg", "max_out_len", "batch_size", "summarizer_abbr",
                          "pred_postprocessor", "min_out_len")
"""Keys of a model entry that OpenCompass's tasks use and remove before they build the model."""

log = logging.getLogger("dare.eval")


def opencompass_missing() -> str | None:
    """Why the plug-in cannot run (OpenCompass is not importable, and how to install it), or None."""
    if _IMPORT_ERROR is None:
        return None
    return f"the OpenCompass plug-in needs opencompass (pip install 'dare-dllm[opencompass]'): {_IMPORT_ERROR}"


def require_opencompass() -> None:
    missing = opencompass_missing()
    if missing is not None:
        raise ConfigError(missing)


class DareDiffusionModel(_BaseModel):
    """An OpenCompass ``BaseModel`` backed by a DARE model, a sampler and the MC-ELBO estimator.

    Args:
        path: checkpoint directory / hub name, or ``tiny:FAMILY[:SEED]``.
        adapter: LoRA adapter directory (optional).
        sampler: :class:`dare.rollout.SamplerConfig` fields (default: the family's sampler).
        likelihood: :class:`dare.eval.likelihood.LikelihoodConfig` fields for ``get_ppl`` / ``get_loglikelihood``.
        dtype / device: weights dtype and device (default: bf16 on CUDA, fp32 on CPU).
        max_seq_len: longest prompt + output; longer contexts are cut from the left (one warning per model).
        chat: wrap ``gen`` prompts in the tokenizer's chat template (default: when it has one). Likelihood
            tasks always score the plain text.
        meta_template: OpenCompass meta template (prompt rounds); with ``chat`` the default maps roles to
            user/assistant turns like OpenCompass's ``HuggingFacewithChatTemplate``.
        generation_kwargs: more sampler fields (OpenCompass's per-model generation settings; ``sampler`` wins).
        stop_words: extra stop strings for generation.
        seed: seeds sampling and the MC corruptions (a sampler ``seed`` is an error: this one is used).
        mc_batch_size: corrupted rows per forward in likelihood scoring.
        compile_blocks: compile every transformer block once before decoding (``torch.compile``, dynamic
            shapes; faster generation on CUDA).
        model / tokenizer: an already loaded DARE model and tokenizer (in-process use; ``path`` is then only
            recorded).
    """

    is_api = False

    def __init__(self, path: str, adapter: str | None = None, sampler: dict | None = None,
                 likelihood: dict | None = None, dtype: str | None = None, device: str | None = None,
                 max_seq_len: int = 4096, chat: bool | None = None, meta_template: dict | None = None,
                 generation_kwargs: dict | None = None, stop_words: Sequence[str] = (), seed: int = 0,
                 mc_batch_size: int = 16, compile_blocks: bool = False, tokenizer_only: bool = False, model=None,
                 tokenizer=None, imports: Sequence[str] | None = None, **unknown: Any):
        require_opencompass()
        from dare.eval.harness import boolean
        from dare.eval.likelihood import LikelihoodConfig
        from dare.rollout.engine import check_environment

        check_environment()
        # OpenCompass passes every key of the model entry: a misspelt one is a one-line error, as are unknown
        # sampler / likelihood fields and an unknown sampler preset
        check_model_args({"sampler": sampler, "likelihood": likelihood, "generation_kwargs": generation_kwargs,
                          "imports": imports, "seed": seed, **unknown})
        compile_blocks = boolean("compile_blocks", compile_blocks)
        super().__init__(path=path, max_seq_len=max_seq_len, tokenizer_only=tokenizer_only,
                         meta_template=meta_template, generation_kwargs=dict(generation_kwargs or {}))
        self.sampler_fields = dict(sampler or {})
        self.likelihood = LikelihoodConfig.from_dict(dict(likelihood or {}))
        self.stop_words = list(stop_words)
        self.seed = seed
        self.mc_batch_size = mc_batch_size
        self._calls = 0
        self._warned: set[tuple] = set()  # warnings given once per model
        if model is None and not tokenizer_only:  # a missing or unreadable checkpoint is a one-line error
            from dare.eval.run import load_for_eval

            model, loaded_tokenizer, _ = load_for_eval(path, adapter, device, dtype)
            tokenizer = tokenizer or loaded_tokenizer
        if tokenizer is None:
            tokenizer = _load_tokenizer(path)
        self.tokenizer = tokenizer
        self.model = None if tokenizer_only else model.eval()
        if compile_blocks and self.model is not None:
            from dare.models.compile import compile_blocks as compile_model_blocks

            compile_model_blocks(self.model)
        self.chat = getattr(tokenizer, "chat_template", None) is not None if chat is None else bool(chat)
        self.chat_parser = None
        if self.chat and not meta_template:  # gen prompts keep their roles (PromptList of role dicts)
            from opencompass.models.base_api import APITemplateParser

            self.chat_parser = APITemplateParser(dict(round=[
                dict(role="HUMAN", api_role="HUMAN"), dict(role="SYSTEM", api_role="HUMAN"),
                dict(role="BOT", api_role="BOT", generate=True)]))

    def parse_template(self, prompt_template, mode: str):
        """``gen`` prompts of a chat model keep their turns (for the chat template); ``ppl`` prompts are plain
        text, which OpenCompass's likelihood inferencers require."""
        if mode == "gen" and self.chat_parser is not None:
            return self.chat_parser.parse_template(prompt_template, mode)
        return self.template_parser.parse_template(prompt_template, mode)

    # ------------------------------------------------------------------------------- tokens

    def encode(self, prompt: str):
        import torch

        return torch.tensor([self._ids(prompt)])

    def decode(self, tokens) -> str:
        ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def get_token_len(self, prompt: str) -> int:
        return len(self._ids(_plain(prompt)))

    def _ids(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    # ---------------------------------------------------------------------------- generation

    def sampler_config(self, max_out_len: int | None):
        """The resolved :class:`SamplerConfig` of a ``generate`` call."""
        from dare.eval.harness import request_sampler
        from dare.rollout import default_sampler

        return request_sampler({**self.generation_kwargs, **self.sampler_fields}, default_sampler(self.model),
                               max_out_len, self.seed, model=self.model)

    def generate(self, inputs: list, max_out_len: int, min_out_len: int | None = None,
                 stopping_criteria: Sequence[str] = (), **kwargs) -> list[str]:
        import torch

        from dare.eval.harness import completion_text
        from dare.rollout import generate

        if self.model is None:
            raise ConfigError("this DareDiffusionModel was built with tokenizer_only=True")
        self._warn_ignored({**({"min_out_len": min_out_len} if min_out_len else {}), **kwargs})
        config = self.sampler_config(max_out_len)
        room = self._room(config.gen_length)
        whole = [self._full_prompt_ids(item) for item in inputs]
        self._warn_cut("generation", sum(len(ids) > room for ids in whole), len(whole),
                       f"max_seq_len {self.max_seq_len} - gen_length {config.gen_length} = {room} tokens")
        prompts = [ids[-room:] for ids in whole]
        ids = list(range(self._calls, self._calls + len(prompts)))
        self._calls += len(prompts)
        with torch.no_grad():
            out = generate(self.model, prompts, config=config, example_ids=ids)
        stops = [s for s in (*stopping_criteria, *self.stop_words) if s]
        return [completion_text(self.tokenizer, out, row, stops, max_out_len) for row in range(len(prompts))]

    def _warn_ignored(self, arguments: Mapping[str, Any]) -> None:
        """One line naming the ``generate`` arguments not applied (each name once per model)."""
        new = [k for k in arguments if ("ignored", k) not in self._warned]
        if new:
            self._warned.update(("ignored", k) for k in new)
            why = (["DARE's samplers have no minimum output length"] if "min_out_len" in new else []) + (
                ["decoding settings go in the model entry's sampler=dict(...)"] if set(new) - {"min_out_len"} else [])
            log.warning(f"warning: DareDiffusionModel.generate ignores {', '.join(f'{k}={arguments[k]!r}' for k in new)}"
                        f": {'; '.join(why)}")

    def _warn_cut(self, kind: str, cut: int, total: int, limit: str) -> None:
        """Once per model and ``kind``: ``cut`` of this call's ``total`` inputs lost their start (``limit``)."""
        if cut and ("cut", kind) not in self._warned:
            self._warned.add(("cut", kind))
            log.warning(f"warning: DareDiffusionModel: {cut} of {total} {kind} inputs of this call are longer than "
                        f"{limit} and were cut from the left (their start is not seen); raise max_seq_len to keep "
                        "them (later cuts are not reported)")

    def _room(self, gen_length: int) -> int:
        return max(self.max_seq_len - gen_length, 1)

    def _full_prompt_ids(self, item) -> list[int]:
        if self.chat:
            text = self.tokenizer.apply_chat_template(_messages(item), add_generation_prompt=True, tokenize=False)
            return self._ids(text, special=False)
        return self._ids(_plain(item))

    def _prompt_ids(self, item, gen_length: int) -> list[int]:
        """The prompt's ids, cut from the left to ``max_seq_len - gen_length``."""
        return self._full_prompt_ids(item)[-self._room(gen_length):]

    # ---------------------------------------------------------------------------- likelihood

    def get_ppl(self, inputs: list, mask_length: Sequence[int] | None = None):
        """``-ELBO / scored tokens`` per input; the first ``mask_length[i]`` tokens are context."""
        import numpy as np

        requests = []
        for i, item in enumerate(inputs):
            ids = self._ids(_plain(item))
            special = 1 if ids and ids[0] == getattr(self.tokenizer, "bos_token_id", None) else 0
            cut = mask_length[i] if mask_length is not None else special
            if not 0 <= cut < len(ids):
                raise InputError(f"get_ppl: mask_length {cut} leaves nothing to score in a {len(ids)}-token input")
            requests.append(self._request(ids[:cut], ids[cut:], i))
        elbo = self._elbo(self._cut_contexts(requests))
        return np.array([-e / len(r.continuation) for e, r in zip(elbo, requests)])

    def get_loglikelihood(self, inputs: list, conts: Sequence[str]):
        """MC-ELBO of each ``conts[i]`` (and anything after it) given the text of ``inputs[i]`` before it."""
        import numpy as np

        requests = []
        for i, (item, cont) in enumerate(zip(inputs, conts)):
            text = _plain(item)
            at = text.rfind(cont) if cont else -1
            if at < 0:
                raise InputError(f"get_loglikelihood: continuation {cont[:40]!r} is not in input {i}")
            context = self._ids(text[:at])
            whole = self._ids(text)
            if whole[:len(context)] == context and len(whole) > len(context):
                continuation = whole[len(context):]
            else:
                continuation = self._ids(text[at:], special=False)
            requests.append(self._request(context, continuation, i))
        return np.array(self._elbo(self._cut_contexts(requests)))

    def _request(self, context: list[int], continuation: list[int], group: int):
        from dare.eval.likelihood import Request

        return Request(context, continuation, group)

    def _cut_contexts(self, requests: list) -> list:
        """``requests`` with each context cut from the left to ``max_seq_len`` less its continuation (one warning
        per model when any is)."""
        import dataclasses

        out, cut = [], 0
        for request in requests:
            room = max(self.max_seq_len - len(request.continuation), 0)
            if len(request.context) > room:
                cut += 1
                request = dataclasses.replace(request, context=request.context[-room:] if room else [])
            out.append(request)
        self._warn_cut("likelihood", cut, len(requests), f"max_seq_len {self.max_seq_len} tokens (context + scored "
                       "tokens)")
        return out

    def _elbo(self, requests) -> list[float]:
        from dare.eval.likelihood import continuation_elbo

        if self.model is None:
            raise ConfigError("this DareDiffusionModel was built with tokenizer_only=True")
        terms = continuation_elbo(self.model, requests, self.likelihood, seed=self.seed, batch_size=self.mc_batch_size)
        return terms.mean(1).tolist()


def model_arguments() -> tuple[str, ...]:
    """The keyword arguments ``DareDiffusionModel`` takes."""
    parameters = inspect.signature(DareDiffusionModel.__init__).parameters.values()
    return tuple(p.name for p in parameters if p.name != "self" and p.kind is not p.VAR_KEYWORD)


SECTIONS = ("sampler", "likelihood", "generation_kwargs")
"""The dict arguments of ``DareDiffusionModel`` whose keys are fields (``generation_kwargs`` holds sampler fields
too: OpenCompass's per-model generation settings, overridden by ``sampler``)."""


def key_places() -> dict[str, tuple[str, ...]]:
    """Where each key of a ``DareDiffusionModel`` entry goes: ``"entry"`` (an argument of the model entry, the
    model's own or OpenCompass's), ``"sampler"`` (a :class:`~dare.rollout.SamplerConfig` field) and
    ``"likelihood"`` (a :class:`~dare.eval.likelihood.LikelihoodConfig` field). ``seed`` is the model's argument
    only: it seeds sampling and the MC corruptions, and overrides a sampler ``seed``."""
    import dataclasses

    from dare.eval.likelihood import LikelihoodConfig
    from dare.rollout import SamplerConfig

    return {"entry": (*model_arguments(), *OPENCOMPASS_MODEL_KEYS),
            "sampler": tuple(f.name for f in dataclasses.fields(SamplerConfig) if f.name != "seed"),
            "likelihood": tuple(f.name for f in dataclasses.fields(LikelihoodConfig))}


def _written(key: str, place: str) -> str:
    """How a config writes ``key`` at ``place`` (a :func:`key_places` name)."""
    return f"{key}=... in the model entry" if place == "entry" else f"{place}=dict({key}=...)"


def check_key_places(args: Mapping[str, Any], name: str = "DareDiffusionModel") -> None:
    """Every key of a model entry (``args``: its arguments) and of its ``sampler`` / ``likelihood`` /
    ``generation_kwargs`` dicts is one that goes there: a key that goes in another of them is a one-line error
    saying where (``sampler=dict(mc_samples=8)`` -> ``likelihood=dict(mc_samples=...)``), a misspelt one names the
    closest key and where that one goes."""
    places = key_places()
    everything = list(dict.fromkeys(k for keys in places.values() for k in keys))
    sections = [("entry", args)] + [(s, args[s]) for s in SECTIONS if isinstance(args.get(s), Mapping)]
    for section, mapping in sections:
        own = places["sampler" if section == "generation_kwargs" else section]
        for key in mapping:
            if key in own:
                continue
            here = "an argument of DareDiffusionModel" if section == "entry" else f"a {section} option"
            homes = [place for place, keys in places.items() if key in keys]
            if homes:
                raise ConfigError(f"{name}: '{key}' is not {here}; write it as "
                                  + " or ".join(_written(key, place) for place in homes))
            hint = closest(key, everything)
            if hint in own:
                hint_text = f" (did you mean '{hint}'?)"
            elif hint is not None:  # a misspelt key of another place: say that place
                home = next(place for place, keys in places.items() if hint in keys)
                hint_text = f" (did you mean {_written(hint, home)}?)"
            else:
                hint_text = ""
            kind = "argument" if section == "entry" else f"{section} option"
            raise ConfigError(f"{name}: unknown {kind} '{key}'{hint_text}"
                              + (f"; valid: {', '.join(model_arguments())}" if section == "entry" else ""))


def check_model_args(args: Mapping[str, Any], name: str = "DareDiffusionModel") -> None:
    """The ``imports`` plug-ins (imported here: :func:`dare.plugins.load_plugins`), argument names, ``sampler`` /
    ``generation_kwargs`` fields (and the sampler preset) and ``likelihood`` fields of a ``DareDiffusionModel`` (:func:`check_key_places`, then the values); ``name`` starts the
    messages."""
    from dare.eval.harness import request_sampler, seed_number
    from dare.eval.likelihood import LikelihoodConfig
    from dare.rollout import SamplerConfig

    from dare.plugins import load_plugins

    # a plug-in's sampler, imported before the names are checked, in OpenCompass's process and in each task's
    load_plugins(args.get("imports"), f"{name}: imports")
    for key in SECTIONS:
        if args.get(key) is not None and not isinstance(args[key], Mapping):
            raise ConfigError(f"{name}: {key} must be a dict of fields, e.g. {key}=dict(...); got {args[key]!r}")
    check_key_places(args, name)
    try:
        sampler = {**(args.get("generation_kwargs") or {}), **(args.get("sampler") or {})}  # as sampler_config merges
        SamplerConfig.from_dict(sampler)
        if "sampler" in sampler:  # resolved as a request resolves it: an unknown preset, a wrong field type
            request_sampler(sampler, sampler["sampler"], None, 0)
        LikelihoodConfig.from_dict(dict(args.get("likelihood") or {}))
        if args.get("seed") is not None:
            seed_number("seed", args["seed"])
    except ConfigError as err:
        raise ConfigError(f"{name}: {err}") from None


def _load_tokenizer(path: str):
    """The tokenizer of ``path`` alone (``tokenizer_only=True``), with a one-line error."""
    from dare.models.loading import load_tokenizer, one_line

    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as err:  # the whole reason: the first line of transformers' is often a heading
        raise InputError(f"cannot load the tokenizer of {path}: {one_line(err)}") from None


def _plain(item) -> str:
    """A prompt as plain text: strings as they are, OpenCompass prompt lists joined by newlines."""
    if isinstance(item, str):
        return item
    return "\n".join(str(p["prompt"]) if isinstance(p, dict) else str(p) for p in item
                     if not (isinstance(p, dict) and "section" in p) and (not isinstance(p, dict) or p.get("prompt")))


def _messages(item) -> list[dict[str, str]]:
    """Chat messages of a prompt: a string is one user turn; role dicts map HUMAN/BOT/SYSTEM to
    user/assistant/system (consecutive turns of one role merged, as OpenCompass's chat wrapper does)."""
    if isinstance(item, str):
        return [{"role": "user", "content": item}]
    messages: list[dict[str, str]] = []
    for part in item:
        if not isinstance(part, dict) or "section" in part or not part.get("prompt"):
            continue
        role = ROLES.get(part.get("role"), "user")
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + part["prompt"]
        else:
            messages.append({"role": role, "content": part["prompt"]})
    return messages


if _IMPORT_ERROR is None:  # make ``type="DareDiffusionModel"`` work in OpenCompass configs too
    from opencompass.registry import MODELS

    MODELS.register_module(name="DareDiffusionModel", module=DareDiffusionModel, force=True)


__all__ = ["OPENCOMPASS_MODEL_KEYS", "DareDiffusionModel", "check_key_places", "check_model_args", "key_places",
           "model_arguments", "require_opencompass"]
