"""The harness of the RL-step benchmarks (``rl_step.py``: d1 on LLaDA, ``bd_rl_step.py``: BGPO on SDAR).

A benchmark module describes its workload; this module runs it the same way for both: one RL step is one rollout
cycle of DARE's real workflow (``dare.trainer.Trainer`` with a ``dare.trainer.rl.RolloutSource`` and the registered
algorithm plug-in; nothing is re-implemented), for each variant (naive / optimised): build model + trainer, a
warm-up step (a one-block rollout, one update; with an engine that records steps, one more warm-up over the timed
blocks per prompt batch), then the timed cycle (timed again when it recorded graphs), phase by phase:

* **rollout**, **reward**, **logprobs**: timed inside ``RolloutSource`` (``rollout/generate_s``, ``reward_s``,
  ``logprob_s``, each after a CUDA synchronisation);
* **update**: the synchronised wall time of the ``Trainer.train_step`` calls minus those.

A workload module defines:

* ``TITLE`` (str), ``VARIANTS`` (name -> ``dict(attn=..., logits_chunk=..., sampler={...})``);
* ``configure(parser)`` (its own options) and ``defaults(args, pick)`` (fills unset options, ``--block``,
  ``--max-blocks``, ``--inner-steps``, ``--micro-batch``, ``--confident-fraction`` included: ``pick(value, full,
  tiny)``);
* ``overrides(args, variant) -> dict`` (``dare train`` overrides besides the shared ones),
  ``build_model(args)``, ``vocab_limit(args)`` (prompt ids stay below it);
* ``rollout_scale(args, variant, measured_blocks, blocks)``: factor from a rollout of ``measured_blocks`` blocks
  to one of ``blocks`` (per-block cost constant: their ratio);
* ``PROJECTIONS`` (result key -> table label) and ``projections(result, args) -> {key: seconds}`` (extra projected
  cycle times, e.g. at the recipe's mu or number of MC terms), and optionally ``verdict(summary) -> str``.

Import from a script in this directory (``benchmarks/`` is put on ``sys.path`` by the scripts).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gc
import json
import random
import signal
import tempfile
import time
import traceback
import types
import warnings
from pathlib import Path

import torch

from common import ConfidenceInjection, clock, threshold_setting

PHASES = ("rollout", "reward", "logprobs", "update")
ENGINES = ("eager", "static", "graph", "auto")


class BudgetExceeded(Exception):
    """The hard time limit fired (SIGALRM)."""


# ----------------------------------------------------------------------------------- workload pieces
class IdTokenizer:
    """Decodes ids as space-separated numbers (random models have no tokenizer; the reward reads the ids)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def parity_reward():
    """Synthetic reward: the fraction of even token ids in the completion (cheap; varies within a group)."""
    from dare.rewards import Reward, RewardResult

    class EvenFraction(Reward):
        name = "even_fraction"

        def score_one(self, completion, sample):
            ids = completion.split()
            frac = sum(int(i) % 2 == 0 for i in ids) / max(len(ids), 1)
            return RewardResult(reward=frac, correct=frac > 0.5)

    return EvenFraction()


PROMPT_BATCHES = 2
"""Distinct prompt batches the steps cycle through (the source does not shuffle)."""
RETIMED_CYCLES = 2
"""Most extra timed cycles after one that recorded graphs."""


def make_prompts(n: int, length: int, spread: int, vocab_limit: int, seed: int = 0):
    """``n`` prompts of ``length +- spread`` random ids below ``vocab_limit`` (no special token)."""
    from dare.trainer.prompts import PromptItem

    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = max(1, length + rng.randint(-spread, spread))
        out.append(PromptItem(tuple(rng.randrange(vocab_limit) for _ in range(size)), {}, i))
    return out


class PhaseMarks:
    """Marker kernels at phase boundaries of a profiled cycle: while ``on``, every synchronised clock read of the
    source (and :meth:`mark`) is counted and, on CUDA, launches ``torch.cuda._sleep(1)`` (kernel
    ``spin_kernel``), so the profiler's kernel list splits into the phases the source times
    (:func:`phase_segments`)."""

    def __init__(self, device: torch.device):
        self.on, self.count, self.cuda = False, 0, device.type == "cuda"

    def mark(self) -> None:
        if self.on:
            self.count += 1
            if self.cuda:
                torch.cuda._sleep(1)


SOURCE_PHASES = ("start", "rollout start", "weight refresh", "rollout", "reward", "logprobs", "update")
"""What runs after each of the source's clock reads in one rollout step (``RolloutSource._collect`` reads the
clock at its start, around the decoding and around the engine's weight refresh inside it, after scoring and after
the log-probs), then the step's update."""


class SyncSites:
    """Where a cycle waits for the GPU. Under :meth:`watching` on CUDA, ``torch.cuda.set_sync_debug_mode("warn")``
    makes every synchronising call (``.item()``, ``.cpu()``, boolean indexing, ``nonzero``...) warn; each such
    warning is counted under the phase index ``phase()`` returns and its call site: the ``depth`` innermost frames
    whose file path contains one of ``roots`` (DARE's and the benchmarks' code). Other warnings pass through."""

    MESSAGE = "synchroniz"  # PyTorch's text: "called a synchronizing CUDA operation"

    def __init__(self, phase, depth: int = 3, roots: tuple[str, ...] = ("/dare/", "/benchmarks/")):
        self.phase, self.depth, self.roots = phase, depth, roots
        self.counts: collections.Counter = collections.Counter()

    def site(self) -> str:
        frames = [f for f in traceback.extract_stack()[:-2] if any(root in f.filename for root in self.roots)]
        return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                           for f in reversed(frames[-self.depth:])) or "(outside DARE)"

    @contextlib.contextmanager
    def watching(self, cuda: bool):
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if self.MESSAGE in str(message):
                self.counts[(self.phase(), self.site())] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        with warnings.catch_warnings():
            warnings.filterwarnings("always", message=f".*{self.MESSAGE}")  # every one, not once per site
            warnings.showwarning = record
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                yield self
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")

    def report(self, labels: list[str], n: int = 12) -> str:
        """Per phase (``labels[index - 1]`` after mark ``index``; ``before the first mark``, ``segment k`` beyond
        the labels): the number of synchronising calls and the ``n`` call sites with the most."""
        phases: dict[int, collections.Counter] = {}
        for (index, site), count in self.counts.items():
            phases.setdefault(index, collections.Counter())[site] += count
        lines = []
        for index in sorted(phases):
            label = ("before the first mark" if index == 0 else
                     labels[index - 1] if index - 1 < len(labels) else f"segment {index - 1}")
            sites = phases[index]
            lines.append(f"{label}: {sum(sites.values())} synchronising calls")
            lines += [f"  {count:6d}  {site}" for site, count in sites.most_common(n)]
        return "\n".join(lines) or "no synchronising calls"


def phase_segments(kernels: list[tuple[str, float, float]], labels: list[str]) -> dict[str, list]:
    """Split a profiled cycle's kernels at the marker kernels; segment ``k`` (after the ``k``-th marker) gets
    ``labels[k]`` (``segment k`` beyond the labels); kernels before the first marker are dropped."""
    out: dict[str, list] = {}
    index = -1
    for item in kernels:
        if "spin_kernel" in item[0]:
            index += 1
            continue
        if index >= 0:
            label = labels[index] if index < len(labels) else f"segment {index}"
            out.setdefault(label, []).append(item)
    return out


def busy_seconds(kernels: list[tuple[str, float, float]]) -> float:
    """Seconds in which at least one of ``kernels`` (``(name, start_us, end_us)``, by start) runs: the union of
    their intervals."""
    busy, end = 0.0, float("-inf")
    for _, start, stop in kernels:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / 1e6


def idle_against_timed(kernel_s: dict[str, float], phases: dict[str, float], updates: list[float]) -> str:
    """Each profiled phase's kernel time (``kernel_s``, :func:`busy_seconds`) against the same phase of the timed
    cycle (``phases``; the updates one by one, ``update``, ``update 2``, ...): the rest of a timed phase is time the
    GPU idled, without the host overhead the profiler adds to its own cycle. (The profiled cycle decodes another
    prompt batch, so a rollout's forwards may differ by a few.)"""
    timed = {**{key: phases[key] for key in ("rollout", "reward", "logprobs") if key in phases},
             **{("update" if k == 0 else f"update {k + 1}"): seconds for k, seconds in enumerate(updates)}}
    lines = []
    for label, seconds in timed.items():
        if label in kernel_s and seconds > 0:
            busy = kernel_s[label]
            lines.append(f"{label}: kernels {busy:.3f} s of the timed {seconds:.3f} s "
                         f"({100 * max(0.0, 1 - busy / seconds):.0f} % idle)")
    return "\n".join(lines)


def top_kernels(kernels: list[tuple[str, float, float]], n: int = 8) -> str:
    """The ``n`` kernels with the most total time: ms, share, calls, median and longest call (us), name. A median
    far below the mean (ms / calls) shows a kernel whose time sits in a few long calls (e.g. the full-canvas
    forwards among a rollout's window steps)."""
    total: dict[str, list[float]] = {}
    for name, start, stop in kernels:
        total.setdefault(name, []).append(stop - start)
    span = sum(stop - start for _, start, stop in kernels) or 1.0
    rows = sorted(total.items(), key=lambda item: sum(item[1]), reverse=True)[:n]
    return "\n".join(f"    {sum(t) / 1000:9.2f} ms {100 * sum(t) / span:5.1f} % {len(t):7d} x  median "
                     f"{sorted(t)[len(t) // 2]:8.1f} us, max {max(t):8.1f} us  {name[:100]}" for name, t in rows)


def source_factory(prompts, injection: ConfidenceInjection, marks: PhaseMarks | None = None):
    """``Trainer(source=...)`` callable: DARE's RolloutSource, with the confidence injection active only while
    rollouts are generated (and marker kernels at its clock reads while ``marks.on``)."""
    from dare.trainer.rl import RolloutSource

    class InjectingSource(RolloutSource):
        def _generate(self, *args, **kwargs):
            with injection.enabled():
                return super()._generate(*args, **kwargs)

        def _clock(self) -> float:
            now = super()._clock()
            if marks is not None:
                marks.mark()
            return now

    def build(trainer):
        cfg = trainer.config
        return InjectingSource(
            prompts, policy=trainer.model, algorithm=trainer.algorithm, tokenizer=IdTokenizer(),
            reward=parity_reward(), config=cfg.rollout, batch_size=cfg.trainer.batch_size,
            micro_batch_size=cfg.trainer.micro_batch_size, info=trainer.info, seed=cfg.trainer.seed, shuffle=False,
            reference=trainer.reference, output_dir=None)

    return build


def engine_overrides(engine: str | None) -> dict:
    """``rollout.sampler.engine=<engine>`` when ``SamplerConfig`` has an ``engine`` field (else nothing: this
    DARE has one decode path)."""
    from dare.rollout import SamplerConfig

    if engine is None or "engine" not in {f.name for f in dataclasses.fields(SamplerConfig)}:
        return {}
    return {"rollout.sampler.engine": engine}


def train_overrides(bench, args, variant: dict, out_dir: str) -> list[str]:
    """The ``dare train`` overrides of one variant: the workload's plus the shared ones (the model is injected)."""
    sampler = {"gen_length": args.gen, "block_length": args.block, "temperature": args.temperature,
               "attn_backend": "sdpa", **threshold_setting(variant["sampler"]["decoder"], args.threshold),
               **variant["sampler"]}
    if args.max_blocks:
        sampler["max_blocks"] = args.max_blocks
    values = {
        "model.dtype": "float32" if args.tiny else "bfloat16",
        "model.attn_backend": variant["attn"], "model.logits_chunk_size": variant["logits_chunk"],
        "model.gradient_checkpointing": args.grad_ckpt,
        "model.compile": args.compile_blocks and variant is bench.VARIANTS.get("optimised"),
        "lora.enabled": not args.no_lora, "lora.r": args.lora_r, "lora.alpha": args.lora_alpha,
        "lora.dropout": args.lora_dropout,
        "rollout.group_size": args.group, "rollout.samples_file": False,
        "algorithm.inner_steps": args.inner_steps,
        "trainer.output_dir": out_dir, "trainer.batch_size": args.prompts * args.group,
        "trainer.micro_batch_size": args.micro_batch, "trainer.max_steps": 2 * args.inner_steps,
        "trainer.progress": False, "trainer.export": False, "distributed.device": args.device.type,
        **bench.overrides(args, variant),
    }
    values.update({f"rollout.sampler.{k}": v for k, v in sampler.items()})
    values.update(engine_overrides(args.engine))
    if args.weights != "model" and variant is bench.VARIANTS.get("optimised"):
        values["rollout.sampler.weights"] = args.weights
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


# ----------------------------------------------------------------------------------- one variant
def timed_step(trainer, step: int, device) -> tuple[dict, float]:
    start = clock(device)
    record = trainer.train_step(step)
    return record, clock(device) - start


def release(device: torch.device) -> None:
    """Return the finished variant's memory (call once its frames and tracebacks are gone)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_variant(bench, name: str, args, prompts, log) -> dict:
    """Build the model and trainer of variant ``name``, run the warm-up step, then time one rollout cycle."""
    from dare.trainer import Trainer, load_train_config

    device = args.device
    variant = bench.VARIANTS[name]
    began = time.perf_counter()
    model = bench.build_model(args)
    injection = ConfidenceInjection(model, args.confident_fraction, device, active=False)
    marks = PhaseMarks(device)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            config = load_train_config(None, train_overrides(bench, args, variant, out_dir))
            trainer = Trainer(config, model=model, source=source_factory(prompts, injection, marks))
            source, mu = trainer.source, args.inner_steps
            setup_s = time.perf_counter() - began
            trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
            log(f"  [{name}] model + trainer built in {setup_s:.1f}s ({trainable / 1e6:.2f}M trainable parameters)")

            # warm-up: a one-block rollout and one update (it pays compilation); an engine that records steps
            # per shape (graphs, static compiled blocks: one per KV-width bucket, so per prompt length too) then
            # warms up over the measured blocks once per prompt batch (PROMPT_BATCHES: the timed cycle reuses
            # one), so the timed cycle records nothing (``graph_captures`` in the result says whether it did);
            # the last warm-up estimates the cycle
            measured = source.sampler
            blocks = -(-args.gen // args.block)
            timed_blocks = min(blocks, args.max_blocks or blocks)
            warm_blocks = [1]
            if getattr(measured, "engine", "eager") != "eager" and timed_blocks > 1:
                warm_blocks += [timed_blocks] * PROMPT_BATCHES
            for warmups, n in enumerate(warm_blocks, start=1):
                # a full-length warm-up runs the measured sampler itself: a row whose prompt ends inside a block
                # decodes one block more than gen / block, and a cap would leave that block's steps unrecorded
                full = n == timed_blocks and not args.max_blocks
                source.sampler = measured if full else measured.replace(max_blocks=n)
                warm, warm_s = timed_step(trainer, (warmups - 1) * mu, device)  # a rollout step
                log(f"  [{name}] warm-up step {warm_s:.1f}s ({n}-block rollout {warm['rollout/generate_s']:.1f}s, "
                    f"{warm.get('rollout/graph_captures') or 0:.0f} graphs recorded)")
                estimate = (warm["rollout/generate_s"] * bench.rollout_scale(args, variant, n, timed_blocks)
                            + (warm_s - warm["rollout/generate_s"]) * mu)
                left = args.deadline - time.perf_counter()
                if warmups == len(warm_blocks) and estimate > left:
                    return {"skipped": f"estimated {estimate:.0f}s > {left:.0f}s left of the time budget"}
            source.sampler = measured

            # the timed cycle; one that recorded graphs (a shape no warm-up reached) is timed again on the next
            # prompt batch while the budget allows, up to RETIMED_CYCLES more times
            discarded, step = [], len(warm_blocks) * mu
            while True:
                records, walls = [], []
                for k in range(mu):
                    record, wall = timed_step(trainer, step, device)
                    step += 1
                    records.append(record)
                    walls.append(wall)
                first = records[0]
                captures = first.get("rollout/graph_captures") or 0
                out_of_time = sum(walls) > args.deadline - time.perf_counter()
                if not captures or len(discarded) == RETIMED_CYCLES or out_of_time:
                    break
                discarded.append({"cycle_s": sum(walls), "rollout_s": first["rollout/generate_s"],
                                  "graph_captures": captures})
                log(f"  [{name}] timed cycle {sum(walls):.2f}s recorded {captures:.0f} graphs: timed again")
            phases = {"rollout": first["rollout/generate_s"], "reward": first["rollout/reward_s"],
                      "logprobs": first["rollout/logprob_s"]}
            updates = [walls[0] - first["rollout/time_s"], *walls[1:]]
            phases["update"] = sum(updates)
            micro = source.batch(mu)  # the cached micro-batches of the measured cycle
            rows = sum(mb.batch_size[0] for mb in micro)
            slots = sum(mb["input_ids"].numel() for mb in micro)
            real = int(sum(mb["attention_mask"].sum() for mb in micro))
            decoded = first["rollout/decoded"] * rows
            cycle = sum(walls)
            result = {
                "phases_s": phases, "updates_s": updates, "cycle_s": cycle, "setup_s": setup_s, "warmup_s": warm_s,
                "warmup_blocks": warm_blocks,
                "rows": rows, "nfe": first["rollout/nfe"], "decoded_tokens": decoded,
                "tokens_per_forward": decoded / rows / max(first["rollout/nfe"], 1),
                "rollout_tokens_per_s": decoded / phases["rollout"], "step_tokens_per_s": decoded / cycle,
                "train_tokens_per_s": real * mu / phases["update"], "train_tokens": real, "train_slots": slots,
                "padding_fraction": 1 - real / slots, "blocks_timed": timed_blocks, "blocks": blocks,
                "reward": first["rollout/reward"], "loss": [r["loss"] for r in records],
                "kl": [r.get("policy/kl") for r in records], "grad_norm": [r["grad_norm"] for r in records],
                "row_tokens_per_step": first["rollout/tokens_per_forward"],
                "commit_confidence": first.get("rollout/commit_confidence"),
                "eos_fraction": first["rollout/eos_fraction"],
                "graph_captures": first.get("rollout/graph_captures"), "discarded_cycles": discarded,
                "config": train_overrides(bench, args, variant, "OUT"),
            }
            result["projected_rollout_s"] = phases["rollout"] * bench.rollout_scale(args, variant, timed_blocks,
                                                                                    blocks)
            result["projected_full_cycle_s"] = cycle - phases["rollout"] + result["projected_rollout_s"]
            result.update(bench.projections(result, args))
            if device.type == "cuda":
                result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if args.profile or args.syncs:  # an extra: its cycle may neither overrun the budget nor lose the result
                if cycle > args.deadline - time.perf_counter():
                    result["profile"] = {"skipped": "the time budget left is shorter than a cycle"}
                    log(f"  [{name}] --profile / --syncs skipped: the time budget left is shorter than a cycle")
                else:
                    try:
                        result["profile"] = profile_cycle(trainer, step, mu, marks, device, log, name,
                                                          profile=args.profile, syncs=args.syncs)
                        if "kernel_s" in result["profile"]:
                            idle = idle_against_timed(result["profile"]["kernel_s"], phases, updates)
                            log(f"  [{name}] profiled kernel time against the timed cycle:\n{idle}")
                    except Exception as err:
                        result["profile"] = {"error": f"{type(err).__name__}: {err}"}
                        log(f"  [{name}] --profile / --syncs failed: {type(err).__name__}: {str(err)[:300]}")
            return result
    finally:
        injection.remove()


def profile_cycle(trainer, step: int, mu: int, marks: PhaseMarks, device, log, name: str, *,
                  profile: bool = True, syncs: bool = False) -> dict:
    """One more rollout cycle with phase marks, under the profiler on CUDA (after the timed cycle, so its numbers
    are not the table's): kernel time by kind per phase and each phase's top kernels, logged and returned as text
    with the number of marks (``len(SOURCE_PHASES) + mu`` when the labels fit the source's clock reads).
    ``profile=False``: no profiler; ``syncs``: the synchronising calls per phase and call site
    (:class:`SyncSites`, CUDA only), under ``"syncs"``."""
    labels = [*SOURCE_PHASES, *(f"update {k + 2}" for k in range(mu - 1))]
    marks.count = 0
    cuda = device.type == "cuda"
    profiler = (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if cuda and profile
                else contextlib.nullcontext())
    sites = SyncSites(lambda: marks.count)
    with profiler as prof, (sites.watching(cuda) if syncs else contextlib.nullcontext()):
        marks.on = True
        try:
            for k in range(mu):
                timed_step(trainer, step + k, device)
                marks.mark()
        finally:
            marks.on = False
    out: dict = {"marks": marks.count}
    if marks.count != len(labels) + 1:
        log(f"  [{name}] --profile: {marks.count} phase marks, expected {len(labels) + 1}: segments are numbered")
        labels = []
    if syncs:
        if cuda:
            out["syncs"] = sites.report(labels)
            log(f"  [{name}] synchronising calls of the cycle:\n{out['syncs']}")
        else:
            log(f"  [{name}] --syncs: no CUDA device, nothing synchronises")
    if prof is None:
        if profile:
            log(f"  [{name}] --profile: no CUDA device, no kernels profiled")
        return out
    from engine_profile import kernel_intervals, timeline_report

    for label, kernels in phase_segments(kernel_intervals(prof), labels).items():
        out.setdefault("kernel_s", {})[label] = busy_seconds(kernels)
        text = (f"{label}:\n{timeline_report(kernels, 1, unit='phase')}\n  top kernels (ms, share of kernel time, "
                f"calls, median and longest call):\n"
                f"{top_kernels(kernels)}")
        log(f"  [{name}] profiled {text}")
        out[label] = text
    return out


# ----------------------------------------------------------------------------------- driver
def parse_args(bench, argv=None) -> argparse.Namespace:
    """The shared options, then the workload's (``bench.configure``) and its defaults (``bench.defaults``)."""
    p = argparse.ArgumentParser(description=bench.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke test)")
    p.add_argument("--device", help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--variants", nargs="+", default=["optimised", "naive"], choices=list(bench.VARIANTS),
                   help="run order (default: optimised first, the naive one uses the rest of the budget)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="rollout.sampler.engine of both variants (eager|static|graph|auto; applied only if this DARE's "
                        "SamplerConfig has an engine field)")
    p.add_argument("--weights", choices=["model", "merged", "fp8"], default="model",
                   help="rollout.sampler.weights of the optimised variant (merged: LoRA adapters merged into copies "
                        "in the model's dtype; fp8: FP8 copies; both need the static or graph engine)")
    p.add_argument("--prompts", type=int, help="prompts per step (default 4; tiny 2)")
    p.add_argument("--group", type=int, help="samples per prompt G (default 8; tiny 4)")
    p.add_argument("--prompt-length", type=int, help="mean prompt tokens (default 128; tiny 12)")
    p.add_argument("--prompt-spread", type=int, help="prompt lengths are mean +- spread, uniform (default 32; tiny 4)")
    p.add_argument("--gen", type=int, help="generation length (default 256; tiny 16)")
    p.add_argument("--max-blocks", type=int, help="decode only the first N blocks in both variants (tiny: all)")
    p.add_argument("--threshold", type=float, default=0.9, help="confidence threshold of the optimised sampler")
    p.add_argument("--confident-fraction", type=float,
                   help="fraction of positions made confident in every rollout forward (0 = raw random weights; "
                        "default: the workload's)")
    p.add_argument("--inner-steps", type=int, help="mu: optimizer steps per rollout")
    p.add_argument("--micro-batch", type=int, help="rows per forward/backward")
    p.add_argument("--no-lora", action="store_true", help="train every weight (frozen reference copy if needed)")
    p.add_argument("--lora-r", type=int, help="LoRA rank (default 128; tiny 8)")
    p.add_argument("--lora-alpha", type=int, help="LoRA alpha (default 64; tiny 16)")
    p.add_argument("--lora-dropout", type=float, default=0.05, help="LoRA dropout (0.05)")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing in the update")
    p.add_argument("--compile-blocks", action="store_true",
                   help="model.compile=true in the optimised variant (regional torch.compile of every block: rollout, "
                        "log-prob and update passes; the warm-up step pays the compilation, which also inflates "
                        "the budget estimate: raise --budget-s)")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="skip a variant whose measured cycle would end past this many seconds (from the start)")
    p.add_argument("--hard-limit-s", type=int, default=285, help="abort whatever runs after this many seconds")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--profile", action="store_true",
                   help="after the timed cycle, profile one more (CUDA): kernel time by kind and top kernels per "
                        "phase (rollout, reward, log-probs, each update)")
    p.add_argument("--syncs", action="store_true",
                   help="after the timed cycle, run one more (with --profile: the profiled one) counting the "
                        "synchronising CUDA calls (torch.cuda.set_sync_debug_mode) per phase and call site")
    bench.configure(p)
    args = p.parse_args(argv)
    tiny = args.tiny
    pick = lambda value, default, small: value if value is not None else (small if tiny else default)  # noqa: E731
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu"))
    args.prompts = pick(args.prompts, 4, 2)
    args.group = pick(args.group, 8, 4)
    args.prompt_length = pick(args.prompt_length, 128, 12)
    args.prompt_spread = pick(args.prompt_spread, 32, 4)
    args.gen = pick(args.gen, 256, 16)
    args.lora_r = pick(args.lora_r, 128, 8)
    args.lora_alpha = pick(args.lora_alpha, 64, 16)
    bench.defaults(args, pick)
    if args.gen % args.block:
        p.error(f"--block {args.block} must divide --gen {args.gen}")
    return args


def main(workload, argv=None) -> int:
    """Run the benchmark of ``workload``: a workload module, or its ``globals()`` (a script loaded without a
    ``sys.modules`` entry)."""
    bench = types.SimpleNamespace(**workload) if isinstance(workload, dict) else workload
    args = parse_args(bench, argv)
    start = time.perf_counter()
    args.deadline = start + args.budget_s

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {message}", flush=True)

    def on_alarm(signum, frame):
        raise BudgetExceeded(f"hard limit of {args.hard_limit_s}s reached")

    if args.device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: extra OpenMP threads only add contention
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.hard_limit_s)
    results: dict = {}
    try:
        import dare  # noqa: F401

        name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
        log(f"device {args.device} ({name}), torch {torch.__version__}; {bench.TITLE}: {args.prompts} prompts x "
            f"{args.group} samples, prompt {args.prompt_length}+-{args.prompt_spread}, gen {args.gen} (first "
            f"{args.max_blocks or 'all'} blocks of {args.block} timed), mu {args.inner_steps}, micro-batch "
            f"{args.micro_batch}, {'full fine-tuning' if args.no_lora else f'LoRA r {args.lora_r}'}")
        engine = engine_overrides(args.engine)
        log(f"rollout engine: {args.engine}; optimised variant's rollout weights: {args.weights}" if engine else
            f"rollout engine: --engine {args.engine} not applied (SamplerConfig has no engine field)")
        prompts = make_prompts(PROMPT_BATCHES * args.prompts, args.prompt_length, args.prompt_spread,
                               bench.vocab_limit(args))
        release(args.device)
        for name in args.variants:
            if time.perf_counter() > args.deadline:
                results[name] = {"skipped": "time budget spent"}
                log(f"skip {name}: time budget spent")
                continue
            log(f"run {name}")
            try:
                results[name] = run_variant(bench, name, args, prompts, log)
            except (Exception, BudgetExceeded) as err:  # a failing variant is reported, not fatal
                results[name] = {"error": f"{type(err).__name__}: {err}",
                                 "traceback": traceback.format_exc(limit=6)[-3000:]}
                log(f"FAILED {name}: {type(err).__name__}: {str(err)[:300]}")
                if isinstance(err, BudgetExceeded):
                    break
            else:
                report_variant(name, results[name], log)
            release(args.device)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    summary = summarise(bench, results)
    print_table(bench, results, summary, args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"benchmark": bench.TITLE,
             "args": {k: str(v) if isinstance(v, torch.device) else v for k, v in vars(args).items()},
             "device": str(args.device), "torch": torch.__version__, "results": results, "summary": summary},
            indent=2) + "\n")
    log("done")
    return 0


def report_variant(name: str, r: dict, log) -> None:
    if "skipped" in r:
        log(f"skip {name}: {r['skipped']}")
        return
    ph = r["phases_s"]
    log(f"  [{name}] cycle {r['cycle_s']:.2f}s = rollout {ph['rollout']:.2f} + reward {ph['reward']:.2f} + "
        f"log-probs {ph['logprobs']:.2f} + update {ph['update']:.2f}; nfe {r['nfe']:.0f}, "
        f"TPF {r['tokens_per_forward']:.2f}, rollout {r['rollout_tokens_per_s']:.1f} tok/s"
        + (f", peak {r['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in r else ""))
    if r.get("graph_captures"):
        log(f"  [{name}] note: the timed rollout recorded {r['graph_captures']:.0f} graphs (shapes the warm-ups did "
            f"not reach); its time includes their recording and compilation")


def projection_rows(bench) -> list[tuple[str, str]]:
    """``(label, result key)`` of the projected cycle times: full-length rollout, then the workload's."""
    return [("RL step, full-length rollout (projected)", "projected_full_cycle_s"),
            *((label, key) for key, label in bench.PROJECTIONS.items())]


def summarise(bench, results: dict) -> dict:
    naive, fast = results.get("naive", {}), results.get("optimised", {})
    if "cycle_s" not in naive or "cycle_s" not in fast:
        return {}
    out = {f"{p}_x": naive["phases_s"][p] / max(fast["phases_s"][p], 1e-9) for p in PHASES}
    out["cycle_x"] = naive["cycle_s"] / fast["cycle_s"]
    out["projected_rollout_x"] = naive["projected_rollout_s"] / fast["projected_rollout_s"]
    for _, key in projection_rows(bench):
        out[key.removesuffix("_s") + "_x"] = naive[key] / fast[key]
    return out


def print_table(bench, results: dict, summary: dict, args) -> None:
    done = [n for n in args.variants if "cycle_s" in results.get(n, {})]
    print(f"\n{bench.TITLE}: {args.prompts}x{args.group} rollouts, gen {args.gen} (first {args.max_blocks or 'all'} "
          f"blocks timed), mu {args.inner_steps}; seconds (x naive / optimised)")
    print("| phase | " + " | ".join(done) + " | speed-up |")
    print("|---|" + "---|" * (len(done) + 1))
    for phase in PHASES:
        cells = [f"{results[n]['phases_s'][phase]:.2f}" for n in done]
        ratio = f"{summary[phase + '_x']:.2f}x" if summary else ""
        print(f"| {phase} | " + " | ".join(cells) + f" | {ratio} |")
    rows = [("RL step (measured)", "cycle_s"), ("rollout, full length (projected)", "projected_rollout_s"),
            *projection_rows(bench)]
    for label, key in rows:
        cells = [f"{results[n][key]:.2f}" for n in done]
        ratio = f"{summary[key.removesuffix('_s') + '_x']:.2f}x" if summary else ""
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    for label, key, fmt in (("rollout tok/s", "rollout_tokens_per_s", "{:.1f}"),
                            ("RL-step tok/s (generated)", "step_tokens_per_s", "{:.1f}"),
                            ("train tok/s", "train_tokens_per_s", "{:.0f}"),
                            ("tokens per forward (decoded / rows / nfe)", "tokens_per_forward", "{:.2f}"),
                            ("tokens per row step (rollout/tokens_per_forward)", "row_tokens_per_step", "{:.2f}"),
                            ("padding fraction", "padding_fraction", "{:.2f}"),
                            ("peak memory GiB", "peak_memory_gib", "{:.1f}")):
        if all(key in results[n] for n in done):
            print(f"| {label} | " + " | ".join(fmt.format(results[n][key]) for n in done) + " | |")
    for name in args.variants:
        r = results.get(name, {})
        if "cycle_s" not in r:
            print(f"{name}: {r.get('skipped') or r.get('error') or 'not run'}")
    if summary:
        line = (f"end to end: {summary['cycle_x']:.2f}x measured, {summary['projected_full_cycle_x']:.2f}x with the "
                f"full-length rollout projected")
        verdict = getattr(bench, "verdict", None)
        print(line + (f" ({verdict(summary)})" if verdict else ""))
