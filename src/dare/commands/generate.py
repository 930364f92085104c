"""``dare generate``: decode completions for prompts with a diffusion sampler.

``--model`` is a checkpoint directory (config.json, weights, tokenizer) or ``tiny:FAMILY`` for an
in-memory tiny random model with DARE's byte tokenizer (offline smoke tests); ``--tokenizer`` gives the tokenizer of
a checkpoint saved without one, and ``--adapter`` alone loads the base model the adapter records
(:func:`model_argument`). The tokenizer's chat template is applied unless ``--no-chat-template``. Any
:class:`dare.rollout.SamplerConfig` field can be set with ``--option key=value``.
"""

from __future__ import annotations

import argparse
import ast
import sys

HELP = "generate text with a diffusion sampler (llada, dream, fastdllm, ...)"
MEMORY_HINT = "the number of --prompt given at once or --gen-length, or choose --dtype bfloat16"
BUILTIN_SAMPLERS = ("llada", "dream", "fastdllm", "fastdllm_dream", "sdar", "llada2", "llada21", "llada21_speed")
"""The samplers :mod:`dare.rollout.samplers` registers, named here so that ``--help`` does not import torch
(``tests/test_rollout_review_fixes.py`` checks the two agree)."""


def sampler_names() -> list[str]:
    """The built-in sampler names, then any other registered by plug-ins already imported."""
    registry = sys.modules.get("dare.rollout.registry")
    extra = [name for name in (registry.SAMPLERS if registry else ()) if name not in BUILTIN_SAMPLERS]
    return list(BUILTIN_SAMPLERS) + extra


def configure(parser: argparse.ArgumentParser) -> None:
    from dare.plugins import add_import_argument

    add_model_arguments(parser)
    parser.add_argument("--prompt", action="append", required=True,
                        help="prompt text (repeat for a batch)")
    add_sampler_arguments(parser, default=None)
    parser.add_argument("--no-chat-template", "--no-chat", dest="no_chat_template", action="store_true",
                        help="tokenize the prompt as raw text (--no-chat, as dare eval spells it, is the same)")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    add_dtype_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_compile_argument(parser)
    add_import_argument(parser)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--adapter`` and ``--tokenizer``, shared by ``dare generate`` and ``dare eval run/sweep``
    (:func:`model_argument` resolves an omitted ``--model``)."""
    parser.add_argument("--model", default=None,
                        help="checkpoint directory / hub name, or tiny:FAMILY[:SEED] (e.g. tiny:llada); may be left "
                             "out with --adapter when the adapter records its base model")
    parser.add_argument("--adapter", default=None,
                        help="LoRA adapter to apply on top of --model: a directory with adapter_config.json and "
                             "adapter_model.safetensors (e.g. RUN/final), or a hub id")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer directory or hub name (default: the --model's), for a checkpoint saved "
                             "without tokenizer files")


DTYPES = ("bfloat16", "float16", "float32", "auto")


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` of the commands that load a model for decoding (``dare generate``, ``dare eval run/sweep``)."""
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="weights dtype (default: bfloat16 on GPU, float32 on CPU; auto: the checkpoint's)")


def model_argument(args: argparse.Namespace) -> str:
    """``--model``, or without it the base model recorded in ``--adapter``'s adapter_config.json (a note on stderr
    says so); one-line :class:`~dare.errors.ConfigError` when neither gives one, or for an ``--adapter`` that is no
    adapter (:func:`~dare.models.loading.check_adapter_path`). Sets ``args.model``."""
    from dare.errors import ConfigError
    from dare.models.loading import check_adapter_path, recorded_base

    local = check_adapter_path(args.adapter) if args.adapter is not None else None  # before anything loads
    if args.model is not None:
        return args.model
    if args.adapter is None:
        raise ConfigError("--model is required (a checkpoint directory, hub name or tiny:FAMILY)")
    base = recorded_base(args.adapter) if local is not None else None
    if not base:
        why = ("is a hub id, whose recorded base model is not read here" if local is None
               else "records no base model (base_model_name_or_path)")
        raise ConfigError(f"--adapter {args.adapter} {why}; pass its base model as --model")
    print(f"note: loading the base model {base} recorded in --adapter {args.adapter}", file=sys.stderr)
    args.model = base
    return base


def add_compile_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile-blocks", action="store_true",
                        help="torch.compile every transformer block (dynamic shapes; the rollout graphs record the "
                             "compiled blocks): faster decoding on CUDA after a one-time compilation")


def compile_if_asked(model, args: argparse.Namespace) -> bool:
    """``--compile-blocks``: compile ``model``'s blocks in place; whether it did (for the results' settings)."""
    if not args.compile_blocks:
        return False
    from dare.models.compile import compile_blocks

    compile_blocks(model)
    return True


def add_sampler_arguments(parser: argparse.ArgumentParser, default: str | None = "llada",
                          seed_help: str = "sampling seed (default 0)",
                          option_help: str = "any other SamplerConfig field, e.g. -o confidence=margin",
                          gen_length_help: str = "generated tokens (default 128)") -> None:
    """The decoding flags shared by ``dare generate`` and ``dare eval run`` (-> :func:`sampler_values`)."""
    names = ", ".join(sampler_names())
    parser.add_argument("--sampler", default=default,
                        help=f"sampler preset: {names} (default {default})" if default
                        else f"sampler preset: {names} (default: the family's)")
    parser.add_argument("--gen-length", type=int, help=gen_length_help)
    parser.add_argument("--block-length", type=int, help="semi-autoregressive block length")
    parser.add_argument("--steps", type=int, help="denoising steps of masked diffusion (default: gen length)")
    parser.add_argument("--block-steps", type=int, help="denoising steps per block of block diffusion "
                        "(default: block length)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (0 = argmax)")
    parser.add_argument("--top-p", type=float, help="nucleus filter")
    parser.add_argument("--top-k", type=int, help="top-k filter")
    parser.add_argument("--threshold", type=float, help="confidence threshold (threshold/dynamic decoders)")
    parser.add_argument("--factor", type=float, help="factor of the factor decoder")
    parser.add_argument("--decoder", help="quota | threshold | factor | dynamic | sequential | entropy_bounded")
    parser.add_argument("--cache", help="none | prefix | dual (masked diffusion); block | none (block diffusion)")
    parser.add_argument("--seed", type=int, help=seed_help)
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help=option_help)


def _parse_value(text: str):
    """``true``/``false`` -> bool (:func:`dare.config.parse_boolean`, as ``dare train`` overrides spell a switch),
    ``null`` -> None (unset: the preset's value), numbers and lists -> themselves; anything else is text, as in a
    YAML recipe: ``none`` and ``None`` included (``cache=none`` means no cache, and ``cache=None`` is a misspelt
    choice, not an unset value)."""
    from dare.config import parse_boolean

    if parse_boolean(text) is not None:
        return parse_boolean(text)
    if text.lower() == "null":
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return text if value is None else value


def sampler_config(args: argparse.Namespace, sampler: str | None = None, model=None):
    """The :class:`SamplerConfig` described by the command-line flags (``sampler`` when ``--sampler`` is unset),
    resolved (for ``model`` when given: a block sampler's unset block length is the model's block size)."""
    from dare.rollout import SamplerConfig, resolve_config

    values = sampler_values(args)
    values.setdefault("sampler", sampler or "llada")
    config = SamplerConfig.from_dict(values)
    return config.resolved() if model is None else resolve_config(config, model)


SAMPLER_FLAGS = ("gen_length", "block_length", "steps", "block_steps", "temperature", "top_p", "top_k", "threshold",
                 "factor", "decoder", "cache", "seed")
"""SamplerConfig fields that have a flag of their own (``--gen-length`` ...), besides ``--sampler``."""


def sampler_values(args: argparse.Namespace, options: list[str] | None = None) -> dict:
    """SamplerConfig fields set on the command line (``--sampler`` only when given; ``-o`` items from
    ``options``, default ``args.option``). A field set both by its flag and by ``-o`` is a one-line error."""
    values = {"sampler": args.sampler} if args.sampler is not None else {}
    for flag in SAMPLER_FLAGS:
        if getattr(args, flag) is not None:
            values[flag] = getattr(args, flag)
    extra = parse_options(args.option if options is None else options)
    reject_flag_and_option(values, extra)
    values.update(extra)
    return values


def reject_likelihood_options(values: dict, where: str = "-o",
                              doing: str = "dare generate decodes with a sampler") -> None:
    """A likelihood-scoring setting (``-o mc_samples=...``) given to a command that only decodes (``doing`` says
    which; ``where`` names the flag): a one-line error saying where it belongs, instead of a did-you-mean among the
    sampler's fields."""
    from dare.errors import ConfigError
    from dare.eval.likelihood import LikelihoodConfig
    from dare.rollout import SamplerConfig

    key = next((k for k in values if k in likelihood_only_fields(LikelihoodConfig, SamplerConfig)), None)
    if key is not None:
        raise ConfigError(f"{where} {key} is a likelihood-scoring setting of dare eval run (--mode likelihood, "
                          f"multiple-choice benchmarks); {doing}")


def likelihood_only_fields(likelihood_config: type, sampler_config: type) -> set[str]:
    """The fields of ``likelihood_config`` (:class:`~dare.eval.LikelihoodConfig`) that ``sampler_config``
    (:class:`~dare.rollout.SamplerConfig`) lacks: ``mc_samples``, ``length_norm``, ..."""
    import dataclasses

    return ({f.name for f in dataclasses.fields(likelihood_config)}
            - {f.name for f in dataclasses.fields(sampler_config)})


def flag_of(field: str) -> str:
    """The command-line flag of a field: ``gen_length`` -> ``--gen-length``."""
    return "--" + field.replace("_", "-")


def reject_flag_and_option(flags: dict, options: dict) -> None:
    """One-line :class:`ConfigError` when a setting is given both by its flag (``flags``) and by ``-o``
    (``options``) with different values: neither silently wins (the same value twice changes nothing: accepted,
    as for a repeated flag; ``--temperature 1 -o temperature=1`` is the same value, ``true`` and ``1`` are not)."""
    from dare.errors import ConfigError

    for key, value in options.items():
        same = key in flags and flags[key] == value and isinstance(flags[key], bool) == isinstance(value, bool)
        if key in flags and not same:
            raise ConfigError(f"{key} is given twice, as {flag_of(key)} {flags[key]} and as -o {key}={value}; "
                              "give it once")


def parse_options(items: list[str], what: str = "-o") -> dict:
    """``["key=value", ...]`` -> ``{key: parsed value}`` (numbers, booleans, ``null`` = None, lists; else the text).
    A key given twice with different values is a one-line error (``what`` names where the items come from, e.g.
    ``-o``); the same value repeated changes nothing and is accepted, as for a command-line flag
    (:class:`dare.cli.StoreOnce`). Values are compared with their types (``1``, ``1.0`` and ``true`` differ)."""
    from dare.errors import ConfigError

    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--option expects KEY=VALUE; got '{item}'")
        key = key.strip().replace("-", "_")
        parsed = _parse_value(value.strip())
        if key in values and repr(values[key]) != repr(parsed):
            raise ConfigError(f"{what} sets {key} twice ({key}={values[key]} and {key}={parsed}); give it once")
        values[key] = parsed
    return values


def load_model(spec: str, device, dtype, adapter: str | None = None, tokenizer: str | None = None):
    """``(model, tokenizer)`` from a checkpoint directory, a hub name or ``tiny:FAMILY[:SEED]``, with LoRA
    ``adapter`` applied when given; the tokenizer from ``tokenizer`` when given, else the one saved with the adapter
    (LoRA training's ``RUN/final``), else the model's (its files checked first: a checkpoint without one fails before
    its weights load)."""
    from dare.models.loading import check_model_tokenizer, load_model as load, loading_errors, tokenizer_for_model

    check_model_tokenizer(spec, tokenizer, adapter)  # a checkpoint without one fails before its weights load
    with loading_errors(spec, adapter):
        model = load(spec, adapter, dtype=dtype, device=device)
    return model, tokenizer_for_model(spec, tokenizer, adapter)


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def run(args: argparse.Namespace) -> int:
    import json
    import time

    import torch

    from dare.devices import resolve_device
    from dare.plugins import load_plugins
    from dare.rollout import default_sampler, generate

    from dare.rollout import SamplerConfig

    load_plugins(args.imports, "--import")  # a plug-in's sampler, before --sampler is checked
    values = sampler_values(args)  # a setting given twice fails before the model is loaded
    reject_likelihood_options(values)
    if args.sampler:
        sampler_config(args)  # a typo fails before the model is loaded
    else:
        SamplerConfig.from_dict(values).check_values()  # so does a value out of range
    if "seed" in values:  # a whole number now: the seed a user gives is checked as every command checks it
        from dare.config import check_seed

        check_seed(values["seed"], "--seed" if args.seed is not None else "-o seed")
    spec = model_argument(args)
    device = resolve_device(args.device)
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    model, tokenizer = load_model(spec, device, dtype, args.adapter, args.tokenizer)
    compiled = compile_if_asked(model, args)
    config = sampler_config(args, default_sampler(model), model)
    prompts = [encode(tokenizer, text, not args.no_chat_template) for text in args.prompt]
    start = time.perf_counter()
    out = generate(model, prompts, config=config, progress=not args.json)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    results = []
    for row, text in enumerate(args.prompt):
        keep = out.completion_mask[row]
        tokens = out.completion[row][keep].tolist()
        results.append({
            "prompt": text,
            "prompt_tokens": len(prompts[row]),
            "completion": tokenizer.decode(tokens, skip_special_tokens=True),
            "tokens": tokens,
            "steps": int(out.num_steps[row]),
        })
    generated = int(out.completion_mask.sum())
    summary = {
        "sampler": config.sampler, "nfe": out.nfe, "seconds": round(seconds, 3), "compile_blocks": compiled,
        "tokens_per_second": round(generated / seconds, 2) if seconds > 0 else None,
        "config": {k: v for k, v in vars(config).items()},
    }
    if args.json:
        print(json.dumps({**summary, "results": results}))
        return 0
    for item in results:
        print(item["completion"])
        print("-" * 40)
    print(f"sampler={config.sampler} cache={config.cache} decoder={config.decoder} nfe={out.nfe} "
          f"tokens={generated} seconds={seconds:.2f}")
    return 0
