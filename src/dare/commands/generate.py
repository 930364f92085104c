"""``dare generate``: decode completions for prompts with a diffusion sampler.

``--model`` is a checkpoint directory (config.json, weights, tokenizer) or ``tiny:FAMILY`` for an
in-memory tiny random model with DARE's byte tokenizer (offline smoke tests). The tokenizer's chat
template is applied unless ``--no-chat-template``. Any :class:`dare.rollout.SamplerConfig` field can be set
with ``--option key=value``.
"""

from __future__ import annotations

import argparse
import ast
import sys

HELP = "generate text with a diffusion sampler (llada, dream, fastdllm, ...)"
BUILTIN_SAMPLERS = ("llada", "dream", "fastdllm", "fastdllm_dream", "sdar", "llada2", "llada21", "llada21_speed")
"""The samplers :mod:`dare.rollout.samplers` registers, named here so that ``--help`` does not import torch
(``tests/test_rollout_review_fixes.py`` checks the two agree)."""


def sampler_names() -> list[str]:
    """The built-in sampler names, then any other registered by plug-ins already imported."""
    registry = sys.modules.get("dare.rollout.registry")
    extra = [name for name in (registry.SAMPLERS if registry else ()) if name not in BUILTIN_SAMPLERS]
    return list(BUILTIN_SAMPLERS) + extra


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="checkpoint directory / hub name, or tiny:FAMILY[:SEED] (e.g. tiny:llada)")
    parser.add_argument("--adapter", default=None,
                        help="LoRA adapter to apply on top of --model: a directory with adapter_config.json and "
                             "adapter_model.safetensors (e.g. RUN/final), or a hub id")
    parser.add_argument("--prompt", action="append", required=True,
                        help="prompt text (repeat for a batch)")
    add_sampler_arguments(parser, default=None)
    parser.add_argument("--no-chat-template", "--no-chat", dest="no_chat_template", action="store_true",
                        help="tokenize the prompt as raw text (--no-chat, as dare eval spells it, is the same)")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                        help="weights dtype (default: bfloat16 on GPU, float32 on CPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_compile_argument(parser)


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


def flag_of(field: str) -> str:
    """The command-line flag of a field: ``gen_length`` -> ``--gen-length``."""
    return "--" + field.replace("_", "-")


def reject_flag_and_option(flags: dict, options: dict) -> None:
    """One-line :class:`ConfigError` when a setting is given both by its flag (``flags``) and by ``-o``
    (``options``): neither silently wins."""
    from dare.errors import ConfigError

    for key, value in options.items():
        if key in flags:
            raise ConfigError(f"{key} is given twice, as {flag_of(key)} {flags[key]} and as -o {key}={value}; "
                              "give it once")


def parse_options(items: list[str], what: str = "-o") -> dict:
    """``["key=value", ...]`` -> ``{key: parsed value}`` (numbers, booleans, ``null`` = None, lists; else the text).
    A key given twice is a one-line error (``what`` names where the items come from, e.g. ``-o``)."""
    from dare.errors import ConfigError

    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--option expects KEY=VALUE; got '{item}'")
        key = key.strip().replace("-", "_")
        parsed = _parse_value(value.strip())
        if key in values:
            raise ConfigError(f"{what} sets {key} twice ({key}={values[key]} and {key}={parsed}); give it once")
        values[key] = parsed
    return values


def load_model(spec: str, device, dtype, adapter: str | None = None):
    """``(model, tokenizer)`` from a checkpoint directory, a hub name or ``tiny:FAMILY[:SEED]``, with LoRA
    ``adapter`` applied when given."""
    from dare.errors import InputError, first_line
    from dare.models.loading import load_model as load, load_tokenizer, loading_errors

    with loading_errors(spec, adapter):
        model = load(spec, adapter, dtype=dtype, device=device)
    try:
        tokenizer = load_tokenizer(spec)
    except (OSError, ValueError) as err:
        raise InputError(f"--model {spec}: no usable tokenizer ({first_line(err)})") from None
    return model, tokenizer


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
    from dare.rollout import default_sampler, generate

    from dare.rollout import SamplerConfig

    values = sampler_values(args)  # a setting given twice fails before the model is loaded
    if args.sampler:
        sampler_config(args)  # a typo fails before the model is loaded
    else:
        SamplerConfig.from_dict(values).check_values()  # so does a value out of range
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    model, tokenizer = load_model(args.model, device, dtype, args.adapter)
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
