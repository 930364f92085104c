"""Checks of a training run that load no model and parse no data (a data file's records are at most counted).

``dare train --dry-run`` runs them, and so does every run before it loads anything (:class:`~dare.trainer.Trainer`),
with the same functions the run uses later (the sampler and reward of :mod:`dare.trainer.rl`, the algorithm's
``check_family`` against the model family read from ``model.path`` and its ``check_rollout`` against the sampler, the
rollout engine and ``model.attn_backend`` on the device, the LoRA target patterns against the model's module tree
built on the meta device, the data path checks of :mod:`dare.data.sft` / :mod:`dare.trainer.prompts`,
``trainer.resume``, ``trainer.output_dir``), and with the run's own messages for what it finds only later (a global
batch larger than the data, a metrics package that is not installed, a response padding that leaves no example within
``data.max_length``), so a dry run cannot pass a config that the run rejects before its first step (a hub model whose
config is not cached locally: its family, LoRA and rollout-sampler checks are skipped, with a note). Settings the run
does not use (``rollout.*`` without rollouts, ``lora.*`` without ``lora.enabled``, data options of another kind of
source, record-key settings of a generated source) get one warning line per section, and so does each setting that
another one makes moot (:data:`OVERRIDDEN`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from dare.errors import ConfigError, first_line
from dare.outputs import check_dir_target
from dare.models.lora_targets import LORA_LAYERS, check_lora_targets

log = logging.getLogger("dare.trainer")

UNUSED_DATA = {
    "rollout": ("response_key", "append_eos", "pad_response_to", "eos_padding", "max_length", "overlong", "packing",
                "pack_length", "fixed_shapes", "chosen_key", "rejected_key"),
    "pairs": ("messages_key", "response_key", "eos_padding", "packing", "pack_length", "fixed_shapes"),
    "dataset": ("chosen_key", "rejected_key"),
}
"""``data`` keys each kind of batch source ignores (RL prompts, preference pairs, SFT examples)."""
RECORD_KEYS = ("prompt_key", "response_key", "messages_key", "chosen_key", "rejected_key")
"""``data`` keys naming the fields of a data file's records: ``synthetic:`` and ``benchmark:`` sources ignore them."""
GENERATED_DATA = ("synthetic:", "benchmark:")
"""``data.path`` prefixes of sources that generate their records (no data file)."""


def check_run(config, *, model: bool = True, data: bool = True, warn: bool = True, family=None,
              device: str | None = None, dry_run: bool = False, world_size: int | None = None,
              launched: bool | None = None) -> None:
    """Raise the one-line error a run of ``config`` would raise for its model path, the algorithm's settings against
    the model family, ``model.attn_backend`` on the device, tokenizer path (or the model directory's tokenizer files),
    ``lora.target_modules`` against the model's module paths (:func:`check_lora_targets` on :func:`model_skeleton`),
    data path, rollout sampler and reward, the metrics packages (:func:`check_metric_packages`),
    ``data.pad_response_to`` against ``data.max_length`` (:func:`check_response_padding`), the global batch against
    the data's records (:func:`check_batch_fits`),
    ``trainer.resume`` or ``trainer.output_dir`` (another command's output or the user's files: refused before the
    run writes there), ``distributed.sequence_parallel`` / ``expert_parallel`` against the launch
    (:func:`check_parallel`; ``world_size`` processes, ``launched`` by torchrun: default, as torchrun's environment
    variables say); ``model`` / ``data``: check those sections (False when the trainer is given its own model /
    batch source); ``family``: the model's :class:`~dare.models.spec.FamilySpec` (default: read from
    ``model.path``, no weights loaded); ``device``: ``cpu`` / ``cuda`` (default:
    :func:`dare.distributed.training_device`); ``warn``: log the settings the run ignores; ``dry_run``: say so when a
    hub model's family is unknown (not in the local cache) and its checks are skipped."""
    from dare.algorithms import get_algorithm
    from dare.distributed import training_device
    from dare.trainer.output_dir import check_output_dir
    from dare.trainer.resume import check_resume

    algorithm = get_algorithm(config.algorithm.name)
    needs = algorithm.needs
    check_resume(config.trainer.resume)
    check_dir_target(config.trainer.output_dir, "trainer.output_dir")  # what ensure_dir would refuse
    check_metric_packages(config.trainer)  # the run imports them once the model and data are loaded
    if data and not needs.rollout:  # RL prompts ignore both keys
        check_response_padding(config.data)
    if model and family is None:  # also the model path's own errors (a missing directory, no weights, ...)
        family = known_family(config.model.path, note=dry_run, rollout=data and needs.rollout)
    if family is not None:
        algorithm.check_family(config.algorithm, family)  # what bind_model checks on the loaded model
    device = device or training_device(config.distributed.device)
    check_attn_backend(config, device)
    check_tokenizer_path(config.model.tokenizer)
    if model and config.model.tokenizer is None and (data or config.trainer.export):  # the model's own tokenizer
        check_tokenizer_path(config.model.path, "model.path")
    rollout_checked = data and needs.rollout and hasattr(algorithm, "check_rollout")
    parallel = config.distributed.sequence_parallel > 1 or config.distributed.expert_parallel > 1
    skeleton = (model_skeleton(config.model.path) if model and family is not None
                and (config.lora.enabled or rollout_checked or parallel) else None)  # built once for every check
    if config.lora.enabled and skeleton is not None:
        check_lora_targets(config.lora.target_modules, skeleton)
    if launched is None:
        from dare.distributed import launched_by_torchrun

        launched = launched_by_torchrun()
    if world_size is None:
        import os

        world_size = int(os.environ.get("WORLD_SIZE", 1)) if launched else 1
    from dare.distributed import check_backend

    check_backend(config.distributed.backend, device)
    world_known = launched or not dry_run  # a dry run without torchrun does not know the launch's processes
    check_parallel(config, needs, world_size, launched, skeleton, world_known=world_known)
    if world_known:
        check_batch_split(config, needs, world_size)
    elif config.distributed.sequence_parallel > 1 or config.distributed.expert_parallel > 1:
        log.warning("note: a dry run without torchrun checks what does not depend on the number of processes; "
                    "run it under torchrun with the launch's --nproc_per_node to check those too")
    if data and needs.rollout:
        from dare.trainer.prompts import check_prompt_path
        from dare.trainer.rl import check_rollout_batch, rollout_reward, rollout_sampler

        if family is None and config.rollout.sampler.sampler is None:  # the family's default: unknown (noted)
            resolved = None
        else:
            resolved = rollout_sampler(config.rollout, family.name if family is not None else None)
        if rollout_checked and skeleton is not None:
            check_algorithm_rollout(config, family, resolved, skeleton)
        check_rollout_engine(resolved or config.rollout.sampler, device)  # the first rollout's error
        rollout_reward(config.rollout)
        check_rollout_batch(config.trainer.batch_size, config.rollout.group_size)
        check_relative(check_prompt_path, config.data.path)
    elif data:
        from dare.data.sft import check_data_path

        check_relative(check_data_path, config.data.path)
    if data:
        check_batch_fits(config, needs)
    check_output_dir(config.trainer.output_dir)  # after the config's own mistakes
    if warn:
        warn_unused(config, needs)


def check_auxiliary_sequence(algorithm: str, names) -> None:
    """One-line error for ``distributed.sequence_parallel > 1`` with an algorithm that trains auxiliary models
    ``names`` (TraceRL's value model): they are not split over the sequence ranks."""
    if names:
        raise ConfigError(f"algorithm {algorithm} trains auxiliary models ({', '.join(names)}), which do not support "
                          "distributed.sequence_parallel > 1")


def check_parallel(config, needs, world_size: int, launched: bool, skeleton=None, world_known: bool = True) -> None:
    """The run's one-line errors for the process layout of a launch of ``world_size`` processes (``launched``: by
    torchrun, with a process group; ``needs``: the algorithm's): several processes need FSDP2 (without it each would
    train its own copy); ``distributed.sequence_parallel`` / ``distributed.expert_parallel`` above 1 need FSDP2 (and
    for experts a torchrun launch), the degree must divide the number of processes, expert parallelism makes no
    rollouts, and on the model's meta-device ``skeleton`` (None: not checked here; the run checks the loaded model)
    the degree must divide the attention heads / each MoE layer's experts. ``world_known=False`` (a dry run without
    torchrun): the checks against the launch are skipped."""
    from dare.algorithms import get_algorithm
    from dare.distributed.expert_parallel import check_expert_banks, check_expert_degree
    from dare.distributed.sequence import SequenceParallel, attention_heads, check_sequence_degree

    distributed = config.distributed
    if launched and world_size > 1 and not distributed.fsdp:
        raise ConfigError(f"distributed.fsdp=false under torchrun with {world_size} processes: each would train its "
                          "own copy of the model on its share of the batch (nothing sums their gradients); use "
                          "distributed.fsdp=true (the default) or one process")
    degree = distributed.sequence_parallel
    if degree > 1:
        if not distributed.fsdp:
            raise ConfigError("distributed.sequence_parallel > 1 needs distributed.fsdp=true (FSDP2 sums the "
                              "gradients of the sequence shards)")
        if world_known:
            check_sequence_degree(degree, world_size)
        check_auxiliary_sequence(config.algorithm.name, get_algorithm(config.algorithm.name).auxiliary_names(
            config.algorithm))
        heads = attention_heads(skeleton.config) if skeleton is not None else None
        if heads is not None:
            SequenceParallel(group=None, degree=degree, rank=0).check_heads(heads)
    degree = distributed.expert_parallel
    if degree > 1:
        if skeleton is not None:  # a dense model first: no launch fixes that
            check_expert_banks(skeleton, degree)
        if needs.rollout:
            raise ConfigError("distributed.expert_parallel > 1 does not support RL rollouts yet (ranks decode "
                              "different numbers of forwards; the expert all-to-all needs every rank in step)")
        if not distributed.fsdp:
            raise ConfigError(f"distributed.expert_parallel={degree} needs distributed.fsdp=true")
        if world_known:
            if not launched:
                raise ConfigError(f"distributed.expert_parallel={degree} needs a torchrun launch (e.g. torchrun "
                                  f"--nproc_per_node {degree} -m dare.cli train ...)")
            check_expert_degree(degree, world_size)


def data_parallel_groups(world_size: int, sequence_parallel: int) -> tuple[int, str]:
    """``(groups, phrase)``: how many data-parallel groups share a step's batch in a launch of ``world_size``
    processes, and how an error names them (``the number of processes (2)``, or with sequence parallelism
    ``the number of data-parallel groups (2 = 4 processes / distributed.sequence_parallel=2)``)."""
    degree = max(1, sequence_parallel)
    groups = max(1, world_size // degree)
    if degree == 1:
        return groups, f"the number of processes ({groups})"
    return groups, (f"the number of data-parallel groups ({groups} = {world_size} processes / "
                    f"distributed.sequence_parallel={degree})")


def check_batch_split(config, needs, world_size: int) -> None:
    """The run's one-line error, before anything loads, when the step's batch does not split evenly over the
    data-parallel groups of the launch: ``trainer.batch_size`` examples or pairs, or ``batch_size /
    rollout.group_size`` prompts for RL (what the batch sources check once the model and data are loaded)."""
    groups, phrase = data_parallel_groups(world_size, config.distributed.sequence_parallel)
    batch = config.trainer.batch_size
    if needs.rollout:
        group = max(1, config.rollout.group_size)
        if batch % group == 0 and (batch // group) % groups:
            raise ConfigError(f"prompts per step ({batch // group} = trainer.batch_size / rollout.group_size) must be "
                              f"divisible by {phrase}")
    elif batch % groups:
        unit = " (pairs)" if needs.pairs else ""
        raise ConfigError(f"trainer.batch_size={batch}{unit} must be divisible by {phrase}")


def check_rollout_engine(sampler, device: str) -> None:
    """The error the first rollout would raise for the engine of ``sampler`` (a ``SamplerConfig``) on ``device``
    (``cpu`` / ``cuda``): ``engine=graph`` off CUDA, or ``weights`` ``merged`` / ``fp8`` where ``engine=auto``
    decodes with the eager loops (:func:`dare.rollout.samplers.decoding_engine`), or ``weights`` ``fp8`` on a GPU
    without FP8 matmuls (before an 8B policy is loaded, not at its first rollout)."""
    import torch

    from dare.models.fp8 import fp8_gpu_error
    from dare.rollout.samplers import decoding_engine

    try:
        decoding_engine(sampler, torch.device(device))
    except ConfigError as err:
        raise ConfigError(f"rollout.sampler: {err}") from None
    if sampler.weights == "fp8" and device == "cuda" and torch.cuda.is_available():
        reason = fp8_gpu_error(torch.device("cuda", torch.cuda.current_device()))
        if reason is not None:
            raise ConfigError(f"rollout.sampler: weights 'fp8': {reason}; use weights 'merged' or 'model'")


def check_algorithm_rollout(config, family, sampler, skeleton) -> None:
    """The algorithm's own checks of the resolved rollout ``sampler`` (``check_rollout``: justgrpo's one token per
    step, dtreerpo's decoder, a block grid that differs from training's, ...), which the run makes once the policy is
    loaded: here on the model's meta-device ``skeleton`` (:func:`model_skeleton`), no weights read."""
    from dare.algorithms import get_algorithm

    skeleton.attn_backend = config.model.attn_backend
    algorithm = get_algorithm(config.algorithm.name)(
        config.algorithm, token_ids=family.token_ids(skeleton.config), seed=config.trainer.seed,
        attn_backend=config.model.attn_backend, logits_chunk_size=config.model.logits_chunk_size)
    algorithm.check_rollout(skeleton, sampler)


METRIC_PACKAGES = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
"""``trainer.KEY`` switch of a metrics sink: (the module the run imports for it, the pip package that holds it)."""


def check_metric_packages(trainer) -> None:
    """One-line error for a metrics sink switched on (``trainer.tensorboard`` / ``trainer.wandb``, a
    :class:`~dare.trainer.config.TrainerConfig`) whose module cannot be imported: not installed (the line names the
    pip package), or failing to import. The run imports it when it opens its logs, after the model and data load."""
    import importlib

    for key, (module, package) in METRIC_PACKAGES.items():
        if not getattr(trainer, key):
            continue
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - a broken install fails in many ways (the run's import too)
            if isinstance(err, ModuleNotFoundError) and (err.name or "").partition(".")[0] == package:
                raise ConfigError(f"trainer.{key}=true needs the {package} package, which is not installed: pip "
                                  f"install {package} (or set trainer.{key}=false)") from None
            raise ConfigError(f"trainer.{key}=true: importing {module} failed ({first_line(err)}); repair the "
                              f"installation of {package} or set trainer.{key}=false") from None


def check_response_padding(data) -> None:
    """One-line error when ``data.pad_response_to`` leaves no example within ``data.max_length`` (``data``: a
    :class:`~dare.trainer.config.DataConfig`): padding beyond it, or up to it under a chat template, whose prompt
    tokens cannot fit beside the response (the run would drop every example as too long)."""
    pad, longest = data.pad_response_to, data.max_length
    if pad is None or pad < longest or (pad == longest and not data.chat_template):
        return
    if pad > longest:
        why = f"is larger than data.max_length={longest}: every response is padded to at least {pad} tokens"
    else:
        why = (f"equals data.max_length={longest}: every response is padded to at least {pad} tokens, leaving no room "
               "for the prompt (data.chat_template adds tokens to every prompt)")
    raise ConfigError(f"data.pad_response_to={pad} {why}, so no example fits; lower data.pad_response_to or raise "
                      "data.max_length")


def check_batch_fits(config, needs) -> None:
    """The run's one-line error for a global batch larger than the data: a step takes ``trainer.batch_size``
    examples (or pairs), or ``batch_size / rollout.group_size`` prompts. The records are counted without reading
    more of the data than a batch (:func:`dare.data.sft.count_records`; a ``benchmark:`` source by
    ``data.num_examples`` only; an empty file is the run's own error); the run alone knows how many are dropped as
    too long, or what is wrong with a record that is no JSON object."""
    from dare.data.sft import count_records, no_records
    from dare.trainer.prompts import BENCHMARK_PREFIX

    batch, path, limit = config.trainer.batch_size, config.data.path, config.data.num_examples
    needed = batch // config.rollout.group_size if needs.rollout else batch
    held = limit if path.startswith(BENCHMARK_PREFIX) else count_records(path, limit, enough=needed)
    if held is None or held >= needed:
        return
    if held == 0:  # the run's error when it reads the file
        raise no_records(path)
    if needs.rollout:  # RolloutSource's message
        raise ConfigError(f"{needed} prompts per step but the dataset has only {held}")
    unit = "pairs" if needs.pairs else "examples"  # PairSource's and DatasetSource's
    raise ConfigError(f"trainer.batch_size={batch} is larger than the dataset ({held} {unit})")


def check_data_records(config, needs) -> None:
    """``dare train --dry-run``'s read of a data file's records, with the run's ``FILE:LINE`` errors: an RL run's
    prompts (the first ``data.num_examples``) each hold a prompt and the fields its reward scores against
    (:func:`dare.trainer.prompts.prompt_records`), a preference run's pairs a prompt, a chosen and a rejected text
    (:func:`dare.trainer.prompts.pair_records`), an SFT run's examples a chat or a prompt and a response
    (:func:`dare.data.sft.check_sft_records`): the loaders' own checks, without a tokenizer. Nothing for
    ``synthetic:`` / ``benchmark:`` sources (the run makes their records itself)."""
    from dare.data.sft import SYNTHETIC_PREFIX, check_sft_records
    from dare.trainer.prompts import BENCHMARK_PREFIX, pair_records, prompt_records
    from dare.trainer.rl import rollout_reward

    path = config.data.path
    if path.startswith((SYNTHETIC_PREFIX, BENCHMARK_PREFIX)):
        return
    if needs.rollout:
        prompt_records(config.data, config.trainer.seed, warn=True, reward=rollout_reward(config.rollout))
    elif needs.pairs:
        pair_records(config.data, config.trainer.seed)
    else:
        check_sft_records(config.data, config.trainer.seed)


def known_family(path: str, note: bool = False, rollout: bool = False):
    """The :class:`~dare.models.spec.FamilySpec` of model path ``path`` without loading weights: of ``tiny:FAMILY``
    or a local checkpoint (:func:`dare.models.loading.family_of_path`), or of a hub name whose config is in the local
    Hugging Face cache; None for a hub name that is not (nothing is downloaded; ``note``: log that the checks that
    depend on the family are skipped, ``rollout``: those of the rollouts too; the run makes them once the model is
    loaded). A local path that cannot hold a model is a one-line error
    (:func:`dare.models.loading.check_checkpoint_path`, as the loader checks it)."""
    from dare.models.loading import family_of_path, local_path, parse_tiny

    if parse_tiny(path) is not None or local_path(path, f"model path {path}: no such checkpoint directory"):
        return family_of_path(path)
    from transformers import AutoConfig

    from dare.models.spec import family_of

    try:
        hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError):  # not cached (or a model_type transformers does not know: load_model says so)
        if note:
            what = "algorithm.* and rollout.sampler" if rollout else "algorithm.*"
            log.warning(f"note: model.path={path} is a hub name whose config is not in the local cache: the dry run "
                        f"skips the checks of {what} against the model family (the run makes them once the model is "
                        "downloaded)")
        return None
    return family_of(hf_config)


def check_attn_backend(config, device: str) -> None:
    """``model.attn_backend`` flex / varlen cannot train on CPU (``device``: ``cpu`` or ``cuda``)."""
    if device == "cpu" and config.model.attn_backend in ("flex", "varlen"):
        raise ConfigError(f"model.attn_backend={config.model.attn_backend} cannot train on CPU "
                          "(flex has no CPU backward, varlen needs CUDA); use sdpa or eager")


def model_dtype(model) -> str:
    """The name (``float32``, ``bfloat16``, ``float16``) of the dtype holding most of ``model``'s parameter
    elements (LoRA adapters may be float32 on a bf16 base)."""
    from collections import Counter

    counts = Counter()
    for param in model.parameters():
        counts[param.dtype] += param.numel()
    dtype = counts.most_common(1)[0][0] if counts else None
    return str(dtype).removeprefix("torch.")


def record_given_model(config, model) -> None:
    """``Trainer(config, model=m)`` trains ``m`` as it is: record in ``config`` (changed in place, so that config.yaml
    and the resume check describe the weights) where ``m`` was loaded from (``model.path``, when it names a path)
    and its dtype (``model.dtype``), with one warning for each setting of ``config`` that said otherwise."""
    from dare.models.loading import unwrap

    base = unwrap(model)
    source = str(getattr(base.config, "_name_or_path", "") or "")
    if source and source != config.model.path:
        log.warning(f"warning: ignoring model.path={config.model.path}: Trainer(model=...) trains the given model, "
                    f"loaded from {source}; config.yaml records model.path={source}")
        config.model.path = source
    dtype = model_dtype(base)
    if dtype != config.model.dtype:
        log.warning(f"warning: ignoring model.dtype={config.model.dtype}: Trainer(model=...) trains the given model "
                    f"as it is, in {dtype}; config.yaml records model.dtype={dtype}")
        config.model.dtype = dtype


def fill_rollout_defaults(config, model=None, dry_run: bool = False) -> None:
    """Record in ``config`` (a :class:`~dare.trainer.config.TrainConfig`, changed in place) the rollout settings that
    depend on the model: an unset ``rollout.sampler.sampler`` is the family's default sampler (of ``model``, else of
    the checkpoint at ``model.path``, read from its config) and an unset ``gen_length`` is 128. So ``config.yaml``,
    the resume check and ``--dry-run`` name the sampler that decodes. Nothing for algorithms that make no rollouts.
    ``dry_run``: nothing is downloaded; a hub model whose config is not cached leaves the sampler unset
    (:func:`check_run` notes it)."""
    from dare.algorithms import get_algorithm
    from dare.rollout.config import DEFAULT_GEN_LENGTH

    sampler = config.rollout.sampler
    if not get_algorithm(config.algorithm.name).needs.rollout:
        return
    from dare.models.loading import family_of_path
    from dare.models.spec import family_of
    from dare.trainer.rl import check_rollout_family

    if model is not None:
        family = family_of(model)
    else:
        family = known_family(config.model.path) if dry_run else family_of_path(config.model.path)
    if family is not None and sampler.sampler is None:  # None: a dry run's uncached hub config (left unset)
        sampler = sampler.for_family(family.name)
    elif family is not None:  # a sampler of the wrong attention kind: the error before its settings' (block_steps)
        check_rollout_family(config.rollout, family)
    if sampler.gen_length is None:
        sampler = sampler.replace(gen_length=DEFAULT_GEN_LENGTH)
    config.rollout.sampler = sampler


def check_tokenizer_path(path: str | None, key: str = "model.tokenizer") -> None:
    """``model.tokenizer`` (or, with ``key="model.path"``, the model directory that gives the tokenizer when
    ``model.tokenizer`` is unset): unset, ``tiny:...``, a hub name, or a local directory holding tokenizer files
    (:data:`dare.models.loading.TOKENIZER_FILES`)."""
    from dare.models.loading import TOKENIZER_FILES, local_path, parse_tiny

    if path is None or parse_tiny(path) is not None:
        return
    local = local_path(path, f"{key} {path}: no such tokenizer directory")
    if local is None:
        return
    if not local.is_dir():
        raise ConfigError(f"{key} {path} is a file; expected a tokenizer (or model) directory")
    if not any((local / name).is_file() for name in TOKENIZER_FILES):
        hint = "" if key == "model.tokenizer" else "; set model.tokenizer to its tokenizer's directory or hub name"
        raise ConfigError(f"{key} {path} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}){hint}")


def tokenizer_load_error(key: str, path: str, err: BaseException) -> ConfigError:
    """The one-line error for a tokenizer at ``path`` (named by config key ``key``) that transformers failed to load
    with ``err``: its whole message on one line (the first line alone is often just a heading ending in a colon)."""
    from dare.models.loading import one_line

    return ConfigError(f"{key}={path}: cannot load a tokenizer ({one_line(err)}); a tokenizer directory holds tokenizer.json "
                       "or tokenizer_config.json with the vocabulary files it names")


def model_skeleton(path: str):
    """The module tree of the model at ``path`` (``tiny:FAMILY`` or a checkpoint whose config is local or cached) built
    on the meta device: no weights are read or allocated; None for a hub name whose config is not cached."""
    import torch

    from dare.models.loading import parse_tiny
    from dare.models.spec import family_of

    tiny = parse_tiny(path)
    if tiny is not None:
        from dare.models.tiny import tiny_config

        hf_config = tiny_config(tiny[0])[0]
    else:
        from transformers import AutoConfig

        try:
            hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError):
            return None
    with torch.device("meta"):
        return family_of(hf_config).model_class(hf_config)


def check_relative(check, path: str) -> None:
    """Run ``check(path)``; a missing relative data file's error says which directory it is relative to."""
    try:
        check(path)
    except ConfigError as err:
        local = Path(path)
        if ":" in path.split("/")[0] or local.is_absolute() or local.exists():  # synthetic:, benchmark:, found
            raise
        raise ConfigError(f"{err} (relative to the current directory {Path.cwd()})") from None


def changed(value, default, prefix: str) -> list[str]:
    """Keys of config section ``value`` (dataclasses recursed) that differ from ``default`` (a partial nested section
    starts from its field's default, :func:`dare.config.from_dict`)."""
    keys = []
    for f in dataclasses.fields(value):
        mine, theirs = getattr(value, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(mine) and dataclasses.is_dataclass(theirs):
            keys += changed(mine, theirs, f"{prefix}{f.name}.")
        elif mine != theirs:
            keys.append(f"{prefix}{f.name}")
    return keys


PACKED_EOS_NOTE = ("note: data.packing=true: packed rows get no EOS padding (data.eos_padding=true pads only padded "
                   "rows with trained EOS), so the loss differs from a padded run's; set data.eos_padding=false to "
                   "compare packed and padded runs")
"""Said at the start of an SFT run that packs while ``data.eos_padding`` is on (:func:`warn_unused`)."""


def warn_unused(config, needs) -> None:
    """One warning line per section whose non-default settings this run ignores, and the note of a packed SFT run
    under ``data.eos_padding`` (:data:`PACKED_EOS_NOTE`), and a warm-up as long as the run
    (:func:`warn_long_warmup`)."""
    from dare.trainer.config import DataConfig, LoraConfig, RolloutConfig

    name = config.algorithm.name
    if not needs.rollout and (keys := changed(config.rollout, RolloutConfig(), "rollout.")):
        log.warning(f"warning: ignoring {', '.join(keys)}: algorithm '{name}' makes no rollouts")
    unused_lora = [k for k in changed(config.lora, LoraConfig(), "lora.") if k != "lora.enabled"]
    if not config.lora.enabled and unused_lora:
        log.warning(f"warning: ignoring {', '.join(unused_lora)}: lora.enabled is false (set lora.enabled=true "
                    "to train an adapter)")
    kind = "rollout" if needs.rollout else "pairs" if needs.pairs else "dataset"
    data = [k for k in changed(config.data, DataConfig(), "data.") if k.split(".")[1] in UNUSED_DATA[kind]]
    if data:
        what = {"rollout": "RL prompts", "pairs": "preference pairs", "dataset": "SFT examples"}[kind]
        log.warning(f"warning: ignoring {', '.join(data)}: not used by algorithm '{name}' (it trains on {what})")
    elif kind == "dataset" and config.data.pack_length is not None and not config.data.packing:
        log.warning("warning: ignoring data.pack_length: data.packing is false")
    if kind == "dataset" and config.data.packing and config.data.eos_padding:
        log.warning(PACKED_EOS_NOTE)
    if config.data.path.startswith(GENERATED_DATA):
        keys = [k for k in changed(config.data, DataConfig(), "data.") if k.split(".")[1] in RECORD_KEYS
                and k not in data]
        if keys:
            log.warning(f"warning: ignoring {', '.join(keys)}: data.path={config.data.path} makes its own records "
                        "(these keys name the fields of a data file's records)")
    moot: dict[str, list[str]] = {}  # one line per reason
    for key, reason in overridden(config):
        if needs.rollout or not key.startswith("rollout."):  # else the rollout section's line names it
            moot.setdefault(reason, []).append(key)
    for reason, keys in moot.items():
        log.warning(f"warning: ignoring {', '.join(keys)}: {reason}")
    warn_long_warmup(config)


def warn_long_warmup(config) -> None:
    """One warning line when ``optim.warmup_steps`` is at least the run's ``trainer.max_steps``: the whole run then
    trains in the linear warm-up (:func:`dare.trainer.optim.lr_factor`). A run of ``trainer.epochs`` passes is not
    checked: its number of steps is known only once its data is loaded."""
    warmup, steps = config.optim.warmup_steps, config.trainer.max_steps
    if steps is None or warmup < steps or warmup == 0:
        return
    reach = "never reaches optim.lr" if warmup > steps else "reaches optim.lr only on the last step"
    run = f"{steps} step{'s' * (steps != 1)}"
    log.warning(f"warning: optim.warmup_steps={warmup} >= the run's {run} (trainer.max_steps): the whole run trains "
                f"in warmup (the learning rate {reach})")


OVERRIDDEN = {
    "trainer.epochs": (lambda c: c.trainer.max_steps is not None,
                       "trainer.max_steps is set and sets the run length (trainer.max_steps=null to train for "
                       "trainer.epochs)"),
    "optim.warmup_ratio": (lambda c: c.optim.warmup_steps > 0,
                           "optim.warmup_steps is set (warmup_ratio applies when warmup_steps is 0)"),
    "optim.min_lr_ratio": (lambda c: c.optim.scheduler == "constant",
                           "optim.scheduler=constant does not decay (min_lr_ratio applies to cosine and linear)"),
    "model.compile_backend": (lambda c: not c.model.compile, "model.compile is false"),
    "trainer.wandb_project": (lambda c: not c.trainer.wandb, "trainer.wandb is false"),
    "rollout.dynamic_extra_rounds": (lambda c: not c.rollout.dynamic_sampling, "rollout.dynamic_sampling is false"),
    "rollout.samples_per_step": (lambda c: not c.rollout.samples_file,
                                 "rollout.samples_file is false (no rollouts.jsonl is written)"),
    "algorithm.kl_estimator": (lambda c: c.algorithm.kl_coef == 0,
                               "algorithm.kl_coef is 0: there is no KL term (set algorithm.kl_coef > 0 to add one)"),
    "algorithm.population_std": (lambda c: c.algorithm.advantage != "zscore",
                                 "algorithm.advantage is not zscore (population_std chooses the z-score's std)"),
    **dict.fromkeys(("algorithm.value_lr", "algorithm.value_clip", "algorithm.gamma", "algorithm.lam"), (
        lambda c: not c.algorithm.value_model,
        "algorithm.value_model is false (no value model is trained, and GAE needs one)")),
    "algorithm.mix_weight": (lambda c: c.algorithm.logp_estimation != "mix", "algorithm.logp_estimation is not mix"),
    "algorithm.eubo_beta": (lambda c: c.algorithm.logp_estimation == "elbo",
                            "algorithm.logp_estimation=elbo uses no EUBO"),
    **dict.fromkeys(("algorithm.distill_lambda_max", "algorithm.distill_gamma", "algorithm.distill_tau_max",
                     "algorithm.distill_beta", "algorithm.distill_horizon"), (
        lambda c: not c.algorithm.self_distillation, "algorithm.self_distillation is false")),
}
"""``key: (when another setting makes it moot, why)``; warned only when ``key`` differs from its default, so a recipe
that sets it (e.g. ``min_lr_ratio`` with a cosine schedule) warns only once the schedule it applies to is changed.
An ``algorithm.*`` key counts for the algorithms that have it (its default is that algorithm's); keys of one reason
share one warning line."""


def overridden(config) -> list[tuple[str, str]]:
    """``(key, reason)`` of the non-default settings of ``config`` that another setting makes moot."""
    moot = []
    for key, (moot_when, reason) in OVERRIDDEN.items():
        section, name = key.split(".")
        values = getattr(config, section)
        if not hasattr(values, name):  # another algorithm's setting
            continue
        if getattr(values, name) != getattr(type(values)(), name) and moot_when(config):
            moot.append((key, reason))
    return moot


__all__ = ["LORA_LAYERS", "METRIC_PACKAGES", "OVERRIDDEN", "PACKED_EOS_NOTE", "UNUSED_DATA", "changed",
           "check_attn_backend", "check_auxiliary_sequence", "check_batch_fits", "check_lora_targets", "check_metric_packages", "check_parallel",
           "check_response_padding", "check_relative", "check_rollout_engine", "check_run", "check_tokenizer_path",
           "fill_rollout_defaults", "known_family", "model_dtype", "model_skeleton", "overridden",
           "record_given_model", "tokenizer_load_error", "warn_long_warmup", "warn_unused"]
