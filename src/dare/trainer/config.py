"""The ``dare train`` config: one typed section per concern (see ``dare train --show-config``)."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from dare.config import (
    check_seed, closest_key, config_keys, flatten, from_dict, load_yaml, merge, override_tree, to_dict,
)
from dare.errors import ConfigError, unknown_choice, wrong_type
from dare.plugins import load_plugins, recorded
from dare.rollout.config import SamplerConfig


@dataclass
class ModelConfig:
    path: str = "tiny:llada"
    """HF checkpoint directory or hub name, or ``tiny:FAMILY[:SEED]`` for a tiny random model (no files)."""
    tokenizer: str | None = None
    """Tokenizer path (default: the model path; tiny models use DARE's byte tokenizer)."""
    dtype: str = "float32"
    """Dtype of the master weights: float32 (recommended with bf16 mixed precision), bfloat16 or float16."""
    attn_backend: str = "sdpa"
    """Attention backend of training forwards: sdpa, eager, flex (CPU forward only) or varlen (CUDA, packed)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block in the backward pass (saves activation memory)."""
    logits_chunk_size: int = 2048
    """Log-probs are computed only at scored (masked) positions: the LM head runs on those rows, this many at a
    time (recomputed in the backward pass), so the full [batch, length, vocab] logits are never materialised.
    0 = full logits, then select (the plain reference path)."""
    compile: bool = False
    """torch.compile every transformer block (attention kernels stay as they are; dynamic shapes, so one
    compilation in the first step serves every block and row length)."""
    compile_backend: str = "inductor"
    """torch.compile backend: inductor (fast kernels), aot_eager (capture only: cheap correctness check) or eager."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (peft) instead of all weights."""
    r: int = 16
    """LoRA rank."""
    alpha: int = 32
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """LoRA dropout (non-zero breaks exact invariance to micro-batching: dropout uses the global RNG)."""
    target_modules: str | list[str] | None = None
    """Regex of adapted module paths, matched in full, or a list of module names as peft takes one (``[q_proj,
    v_proj]``: every module whose path ends in one of them); default: the family's ``lora_targets``."""


@dataclass
class DataConfig:
    path: str = "synthetic:reverse"
    """jsonl/parquet file of examples, ``synthetic:TASK`` for a generated task (SFT: copy, reverse, add; RL prompts
    also countdown, sudoku, sudoku9, gsm_symbolic) or, for RL prompts, ``benchmark:NAME[:PATH]``."""
    prompt_key: str = "prompt"
    """Field holding the prompt (prompt/response records)."""
    response_key: str = "response"
    """Field holding the response (prompt/response records)."""
    messages_key: str = "messages"
    """Field holding a chat (list of {role, content}); the last assistant message is the response."""
    chat_template: bool = True
    """Wrap prompt/response with the tokenizer's chat template (``apply_chat_template``)."""
    append_eos: bool = True
    """End every response with the EOS token (the model learns to stop)."""
    pad_response_to: int | None = None
    """Pad every response with EOS up to this many tokens (LLaDA's fixed-length answers); None = no padding."""
    eos_padding: bool = True
    """Padded layout: fill rows up to the global batch's longest example with EOS tokens that count as answer
    tokens (LLaDA guideline); false = pad tokens that are neither attended nor trained."""
    max_length: int = 1024
    """Maximum tokens per example (prompt + response + EOS padding)."""
    overlong: str = "drop"
    """What to do with longer examples: drop (counted and reported) or error."""
    packing: bool = False
    """Pack examples into ``[1, T]`` rows with ``cu_seqlens`` (no cross-example attention) instead of padding."""
    pack_length: int | None = None
    """Tokens per packed row (default: max_length); each packed row is one micro-batch."""
    fixed_shapes: bool | None = None
    """Pad every micro-batch to one shape: padded rows to max_length (the fill counts as answer when eos_padding),
    packed rows to pack_length (a filler document that is never attended or trained). Compiled kernels (flex
    attention, model.compile) then never recompile for a new length. null = auto: on for model.attn_backend=flex,
    whose compiled kernel is specialised to the row length."""
    shuffle: bool = True
    """Shuffle examples every epoch (deterministic in trainer.seed and the epoch)."""
    num_examples: int | None = None
    """Use only the first N examples, N >= 1 (synthetic tasks: how many to generate; default 512)."""
    chosen_key: str = "chosen"
    """Preference pairs (DPO/VRPO): field holding the preferred response."""
    rejected_key: str = "rejected"
    """Preference pairs (DPO/VRPO): field holding the dispreferred response."""


@dataclass
class RolloutConfig:
    """Online RL: how prompts are turned into scored rollouts (``trainer.batch_size`` counts rollouts)."""

    group_size: int = 8
    """Rollouts per prompt (the GRPO group G); prompts per step = trainer.batch_size / group_size."""
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(temperature=1.0))
    """Decoding settings of the rollouts (``dare.rollout.SamplerConfig``); each rollout's sampler seed is derived from
    trainer.seed, the rollout index and ``seed`` (0: from trainer.seed and the rollout index alone). An unset
    ``sampler`` is the model family's default sampler and an unset ``gen_length`` 128; config.yaml records both."""
    reward: Any = None
    """Reward: a registered name, a preset, or {name: weight | {weight, options}} (see dare.rewards)."""
    max_prompt_length: int = 512
    """Prompts longer than this many tokens are dropped (and counted)."""
    chunk_size: int | None = None
    """Rows per generate call (default: the rank's whole share of the step)."""
    samples_file: bool = True
    """Append every rollout step's first completions with their rewards to output_dir/rollouts.jsonl."""
    samples_per_step: int = 2
    """How many completions per step go to rollouts.jsonl (rank 0)."""
    dynamic_sampling: bool = False
    """DAPO-style dynamic sampling: drop groups whose rewards are all equal and roll out more prompts until the step
    has trainer.batch_size / group_size informative groups (dare.trainer.dynamic_sampling)."""
    dynamic_extra_rounds: int = 4
    """Dynamic sampling: at most this many extra rounds of prompts per step; slots still open after them take the
    earliest flat groups (rollout/dynamic/filled)."""

    def check_counts(self) -> None:
        """One-line errors for this section's counts outside their range: :meth:`TrainConfig.validate` calls it, and
        so does a :class:`~dare.trainer.rl.RolloutSource` built directly from a section."""
        positive_or_null({"rollout.chunk_size": (self.chunk_size, "null = the rank's whole share of the step")})
        at_least_zero({"rollout.samples_per_step": (self.samples_per_step, "0 = none"),
                       "rollout.dynamic_extra_rounds": (self.dynamic_extra_rounds, "0 = no extra rounds")})


def check_regex(key: str, pattern: str | None) -> None:
    """One-line error unless ``pattern`` (None: unset) is a valid regular expression."""
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as err:
        raise ConfigError(f"{key}={pattern!r} is not a valid regular expression ({err})") from None


def positive_or_null(values: dict[str, tuple[int | None, str]]) -> None:
    """``{key: (value, what null means)}``: a one-line error for the first value below 1."""
    for key, (value, meaning) in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"{key} must be a positive integer or null ({meaning}); got {value}")


def at_least_zero(values: dict[str, tuple[int, str]]) -> None:
    """``{key: (value, what 0 means)}``: a one-line error for the first negative value."""
    for key, (value, meaning) in values.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0 ({meaning}); got {value}")


@dataclass
class OptimConfig:
    lr: float = 1e-5
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas: two numbers in [0, 1)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    scheduler: str = "constant"
    """Learning-rate schedule after warm-up: constant, cosine or linear."""
    warmup_steps: int = 0
    """Linear warm-up steps (0 = none); see also warmup_ratio."""
    warmup_ratio: float = 0.0
    """Warm-up as a fraction of the total steps (used when warmup_steps is 0)."""
    min_lr_ratio: float = 0.0
    """Final learning rate of cosine/linear decay, as a fraction of lr (in [0, 1])."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this positive value (null = no clipping)."""


@dataclass
class TrainerConfig:
    output_dir: str = "runs/dare"
    """Output directory: config.yaml, metrics.jsonl, checkpoints/, final/ (HF checkpoint or LoRA adapter)."""
    seed: int = 0
    """Seed of data order, corruption noise and initialisation of new weights."""
    batch_size: int = 8
    """Examples per optimizer step over all ranks (the global batch)."""
    micro_batch_size: int = 1
    """Padded rows per forward/backward on one rank (gradient accumulation splits the rank's share)."""
    max_steps: int | None = None
    """Optimizer steps to run (default: epochs x examples // batch_size)."""
    epochs: float = 1.0
    """Passes over the data when max_steps is not set."""
    log_every: int = 1
    """Write metrics every N steps."""
    save_every: int | None = None
    """Save a resumable checkpoint every N steps (and at the end); null = only at the end."""
    keep_last: int = 2
    """Keep this many most recent checkpoints (0 = keep all)."""
    save_on_interrupt: bool = True
    """Ctrl-C or SIGTERM (``kill``, ``scancel``, pre-emption) during training: finish the current step, save a
    checkpoint, then stop (resume with trainer.resume=auto); a second one stops at once. false: stop at once."""
    resume: str = "auto"
    """auto (latest checkpoint in output_dir, if any; none: start at step 0, replacing final/ and metrics.jsonl),
    never (start over: deletes output_dir's checkpoints/ and final/ first; refused when model.path, model.tokenizer
    or data.path lies in them), a checkpoint directory (OUTPUT_DIR/checkpoints/step_00000012: eight-digit step
    numbers) or a run directory (its latest complete checkpoint)."""
    export: bool = True
    """At the end write output_dir/final: a HF checkpoint (full training) or a peft adapter (LoRA)."""
    progress: bool = True
    """Show a progress bar (rank 0)."""
    tensorboard: bool = False
    """Also log metrics to TensorBoard (needs the tensorboard extra)."""
    wandb: bool = False
    """Also log metrics to Weights & Biases (needs the wandb extra)."""
    wandb_project: str = "dare"
    """W&B project name."""


@dataclass
class DistributedConfig:
    backend: str = "auto"
    """Process-group backend under torchrun: auto (nccl on CUDA, gloo on CPU), nccl or gloo."""
    device: str = "auto"
    """auto (CUDA when available), cuda or cpu."""
    fsdp: bool = True
    """Shard with FSDP2 (fully_shard per block + root) when running under torchrun."""
    mixed_precision: str = "auto"
    """auto (bf16 compute / fp32 reduce on CUDA, fp32 on CPU), bf16 (on CPU too: bf16 autocast in one process, FSDP2's
    bf16 weights under torchrun; the master weights stay model.dtype) or fp32."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered block weights after forward (ZeRO-3); false keeps them (ZeRO-2, faster)."""
    sequence_parallel: int = 1
    """Sequence-parallel degree P (Ulysses): the ranks form a (data x sequence) mesh, each group of P consecutive
    ranks trains the same micro-batches with every row split into P slices (activation memory / P); attention
    exchanges heads (all-to-all) and stays exact. Must divide the number of processes and the attention heads.
    FSDP2 still shards the weights over all ranks. 1 = off."""
    expert_parallel: int = 1
    """MoE models: spread each MoE layer's experts over this many ranks (all-to-all token dispatch); must divide
    the world size and the number of experts. 1 = every rank holds all experts (sharded by FSDP2)."""


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to train."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Optional LoRA adapter."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""
    algorithm: Any = field(default_factory=lambda: {"name": "sft"})
    """Algorithm section: ``name`` plus that algorithm's options (see dare.algorithms)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """RL only: group size, sampler and reward of the rollouts."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop, logging and checkpointing."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """torchrun / FSDP2 settings."""
    imports: list[str] = field(default_factory=list)
    """Your own plug-ins, imported before any name is checked: module names (``my_pkg.rewards``) or ``.py`` files
    (relative to the current directory) that register rewards, algorithms or samplers (see dare.plugins)."""

    def validate(self) -> None:
        choices = {
            "data.overlong": (self.data.overlong, ("drop", "error")),
            "optim.scheduler": (self.optim.scheduler, ("constant", "cosine", "linear")),
            "trainer.resume": (self.trainer.resume, None),
            "distributed.backend": (self.distributed.backend, ("auto", "nccl", "gloo")),
            "distributed.device": (self.distributed.device, ("auto", "cuda", "cpu")),
            "distributed.mixed_precision": (self.distributed.mixed_precision, ("auto", "bf16", "fp32")),
            "model.dtype": (self.model.dtype, ("float32", "bfloat16", "float16")),
            "model.attn_backend": (self.model.attn_backend, ("sdpa", "eager", "flex", "varlen")),
            "model.compile_backend": (self.model.compile_backend, ("inductor", "aot_eager", "eager")),
        }
        for key, (value, allowed) in choices.items():
            if allowed is not None and value not in allowed:
                raise unknown_choice(f"value for {key}", value, allowed)
        for key, value in (("model.path", self.model.path), ("data.path", self.data.path),
                           ("trainer.output_dir", self.trainer.output_dir)):
            if not str(value).strip():  # `key=` on a command line; an empty output_dir would write into the cwd
                raise ConfigError(f"{key} must not be empty")
        positive = {"trainer.batch_size": self.trainer.batch_size, "trainer.micro_batch_size": self.trainer.micro_batch_size,
                    "trainer.log_every": self.trainer.log_every, "data.max_length": self.data.max_length,
                    "lora.r": self.lora.r, "rollout.group_size": self.rollout.group_size,
                    "rollout.max_prompt_length": self.rollout.max_prompt_length,
                    "distributed.expert_parallel": self.distributed.expert_parallel}
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be positive; got {value}")
        if self.distributed.sequence_parallel < 1:
            raise ConfigError(f"distributed.sequence_parallel must be >= 1; got {self.distributed.sequence_parallel}")
        optional = {"trainer.max_steps": "null = trainer.epochs passes over the data",
                    "trainer.save_every": "null = a checkpoint only at the end"}
        for key, meaning in optional.items():
            value = getattr(self.trainer, key.split(".")[1])
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be positive or null ({meaning}); got {value}")
        if self.trainer.max_steps is None and self.trainer.epochs <= 0:
            raise ConfigError(f"trainer.epochs must be positive; got {self.trainer.epochs}")
        if self.model.logits_chunk_size < 0:
            raise ConfigError(f"model.logits_chunk_size must be >= 0 (0 = full logits); got {self.model.logits_chunk_size}")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr must be positive; got {self.optim.lr}")
        self._validate_numbers()

    def _validate_numbers(self) -> None:
        """One-line errors for numbers outside their range (they would otherwise fail deep inside torch, or train
        silently wrong: a negative gradient clip reverses the update)."""
        optim, data = self.optim, self.data
        check_seed(self.trainer.seed, "trainer.seed")
        sampler_seed = getattr(self.rollout.sampler, "seed", 0)
        if isinstance(sampler_seed, int):  # another type: the sampler's own check names it
            check_seed(sampler_seed, "rollout.sampler.seed")
        if optim.grad_clip is not None and optim.grad_clip <= 0:
            raise ConfigError(f"optim.grad_clip must be positive (null disables clipping); got {optim.grad_clip}")
        if optim.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0; got {optim.weight_decay}")
        if optim.eps <= 0:
            raise ConfigError(f"optim.eps must be positive; got {optim.eps}")
        if len(optim.betas) != 2 or not all(0 <= b < 1 for b in optim.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.999]; got {optim.betas}")
        if optim.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0 (0 = none); got {optim.warmup_steps}")
        for key, value in (("optim.warmup_ratio", optim.warmup_ratio), ("optim.min_lr_ratio", optim.min_lr_ratio)):
            if not 0 <= value <= 1:
                raise ConfigError(f"{key} must be in [0, 1]; got {value}")
        if self.lora.alpha <= 0:
            raise ConfigError(f"lora.alpha must be positive; got {self.lora.alpha}")
        if not 0 <= self.lora.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1); got {self.lora.dropout}")
        if isinstance(self.lora.target_modules, str):  # a list holds module names (dare.models.lora.target_pattern)
            check_regex("lora.target_modules", self.lora.target_modules)
        positive_or_null({"data.num_examples": (data.num_examples, "null = every record; synthetic tasks: 512"),
                          "data.pack_length": (data.pack_length, "null = data.max_length"),
                          "data.pad_response_to": (data.pad_response_to, "null = no padding")})
        at_least_zero({"trainer.keep_last": (self.trainer.keep_last, "0 = keep every checkpoint")})
        self.rollout.check_counts()
        self._validate_group()

    def _validate_group(self) -> None:
        """``rollout.group_size`` against the algorithm (e.g. 1 with group-relative advantages trains nothing); skipped
        while the ``algorithm`` section is still an unresolved mapping."""
        from dare.algorithms import ALGORITHMS

        algorithm = ALGORITHMS.get(getattr(self.algorithm, "name", None))
        if algorithm is not None and algorithm.needs.rollout:
            algorithm.check_group_size(self.algorithm, self.rollout.group_size)

    def fixed_width(self) -> int | None:
        """Tokens of every micro-batch row under ``data.fixed_shapes`` (null: on for ``model.attn_backend=flex``):
        ``data.pack_length`` (default ``max_length``) for packed rows, ``data.max_length`` for padded rows; None
        when row shapes follow the data."""
        on = self.data.fixed_shapes if self.data.fixed_shapes is not None else self.model.attn_backend == "flex"
        if not on:
            return None
        return (self.data.pack_length or self.data.max_length) if self.data.packing else self.data.max_length


def load_train_config(path: str | os.PathLike | None, overrides: list[str] | str | dict = ()) -> TrainConfig:
    """Read a recipe YAML (None: the defaults), apply ``overrides`` (a list of ``key=value`` strings, one such string,
    or a mapping ``{key: value}`` with dotted keys or nested sections), validate every section (algorithm included).
    A ``model.path`` / ``data.path`` that neither the recipe nor an override sets gets a ``note:`` line naming the
    default the run trains (:func:`note_defaults`). ``path`` may name a shipped recipe (``llada/d1_tiny``; a missing
    ``configs/llada/d1_tiny.yaml`` reads that recipe after a note: :func:`dare.recipes.resolve_recipe`)."""
    from dare.algorithms import resolve_algorithm_config
    from dare.recipes import check_recipe_argument, resolve_recipe

    check_recipe_argument(path)
    if path is not None:
        path = resolve_recipe(path)
    raw = load_yaml(path, texts=True) if path is not None else {}
    given = override_tree(overrides)
    # the plug-ins register before any name below is checked; an imports override replaces the recipe's list
    load_plugins(given.get("imports", raw.get("imports")))
    if path is not None:
        raw = _fit_recipe_algorithm(raw, given, path)
    raw = merge(raw, given)
    config = from_dict(TrainConfig, raw)
    config.imports = recorded(config.imports)  # config.yaml names the files from anywhere
    check_algorithm_section_keys(config.algorithm)
    config.algorithm = resolve_algorithm_config(config.algorithm)
    config.validate()
    note_defaults(raw, path)
    return config


DEFAULTS_NOTED = {"model.path": "a tiny randomly initialised LLaDA, no weights",
                  "data.path": "a generated word-reversal task, 'reverse WORD'"}
"""Keys whose default a run trains only after a ``note:`` line (a recipe that forgot them would otherwise train the
tiny default model on the generated task without a word), with what their defaults are."""


def note_defaults(raw: dict, path) -> None:
    """Log one ``note:`` line per key of :data:`DEFAULTS_NOTED` that ``raw`` (the recipe with its overrides) does not
    set: the run then trains on that key's default. Under torchrun only rank 0 says so."""
    import logging

    if int(os.environ.get("RANK", "0")) != 0:
        return
    defaults = TrainConfig()
    for key, meaning in DEFAULTS_NOTED.items():
        section, name = key.split(".")
        given = raw.get(section)
        is_set = name in given if isinstance(given, dict) else given is not None  # a section object sets it
        if is_set:
            continue
        where = f"the recipe {path} sets no {key}" if path is not None else f"no recipe and no {key}=... override"
        default = getattr(getattr(defaults, section), name)
        logging.getLogger("dare.trainer").warning(
            f"note: {where}: using the default {key}={default} ({meaning}); set {key} to choose")


def _algorithm_keys(name: str) -> set[str] | None:
    """The keys of algorithm ``name``'s section (None for an unknown name: its own error comes later)."""
    import dataclasses

    from dare.algorithms import ALGORITHMS

    cls = ALGORITHMS.get(name) if isinstance(name, str) else None
    return None if cls is None else {f.name for f in dataclasses.fields(cls.config_class) if f.init}


def check_algorithm_section_keys(section) -> None:
    """One-line :class:`ConfigError` for a key of the ``algorithm`` mapping that its algorithm lacks but another
    section has (``algorithm.group_size`` -> did you mean ``rollout.group_size``?), as a misplaced key of any other
    section is told; any other unknown key is left to the algorithm's own unknown-key error (its closest setting)."""
    if not isinstance(section, dict):
        return
    keys = _algorithm_keys(section.get("name", "sft"))
    if keys is None:
        return
    known = [k for k in config_keys(TrainConfig) if k.partition(".")[0] != "algorithm"]
    known += [f"algorithm.{k}" for k in sorted(keys)]
    for key in (k for k in section if k not in keys):
        hint = closest_key(f"algorithm.{key}", known)
        if hint is not None and not hint.startswith("algorithm."):
            raise ConfigError(f"unknown config key 'algorithm.{key}' (did you mean '{hint}'?)")


def _shares_settings(algorithm, base) -> bool:
    """True when registered algorithm class ``algorithm`` is a variant of ``base`` with its settings: it subclasses
    ``base`` and keeps its ``config_class`` (a plug-in's d1 that changes a hook), or, for a plug-in (a class defined
    outside DARE), extends it (a subclass of d1's config adding a field). DARE's own subclasses with a config class of
    their own (IGPO of d1, DPO of VRPO) have defaults of their own. Either may be None."""
    if not (isinstance(algorithm, type) and isinstance(base, type) and issubclass(algorithm, base)):
        return False
    mine, theirs = getattr(algorithm, "config_class", None), getattr(base, "config_class", None)
    if mine is theirs:
        return True
    plugin = algorithm.__module__.partition(".")[0] != "dare"
    return plugin and isinstance(mine, type) and isinstance(theirs, type) and issubclass(mine, theirs)


def _fit_recipe_algorithm(raw: dict, given: dict, path) -> dict:
    """The recipe's ``algorithm`` section against the algorithm that runs. With ``algorithm.name`` overridden to
    another algorithm, none of the recipe's algorithm settings carry over: the new algorithm starts from its own
    defaults plus the ``algorithm.*`` overrides, and one note names the settings dropped (a key both algorithms have
    would otherwise keep a value tuned for the recipe's algorithm), unless the new algorithm is a variant of the
    recipe's with its settings (:func:`_shares_settings`: a plug-in's d1, or one extending d1's config): then the recipe's settings carry over. With the recipe's own algorithm, an unknown key
    the recipe holds is an error that says so and names the algorithms having it. Keys given as overrides are left
    to the usual unknown-key error."""
    import logging

    from dare.algorithms import ALGORITHMS

    section = raw.get("algorithm")
    if isinstance(section, str):
        section = {"name": section}
    if not isinstance(section, dict):
        return raw
    override = given.get("algorithm") if isinstance(given.get("algorithm"), dict) else {}
    recipe_name = section.get("name", "sft")
    name = override.get("name", recipe_name)
    keys = _algorithm_keys(name)
    if keys is None:
        return raw
    if name != recipe_name and _shares_settings(ALGORITHMS.get(name), ALGORITHMS.get(recipe_name)):
        # a variant of the recipe's algorithm with its config class (a plug-in's d1): the recipe's settings fit it
        return {**raw, "algorithm": {**section, "name": name}}
    if name != recipe_name:
        dropped = [k for k in section if k != "name" and k not in override]
        if dropped:
            logging.getLogger("dare.trainer").warning(
                f"note: algorithm.name={name} replaces the recipe's {recipe_name}: dropping its "
                f"{', '.join(f'algorithm.{k}' for k in dropped)} ({name} starts from its own defaults; keep a "
                "setting with algorithm.KEY=VALUE)")
        return {**raw, "algorithm": {"name": name}}
    stray = [k for k in section if k not in keys and k not in override]
    if not stray:
        return {**raw, "algorithm": section}
    key = stray[0]
    owners = sorted(n for n in ALGORITHMS if key in (_algorithm_keys(n) or ()))
    if not owners:
        return raw  # no algorithm has it: the unknown-key error names the closest valid key
    raise ConfigError(f"unknown config key 'algorithm.{key}' in the recipe {path}: algorithm {name} has no such "
                      f"setting (it is a setting of {', '.join(owners)})")


def check_config_object(config: Any) -> None:
    """One-line :class:`ConfigError` unless ``config`` (of :class:`~dare.trainer.Trainer` / ``run_training``) is a
    :class:`TrainConfig`: a recipe path or a mapping is pointed to :func:`load_train_config`."""
    if isinstance(config, TrainConfig):
        return
    if isinstance(config, (str, os.PathLike)):
        hint = f"load the recipe first with dare.trainer.load_train_config({str(config)!r})"
    else:
        hint = "build one with dare.trainer.load_train_config(recipe_path, ['key=value', ...])"
    raise wrong_type("config", config, "a TrainConfig", hint, ConfigError)


def revalidate(config: TrainConfig) -> None:
    """The checks of :func:`load_train_config` (types, values, the algorithm's section) on a config object that may
    have been built or edited in Python since (``cfg.optim.lr = -1``): one-line errors, before any work. An attribute
    that is no config key (``cfg.optim.lrr = 5``) is an error, as is an ``algorithm`` section of another algorithm's
    class (``cfg.algorithm.name = "d1"`` on an SFT config); the checked values (``"1e-3"`` read as the float it
    spells, an ``algorithm`` mapping as its config class) are written back, so the run trains what was checked."""
    from dare.algorithms import get_algorithm, resolve_algorithm_config

    stray = _stray_attributes(config)
    if stray:
        hint = closest_key(stray[0], config_keys(TrainConfig))
        raise ConfigError(f"unknown config key '{stray[0]}' (set in Python)"
                          + (f" (did you mean '{hint}'?)" if hint else ""))
    section = config.algorithm
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        wanted = get_algorithm(section.name).config_class
        if type(section) is not wanted:
            raise ConfigError(
                f"config.algorithm is a {type(section).__name__} but its name is '{section.name}' "
                f"({wanted.__name__}): build the config with load_train_config(recipe, {{'algorithm.name': "
                f"'{section.name}'}}) or set config.algorithm = {{'name': '{section.name}', ...}}")
    again = from_dict(TrainConfig, config_dict(config))
    load_plugins(again.imports)  # a config built in Python: its plug-ins register before its names are checked
    check_algorithm_section_keys(again.algorithm)
    again.algorithm = resolve_algorithm_config(again.algorithm)
    again.validate()
    _write_back(config, again)


def _stray_attributes(obj, prefix: str = "") -> list[str]:
    """Dotted names of attributes set on the config tree ``obj`` that are no fields (a typo made in Python)."""
    names = {f.name for f in dataclasses.fields(obj)}
    found = [f"{prefix}{k}" for k in vars(obj) if k not in names and not k.startswith("_")]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found += _stray_attributes(value, f"{prefix}{f.name}.")
    return found


def _write_back(target, source) -> None:
    """Copy ``source``'s field values into the config tree ``target`` in place (sections of the same class stay the
    same objects)."""
    for f in dataclasses.fields(source):
        new, old = getattr(source, f.name), getattr(target, f.name)
        if dataclasses.is_dataclass(new) and type(new) is type(old):
            _write_back(old, new)
        else:
            setattr(target, f.name, new)


def config_dict(config: TrainConfig) -> dict:
    """The resolved config as plain data (what is saved as output_dir/config.yaml)."""
    return to_dict(config)


def check_same_on_every_rank(config: TrainConfig, info) -> None:
    """Under torchrun: a one-line error on every rank when the processes were given different settings (a
    per-rank override): otherwise they train a mixture silently (``optim.lr``), or one waits forever for the
    others (``trainer.max_steps``, ``distributed.sequence_parallel``). ``imports`` may differ (where the plug-in
    files lie)."""
    if not info.initialized:
        return
    from dare.distributed import all_gather_objects

    mine = {k: v for k, v in flatten(config_dict(config)).items() if k != "imports"}
    everyone = all_gather_objects(mine, info)  # the whole world (all_gather_objects takes no group)
    for rank, theirs in enumerate(everyone[1:], start=1):
        differ = sorted(k for k in mine.keys() | theirs.keys() if everyone[0].get(k) != theirs.get(k))
        if differ:
            key = differ[0]
            more = f" (and {len(differ) - 1} more: {', '.join(differ[1:4])}{', ...' if len(differ) > 4 else ''})" \
                if len(differ) > 1 else ""
            raise ConfigError(f"the processes of this torchrun launch have different settings: rank {rank} has "
                              f"{key}={theirs.get(key)} where rank 0 has {everyone[0].get(key)}{more}; give every "
                              "process the same recipe and overrides")
