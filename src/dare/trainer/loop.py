"""The training loop shared by every algorithm.

Per optimizer step ``s`` (0-based; logged as ``step = s + 1``)::

    micro = source.batch(s)                      # this rank's micro-batches of the global batch
    micro = [algorithm.corrupt(mb, s) ...]       # stored views, seeded per example
    totals = all_reduce(sum algorithm.totals(mb)) # global-batch normalisers
    for mb in micro (+ empty ones so every rank runs the same number):
        loss, metrics = algorithm.loss(mb, algorithm.estimate(model, mb), totals); loss.backward()
    clip; optimizer.step(); scheduler.step()      # gradients are sums over micro-batches and ranks

Extension points: pass another :class:`~dare.trainer.sources.BatchSource` and/or a registered algorithm;
the loop, sharding, checkpointing and logging stay the same. The source follows the algorithm's ``needs``:
a dataset (SFT), rollouts of the current policy (RL: :class:`~dare.trainer.rl.RolloutSource`, rollout ->
reward -> advantage -> stored views -> old/reference log-probs) or preference pairs
(:class:`~dare.trainer.preference.PairSource`). Sources with ``prepares_views = True`` return micro-batches
that already hold the algorithm's views (the loop does not corrupt them again); a source's
``step_metrics`` (global values, e.g. rollout rewards) are added to the step's record.

Test seam: with the environment variable ``DARE_KILL_AT_STEP=N`` the process SIGKILLs itself right after
step N has been logged (and checkpointed when due), to test kill-and-resume.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dare.algorithms import get_algorithm
from dare.config import yaml_text
from dare.distributed import (
    DistInfo, all_reduce_dict, all_reduce_max_int, apply_fsdp, autocast_context, barrier, init_distributed,
)
from dare.distributed.grad_norm import clip_grad_norm_
from dare.errors import ConfigError, DivergedError, and_join
from dare.interrupts import StopAfterStep, write_line
from dare.outputs import atomic_write_text, ensure_dir, mark_output, publish_dir, remove_strays, staging_dir
from dare.progress import hf_progress_bars
from dare.trainer.checkpoint import load_checkpoint, remove_partial_checkpoints, save_checkpoint
from dare.trainer.config import TrainConfig, check_same_on_every_rank, config_dict, revalidate
from dare.trainer.metrics import MetricsLogger, truncate_jsonl
from dare.trainer.preflight import (
    check_auxiliary_sequence, check_lora_targets, check_run, fill_rollout_defaults, record_given_model,
    tokenizer_load_error,
)
from dare.trainer.output_dir import COMMAND as RUN_COMMAND
from dare.trainer.output_dir import OutputLock
from dare.trainer.resume import START_OVER_DIRS, check_steps_ahead, resume_point
from dare.trainer.sources import batch_keys_read_by
from dare.trainer.optim import build_optimizer, build_scheduler


def present_outputs(out: Path, names: list[str]) -> list[str]:
    """Those of ``names`` that ``out`` holds: ``NAME/`` a directory, else a non-empty file."""
    def there(name: str) -> bool:
        path = out / name.rstrip("/")
        return path.is_dir() if name.endswith("/") else path.is_file() and path.stat().st_size > 0

    return [name for name in names if there(name)]


log = logging.getLogger("dare.trainer")


def compute_precision(mixed_precision: str, device: torch.device, sharded: bool):
    """The autocast context of the trainer's forwards (losses, rollouts, old / reference log-probs) for
    ``distributed.mixed_precision``: none when FSDP2 shards the model (its policy casts the weights), bf16 on CUDA for
    ``auto`` / ``bf16`` (:func:`~dare.distributed.autocast_context`), and bf16 on CPU when ``bf16`` is asked for:
    float32 master weights, optimizer and gradients, bf16 matmuls, as FSDP2's bf16 policy computes on CPU."""
    if not sharded and device.type == "cpu" and mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return autocast_context(mixed_precision if not sharded else "fp32", device)


def _add(into: dict, values: dict) -> None:
    """Accumulate scalar metrics where they live (no host sync per micro-batch; one at the end of the step)."""
    for key, value in values.items():
        value = torch.as_tensor(value).detach().to(torch.float64)
        into[key] = into[key] + value if key in into else value


class Trainer:
    """Build everything from a :class:`TrainConfig` and run :meth:`train`.

    ``source`` replaces the dataset source: a :class:`~dare.trainer.sources.BatchSource`, or a callable
    ``source(trainer) -> BatchSource`` called once the model, algorithm and reference exist (an RL source with
    its own prompts or reward needs them). ``info`` is a pre-initialised distributed context; ``model`` an
    already built model on ``info.device`` used instead of loading ``config.model.path`` (e.g. a randomly
    initialised model for benchmarks; without LoRA a frozen reference is a copy of it taken before training).
    """

    def __init__(self, config: TrainConfig, *, source=None, info: DistInfo | None = None, model=None):
        from dare.models.spec import family_of
        from dare.trainer.config import check_config_object

        check_config_object(config)  # a recipe path or a dict: one line pointing to load_train_config

        self.config = config
        cfg = config
        revalidate(cfg)  # a config edited in Python after load_train_config: its types and values
        self.info = info or init_distributed(cfg.distributed.backend, cfg.distributed.device)
        check_same_on_every_rank(cfg, self.info)  # a per-rank override: one line, not a mixture or a hang
        if model is not None:
            record_given_model(cfg, model)  # where the given model comes from and its dtype, for config.yaml
        fill_rollout_defaults(cfg, model)  # the family's sampler, before config.yaml records it
        check_run(cfg, model=model is None, data=source is None, warn=self.info.is_main,  # what --dry-run checks
                  family=family_of(model) if model is not None else None, device=self.info.device.type,
                  world_size=self.info.world_size, launched=self.info.initialized)
        self.output_dir = Path(cfg.trainer.output_dir)
        self._lock, self._locked = OutputLock(self.output_dir), False
        self.resume_from = self._prepare_output_dir()  # locks the output directory (rank 0) until train() ends
        try:
            self._build(config, source, model)
        except BaseException:
            self.release_output_dir()
            raise

    def _build(self, config: TrainConfig, source, model) -> None:
        """The model, algorithm, reference, batch source, optimizers and logger (after the output directory)."""
        from dare.models.loading import load_model, resolve_dtype, unwrap
        from dare.models.spec import family_of

        cfg = config
        torch.manual_seed(cfg.trainer.seed)

        given = model is not None
        if not given:
            model = load_model(cfg.model.path, dtype=resolve_dtype(cfg.model.dtype), device=self.info.device)
        self.token_ids = family_of(model).token_ids(model.config)
        self.context_length = family_of(model).context_length(model.config)
        base = unwrap(model)
        base.attn_backend = cfg.model.attn_backend
        self.algorithm = get_algorithm(cfg.algorithm.name)(
            cfg.algorithm, token_ids=self.token_ids, seed=cfg.trainer.seed, attn_backend=cfg.model.attn_backend,
            logits_chunk_size=cfg.model.logits_chunk_size)
        self.algorithm.bind_model(base)
        # A given model has no checkpoint to load a frozen reference from: copy it before it is adapted / sharded
        # (the algorithm is built first so its needs are known).
        frozen = None
        if given and self.algorithm.needs.reference and not cfg.lora.enabled:
            frozen = copy.deepcopy(model)
        if cfg.model.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        if cfg.lora.enabled:
            from dare.models.lora import apply_lora

            check_lora_targets(cfg.lora.target_modules, model)  # peft's own error names no module of the model
            model = apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules)
        if cfg.model.compile:
            from dare.models.compile import compile_blocks

            compile_blocks(model, backend=cfg.model.compile_backend)
        self.sequence, self.data_info = self._sequence_parallel(base)
        self.algorithm.sequence_parallel = self.sequence
        self.sharded = self.info.initialized and cfg.distributed.fsdp
        self._expert_parallel(model)  # before the blocks are sharded: the experts get their own FSDP2 mesh
        if self.sharded:
            apply_fsdp(model, unwrap(model).blocks, self.info, cfg.distributed.mixed_precision,
                       cfg.distributed.reshard_after_forward)
        self.model = model.train()

        self.auxiliary = self.algorithm.auxiliary_models(self._load_backbone)
        if self.sequence is not None:  # also checked before loading (preflight.check_parallel: auxiliary_names)
            check_auxiliary_sequence(cfg.algorithm.name, list(self.auxiliary))
        for aux in self.auxiliary.values():
            if self.sharded:
                apply_fsdp(aux.module, aux.blocks or [], self.info, cfg.distributed.mixed_precision,
                           cfg.distributed.reshard_after_forward)
            aux.module.train()
        self.reference = self._reference(frozen) if self.algorithm.needs.reference else None
        if source is None:
            source = self._build_source()
        elif callable(source) and not hasattr(source, "batch"):
            source = source(self)
        self.source = source
        if getattr(self.source, "prepares_views", False):  # old / reference forwards under the same precision
            self.source.precision = self.precision
        self.total_steps = cfg.trainer.max_steps or max(1, int(cfg.trainer.epochs * self.source.steps_per_epoch))

        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ConfigError("the model has no trainable parameters")
        self.optimizer = build_optimizer(params, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, self.total_steps)
        self.aux_optimizers, self.aux_schedulers = {}, {}
        for name, aux in self.auxiliary.items():  # own AdamW at aux.lr, the policy's schedule shape
            aux_optim = dataclasses.replace(cfg.optim, lr=aux.lr)
            self.aux_optimizers[name] = build_optimizer([p for p in aux.module.parameters() if p.requires_grad],
                                                        aux_optim)
            self.aux_schedulers[name] = build_scheduler(self.aux_optimizers[name], aux_optim, self.total_steps)
        self.step = 0
        self.stop_requested = False
        self.interrupted = False     # a stop signal ended the loop (trainer.save_on_interrupt)
        self.in_step = False         # train_step is running (what a stop signal's message counts)
        self.steps_run = 0           # steps this call of train() ran, and those of them that trained nothing
        self.empty_steps = 0
        self.rewards: list[float] = []  # each rollout's mean reward, for the summary's first -> last
        self.rollouts_without_signal = 0  # rollouts with no informative group (every advantage 0)
        self.logger = MetricsLogger(self.output_dir, enabled=self.info.is_main, tensorboard=cfg.trainer.tensorboard,
                                    wandb=cfg.trainer.wandb, wandb_project=cfg.trainer.wandb_project,
                                    config=config_dict(config), resuming=self.resume_from is not None)

    def precision(self):
        """The autocast context of this run's forwards (:func:`compute_precision`)."""
        return compute_precision(self.config.distributed.mixed_precision, self.info.device, self.sharded)

    # ---- construction helpers -----------------------------------------------------------------------
    def _prepare_output_dir(self) -> Path | None:
        """Create the output directory, decide what to resume from (None: start at step 0; see
        :mod:`dare.trainer.resume`), remove what interrupted writes left, and write ``config.yaml``.

        ``trainer.resume=never`` deletes ``checkpoints/`` and ``final/`` (refused when the model, tokenizer or data
        lie there: :func:`~dare.trainer.resume.check_start_over`); a run that starts at step 0 in a directory
        holding a previous run's outputs says which of them it replaces."""
        cfg, out = self.config, self.output_dir
        settings = config_dict(cfg)
        ensure_dir(out, "trainer.output_dir")
        self._lock_output_dir()
        try:
            resume = cfg.trainer.resume
            checkpoint = resume_point(out, resume, settings)  # resume=never: refused if it would delete an input
            check_steps_ahead(checkpoint, cfg.trainer.max_steps)  # nothing to train: refused
        except BaseException:
            self.release_output_dir()
            raise
        if self.info.is_main:
            remove_strays(out)
            remove_partial_checkpoints(out)
            self._announce_start(checkpoint)
            if resume == "never":  # start over: weights of the previous run are not this run's
                for name in START_OVER_DIRS:
                    shutil.rmtree(out / name, ignore_errors=True)
            atomic_write_text(out / "config.yaml", yaml_text(settings))
        barrier(self.info)
        return checkpoint

    def _lock_output_dir(self) -> None:
        """Take the output directory's lock (:class:`~dare.trainer.output_dir.OutputLock`; rank 0 only, every rank
        learns whether it got it) and mark the directory as a ``dare train`` output; a one-line error on every rank
        when another process holds it."""
        if self._locked:
            return
        refused = None
        if self.info.is_main:
            try:
                self._lock.acquire()
            except ConfigError as err:
                refused = err
        if self.info.initialized and all_reduce_max_int(int(refused is not None), self.info) and refused is None:
            raise ConfigError(f"trainer.output_dir {self.output_dir} is in use by another `dare train` run (rank 0 "
                              "says which)")
        if refused is not None:
            raise refused
        self._locked = True
        if self.info.is_main:
            mark_output(self.output_dir, RUN_COMMAND)

    def release_output_dir(self) -> None:
        """Let other runs write the output directory again (:meth:`train` does at its end; a later :meth:`train`
        takes the lock again)."""
        self._lock.release()
        self._locked = False

    def _logs(self) -> list[str]:
        """The per-step logs of this run that start empty when it starts at step 0."""
        cfg = self.config
        samples = get_algorithm(cfg.algorithm.name).needs.rollout and cfg.rollout.samples_file
        return ["metrics.jsonl", *(["rollouts.jsonl"] if samples else [])]

    def _announce_start(self, checkpoint: Path | None) -> None:
        """One line when a run that starts at step 0 removes or replaces a previous run's outputs in the directory:
        ``trainer.resume=never`` (what it deletes), or ``auto`` without a checkpoint (a run stopped before its first
        one)."""
        out, cfg = self.output_dir, self.config.trainer
        if cfg.resume == "never":
            gone = present_outputs(out, [*(f"{name}/" for name in START_OVER_DIRS), *self._logs()])
            if gone:
                print(f"starting over in {out} (trainer.resume=never): removing {', '.join(gone)}")
        elif checkpoint is None:
            replaced = present_outputs(out, [*(["final/"] if cfg.export else []), *self._logs()])
            if replaced:
                verb = "is" if len(replaced) == 1 else "are"
                print(f"no checkpoint in {out}: starting from step 0; {and_join(replaced)} {verb} replaced")

    @functools.cached_property
    def tokenizer(self):
        """The tokenizer of ``model.tokenizer`` / ``model.path`` (loaded on first use: sources built from
        ``data`` and exports need it, an injected source and model may not have one)."""
        from dare.models.loading import load_tokenizer

        path = self.config.model.tokenizer or self.config.model.path
        try:
            return load_tokenizer(path)
        except (OSError, ValueError, KeyError, TypeError) as err:  # "can't load", unrecognised or damaged files
            raise tokenizer_load_error("model.tokenizer" if self.config.model.tokenizer else "model.path", path,
                                       err) from None

    def _reference(self, frozen=None):
        """The frozen reference policy: the adapter-disabled policy with LoRA, else a frozen (sharded) copy
        (``frozen``: of a model passed as ``Trainer(model=...)``, else loaded from ``model.path``)."""
        from dare.trainer.workflow import Reference

        if self.config.lora.enabled:
            return Reference(self.model)
        from dare.models.loading import load_model, resolve_dtype, unwrap

        cfg = self.config
        if frozen is None:
            frozen = load_model(cfg.model.path, dtype=resolve_dtype(cfg.model.dtype), device=self.info.device)
        frozen.requires_grad_(False)
        unwrap(frozen).attn_backend = cfg.model.attn_backend
        if self.sharded:
            apply_fsdp(frozen, unwrap(frozen).blocks, self.info, cfg.distributed.mixed_precision,
                       cfg.distributed.reshard_after_forward)
        return Reference(self.model, frozen.eval())

    def _sequence_parallel(self, base):
        """``(SequenceParallel | None, data-parallel DistInfo)`` for ``distributed.sequence_parallel``: the
        (data x sequence) mesh and the view of this rank that data sources and global-batch sums use (the launch
        was checked before loading: :func:`~dare.trainer.preflight.check_parallel`)."""
        degree = self.config.distributed.sequence_parallel
        if degree == 1:
            return None, self.info
        from dare.distributed.sequence import attention_heads, build_sequence_parallel

        sequence, data_info = build_sequence_parallel(self.info, degree)
        heads = attention_heads(base.config)
        if heads is not None:
            sequence.check_heads(heads)
        return sequence, data_info

    def _expert_parallel(self, model) -> None:
        """``distributed.expert_parallel: N > 1``: shard the experts of every MoE layer over N ranks (the ``expert``
        dimension of a 2-D mesh) and FSDP2-shard them over the ``expert_replicas`` dimension (the launch was checked
        before loading: :func:`~dare.trainer.preflight.check_parallel`)."""
        from dare.distributed import mixed_precision_policy
        from dare.distributed.expert_parallel import expert_parallel_mesh, shard_expert_replicas, shard_experts
        from dare.models.loading import unwrap

        degree = self.config.distributed.expert_parallel
        if degree == 1:
            return
        mesh = expert_parallel_mesh(self.info, degree)
        shard_experts(unwrap(model), mesh["expert"])
        policy = mixed_precision_policy(self.config.distributed.mixed_precision, self.info.device)
        shard_expert_replicas(unwrap(model), mesh["expert_replicas"], policy)

    def _load_backbone(self):
        """A fresh copy of the initial policy weights (no adapter) for an algorithm's auxiliary model."""
        from dare.models.loading import load_model, resolve_dtype, unwrap

        cfg = self.config
        model = load_model(cfg.model.path, dtype=resolve_dtype(cfg.model.dtype), device=self.info.device)
        unwrap(model).attn_backend = cfg.model.attn_backend
        if cfg.model.gradient_checkpointing:
            unwrap(model).gradient_checkpointing_enable()
        return model

    def _build_source(self):
        needs = self.algorithm.needs
        if needs.rollout:
            from dare.trainer.rl import build_rollout_source

            return build_rollout_source(self)
        if needs.pairs:
            from dare.trainer.preference import build_pair_source

            return build_pair_source(self)
        return self._dataset_source()

    def _warn_rows_past_context(self, longest: int) -> None:
        """Warn when trained rows reach positions past the model's configured context: fixed-width padded rows
        reach ``data.max_length``, other rows (packed documents restart their positions) their longest example.
        A ``data.max_length`` above the context that no row reaches is no warning."""
        cfg, context = self.config, self.context_length
        padded_to = None if cfg.data.packing else cfg.fixed_width()
        if not context or max(longest, padded_to or 0) <= context:
            return
        if padded_to is not None and padded_to > longest:
            reach = f"fixed-shape rows are padded to data.max_length={padded_to} positions"
        else:
            reach = f"the longest example has {longest} tokens (data.max_length={cfg.data.max_length})"
        log.warning(f"warning: {reach}, beyond the model's configured context length {context}: positions past "
                    "it are untrained")

    def _dataset_source(self):
        from dare.data.sft import build_sft_dataset
        from dare.trainer.sources import DatasetSource

        cfg = self.config
        data = build_sft_dataset(cfg.data, self.tokenizer, self.token_ids.eos, seed=cfg.trainer.seed,
                                 progress=cfg.trainer.progress and self.info.is_main, warn=self.info.is_main)
        if data.dropped and self.info.is_main:
            log.warning(f"warning: dropped {data.dropped} of {data.dropped + len(data)} examples longer than "
                        f"data.max_length={cfg.data.max_length}")
        if self.info.is_main:
            self._warn_rows_past_context(max(map(len, data.examples)))
        pack_length = cfg.data.pack_length or cfg.data.max_length
        if cfg.data.packing and pack_length < cfg.data.max_length:
            raise ConfigError(f"data.pack_length={pack_length} must be at least data.max_length={cfg.data.max_length}")
        return DatasetSource(
            data.examples, batch_size=cfg.trainer.batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
            rank=self.data_info.rank, world_size=self.data_info.world_size, seed=cfg.trainer.seed,
            shuffle=cfg.data.shuffle,
            packing=cfg.data.packing, pack_length=pack_length, eos_id=self.token_ids.eos, pad_id=self.token_ids.pad,
            eos_padding=cfg.data.eos_padding, fixed_width=cfg.fixed_width(),
        )

    @property
    def trainable_only(self) -> bool:
        return self.config.lora.enabled

    # ---- one step ------------------------------------------------------------------------------------
    def forward_backward(self, step: int) -> dict[str, torch.Tensor]:
        """Accumulate the gradient of step ``step``'s global-batch loss into ``.grad``; returns summed metrics."""
        from dare.data.sft import dummy_micro_batch

        micro = self.source.batch(step)
        prepared = getattr(self.source, "prepares_views", False)
        with batch_keys_read_by(self.algorithm.name, micro):  # a custom source's missing key: one line
            if not prepared:
                micro = [self.algorithm.corrupt(mb, step) for mb in micro]
            local_totals: dict = {}
            for mb in micro:
                _add(local_totals, self.algorithm.totals(mb))
        totals = all_reduce_dict(dict(local_totals), self.data_info)  # over data-parallel groups: sequence-parallel
        count = all_reduce_max_int(len(micro), self.data_info)       # ranks hold the same micro-batches
        if prepared and len(micro) < count:
            raise RuntimeError("the source returned different numbers of micro-batches on different ranks")
        while len(micro) < count:  # same number of forward/backward collectives on every rank
            micro.append(self.algorithm.corrupt(dummy_micro_batch(self.token_ids.pad), step))
        sums: dict = {}
        device_totals = {k: v.to(self.info.device) for k, v in totals.items()}
        micro = [mb.to(self.info.device, non_blocking=True) for mb in micro]  # all copies queued up front
        for mb in micro:
            with self.precision(), batch_keys_read_by(self.algorithm.name, micro):
                metrics = self.algorithm.backward(self.model, mb, device_totals)
            _add(sums, metrics)
        out = all_reduce_dict(sums, self.data_info)
        out.update({k: v for k, v in totals.items() if v.numel() == 1})
        out.update(getattr(self.source, "step_metrics", None) or {})
        return out

    def optimizer_step(self) -> dict[str, float]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.config.optim.grad_clip if self.config.optim.grad_clip is not None else float("inf")
        norm = clip_grad_norm_(params, max_norm)  # expert-parallel banks live on their own mesh
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        lr = self.scheduler.get_last_lr()[0]
        if not math.isfinite(float(norm)):  # the update would write inf/NaN into every weight
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(f"the gradient norm is {float(norm)}")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        record = {"grad_norm": float(norm), "lr": float(lr)}
        for name, aux in self.auxiliary.items():
            aux_norm = torch.nn.utils.clip_grad_norm_([p for p in aux.module.parameters() if p.requires_grad],
                                                      max_norm)
            if hasattr(aux_norm, "full_tensor"):
                aux_norm = aux_norm.full_tensor()
            self.aux_optimizers[name].step()
            self.aux_schedulers[name].step()
            self.aux_optimizers[name].zero_grad(set_to_none=True)
            record[f"{name}/grad_norm"] = float(aux_norm)
        return record

    def train_step(self, step: int) -> dict:
        """Run optimizer step ``step`` and return its metrics record (not logged: :meth:`train` logs it).

        ``step`` is the **0-based** index of the step (the record and ``metrics.jsonl`` say ``step + 1``): the first
        step is ``train_step(0)``, the next one to run ``train_step(trainer.step)``. Sources are pure functions of
        the index, so it chooses the data / rollout of the step; RL with ``algorithm.inner_steps = mu > 1`` makes
        its rollouts at the multiples of ``mu`` and reuses them for the following ``mu - 1`` indices (an index
        inside a cycle whose rollouts were never made is a warning and rolls them out). Run as the next step
        (``step == trainer.step``) it advances ``trainer.step``, so that :meth:`save` and a later :meth:`train`
        continue after it (a hand-written loop ``for s in range(3): trainer.train_step(s)`` then saves
        ``step_00000003``); it does not log, count toward the end-of-run summary or checkpoint (:meth:`train` does)."""
        start, cpu_start = time.perf_counter(), time.process_time()
        sums = self.forward_backward(step)
        record = {"step": step + 1, "epoch": round(self.source_epoch(step + 1), 6)}
        record.update({k: float(v) for k, v in sorted(sums.items()) if torch.as_tensor(v).numel() == 1})
        if "loss" in record and not math.isfinite(record["loss"]):
            self.optimizer.zero_grad(set_to_none=True)
            raise self._diverged(f"the loss is {record['loss']}")
        record.update(self.optimizer_step())
        record["time/step_s"] = round(time.perf_counter() - start, 4)
        record["time/step_cpu_s"] = round(time.process_time() - cpu_start, 4)  # all threads of the process
        if step == self.step:  # the next step: what save() and train() continue from
            self.step = step + 1
        return record

    def _diverged(self, what: str) -> DivergedError:
        """The one-line error of a step whose ``what`` is not finite: raised before the update, so no weights are
        changed, saved or exported from it (the checkpoints of earlier steps stay)."""
        dtype = self.config.model.dtype
        hint = (f"model.dtype={dtype} overflows easily: try bfloat16 or float32, or " if dtype in ("float16", "fp16")
                else "try ")
        return DivergedError(f"step {self.step + 1}: {what}; training stopped before the update (no weights of this "
                             f"step are saved or exported); {hint}a lower optim.lr (now {self.config.optim.lr:g}) or "
                             "optim.grad_clip")

    def source_epoch(self, step: int) -> float:
        return step / max(1, getattr(self.source, "steps_per_epoch", 1))

    # ---- checkpoints ---------------------------------------------------------------------------------
    def save(self) -> Path:
        return save_checkpoint(self.output_dir, self.step, self.model, self.optimizer, self.scheduler, self.info,
                               trainable_only=self.trainable_only, keep_last=self.config.trainer.keep_last,
                               rank_state={"source": self.source.state_dict()}, auxiliary=self._auxiliary_pairs(),
                               extra={"aux_schedulers": {k: v.state_dict() for k, v in self.aux_schedulers.items()},
                                      "config": config_dict(self.config)})

    def _auxiliary_pairs(self) -> dict:
        return {name: (aux.module, self.aux_optimizers[name]) for name, aux in self.auxiliary.items()}

    def _truncate_logs(self, step: int) -> None:
        """Drop log lines of steps after ``step`` (``metrics.jsonl``, the source's samples file): they are redone."""
        self.logger.truncate_after(step)
        samples = getattr(self.source, "samples_path", None)
        if samples is not None:
            truncate_jsonl(samples, step)

    def maybe_resume(self) -> None:
        path = self.resume_from
        if path is None:
            self._truncate_logs(0)
            return
        state = load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.info,
                                trainable_only=self.trainable_only, auxiliary=self._auxiliary_pairs(),
                                sequence_parallel=self.config.distributed.sequence_parallel)
        for name, sched_state in state.get("aux_schedulers", {}).items():
            self.aux_schedulers[name].load_state_dict(sched_state)
        self.source.load_state_dict(state.get("rank_state", {}).get("source", state.get("source", {})))
        self.step = int(state["step"])
        self._truncate_logs(self.step)
        if self.info.is_main:
            print(f"resumed from {path} at step {self.step}")

    def _save_pretrained(self, out: Path, state: dict) -> None:
        """Write the weights and the tokenizer into ``out`` (:func:`dare.trainer.export.save_model_dir`)."""
        from dare.trainer.export import save_model_dir

        save_model_dir(self.model, self.tokenizer, out, state, adapter=self.trainable_only,
                       chat_template=self.config.data.chat_template)

    def export(self, out_dir: Path | None = None) -> Path:
        """Write a HF checkpoint (full training) or a peft adapter (LoRA) plus the tokenizer (collective).

        Written into a hidden staging directory and renamed to ``out`` when complete: an interrupted export never
        leaves a ``final/`` that looks finished (the next run deletes the staging directory)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        final = Path(out_dir or self.output_dir / "final")
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=self.trainable_only)
        state = get_model_state_dict(self.model, options=options)
        out = staging_dir(final) if self.info.is_main else None
        if self.info.is_main:
            with hf_progress_bars(self.config.trainer.progress):
                self._save_pretrained(out, state)
        for name, aux in self.auxiliary.items():  # e.g. value.pt: the value model's full state dict
            aux_state = get_model_state_dict(aux.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.info.is_main:
                torch.save(aux_state, out / f"{name}.pt")
        if self.info.is_main:
            publish_dir(out, final)
        barrier(self.info)
        return final

    # ---- the loop ------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """End :meth:`train` after the current step (e.g. from an ``on_step`` callback: early stopping)."""
        self.stop_requested = True

    def train(self, on_step: Callable[[Trainer, dict], dict | None] | None = None) -> dict:
        """Run the remaining steps; returns the last metrics record.

        ``on_step(trainer, record)`` runs after every optimizer step, before the record is logged; the metrics it
        returns (e.g. a periodic held-out evaluation) are added to the record, and it may end training early with
        :meth:`request_stop` (the final checkpoint / export is still written). It must not change the parameters
        (sources and corruptions are seeded per step, so evaluating in between does not change the run)."""
        self._lock_output_dir()
        try:
            return self._train(on_step)
        finally:
            self.release_output_dir()

    def _train(self, on_step) -> dict:
        cfg = self.config.trainer
        self.maybe_resume()
        kill_at = int(os.environ.get("DARE_KILL_AT_STEP", "0") or 0)
        bar = None
        if cfg.progress and self.info.is_main:
            from dare.progress import progress_bar

            bar = progress_bar(self.total_steps, "train", initial=self.step, dynamic_ncols=True)
        signals = StopAfterStep(self._announce_stop) if cfg.save_on_interrupt else None
        with signals or contextlib.nullcontext():
            try:
                record = self._run_steps(on_step, bar, kill_at, signals) or {"step": self.step}
            finally:
                if bar is not None:  # also when interrupted: the bar's line ends before any message
                    if self.stop_requested and self.step < self.total_steps:  # not an interrupted run: say so
                        bar.set_description(f"train (stopped early at step {self.step})", refresh=True)
                    bar.close()
            if self.interrupted and self.step < self.total_steps:  # a second signal during the save stops it
                if not self._save_due():  # else the loop saved this step already
                    self.save()
                self.logger.close()
                raise KeyboardInterrupt  # dare train prints where to resume from
        if self.empty_steps:  # for the end-of-run summary (not a logged metric)
            record = {**record, "steps_run": self.steps_run, "steps_trained_nothing": self.empty_steps}
        record = {**record, **reward_digest(self.rewards, self.rollouts_without_signal)}
        if self.stop_requested and self.step < self.total_steps:
            self._record_early_stop()
        self.save()  # always: a rerun resumes from it (and finds nothing left to train) instead of starting over
        if cfg.export:
            self.export()
        self.logger.close()
        return record

    def _note_step(self, record: dict) -> None:
        """Count the step for the end-of-run summary: its rollout's mean reward and learning signal (RL), and whether
        it trained nothing (a count metric of :data:`EMPTY_STEP_METRICS` is 0: e.g. TraceRL's accuracy filter or
        dynamic sampling left no rows); the first such step is a warning unless the rollout source's warning on a
        rollout without learning signal already said why, the summary says how many."""
        self.steps_run += 1
        if "rollout/reward" in record:  # a step that rolled out (inner steps reuse its rollouts)
            self.rewards.append(record["rollout/reward"])
            self.rollouts_without_signal += int(record.get("rollout/informative_groups") == 0)
        key = next((key for key in EMPTY_STEP_METRICS if key in record and record[key] == 0), None)
        if key is None:
            return
        self.empty_steps += 1
        said = record.get("rollout/informative_groups") == 0  # the rollout source's warning said why
        if self.empty_steps == 1 and self.info.is_main and not said:
            reason = self.algorithm.nothing_trained_reason(record) or f"no {key} to train (metric {key} = 0)"
            log.warning(f"warning: step {record['step']}: {reason}: nothing trained this step (later such steps "
                        "are counted in the end-of-run summary)")

    def _record_early_stop(self) -> None:
        """After :meth:`request_stop`: config.yaml says ``trainer.max_steps`` = the steps run, so it reproduces the
        weights (when the schedule does not depend on the run length; otherwise the planned length stays)."""
        from dare.trainer.resume import schedule_depends_on_length

        settings = config_dict(self.config)
        if schedule_depends_on_length(settings):
            return
        self.config.trainer.max_steps = self.step
        if self.info.is_main:
            atomic_write_text(self.output_dir / "config.yaml", yaml_text(config_dict(self.config)))

    def _save_due(self) -> bool:
        """Whether ``trainer.save_every`` checkpoints the step just run (the final one is saved by :meth:`train`)."""
        every = self.config.trainer.save_every
        return bool(every) and self.step % every == 0 and self.step < self.total_steps

    def _announce_stop(self, label: str) -> None:
        """What the first stop signal prints (main rank): the loop stops after the running step and saves there."""
        if self.info.is_main:
            again = "Ctrl-C again" if label.startswith("SIGINT") else "a second signal"
            step = self.step + 1 if self.in_step else self.step  # between steps (on_step, a save): the last one
            write_line(f"{label}: stopping after step {step} and saving a checkpoint there ({again} stops at once, "
                       "without it)")

    def _stop_signalled(self, signals: StopAfterStep | None) -> bool:
        """Whether a stop signal reached any process (one collective per step under torchrun, so that every rank
        stops after the same step: the checkpoint is saved by all of them). The main rank says so when the signal
        reached only other ranks (it announces its own in :meth:`_announce_stop`)."""
        if signals is None:
            return False
        received = signals.received is not None
        if not self.info.initialized:
            return received
        anywhere = bool(all_reduce_max_int(int(received), dataclasses.replace(self.info, group=None)))
        if anywhere and not received and self.info.is_main:  # rank 0 announces the other ranks' signal
            write_line(f"a stop signal reached another process: stopping after step {self.step} and saving a "
                       "checkpoint there")
        return anywhere

    def _run_steps(self, on_step, bar, kill_at: int, signals: StopAfterStep | None = None) -> dict | None:
        """The remaining steps; returns the last step's record (None when no step was left). A stop signal
        (``signals``) ends the loop after the running step, with :attr:`interrupted` set."""
        cfg = self.config.trainer
        record, start, reward = None, time.perf_counter(), None
        rl = bool(self.algorithm.needs.rollout)
        unlogged_rollout = None  # the record of a rollout step that log_every skipped
        while self.step < self.total_steps and not self.stop_requested and not self.interrupted:
            self.in_step = True
            try:
                record = self.train_step(self.step)  # advances self.step
            finally:
                self.in_step = False
            self._note_step(record)
            if on_step is not None:
                record.update(callback_metrics(on_step(self, record)))
            record["time/elapsed_s"] = round(time.perf_counter() - start, 3)
            self.interrupted = self._stop_signalled(signals)
            logged = (self.step % cfg.log_every == 0 or self.step == self.total_steps or self.stop_requested
                      or self.interrupted)
            if "rollout/reward" in record and not logged:
                unlogged_rollout = record
            if logged:
                self.logger.log(with_rollout(record, unlogged_rollout))
                unlogged_rollout = None
            if bar is not None:  # postfix first: the line update() draws shows this step's values
                reward = record.get("rollout/reward", reward)  # the latest rollout's (inner steps reuse it)
                bar.set_postfix(progress_postfix(record, reward, rl), refresh=False)
                bar.update(1)
            if self._save_due():
                self.save()
                self.interrupted = self.interrupted or self._stop_signalled(signals)  # a signal during the save
            if kill_at and self.step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return record


def callback_metrics(returned) -> dict:
    """What an ``on_step`` callback returned, as metrics to add to the step's record: a mapping, or None for none;
    anything else is a one-line :class:`~dare.errors.InputError` (not a TypeError inside the loop)."""
    from collections.abc import Mapping

    if returned is None:
        return {}
    if not isinstance(returned, Mapping):
        from dare.errors import InputError, described

        raise InputError(f"the on_step callback returned {described(returned)}: return a dict of metrics to log "
                         "(name: number) or None")
    return dict(returned)


def with_rollout(record: dict, rollout: dict | None) -> dict:
    """``record`` as logged: a step that made no rollout (an inner step, ``algorithm.inner_steps`` > 1) after a rollout
    step that ``trainer.log_every`` skipped carries that rollout's keys, with ``rollout/step`` naming its step;
    otherwise no rollout metric would ever reach ``metrics.jsonl`` when every rollout step falls between logged
    steps (``log_every`` 4 with 12 inner steps)."""
    if rollout is None or "rollout/reward" in record:
        return record
    return {**record, **{k: v for k, v in rollout.items() if k not in record}, "rollout/step": rollout["step"]}


EMPTY_STEP_METRICS = ("rows", "sequences", "tokens", "trained_tokens")
"""Count metrics of a step (summed over the global batch); one that is 0 means the step trained nothing."""

REWARD_WINDOW = 5
"""The end-of-run summary compares the mean reward of the first and the last rollouts, at most this many each."""


def progress_postfix(record: dict, reward: float | None, rl: bool) -> dict[str, str]:
    """The training bar's values after step ``record``: for RL (``rl``) the latest rollout's mean ``reward`` and the
    gradient norm - the clipped policy-gradient loss is 0 at the old policy (one update per rollout batch), though
    its gradient is not, so the loss would say nothing -, else the loss; and the learning rate."""
    values = {}
    if rl:
        if reward is not None:
            values["reward"] = f"{reward:.3f}"
        values["grad_norm"] = f"{record['grad_norm']:.3g}"
    else:
        values["loss"] = f"{record['loss']:.4f}"
    values["lr"] = f"{record['lr']:.2e}"
    return values


def reward_digest(rewards: list[float], without_signal: int = 0) -> dict:
    """The end-of-run summary's keys (added to :meth:`Trainer.train`'s record, not logged) of a run whose rollouts
    had mean rewards ``rewards``: ``reward_first`` / ``reward_last`` (means of the first / last ``reward_window``
    rollouts: at most :data:`REWARD_WINDOW`, half of them), ``rollouts_run`` and ``rollouts_without_signal``
    (rollouts whose every advantage was 0). Empty without rollouts."""
    if not rewards:
        return {}
    window = max(1, min(REWARD_WINDOW, len(rewards) // 2))
    return {"reward_first": sum(rewards[:window]) / window, "reward_last": sum(rewards[-window:]) / window,
            "reward_window": window, "rollouts_run": len(rewards), "rollouts_without_signal": without_signal}


def summary_parts(record: dict, rewarded: dict | None = None) -> list[str]:
    """The training values of the end-of-run line for ``record`` (:meth:`Trainer.train`'s): an RL run's mean reward
    first -> last (:func:`reward_digest`) and its last gradient norm (its loss says little: :func:`progress_postfix`),
    else the loss; ``rewarded`` (``{"step", "reward"}``, the latest step that rolled out) for a record without the
    digest."""
    if "reward_first" in record:
        first, last, window, runs = (record[k] for k in ("reward_first", "reward_last", "reward_window",
                                                          "rollouts_run"))
        if runs == 1:
            parts = [f"reward {last:.4f} (1 rollout)"]
        else:
            which = "first -> last" if window == 1 else f"means of the first / last {window}"
            parts = [f"reward {first:.4f} -> {last:.4f} ({which} of {runs} rollouts)"]
        if "grad_norm" in record:
            parts.append(f"grad_norm {record['grad_norm']:.4g}")
        return parts
    parts = [f"loss {record['loss']:.4f}"] if "loss" in record else []
    if "rollout/reward" in record:
        parts.append(f"reward {record['rollout/reward']:.4f}")
    elif rewarded is not None:
        parts.append(f"reward {rewarded['reward']:.4f} at step {rewarded['step']}")
    return parts


def summary_warnings(record: dict) -> list[str]:
    """The end-of-run warning lines of ``record``: steps that trained nothing, rollouts without a learning signal
    (each said once by a warning when it first happened)."""
    lines = []
    empty = int(record.get("steps_trained_nothing", 0))
    if empty:  # the loss says 0.0000 either way: say why
        lines.append(f"warning: {empty} of the {record.get('steps_run', empty)} steps run trained nothing (no rows "
                     "left to train: the first such step's warning says why)")
    flat = int(record.get("rollouts_without_signal", 0))
    if flat:
        lines.append(f"warning: {flat} of the {record.get('rollouts_run', flat)} rollouts had no learning signal "
                     "(every advantage 0, e.g. all rewards of each group equal: the first one's warning says why)")
    return lines


def run_training(config: TrainConfig, source=None,
                 on_step: Callable[[Trainer, dict], dict | None] | None = None) -> dict:
    """Train with ``config`` (under torchrun: one call per process); returns the last metrics record.
    ``on_step(trainer, record)`` is called after every step (see :meth:`Trainer.train`)."""
    from dare.distributed import shutdown

    trainer = Trainer(config, source=source)
    try:
        return trainer.train(on_step)
    finally:
        shutdown(trainer.info)
