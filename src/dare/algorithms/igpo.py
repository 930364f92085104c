"""IGPO, Inpainting-Guided Policy Optimization (facebookresearch/igpo, arXiv 2509.10396). Full-attention families.

GRPO loses its signal on a group where every rollout fails (all advantages 0). IGPO uses the diffusion model's
inpainting ability: when **no rollout of a group is correct** (the reward's accuracy flag), the whole group is
decoded again with fragments of the prompt's **reference reasoning** written into the completion canvas (given
tokens the sampler keeps, ``dare.rollout.generate(..., canvas=...)``), and up to ``max_replacements`` of the
group's rollouts are replaced by re-rolls that are correct. The group then has mixed rewards and a learning signal.
Groups with any correct rollout are never touched.

**Hints** (per re-rolled rollout): the reasoning is the sample's ``reasoning_key`` field, **cut before the first
occurrence of the reference answer** (``answer_key``) and of ``answer_marker`` (e.g. GSM8K's ``####``), so the
answer itself is never written into the canvas and every reward of a re-roll is earned by the model's own tokens
(a contiguous run of hint tokens is a substring of that prefix; distinct chunks stay separated). The prefix is
tokenized and cut into chunks of ``min_chunk .. max_chunk`` tokens; for an inpainting ratio ``r`` drawn uniformly in
``[ratio_low, ratio_high]`` (sorted within the group), ``int(n_chunks (1 - r))`` random chunks are hidden and the
others (always including the last one) are revealed, placed at their offsets stretched by
``f = clamp((G - free_tail) / n_tokens, 1, 1.5)`` inside the first ``G - free_tail`` positions. Samples without
reasoning get no hint (their group is re-rolled without one): at the start of a run a warning says when no prompt
record has usable reasoning (the field is absent, or holds nothing before the answer), a note when only some lack
it; ``reasoning_key: null`` re-rolls without hints on purpose (no warning), e.g. on data without reasoning.

**Loss**: d1's one-step estimator (the whole completion masked, prompt never masked: the reference's
``d1_masking``) with token-level clipped GRPO, mean-only advantages and k3 KL, over the global batch's completion
tokens. Hint tokens are part of the completion (the reward read them); of each row's hint tokens only the
``hint_entropy_keep`` fraction with the highest predictive entropy (at least one) is trained, the others get weight
0 (the reference's entropy clipping of inpainted tokens).

Metrics: ``igpo/triggered`` (fraction of groups with no correct rollout), ``igpo/rescued`` (fraction of groups that
got at least one correct re-roll), ``igpo/replaced`` (fraction of rollouts replaced).

Deviations from the reference (``trainer_igpo.py``, ``utils/generate.py``):

* the reference reveals chunks of the **whole** reasoning trace, whose last chunk (always revealed) usually holds
  the final answer; here the reasoning is cut before the answer, so hints never contain it;
* the reference's recipe uses a GSPO sequence ratio; here the token-level GRPO ratio (its ``use_gspo: false`` path);
* ``max_spacing`` of the chunk placement is not applied (chunks keep their stretched offsets);
* hint entropies come from the current policy's one-step forward of each inner step (the reference: the rollout
  policy's), and the completion is truncated at its first stop token as in d1 (the reference trains the whole
  generated canvas).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import check_settings, register_algorithm, settings_error
from dare.algorithms.d1 import D1, D1Config
from dare.algorithms.logprobs import denoising_logits, model_inputs
from dare.algorithms.rl import RolloutContext


@dataclass
class IGPOConfig(D1Config):
    name: str = "igpo"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (IGPO: r - mean_G r)."""
    inner_steps: int = 4
    """mu (IGPO recipe num_iterations 4)."""
    clip_low: float = 0.2
    """Ratio clip epsilon (IGPO epsilon_low = epsilon_high = 0.2)."""
    kl_coef: float = 0.01
    """beta of the k3 KL to the reference (IGPO 0.01)."""
    p_mask_prompt: float = 0.0
    """Prompt tokens are never masked in IGPO's estimator."""
    reasoning_key: str | None = "reasoning"
    """Sample field holding the reference reasoning the hints come from (MetaMathQA: reasoning; GSM8K rows: answer);
    null = no hints (failed groups are re-rolled without them)."""
    answer_key: str = "answer"
    """Sample field holding the final answer; the reasoning is cut before its first occurrence."""
    answer_marker: str | None = "####"
    """The reasoning is also cut before this marker (GSM8K's final-answer line); null = none."""
    max_replacements: int = 4
    """At most this many rollouts of a failed group are replaced by correct inpainted re-rolls."""
    ratio_low: float = 0.2
    """Lower end of the inpainting ratio (fraction of revealed chunks) drawn per re-roll."""
    ratio_high: float = 0.6
    """Upper end of the inpainting ratio."""
    min_chunk: int = 5
    """Smallest hint chunk in tokens."""
    max_chunk: int = 10
    """Largest hint chunk in tokens."""
    free_tail: int = 30
    """Completion positions at the end never hinted (room for the answer)."""
    hint_entropy_keep: float = 0.2
    """Fraction of each row's hint tokens trained (the highest-entropy ones; at least one)."""

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.ratio_low <= self.ratio_high <= 1:
            raise settings_error(self, "must satisfy 0 <= ratio_low <= ratio_high <= 1", "ratio_low", "ratio_high")
        if not 1 <= self.min_chunk <= self.max_chunk:
            raise settings_error(self, "must satisfy 1 <= min_chunk <= max_chunk", "min_chunk", "max_chunk")
        check_settings(self, {"max_replacements": (lambda v: v >= 0, ">= 0"), "free_tail": (lambda v: v >= 0, ">= 0"),
                              "hint_entropy_keep": (lambda v: 0 <= v <= 1, "in [0, 1]")})


def hint_source(sample: dict, reasoning_key: str | None, answer_key: str, marker: str | None) -> str:
    """The part of the sample's reasoning that may be revealed: everything before ``marker`` and before the first
    occurrence of the final answer (the ``answer_key`` text, or what follows ``marker`` in it); empty without
    reasoning (or ``reasoning_key`` None)."""
    if reasoning_key is None:
        return ""
    reasoning = str(sample.get(reasoning_key) or "")
    answer = str(sample.get(answer_key) or "")
    if marker and marker in answer:
        answer = answer.rsplit(marker, 1)[-1]
    answer = answer.strip()
    end = reasoning.index(marker) if marker and marker in reasoning else len(reasoning)
    if answer and answer in reasoning[:end]:
        end = reasoning.index(answer)
    return reasoning[:end]


def hint_canvas(tokens: list[int], gen_length: int, ratio: float, mask_id: int, rng: random.Random, *,
                min_chunk: int, max_chunk: int, free_tail: int) -> torch.Tensor:
    """``[G]`` canvas: revealed chunks of ``tokens`` at stretched offsets, ``mask_id`` elsewhere (module docstring)."""
    canvas = torch.full((gen_length,), mask_id, dtype=torch.long)
    room = max(gen_length - free_tail, 0)
    tokens = tokens[:room]
    chunks, i = [], 0
    while i < len(tokens):
        size = min(rng.randint(min_chunk, max_chunk), len(tokens) - i)
        if size < min_chunk:
            break
        chunks.append((i, i + size))
        i += size
    if not chunks:
        return canvas
    hidden = set(rng.sample(range(len(chunks)), int(len(chunks) * (1 - ratio))))
    stretch = min(max(room / len(tokens), 1.0), 1.5)
    for k, (lo, hi) in enumerate(chunks):
        if k in hidden and k != len(chunks) - 1:
            continue
        start = int(lo * stretch)
        end = min(start + hi - lo, room)
        canvas[start:end] = torch.tensor(tokens[lo:lo + end - start], dtype=torch.long)
    return canvas


@register_algorithm
class IGPO(D1):
    """d1-style GRPO plus inpainted re-rolls of all-failed groups (see the module docstring)."""

    name = "igpo"
    config_class = IGPOConfig
    attentions = ("full",)

    # ---- rollouts ------------------------------------------------------------------------------------------
    def check_samples(self, samples: list[dict]) -> str | None:
        """The rollout source's start-of-run line on the prompt records ``samples``: a warning when none can give a
        hint (``reasoning_key`` absent, or no reasoning before the answer), a note when some cannot; None when all
        can or ``reasoning_key`` is null (no hints asked for)."""
        cfg = self.config
        if cfg.reasoning_key is None or not samples:
            return None
        missing = sum(not sample.get(cfg.reasoning_key) for sample in samples)
        empty = sum(not hint_source(sample, cfg.reasoning_key, cfg.answer_key, cfg.answer_marker).strip()
                    for sample in samples) - missing
        key, n = cfg.reasoning_key, len(samples)
        if missing == n:
            fields = ", ".join(sorted({k for sample in samples for k in sample}))
            return (f"warning: algorithm.reasoning_key={key!r}: none of the {n} prompt records has this field "
                    f"(they hold: {fields}), so IGPO never writes hints: failed groups are only re-rolled (set "
                    "algorithm.reasoning_key to the field holding reference reasoning, or to null to re-roll "
                    "without hints on purpose)")
        if missing + empty == n:
            return (f"warning: algorithm.reasoning_key={key!r}: no prompt record has reasoning before its answer "
                    f"(algorithm.answer_key={cfg.answer_key!r}, answer_marker={cfg.answer_marker!r}), so IGPO never "
                    "writes hints (hints never contain the answer): failed groups are only re-rolled")
        if missing + empty:
            return (f"note: {missing + empty} of the {n} prompt records have no reasoning before the answer in "
                    f"{key!r}: their failed groups are re-rolled without hints")
        return None

    def refine_rollouts(self, batch: TensorDict, context: RolloutContext) -> tuple[TensorDict, dict]:
        cfg, group = self.config, context.group_size
        correct = batch["correct"].bool().reshape(-1, group)
        failed = (~correct.any(1)).nonzero().squeeze(-1).tolist()
        if "given" not in batch.keys():
            batch["given"] = torch.zeros_like(batch["generated"])
        counts = torch.tensor([float(correct.shape[0]), float(len(failed)), 0.0, 0.0, float(batch.batch_size[0])])
        if failed and context.regenerate is not None:
            index = [g * group + k for g in failed for k in range(group)]
            redo = context.regenerate(index, self.hint_canvases(batch, context, index))
            for n, g in enumerate(failed):
                good = [k for k in range(group) if bool(redo["correct"][n * group + k])]
                chosen = good[:cfg.max_replacements]
                counts[2] += float(bool(chosen))
                counts[3] += len(chosen)
                for slot, k in enumerate(chosen):  # the first rollouts of the group are replaced
                    for key in batch.keys():
                        if key in redo.keys():
                            batch[key][g * group + slot] = redo[key][n * group + k]
        groups, triggered, rescued, replaced, rows = context.all_reduce(counts).tolist()
        return batch, {"igpo/triggered": triggered / max(groups, 1.0), "igpo/rescued": rescued / max(groups, 1.0),
                       "igpo/replaced": replaced / max(rows, 1.0)}

    def hint_canvases(self, batch: TensorDict, context: RolloutContext, index: list[int]) -> torch.Tensor:
        """``[n, G]`` canvases of the re-rolled rows ``index``: each group's rows get sorted ratios."""
        cfg, group = self.config, context.group_size
        gen_length = int(batch["generated"][0].sum())
        canvases = []
        for lo in range(0, len(index), group):
            rows = index[lo:lo + group]
            first = int(batch["rollout_index"][rows[0]])
            rng = random.Random(f"igpo:{self.seed}:{context.rollout}:{first}")
            ratios = sorted(rng.uniform(cfg.ratio_low, cfg.ratio_high) for _ in rows)
            sample = context.samples[rows[0]] if context.samples is not None else {}
            text = hint_source(sample, cfg.reasoning_key, cfg.answer_key, cfg.answer_marker)
            tokens = list(context.encode(text)) if text and context.encode is not None else []
            for ratio in ratios:
                canvases.append(hint_canvas(tokens, gen_length, ratio, self.token_ids.mask, rng,
                                            min_chunk=cfg.min_chunk, max_chunk=cfg.max_chunk,
                                            free_tail=cfg.free_tail))
        return torch.stack(canvases)

    # ---- loss ----------------------------------------------------------------------------------------------
    def trained_mask(self, batch: TensorDict, entropy: torch.Tensor | None = None) -> torch.Tensor:
        """``[R, S]``: completion tokens trained - every generated one and, per row, the ``hint_entropy_keep``
        highest-entropy hint tokens (``entropy`` None: only the count matters, the first ones are marked)."""
        completion = batch["completion_mask"]
        hints = completion & batch["given"] if "given" in batch.keys() else torch.zeros_like(completion)
        keep = ~hints & completion
        count = hints.sum(-1)
        quota = torch.where(count > 0, (count.float() * self.config.hint_entropy_keep).long().clamp(min=1), 0)
        score = (entropy if entropy is not None else -torch.arange(hints.shape[1], dtype=torch.float32,
                                                                    device=hints.device)[None].expand(hints.shape))
        score = torch.where(hints, score.float(), -torch.inf)
        rank = torch.argsort(torch.argsort(score, -1, descending=True), -1)
        return keep | (hints & (rank < quota[:, None]))

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["trained_tokens"] = self.trained_mask(batch).sum().to(torch.float64)
        return out

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        out = super().estimate(model, batch)
        hints = batch["given"] & batch["completion_mask"] if "given" in batch.keys() else None
        entropy = torch.zeros(batch["input_ids"].shape, dtype=torch.float32, device=batch["input_ids"].device)
        if hints is not None and bool(hints.any()):
            rows = hints.any(-1).nonzero().squeeze(-1)
            with torch.no_grad():
                sub = batch[rows]
                logits = denoising_logits(model, sub["noisy_ids"], sub["input_ids"], blocks=self.blocks,
                                          attn_backend=self.attn_backend, **model_inputs(sub)).float()
                logits[..., self.token_ids.mask] = -torch.inf
                logp = torch.log_softmax(logits, -1)
                entropy[rows] = -(logp.exp() * torch.nan_to_num(logp, neginf=0.0)).sum(-1)
        out["hint_entropy"] = entropy
        return out

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        logp = estimates["logp"]
        trained = self.trained_mask(batch, estimates["hint_entropy"] if "hint_entropy" in estimates.keys() else None)
        weights = trained.float() / totals["trained_tokens"].clamp(min=1).float()
        loss, metrics = self.ppo_token_loss(logp, self.old_or_detached(batch, "logp", logp),
                                            batch["advantages"][:, None], weights, batch.get("ref_logp"))
        metrics["loss"] = loss.detach()
        return loss, metrics
