"""Online RL batches: :class:`RolloutSource` runs rollout -> reward -> advantage -> stored views -> old /
reference estimates and hands the trainer ready micro-batches (``prepares_views = True``).

Step ``s`` belongs to rollout ``r = s // mu`` (``mu = algorithm.inner_steps``): at ``s0 = r * mu`` the source
draws the rollout's prompts (a per-epoch seeded permutation, like :class:`~dare.trainer.sources.DatasetSource`),
splits them over ranks (whole groups per rank), generates ``G`` completions per prompt with the **current**
policy (eval mode, FSDP parameters gathered once, the trainer's autocast, sampler seed ``derive_seed(base, r)``
with ``base`` = :func:`rollout_base_seed` of ``trainer.seed`` and ``rollout.sampler.seed``, row seeds = the
rollout's global index), scores them, computes advantages with the algorithm's hook, then for
each inner step ``k < mu`` builds the algorithm's views for step ``s0 + k`` and the old / reference estimates on
them (policy eval mode and reference context entered once for all micro-batches). The batch is cached until step
``s0 + mu - 1``; checkpoints inside a cycle store the cache per rank, so resume is exact. Everything else is a pure
function of the step.

Phase timings (device-synchronised) go to the step's metrics: ``rollout/generate_s`` (decoding),
``rollout/reward_s`` (assembling, decoding text, reward, advantages), ``rollout/logprob_s`` (views and old /
reference forwards) and ``rollout/time_s`` (all three); ``rollout/decoded`` is the mean number of decoded positions
per rollout.

Rollout health (threshold decoders tend to turn overconfident during online RL and commit tokens too early):

* ``rollout/tokens_per_forward``: decoded completion positions per row-forward, ``sum(decoded) / sum(num_steps)``
  over all rows. A row's forwards are the batch forwards in which it took a denoising step (LLaDA2.1 edit-only
  forwards included), so rows that left the batch at EOS or finished a block early do not dilute it; it equals
  ``decoded / nfe`` only when every row steps in every forward of its batch (one chunk, fixed quota, no early
  stop); 1 for one-token-per-step decoding;
* ``rollout/commit_confidence``: mean decoder confidence of the committed completion tokens (``confidence_map``
  inside the completion mask): the token's probability for ``confidence=prob``, the decoder's score (not a
  probability) for ``margin`` / ``neg_entropy`` / ``random``; absent when the sampler does not return it;
* ``rollout/eos_fraction``: fraction of rows whose decoded completion contains a stop token (EOS/EOT).

Rollout engine (:mod:`dare.rollout.engine`; CUDA graphs by default on CUDA): ``rollout/weight_refresh_s`` (making
the recorded graphs read the weights of the last optimizer step: they are updated in place, so this is an address
check; a moved parameter drops the graphs; for an FSDP policy the copy of the gathered weights into the engine's
unsharded copy), ``rollout/graph_captures`` and ``rollout/graph_capture_s`` (graphs
recorded in this rollout: the first rollouts of each new batch/prompt-width shape), ``rollout/engine_fallbacks``
(generation calls of this rollout that fell back to the eager loop, each 2-15x slower; the log names the reason).

Learning signal (every group-based algorithm): ``rollout/flat_groups`` is the fraction of groups whose rewards are
all equal (the rewards the advantages are computed from: after an algorithm's own rule such as TraceRL's
``truncated_reward``, whose mean is then ``rollout/trained_reward``), ``rollout/informative_groups`` the fraction
with a non-zero advantage. A rollout without any informative group teaches nothing: the first one is a warning
saying why (equal rewards, the algorithm's notes: truncation, a group filter), later ones are counted in the
end-of-run summary; the first rollout where an algorithm's rule flattened groups that the reward alone did not is
a warning too.

With ``rollout.dynamic_sampling`` the step's groups whose rewards are all equal are replaced by groups of extra
rounds of prompts (:mod:`dare.trainer.dynamic_sampling`; ``rollout/dynamic/*`` metrics); the health metrics then
describe the step's own prompts (round 0), ``nfe`` and ``generate_s`` every round, the other metrics the admitted
batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from dare.algorithms.rl import RolloutContext
from dare.trainer.prompts import PromptItem
from dare.distributed import DistInfo, all_reduce_dict, all_reduce_max_int, gathered_parameters
from dare.errors import ConfigError
from dare.models.loading import evaluating
from dare.rewards import score_checked
from dare.rollout import derive_seed, left_pad
from dare.rollout.output import completion_mask as stop_mask
from dare.trainer.workflow import Reference, prepare_micro_batches

TRAJECTORY_FIELDS = ("states", "predictions", "confidences", "transfers", "candidates")

log = logging.getLogger("dare.trainer")


class RolloutSource:
    """The RL :class:`~dare.trainer.sources.BatchSource` (see the module docstring).

    Args:
        prompts: tokenized prompts with their reward samples.
        policy: the trained model (possibly peft-wrapped / FSDP-sharded).
        algorithm: the RL plug-in (``needs``, ``inner_steps``, ``assign_advantages``, ``corrupt``, ``estimate``).
        tokenizer: decodes completions for the reward.
        reward: a :class:`dare.rewards.Reward`.
        config: the ``rollout`` section (:class:`~dare.trainer.config.RolloutConfig`).
        batch_size: rollouts per optimizer step over all ranks (``prompts per step x group_size``).
        micro_batch_size: rollout rows per forward/backward.
        reference: the reference policy (:class:`~dare.trainer.workflow.Reference`) when the algorithm needs one.
        output_dir: where ``rollouts.jsonl`` samples go (None = not written).
    """

    prepares_views = True
    precision = staticmethod(contextlib.nullcontext)
    """Context of old / reference forwards (the trainer sets its autocast)."""

    def __init__(self, prompts: list[PromptItem], *, policy, algorithm, tokenizer, reward, config, batch_size: int,
                 micro_batch_size: int, info: DistInfo | None = None, seed: int = 0, shuffle: bool = True,
                 reference: Reference | None = None, output_dir: str | Path | None = None, progress: bool = False):
        from dare.models.spec import family_of

        self.info = info or DistInfo()
        group = config.group_size
        check_rollout_batch(batch_size, group)
        self.prompts_per_step = batch_size // group
        if self.prompts_per_step % self.info.world_size:
            raise ConfigError(f"prompts per step ({self.prompts_per_step} = trainer.batch_size / rollout.group_size) "
                              f"must be divisible by the number of processes ({self.info.world_size})")
        if self.prompts_per_step > len(prompts):
            raise ConfigError(f"{self.prompts_per_step} prompts per step but the dataset has only {len(prompts)}")
        config.check_counts()
        if getattr(algorithm.config, "advantage", None) == "loo" and group < 2:
            raise ConfigError("leave-one-out advantages need rollout.group_size >= 2")
        self.prompts, self.policy, self.algorithm = prompts, policy, algorithm
        self.tokenizer, self.reward, self.config = tokenizer, reward, config
        self.group_size, self.batch_size, self.micro_batch_size = group, batch_size, micro_batch_size
        self.seed, self.shuffle, self.reference, self.progress = seed, shuffle, reference, progress
        self.rollout_seed = rollout_base_seed(seed, config.sampler.seed)
        self.mu = algorithm.inner_steps
        self.rollouts_per_epoch = len(prompts) // self.prompts_per_step
        self.steps_per_epoch = self.rollouts_per_epoch * self.mu
        self.token_ids = family_of(policy).token_ids(policy.config)
        from dare.models.loading import unwrap

        family = family_of(policy).name
        if hasattr(algorithm, "ensure_bound"):  # a family the algorithm cannot train: said before any sampler error
            algorithm.ensure_bound(unwrap(policy))
        resolved = rollout_sampler(config, family)  # validate now (one-line errors before any work)
        if hasattr(algorithm, "check_rollout"):  # binds the model (may refine needs) and checks the block grid
            algorithm.check_rollout(unwrap(policy), resolved)
        self.sampler = config.sampler.for_family(family).replace(
            record_trajectory=algorithm.needs.trajectory or config.sampler.record_trajectory)
        self.samples_path = Path(output_dir) / "rollouts.jsonl" if output_dir is not None and self.info.is_main else None
        self.step_metrics: dict[str, float] = {}
        self._cache: tuple[int, list[list[TensorDict]]] | None = None
        self._last_step = -1
        self._order_cache: tuple[int, list[int]] | None = None
        self._dynamic_metrics: dict[str, float] = {}
        self._generate_s = 0.0
        self._restored = False  # load_state_dict ran (a resumed run)
        self._warned: set[str] = set()  # the learning-signal warnings said once
        check_samples = getattr(algorithm, "check_samples", None)  # e.g. IGPO: do the records hold hints?
        message = check_samples([item.sample for item in prompts]) if check_samples is not None else None
        if message and self.info.is_main:
            log.warning(message)

    # ---- prompt order (pure function of the rollout index) -------------------------------------------
    def _order(self, epoch: int) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != epoch:
            n = len(self.prompts)
            if self.shuffle:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)).tolist()
            else:
                order = list(range(n))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def prompt_indices(self, rollout: int) -> list[int]:
        """Dataset indices of the ``prompts_per_step`` prompts of rollout ``rollout`` (all ranks)."""
        epoch, position = divmod(rollout, self.rollouts_per_epoch)
        return self._order(epoch)[position * self.prompts_per_step:(position + 1) * self.prompts_per_step]

    # ---- the BatchSource protocol --------------------------------------------------------------------
    def batch(self, step: int) -> list[TensorDict]:
        start = step - step % self.mu
        self.step_metrics = {}
        if self._cache is None or self._cache[0] != start:
            if step != start and self.info.is_main:
                log.warning(self._missing_cycle_message(step, start))
            self._cache = (start, self._collect(start))
        self._last_step = step
        return [mb.clone() for mb in self._cache[1][step - start]]

    def _missing_cycle_message(self, step: int, start: int) -> str:
        """The warning of step ``step`` (0-based) inside a rollout cycle whose rollouts (made at ``start``) are not
        cached: a first call with a 1-based step (``Trainer.train_step(1)``), or a resume that lost the cache."""
        where = (f"step index {step} (0-based, logged as step {step + 1}) is update {step - start + 1} of "
                 f"algorithm.inner_steps={self.mu} on the rollouts made at step index {start}, which")
        if self._last_step < 0 and not self._restored:  # nothing ran before: most likely a 1-based step index
            return (f"warning: {where} were never made: rolling them out now with the current policy. "
                    "Trainer.train_step(step) takes the 0-based index of the step to run: the first step is "
                    "train_step(0), the next one train_step(trainer.step)")
        return (f"warning: {where} are not cached (resumed with another world size or "
                "distributed.sequence_parallel?): rolling them out again with the current policy")

    def state_dict(self) -> dict:
        if self._cache is None or (self._last_step + 1) % self.mu == 0:
            return {}  # the next step starts a new rollout: nothing to keep
        start, cached = self._cache
        return {"start": start, "micro": [[mb.to_dict() for mb in row] for row in cached],
                "sizes": [[mb.batch_size[0] for mb in row] for row in cached]}

    def load_state_dict(self, state: dict) -> None:
        self._restored = True
        if state.get("micro") is None:
            return
        micro = [[TensorDict(d, batch_size=[n]) for d, n in zip(row, sizes)]
                 for row, sizes in zip(state["micro"], state["sizes"])]
        self._cache = (int(state["start"]), micro)

    # ---- one rollout -----------------------------------------------------------------------------------
    def _rows(self, start: int) -> tuple[list[PromptItem], list[int]]:
        """This rank's prompts (each repeated G times) and the rows' global indices in the step."""
        indices = self.prompt_indices(start // self.mu)
        share = self.prompts_per_step // self.info.world_size
        first = self.info.rank * share
        items, rows = [], []
        for p, index in enumerate(indices[first:first + share]):
            for g in range(self.group_size):
                items.append(self.prompts[index])
                rows.append((first + p) * self.group_size + g)
        return items, rows

    def _generate(self, items: list[PromptItem], rows: list[int], rollout: int):
        ids, attn = left_pad([item.ids for item in items], self.token_ids.pad)
        device = next(self.policy.parameters()).device
        sampler = self.sampler.replace(seed=derive_seed(self.rollout_seed, rollout))
        chunk = self.config.chunk_size or len(items)
        outputs = []
        with torch.no_grad(), evaluating(self.policy), gathered_parameters(self.policy), self.precision():
            self._engine_metrics(before=True)
            for lo in range(0, len(items), chunk):
                outputs.append(self.algorithm.generate(
                    self.policy, ids[lo:lo + chunk].to(device), attn[lo:lo + chunk].to(device), sampler,
                    example_ids=rows[lo:lo + chunk], group_size=self.group_size, progress=self.progress))
            self._engine_metrics(before=False)
        return outputs

    def _engine_metrics(self, before: bool) -> None:
        """Rollout-engine costs of this rollout: ``rollout/weight_refresh_s`` (making recorded CUDA graphs read the
        updated weights: an address check, a re-recording only if a parameter moved, plus copying them into the
        engine's unsharded FSDP copy and its merged / FP8 projection copies), ``rollout/graph_captures`` and
        ``rollout/graph_capture_s`` (graphs recorded during this rollout; 0 once every shape has been seen),
        ``rollout/engine_fallbacks`` (generation calls that fell back to the eager loop) and
        ``rollout/engine_copies_gib`` (device memory of the engine's projection copies, kept between rollouts: the
        fused q/k/v and gate/up copies of small steps, with a LoRA policy's every adapted projection, or the merged /
        FP8 copies)."""
        from dare.rollout.engine import engine_stats, refresh_weights

        stats = engine_stats(self.policy)
        if before:
            began = self._clock()
            refresh_weights(self.policy)
            self._engine = {"rollout/weight_refresh_s": self._clock() - began, "captures": stats.captures,
                            "capture_s": stats.capture_s, "fallbacks": stats.fallbacks,
                            "owned_s": stats.owned_refresh_s + stats.copies_refresh_s}
            return
        # an FSDP policy's weights are copied into the engine's unsharded copy at each generation call, and the
        # merged / FP8 projection copies (SamplerConfig.weights) are refreshed from the parameters
        copied = stats.owned_refresh_s + stats.copies_refresh_s
        self._engine["rollout/weight_refresh_s"] += copied - self._engine.pop("owned_s")
        self._engine["rollout/graph_captures"] = float(stats.captures - self._engine.pop("captures"))
        self._engine["rollout/graph_capture_s"] = stats.capture_s - self._engine.pop("capture_s")
        self._engine["rollout/engine_fallbacks"] = float(stats.fallbacks - self._engine.pop("fallbacks"))
        self._engine["rollout/engine_copies_gib"] = stats.fused_bytes / 2 ** 30

    def _decode(self, completion: torch.Tensor, mask: torch.Tensor) -> list[str]:
        lengths = mask.sum(-1).tolist()
        return [self.tokenizer.decode(row[:n].tolist(), skip_special_tokens=True)
                for row, n in zip(completion.cpu(), lengths)]

    def _score(self, items: list[PromptItem], completion: torch.Tensor, mask: torch.Tensor):
        texts = self._decode(completion, mask)
        return texts, score_checked(self.reward, texts, [item.sample for item in items])

    def _assemble(self, outputs, rows: list[int]) -> TensorDict:
        """One CPU TensorDict of this rank's rollouts in the layout of ``dare.algorithms.rl``."""
        eos = self.token_ids.eos
        seqs, attn, comp, steps, logps, local = [], [], [], [], [], []
        for out in outputs:
            seqs.append(out.sequences.cpu())
            attn.append(out.attention_mask.cpu())
            comp.append(out.completion_mask.cpu())
            steps.append(out.step_map.cpu())
            logps.append(out.logprobs.cpu())
            local.append(None if out.block_step_map is None else out.block_step_map.cpu())
        sequences, attention = torch.cat(seqs), torch.cat(attn).long()
        completion, step_map = torch.cat(comp), torch.cat(steps)
        prompt_len = outputs[0].prompt_length
        rows_t = torch.tensor(rows, dtype=torch.long)
        n, width = sequences.shape
        given = None
        if any(out.given is not None for out in outputs):  # tokens given by a canvas (IGPO's hints)
            given = torch.cat([out.given.cpu() if out.given is not None else torch.zeros_like(out.step_map.cpu(),
                                                                                              dtype=torch.bool)
                               for out in outputs])
        gen = sequences[:, prompt_len:]
        undecoded = step_map < 0 if given is None else (step_map < 0) & ~given
        gen[undecoded] = eos  # undecoded tail after an early stop: EOS padding, as the model would emit
        prompt_mask = torch.zeros(n, width, dtype=torch.bool)
        prompt_mask[:, :prompt_len] = attention[:, :prompt_len].bool()
        generated = torch.zeros(n, width, dtype=torch.bool)
        generated[:, prompt_len:] = True
        full_completion = torch.zeros(n, width, dtype=torch.bool)
        full_completion[:, prompt_len:] = completion
        data = {
            "input_ids": sequences, "attention_mask": attention, "prompt_mask": prompt_mask, "generated": generated,
            "completion_mask": full_completion, "example_index": torch.where(attention.bool(), rows_t[:, None], -1),
            "rollout_index": rows_t, "group_size": torch.full((n,), self.group_size, dtype=torch.long),
            "temperature": torch.full((n,), float(self.sampler.temperature)),
            "rollout_logprobs": torch.cat(logps), "step_map": step_map,
        }
        if all(x is not None for x in local):  # block samplers: step within the block
            data["block_step_map"] = torch.cat(local)
        if given is not None:
            data["given"] = torch.zeros(n, width, dtype=torch.bool)
            data["given"][:, prompt_len:] = given
        if self.algorithm.needs.trajectory:
            data.update(self._trajectory(outputs))
        return TensorDict(data, batch_size=[n])

    def _trajectory(self, outputs) -> dict[str, torch.Tensor]:
        """Trajectory fields padded to the longest trajectory over all ranks (so every rank replays the same
        number of steps: FSDP collectives stay aligned)."""
        local = max(out.trajectory.states.shape[1] for out in outputs)
        steps = all_reduce_max_int(local, self.info)
        fields: dict[str, list[torch.Tensor]] = {f"traj_{k}": [] for k in (*TRAJECTORY_FIELDS, "step_mask")}
        for out in outputs:
            traj = out.trajectory
            extra = steps - traj.states.shape[1]
            for key in TRAJECTORY_FIELDS:
                value = getattr(traj, key).cpu()
                if extra:
                    fill = self.token_ids.mask if key in ("states", "predictions") else 0
                    pad = torch.full((value.shape[0], extra, value.shape[2]), fill, dtype=value.dtype)
                    value = torch.cat([value, pad], 1)
                fields[f"traj_{key}"].append(value)
            mask = traj.step_mask.cpu()
            fields["traj_step_mask"].append(torch.cat([mask, torch.zeros(mask.shape[0], extra, dtype=torch.bool)], 1))
        return {k: torch.cat(v) for k, v in fields.items()}

    def _context(self, items: list[PromptItem], rows: list[int] | None = None, rollout: int = 0,
                 batch: TensorDict | None = None) -> RolloutContext:
        samples = [item.sample for item in items]
        stops = self.token_ids.stop_ids

        def score(ids: torch.Tensor) -> torch.Tensor:
            texts = self._decode(ids, stop_mask(ids.cpu(), stops))
            return torch.tensor([r.reward for r in score_checked(self.reward, texts, samples)], dtype=torch.float32)

        def reduce(t: torch.Tensor) -> torch.Tensor:
            return all_reduce_dict({"t": t}, self.info)["t"].to(t.dtype)

        def evaluate(fn, batch: TensorDict) -> torch.Tensor:
            device = next(self.policy.parameters()).device
            outputs = []
            with torch.no_grad(), self.precision():
                for lo in range(0, batch.batch_size[0], self.micro_batch_size):
                    outputs.append(fn(batch[lo:lo + self.micro_batch_size].to(device)).cpu())
            return torch.cat(outputs)

        def regenerate(index: list[int], canvas: torch.Tensor, attempt: int = 1) -> TensorDict:
            """Rows ``index`` of ``batch`` decoded again from ``canvas`` (their prompts, a fresh random stream),
            assembled and scored like the originals."""
            width = int((~batch["generated"][0]).sum())  # the padded prompt width P (same for every row)
            device = next(self.policy.parameters()).device
            sampler = self.sampler.replace(seed=derive_seed(self.rollout_seed, rollout, attempt))
            sub_rows = [rows[i] for i in index]
            with torch.no_grad(), evaluating(self.policy), gathered_parameters(self.policy), self.precision():
                out = self.algorithm.generate(self.policy, batch["input_ids"][index, :width].to(device),
                                              batch["attention_mask"][index, :width].to(device), sampler,
                                              example_ids=sub_rows, group_size=self.group_size, canvas=canvas)
            redo = self._assemble([out], sub_rows)
            _, results = self._score([items[i] for i in index], out.completion.cpu(), out.completion_mask.cpu())
            redo["rewards"] = torch.tensor([r.reward for r in results], dtype=torch.float32)
            redo["correct"] = torch.tensor([bool(r.correct) for r in results])
            return redo

        return RolloutContext(self.group_size, score, reduce, lambda n: all_reduce_max_int(n, self.info), evaluate,
                              samples=samples, encode=lambda text: self.tokenizer(text, add_special_tokens=False)
                              ["input_ids"], regenerate=regenerate, rollout=rollout)

    def _clock(self) -> float:
        """Wall time after the device's queued work (phase timings would otherwise drift across phases)."""
        device = next(self.policy.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def _roll(self, rollout: int, items: list[PromptItem], rows: list[int]):
        """Generate, assemble and score this rank's ``items`` (row ids ``rows``): ``(batch with rewards, texts,
        results, outputs)``; the decoding time is added to ``self._generate_s``."""
        began = self._clock()
        outputs = self._generate(items, rows, rollout)
        self._generate_s += self._clock() - began
        batch = self._assemble(outputs, rows)
        completion = torch.cat([out.completion.cpu() for out in outputs])
        comp_mask = torch.cat([out.completion_mask.cpu() for out in outputs])
        texts, results = self._score(items, completion, comp_mask)
        batch["rewards"] = torch.tensor([r.reward for r in results], dtype=torch.float32)
        batch["correct"] = torch.tensor([bool(r.correct) for r in results])
        return batch, texts, results, outputs

    def _collect(self, start: int) -> list[list[TensorDict]]:
        began = self._clock()
        rollout = start // self.mu
        items, rows = self._rows(start)
        self._generate_s = 0.0
        batch, texts, results, outputs = self._roll(rollout, items, rows)
        nfe = sum(out.nfe for out in outputs)
        if self.config.dynamic_sampling:
            batch, items, texts, results, nfe = self._dynamic(rollout, batch, items, texts, results, nfe)
            rows = batch["rollout_index"].tolist()
        generated_s = self._generate_s
        context = self._context(items, rows, rollout, batch)
        batch, refined = refined_rollouts(self.algorithm, batch, context)  # e.g. IGPO's inpainted re-rolls
        returned = self.algorithm.assign_advantages(batch, self._context(items, rows, rollout, batch))
        if isinstance(returned, TensorDict):  # a hook that builds a new batch instead of editing the one it got
            batch = returned
        check_advantages(self.algorithm, batch)
        self._log_metrics(batch, results, outputs, nfe, generated_s, step=start)
        self.step_metrics.update(refined)
        self._write_samples(start, items, texts, results)
        device = next(self.policy.parameters()).device
        scored = self._clock()
        bounds = range(0, batch.batch_size[0], self.micro_batch_size)
        chunks = [batch[lo:lo + self.micro_batch_size].clone() for k in range(self.mu) for lo in bounds]
        steps = [start + k for k in range(self.mu) for _ in bounds]
        views = prepare_micro_batches(self.algorithm, chunks, steps, self.policy, self.reference, device,
                                      self.precision, on_policy_steps={start})
        micro = [views[k * len(bounds):(k + 1) * len(bounds)] for k in range(self.mu)]
        done = self._clock()
        self.step_metrics["rollout/reward_s"] = round(scored - began - generated_s, 4)
        self.step_metrics["rollout/logprob_s"] = round(done - scored, 4)
        self.step_metrics["rollout/time_s"] = round(done - began, 4)
        return micro

    def _dynamic(self, rollout: int, batch: TensorDict, items, texts, results, nfe: int):
        """Dynamic sampling (:mod:`dare.trainer.dynamic_sampling`): extra rounds until the step has ``P`` informative
        groups (or the round budget is spent), then this rank's share of the admitted groups in global order."""
        from dare.distributed import all_gather_objects
        from dare.trainer.dynamic_sampling import admit, concat_rows, extra_prompts, flat_groups, renumber

        group, prompts = self.group_size, self.prompts_per_step
        share = prompts // self.info.world_size
        first = self.info.rank * share
        round0_reward = float(all_reduce_dict({"r": batch["rewards"].double().sum()}, self.info)["r"]) / self.batch_size
        used = set(self.prompt_indices(rollout))
        flat, store = [], {}

        def record(round_: int, batch: TensorDict, items, texts, results) -> None:
            local = torch.zeros(prompts)
            local[first:first + share] = flat_groups(self._trained_rewards(batch), group).double()
            flat.append(all_reduce_dict({"f": local}, self.info)["f"].bool())
            for p in range(share):
                rows = slice(p * group, (p + 1) * group)
                store[(round_, first + p)] = (batch[rows].clone(), items[rows], texts[rows], results[rows])

        record(0, batch, items, texts, results)
        extra = 0
        while int((~torch.stack(flat)).sum()) < prompts and extra < self.config.dynamic_extra_rounds:
            extra += 1
            indices = extra_prompts(len(self.prompts), used, prompts, seed=self.seed, rollout=rollout, round_=extra)
            used.update(indices)
            mine = indices[first:first + share]
            items = [self.prompts[i] for i in mine for _ in range(group)]
            rows = [extra * self.batch_size + (first + p) * group + g for p in range(share) for g in range(group)]
            batch, texts, results, outputs = self._roll(rollout, items, rows)
            nfe += sum(out.nfe for out in outputs)
            record(extra, batch, items, texts, results)
        keys, filled = admit(flat, prompts)
        if self.info.world_size > 1:  # groups generated on other ranks
            wanted = set(keys)
            for part in all_gather_objects({k: v for k, v in store.items() if k in wanted}, self.info):
                store.update(part)
        parts = [store[key] for key in keys[first:first + share]]
        batch = renumber(concat_rows([p[0] for p in parts], self.token_ids.pad, self.token_ids.mask), first * group)
        dropped = sum(int(f.sum()) for f in flat) - filled
        self._dynamic_metrics = {
            "rollout/dynamic/dropped": float(dropped), "rollout/dynamic/extra_rounds": float(extra),
            "rollout/dynamic/filled": float(filled), "rollout/dynamic/round0_reward": round0_reward}
        return (batch, [x for p in parts for x in p[1]], [x for p in parts for x in p[2]],
                [x for p in parts for x in p[3]], nfe)

    # ---- logging ---------------------------------------------------------------------------------------
    def _trained_rewards(self, batch: TensorDict) -> torch.Tensor:
        """``[R]``: the rewards the algorithm computes advantages from (its ``trained_rewards`` hook, e.g. TraceRL's
        truncation rule; else the reward's own)."""
        hook = getattr(self.algorithm, "trained_rewards", None)
        return batch["rewards"] if hook is None else hook(batch)

    def _signal_sums(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """Rank-local counts of the learning-signal check (module docstring): ``groups``, ``flat`` (equal trained
        rewards), ``made_flat`` (of them, those whose own rewards differ), ``informative`` (a non-zero advantage),
        ``dropped`` (groups an algorithm's filter removed: ``keep`` false), ``rows`` and, for an algorithm whose
        reward rule depends on it (its ``stopped`` hook, e.g. TraceRL's truncation), ``stopped``: rows it counts as
        stopped, by its own test."""
        group = self.group_size
        trained = self._trained_rewards(batch).double().reshape(-1, group)
        raw = batch["rewards"].double().reshape(-1, group)
        advantage = batch["advantages"].reshape(batch.batch_size[0], -1).abs().amax(-1).reshape(-1, group)
        flat, raw_flat = trained.std(1, unbiased=False) == 0, raw.std(1, unbiased=False) == 0
        sums = {"groups": trained.shape[0], "flat": flat.sum(), "made_flat": (flat & ~raw_flat).sum(),
                "informative": (advantage > 0).any(1).sum(), "rows": batch.batch_size[0],
                "trained_reward": trained.sum()}
        stopped = getattr(self.algorithm, "stopped", None)
        if stopped is not None:  # one test of "stopped" for the rule and for its warning
            sums["stopped"] = stopped(batch).sum()
        if "keep" in batch.keys():
            sums["dropped"] = (~batch["keep"].bool().reshape(-1, group).any(1)).sum()
        return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in sums.items()}

    def _check_signal(self, step: int, counts: dict[str, float]) -> None:
        """Warn (rank 0, once each) about the first rollout without any informative group and the first one where
        the algorithm's own reward rule flattened groups (``step``: the 0-based step that made the rollout)."""
        if not self.info.is_main:
            return
        groups, flat = round(counts["groups"]), round(counts["flat"])
        notes_of = getattr(self.algorithm, "signal_notes", None) or (lambda counts, flattening=False: [])
        made_flat = round(counts["made_flat"])  # flat only after the algorithm's reward rule
        if counts["informative"] == 0 and "no_signal" not in self._warned:
            self._warned.add("no_signal")
            share = f"all {groups}" if flat == groups else f"{flat} of {groups}"
            why = [f"{share} groups have equal rewards"] if flat else []
            why = [*why, *notes_of(counts)] or [f"none of the {groups} groups has a non-zero advantage"]
            log.warning(f"warning: step {step + 1}: no learning signal in this rollout ({'; '.join(why)}): every "
                        "advantage is 0, so nothing is learned from it (later such rollouts are counted in the "
                        "end-of-run summary)")
        elif made_flat > 0 and "made_flat" not in self._warned:
            self._warned.add("made_flat")
            why = "; ".join(notes_of(counts, flattening=True)) or "the algorithm's reward rule"
            log.warning(f"warning: step {step + 1}: {why}: that made {made_flat} of {groups} groups flat (equal "
                        "rewards, zero advantage); said once, see rollout/trained_reward and rollout/flat_groups")

    def _log_metrics(self, batch: TensorDict, results, outputs, nfe: int, generated_s: float,
                     step: int = 0) -> None:
        """Step metrics: rewards etc. of ``batch``, health of the ``outputs`` chunks, ``nfe`` forwards; the
        learning-signal check of the rollout made at ``step``."""
        rewards = batch["rewards"].double()
        partial = [r.partial for r in results if r.partial is not None]
        lengths = batch["completion_mask"].sum(-1).double()
        sums = {
            "n": float(rewards.numel()), "reward": rewards.sum(), "reward_sq": (rewards ** 2).sum(),
            "correct": float(sum(r.correct for r in results)), "partial": float(sum(partial)),
            "partial_n": float(len(partial)), "length": lengths.sum(),
            "adv_abs": batch["advantages"].double().abs().sum() / max(batch["advantages"][0].numel(), 1),
            "nfe": float(nfe), "generate_s": generated_s, "ranks": 1.0,
            **health_sums(outputs, self.token_ids.stop_ids), **self._signal_sums(batch),
        }
        s = {k: float(v) for k, v in all_reduce_dict(sums, self.info).items()}
        n = max(s["n"], 1.0)
        mean = s["reward"] / n
        groups = max(s["groups"], 1.0)
        self.step_metrics = {
            "rollout/reward": mean, "rollout/reward_std": max(s["reward_sq"] / n - mean ** 2, 0.0) ** 0.5,
            "rollout/accuracy": s["correct"] / n, "rollout/length": s["length"] / n,
            "rollout/eos_fraction": s["eos"] / n, "rollout/flat_groups": s["flat"] / groups,
            "rollout/informative_groups": s["informative"] / groups,
            "rollout/advantage_abs": s["adv_abs"] / n, "rollout/nfe": s["nfe"] / s["ranks"],
            "rollout/generate_s": s["generate_s"] / s["ranks"], "rollout/decoded": s["decoded"] / n,
            "rollout/tokens_per_forward": s["decoded"] / max(s["row_steps"], 1.0),
        }
        self.step_metrics.update({k: round(float(v), 6) for k, v in getattr(self, "_engine", {}).items()})
        if s["confident_n"]:
            self.step_metrics["rollout/commit_confidence"] = s["confidence"] / s["confident_n"]
        if s["partial_n"]:
            self.step_metrics["rollout/partial"] = s["partial"] / s["partial_n"]
        if getattr(self.algorithm, "trained_rewards", None) is not None:  # the algorithm changes rewards
            self.step_metrics["rollout/trained_reward"] = s["trained_reward"] / n
        if "dropped" in s:
            self.step_metrics["rollout/dropped_groups"] = s["dropped"] / groups
        self._check_signal(step, s)
        if self.config.dynamic_sampling:
            self.step_metrics.update(self._dynamic_metrics)

    def _write_samples(self, start: int, items, texts, results) -> None:
        if self.samples_path is None or self.config.samples_per_step <= 0:
            return
        with self.samples_path.open("a") as handle:
            for item, text, result in list(zip(items, texts, results))[:self.config.samples_per_step]:
                handle.write(json.dumps({"step": start + 1, "prompt": item.text, "completion": text,
                                         "reward": result.reward, "correct": result.correct}) + "\n")


def health_sums(outputs, stop_ids) -> dict[str, torch.Tensor]:
    """Rank-local sums of the rollout health metrics over the :class:`~dare.rollout.RolloutOutput` chunks
    ``outputs`` (see the module docstring): ``decoded`` positions, ``row_steps`` (sum of ``num_steps``), rows with
    a decoded stop token (``eos``), and the ``confidence`` sum over ``confident_n`` committed completion tokens
    (0 / 0 when a chunk has no ``confidence_map``); float64 CPU scalars."""
    keys = ("decoded", "row_steps", "eos", "confidence", "confident_n")
    sums = {k: torch.zeros((), dtype=torch.float64) for k in keys}
    for out in outputs:
        decoded = out.step_map >= 0
        stops = torch.as_tensor(list(stop_ids), device=out.completion.device)
        sums["decoded"] += decoded.sum().cpu()
        sums["row_steps"] += out.num_steps.sum().cpu()
        sums["eos"] += (torch.isin(out.completion, stops) & decoded).any(-1).sum().cpu()
        if out.confidence_map is not None:
            sums["confidence"] += out.confidence_map[out.completion_mask].double().sum().cpu()
            sums["confident_n"] += out.completion_mask.sum().cpu()
    return sums


def rollout_base_seed(seed: int, sampler_seed: int) -> int:
    """The base of every rollout's sampler seed: ``trainer.seed`` itself for ``rollout.sampler.seed`` 0 (the
    default), else a mix of both (another sampler seed, other rollouts; prompt order and corruption noise stay on
    ``trainer.seed``)."""
    return seed if sampler_seed == 0 else derive_seed(seed, sampler_seed)


def rollout_sampler(config, family: str | None = None):
    """The resolved ``rollout.sampler`` of the ``rollout`` section ``config`` (one-line errors for a bad one); an
    unset ``sampler`` is model family ``family``'s default."""
    if config.sampler.temperature <= 0:
        raise ConfigError("RL rollouts need rollout.sampler.temperature > 0 (a group of greedy rollouts is identical)")
    if family is not None:
        check_rollout_family(config, family)
    try:
        sampler = config.sampler if family is None else config.sampler.for_family(family)
        return sampler.resolved()
    except ConfigError as err:  # the sampler names its own fields: say which section they are in
        raise ConfigError(f"rollout.sampler: {err}") from None


def check_rollout_family(config, family) -> None:
    """One-line error when the ``rollout`` section's sampler (if set) does not decode model ``family``'s attention
    kind: checked before the sampler's own settings, whose errors (e.g. block_steps on a full-attention sampler)
    would otherwise hide it."""
    if config.sampler.sampler is None:
        return
    from dare.rollout.samplers import check_sampler_family

    try:
        check_sampler_family(config.sampler.sampler, family)
    except ConfigError as err:
        raise ConfigError(f"rollout.sampler: {err}") from None


def check_rollout_batch(batch_size: int, group_size: int) -> None:
    """One-line error unless ``trainer.batch_size`` (rollouts per step) is a multiple of ``rollout.group_size``."""
    if batch_size % group_size:
        raise ConfigError(f"trainer.batch_size={batch_size} (rollouts per step) must be a multiple of "
                          f"rollout.group_size={group_size}")


def refined_rollouts(algorithm, batch: TensorDict, context) -> tuple[TensorDict, dict]:
    """``algorithm.refine_rollouts(batch, context)`` as ``(batch, metrics)``: a hook returning the batch alone gets no
    metrics; anything else is a one-line :class:`~dare.errors.PluginError` (a two-row TensorDict would otherwise
    unpack into two rows)."""
    from dare.errors import PluginError, described

    out = algorithm.refine_rollouts(batch, context)
    if isinstance(out, TensorDict):
        return out, {}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], TensorDict) and isinstance(out[1], dict):
        return out
    raise PluginError(f"algorithm '{algorithm.name}': refine_rollouts returned {described(out)}; return (batch, "
                      "metrics dict)")


def check_advantages(algorithm, batch: TensorDict) -> None:
    """One-line :class:`~dare.errors.PluginError` naming the algorithm for advantages its loss cannot read: none
    set, not a float tensor of one row per rollout with ``algorithm.advantage_dims`` dimensions, or not finite."""
    from dare.errors import PluginError

    rows, name = batch.batch_size[0], algorithm.name
    where = f"algorithm '{name}': assign_advantages"
    if "advantages" not in batch.keys():
        raise PluginError(f"{where} set no batch['advantages'] (edit the batch it is given, or return it)")
    adv = batch["advantages"]
    dims = algorithm.advantage_dims
    if not adv.is_floating_point() or adv.shape[0] != rows or (dims is not None and adv.ndim != dims):
        shape = "[R]" if dims == 1 else f"[R, ...] of {dims} dimensions" if dims else "[R, ...]"
        raise PluginError(f"{where} set advantages of shape {list(adv.shape)} ({adv.dtype}); its loss reads a "
                          f"float tensor {shape}, R = {rows} rollouts (advantage_dims = {dims})")
    if not torch.isfinite(adv).all():
        bad = int((~torch.isfinite(adv)).sum())
        raise PluginError(f"{where} set {bad} non-finite advantage(s) of {adv.numel()}")


def rollout_reward(config):
    """The :class:`dare.rewards.Reward` of ``rollout.reward`` (one-line errors for a missing or unknown one)."""
    from dare.rewards import get_reward

    if config.reward is None:
        raise ConfigError("RL needs a reward: set rollout.reward (e.g. gsm8k, d1_countdown, exact_match)")
    return get_reward(config.reward)


def build_rollout_source(trainer) -> RolloutSource:
    """The rollout source of a :class:`~dare.trainer.Trainer` (prompts from ``data``, reward and sampler from
    ``rollout``)."""
    from dare.trainer.prompts import build_prompts

    cfg = trainer.config
    reward = rollout_reward(cfg.rollout)
    prompts, dropped = build_prompts(cfg.data, trainer.tokenizer, cfg.rollout.max_prompt_length, cfg.trainer.seed,
                                     warn=trainer.info.is_main, reward=reward)
    if dropped and trainer.info.is_main:
        log.warning(f"warning: dropped {dropped} of {dropped + len(prompts)} prompts longer than "
                    f"rollout.max_prompt_length={cfg.rollout.max_prompt_length}")
    return RolloutSource(
        prompts, policy=trainer.model, algorithm=trainer.algorithm, tokenizer=trainer.tokenizer, reward=reward,
        config=cfg.rollout, batch_size=cfg.trainer.batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
        info=trainer.data_info, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle, reference=trainer.reference,
        output_dir=trainer.output_dir if cfg.rollout.samples_file else None,
    )


__all__ = ["RolloutSource", "build_rollout_source", "check_rollout_batch", "check_rollout_family", "health_sums",
           "rollout_base_seed", "rollout_reward", "rollout_sampler"]
