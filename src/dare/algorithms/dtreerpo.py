"""d-TreeRPO (THU-BPM, arXiv 2512.09675): tree-structured rollouts, step-wise advantages propagated bottom-up from
the leaf rewards, and a time-scheduled self-distillation term. Full-attention families (LLaDA, LLaDA-MoE, Dream).

**Tree rollouts.** The ``N = rollout.sampler.steps`` denoising steps are cut at the branch points
``d_k = floor(k N / s)``, ``k = 0..s`` (``s = levels``, the reference's contraction factor). A prompt's tree has
``n0`` root branches and every internal node has ``T = branch_factor`` children; a node at level ``l`` is the
state after ``d_(l+1)`` steps, decoded from its parent's state by steps ``d_l .. d_(l+1) - 1``. The leaves are
the rollouts of the batch: ``rollout.group_size = n0 T^(s-1)`` rows per prompt, leaf ``g`` descending from node
``g // T^(s-1-l)`` at level ``l``. Each node is decoded once, through the public rollout API
(``dare.rollout.generate(..., canvas=parent state, step_range=(d_l, d_(l+1)))``; its own random stream:
``example_id = node key * s + l``), so siblings share their parent's state exactly and the leaves' step maps carry
the whole tree (the state of a leaf's level-``l`` ancestor = its tokens committed before step ``d_(l+1)``). A row
that finished (stop token, everything before it decoded) gets its undecoded tail as given padding, so later
levels skip it.

**Advantages (bottom-up).** Leaf value = reward; node value = mean of its children's values (= the mean reward
of its leaves). A node's *local advantage* is its value minus the mean value of its siblings (the other children
of its parent; 0 when it has none, as the reference).

**Loss.** Every non-root node is one *segment*: the transition parent -> node, scored in one forward of the
parent state (``log p(y_j | parent state)`` at the positions masked in the parent and decoded in the node, up to
the node's first stop token; temperature 1). A segment is trained once, on the row of its first leaf (view ``l`` of
a row = its level-``l`` ancestor's segment). Per segment the clipped surrogate (ratio to the rollout policy's
estimate, ``epsilon = clip_low``) is averaged over its tokens, with the node's local advantage; segments are
averaged over the global batch. ``kl_coef``: k3 KL to the reference, weighted the same way.

**Self-distillation** (``self_distillation``): for every group of siblings (children of one parent) and every
position ``j`` decoded by at least one sibling with a positive advantage, the target ``q_j`` is the histogram of
those siblings' tokens at ``j`` weighted by ``softmax(A / tau(t))`` (over the group's positive siblings);
the term is ``KL(q_j || p_theta(. | parent state)_j)`` averaged over the (group, position) pairs of the global
batch, scaled by ``lambda(t) = lambda_max (e^(gamma t / H) - 1) / (e^gamma - 1)``,
``tau(t) = tau_max (1 - t / H)^beta`` (``t`` = optimizer step, ``H = distill_horizon``). Its gradient is the
weighted log-likelihood of the siblings' tokens under the parent state, i.e. per-token weights on the segment
log-probs: the loss carries the cross-entropy ``-sum_u q_u log p_u`` (the entropy of ``q`` is a constant and is
left out of the loss value). The sibling groups (their positive siblings' advantages and decoded positions) are
gathered in ``assign_advantages``, which sees whole groups, and stored on every row of the group; each step's weights
(``tau(t)``, ``lambda(t)``) and pair counts (on the group's first row, summed over the global batch) come from them,
so neither depends on how the rows are split into micro-batches.

Deviations from the reference (``dtreerpo/dtreerpo_trainer.py``; DARE ``dtreerpo_algos.py``):

* the reference re-plans a resumed block's remaining masks over its remaining steps by hand; here that is the
  rollout engine's ``step_range`` (LLaDA's linear quota then commits the same per-step counts as one run);
* the reference trains the segments of one parent per optimizer step (``parents_per_step: 1``) from a buffer;
  here every segment of the rollout batch is in each optimizer step (``inner_steps`` = its ``num_iterations``);
* a segment's "completion mask" stops at the node's first stop token of the family (EOS or end-of-turn), the
  reference at the first EOS id;
* the sampler must be a fixed-step quota decoder (``decoder: quota``), so step ``d_k`` is a schedule position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import check_settings, register_algorithm
from dare.algorithms.functional import clipped_surrogate, kl_estimate
from dare.algorithms.rl import PPOConfig, RLAlgorithm, RolloutContext, TermwiseMixin, response_field
from dare.errors import ConfigError


@dataclass
class DTreeRPOConfig(PPOConfig):
    name: str = "dtreerpo"
    """Algorithm name."""
    advantage: str = "none"
    """Unused: advantages are the tree's local (sibling-relative) advantages."""
    inner_steps: int = 12
    """mu: optimizer steps per rollout batch (reference num_iterations 12)."""
    clip_low: float = 0.4
    """Ratio clip epsilon (reference 0.4)."""
    kl_coef: float = 0.01
    """beta of the k3 KL to the reference (reference 0.01)."""
    branch_factor: int = 4
    """T: children of every internal node below the root (reference tree_branch_factor 4)."""
    levels: int = 2
    """s: segments along each root-to-leaf path; branch points at floor(k N / s) (reference
    tree_contraction_factor 2). rollout.group_size = root branches x T^(s-1) leaves per prompt."""
    self_distillation: bool = True
    """Add the time-scheduled self-distillation term."""
    distill_lambda_max: float = 3.0e-3
    """lambda_max of the self-distillation weight schedule."""
    distill_gamma: float = 2.0
    """gamma of lambda(t) = lambda_max (exp(gamma t / H) - 1) / (exp(gamma) - 1)."""
    distill_tau_max: float = 2.0
    """tau_max of the softmax temperature tau(t) = tau_max (1 - t / H)^beta over sibling advantages."""
    distill_beta: float = 0.7
    """beta of tau(t)."""
    distill_horizon: int = 30000
    """H: the step at which lambda reaches lambda_max and tau 0 (the reference uses max_steps = 30000)."""

    def __post_init__(self):
        super().__post_init__()
        check_settings(self, {"branch_factor": (lambda v: v >= 1, ">= 1"), "levels": (lambda v: v >= 1, ">= 1"),
                              "distill_horizon": (lambda v: v >= 1, ">= 1"),
                              "distill_tau_max": (lambda v: v > 0, "> 0"),
                              "distill_lambda_max": (lambda v: v >= 0, ">= 0")})


def branch_points(steps: int, levels: int) -> list[int]:
    """``d_k = floor(k N / s)``, ``k = 0..s``: the step counts at which the tree branches."""
    return [k * steps // levels for k in range(levels + 1)]


def local_advantages(values: torch.Tensor, siblings: int) -> torch.Tensor:
    """Each node's value minus the mean value of its siblings (consecutive runs of ``siblings`` nodes share a
    parent); 0 baseline for a node without siblings (the reference's rule)."""
    if siblings == 1:
        return values.clone()
    groups = values.reshape(-1, siblings)
    others = (groups.sum(1, keepdim=True) - groups) / (siblings - 1)
    return (groups - others).reshape(values.shape)


def tree_advantages(rewards: torch.Tensor, index: torch.Tensor, group_size: int, branch: int, levels: int):
    """``(advantages [R, s], owner [R, s], values [R, s])`` of the leaves ``index`` (global rollout indices, whole
    groups of ``group_size`` leaves): the local advantage and value of each leaf's level-``l`` ancestor, and whether
    the row is that ancestor's first leaf (the row that trains its segment)."""
    order = torch.argsort(index)
    leaves = rewards.float()[order]
    rows = leaves.shape[0]
    adv = torch.zeros(rows, levels)
    val = torch.zeros(rows, levels)
    owner = torch.zeros(rows, levels, dtype=torch.bool)
    for level in range(levels):
        size = branch ** (levels - 1 - level)  # leaves under a level-l node
        node_values = leaves.reshape(-1, size).mean(1)
        siblings = group_size // size if level == 0 else branch  # the root branches, then T
        node_adv = local_advantages(node_values, siblings)
        adv[:, level] = node_adv.repeat_interleave(size)
        val[:, level] = node_values.repeat_interleave(size)
        owner[:, level] = torch.arange(rows) % size == 0
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(rows)
    return adv[inverse], owner[inverse], val[inverse]


@register_algorithm
class DTreeRPO(TermwiseMixin, RLAlgorithm):
    """Tree rollouts, bottom-up local advantages, segment-level clipped surrogate + self-distillation."""

    name = "dtreerpo"
    advantage_dims = 2  # one per rollout and tree segment
    config_class = DTreeRPOConfig
    attentions = ("full",)
    total_steps: int | None = None

    @classmethod
    def group_baseline(cls, config) -> str:
        """Always relative to the group: its advantages compare sibling branches of a tree."""
        return "its advantages compare sibling branches of a tree"

    # ---- rollout -------------------------------------------------------------------------------------------
    def check_rollout(self, model, sampler) -> None:
        super().check_rollout(model, sampler)
        if sampler.decoder != "quota":
            raise ConfigError(f"dtreerpo branches at fixed denoising steps: use rollout.sampler.decoder=quota "
                              f"(got '{sampler.decoder}')")
        if sampler.steps < self.config.levels:
            raise ConfigError(f"dtreerpo needs rollout.sampler.steps >= algorithm.levels ({self.config.levels}); "
                              f"got {sampler.steps}")
        if sampler.record_trajectory:
            raise ConfigError("dtreerpo rollouts do not record trajectories")
        self.total_steps = sampler.steps

    def leaves_per_node(self, level: int) -> int:
        return self.config.branch_factor ** (self.config.levels - 1 - level)

    def check_group(self, group_size: int) -> None:
        per_root = self.leaves_per_node(0)
        if group_size % per_root:
            raise ConfigError(f"dtreerpo: rollout.group_size ({group_size}) must be a multiple of branch_factor^"
                              f"(levels-1) = {per_root} (root branches x leaves per root branch)")

    def generate(self, model, prompts, attention_mask, sampler, *, example_ids, group_size: int,
                 progress: bool = False, canvas=None):
        """Decode every node of the rows' trees level by level (see the module docstring); returns the leaves."""
        if canvas is not None:
            raise ConfigError("dtreerpo grows its trees from empty canvases")
        from dare.models.spec import family_of
        from dare.rollout import RolloutOutput, completion_mask, generate, resolve_config
        from dare.rollout.output import finished_rows

        self.check_group(group_size)
        tok = family_of(model).token_ids(model.config)
        resolved = resolve_config(sampler, model)
        bounds = branch_points(resolved.steps, self.config.levels)
        device = prompts.device
        rows = torch.as_tensor([int(i) for i in example_ids], dtype=torch.long, device=device)
        count, gen = rows.shape[0], resolved.gen_length
        state = torch.full((count, gen), tok.mask, dtype=torch.long, device=device)
        step_map = torch.full((count, gen), -1, dtype=torch.long, device=device)
        logprobs = torch.zeros((count, gen), dtype=torch.float32, device=device)
        num_steps = torch.zeros(count, dtype=torch.long, device=device)
        stops = torch.tensor(tok.stop_ids, device=device)
        nfe = 0
        out = None
        for level in range(self.config.levels):
            keys = rows // self.leaves_per_node(level)
            distinct, inverse = torch.unique(keys, return_inverse=True)
            first = torch.zeros_like(distinct).scatter_reduce(0, inverse, torch.arange(count, device=device), "amin",
                                                              include_self=False)
            last = level == self.config.levels - 1
            out = generate(model, prompts[first], attention_mask[first], resolved,
                           example_ids=(distinct * self.config.levels + level).tolist(),
                           canvas=state[first] if level else None,
                           step_range=(bounds[level], None if last else bounds[level + 1]), progress=progress)
            nfe += out.nfe
            decoded = (out.step_map >= 0)[inverse]
            step_map = torch.where(decoded, out.step_map[inverse] + bounds[level], step_map)
            logprobs = torch.where(decoded, out.logprobs[inverse], logprobs)
            num_steps += out.num_steps[inverse]
            state = out.state(tok.mask)[inverse]
            done = finished_rows(state, tok.mask, stops)  # finished rows: their tail is given padding
            state = torch.where(done[:, None] & (state == tok.mask), torch.full_like(state, tok.pad), state)
        decoded = step_map >= 0
        completion = torch.where(decoded, state, torch.full_like(state, tok.pad))
        width = prompts.shape[1]
        sequences = torch.cat([prompts, completion], 1)
        mask = torch.cat([attention_mask.long(), torch.ones_like(completion)], 1)
        return RolloutOutput(sequences=sequences, attention_mask=mask, prompt_length=width, completion=completion,
                             completion_mask=completion_mask(completion, tok.stop_ids, decoded), logprobs=logprobs,
                             step_map=step_map, num_steps=num_steps, nfe=nfe)

    # ---- advantages and views ------------------------------------------------------------------------------
    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        self.check_group(context.group_size)
        cfg = self.config
        adv, owner, values = tree_advantages(batch["rewards"], batch["rollout_index"], context.group_size,
                                             cfg.branch_factor, cfg.levels)
        batch["tree_advantages"], batch["tree_owner"], batch["tree_values"] = adv, owner, values
        batch["advantages"] = adv * owner  # (metrics) the advantage of every trained segment
        if cfg.self_distillation:
            batch.update(self.distill_groups(batch, context.group_size))
        return batch

    def distill_schedule(self, step: int) -> tuple[float, float]:
        """``(lambda(t), tau(t))`` at optimizer step ``t``."""
        cfg = self.config
        progress = min(1.0, max(0.0, step / cfg.distill_horizon))
        lam = cfg.distill_lambda_max * math.expm1(cfg.distill_gamma * progress) / math.expm1(cfg.distill_gamma)
        tau = max(cfg.distill_tau_max * (1.0 - progress) ** cfg.distill_beta, 1e-6)
        return lam, tau

    def segment_views(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(noisy_ids [R, s, S], select [R, s, S])``: view ``l`` is the row's level-``l`` parent state and the
        positions its level-``l`` node decoded (up to the node's first stop token), on the segment's owner row."""
        if self.total_steps is None:
            raise RuntimeError("dtreerpo: check_rollout must run before the views (the tree follows the sampler's "
                               "steps)")
        bounds = branch_points(self.total_steps, self.config.levels)
        steps = response_field(batch, batch["step_map"])
        ids = batch["input_ids"]
        stops = torch.tensor(self.token_ids.stop_ids, device=ids.device)
        noisy, select = [], []
        for level in range(self.config.levels):
            last = level == self.config.levels - 1
            in_parent = (steps >= 0) & (steps < bounds[level])
            in_node = (steps >= 0) & ((steps < bounds[level + 1]) | last)
            stop = in_node & torch.isin(ids, stops)
            before_stop = (stop.long().cumsum(-1) - stop.long()) == 0
            hidden = batch["generated"] & ~in_parent
            noisy.append(torch.where(hidden, torch.full_like(ids, self.token_ids.mask), ids))
            select.append(in_node & ~in_parent & before_stop & batch["tree_owner"][:, level:level + 1])
        return torch.stack(noisy, 1), torch.stack(select, 1)

    def siblings(self, level: int, group_size: int) -> int:
        """Nodes sharing a parent at level ``level``: the root branches of a prompt, then ``T``."""
        return group_size // self.leaves_per_node(0) if level == 0 else self.config.branch_factor

    def distill_groups(self, batch: TensorDict, group_size: int) -> dict[str, torch.Tensor]:
        """The sibling groups of the self-distillation term, stored on every segment-owner row of each group (so a
        micro-batch holding any part of a group computes that group's targets exactly as the whole batch would).
        Needs whole groups, i.e. the rollout batch of ``assign_advantages``; ``K`` = the most siblings of a parent:

        * ``distill_advantages [R, s, K]``: the local advantages of the group's positive siblings (``-inf`` padding;
          all ``-inf`` on rows of a group without a distillation target: no positive sibling, or one member);
        * ``distill_active [R, s, S, K]``: the positions each positive sibling's segment decoded (its ``select``);
        * ``distill_slot [R, s]``: the row's own slot among its group's positive siblings (-1: not one);
        * ``distill_first [R, s]``: the group's first row, which counts the group's (group, position) pairs.

        They do not depend on the optimizer step; :meth:`distill_weights` applies ``tau(t)`` and ``lambda(t)``."""
        _, select = self.segment_views(batch)
        rows, levels, width = select.shape
        slots = max(self.siblings(level, group_size) for level in range(levels))
        advantages = torch.full((rows, levels, slots), -math.inf, dtype=torch.float32)
        active = torch.zeros(rows, levels, width, slots, dtype=torch.bool)
        slot = torch.full((rows, levels), -1, dtype=torch.long)
        first = torch.zeros(rows, levels, dtype=torch.bool)
        index, adv = batch["rollout_index"], batch["tree_advantages"]
        for level in range(levels):
            parent_size = self.leaves_per_node(level) * self.config.branch_factor if level else group_size
            groups = index // parent_size
            owners = batch["tree_owner"][:, level]
            for group in torch.unique(groups[owners]).tolist():
                members = (owners & (groups == group)).nonzero().squeeze(-1)
                positive = members[adv[members, level] > 0]
                if members.numel() <= 1 or positive.numel() == 0:
                    continue
                count = positive.numel()
                advantages[members, level, :count] = adv[positive, level].float()
                active[members, level, :, :count] = select[positive, level].T
                slot[positive, level] = torch.arange(count)
                first[members[0], level] = True
        return {"distill_advantages": advantages, "distill_active": active, "distill_slot": slot,
                "distill_first": first}

    def distill_weights(self, batch: TensorDict, select: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [R, s, S], pairs [R])``: ``lambda(t) q``-weights of the self-distillation cross-entropy on each
        segment token, and the (sibling group, position) pairs counted on each group's first row. Computed from the
        whole sibling groups stored per row by :meth:`distill_groups`, so they do not depend on micro-batching."""
        lam, tau = self.distill_schedule(step)
        adv = batch["distill_advantages"].float()  # [R, s, K]
        valid = torch.isfinite(adv)
        targeted = valid.any(-1, keepdim=True)  # rows of a group with a distillation target
        w = torch.softmax(torch.where(targeted, adv / tau, 0.0), -1) * valid  # softmax over the positive siblings
        active = batch["distill_active"]  # [R, s, S, K]
        total = (w[:, :, None, :] * active).sum(-1)  # [R, s, S] per position
        slot = batch["distill_slot"]
        own = w.gather(-1, slot.clamp(min=0)[..., None])  # [R, s, 1]
        mine = select & (slot >= 0)[..., None]
        weights = torch.where(mine, own / total.clamp(min=1e-12), 0.0) * lam
        pairs = ((total > 0) & batch["distill_first"][..., None]).sum((1, 2)).to(torch.float64)
        return weights.float(), pairs

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        batch["noisy_ids"], batch["select"] = self.segment_views(batch)
        batch["tree_tokens"] = batch["select"].sum(-1).to(torch.float32)  # [R, s] tokens per segment
        if self.config.self_distillation:
            batch["distill_weight"], batch["distill_pairs"] = self.distill_weights(batch, batch["select"], step)
        return batch

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["segments"] = batch["tree_owner"].sum().to(torch.float64)
        out["segment_tokens"] = batch["select"].sum().to(torch.float64)
        if self.config.self_distillation:
            out["distill_pairs"] = batch["distill_pairs"].sum()
        return out

    def num_terms(self, batch: TensorDict) -> int:
        return self.config.levels

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        cfg = self.config
        logp = estimates["logp"]
        old = self.old_term(batch, "logp", k, logp)
        select = batch["select"][:, k]
        adv = batch["tree_advantages"][:, k:k + 1].float()
        per_token, clipped = clipped_surrogate(logp, old, adv, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        segment = select.float() / batch["tree_tokens"][:, k:k + 1].clamp(min=1)  # token mean per segment
        weight = segment / totals["segments"].clamp(min=1).float()
        loss = (per_token * weight).sum()
        tokens = totals["segment_tokens"].clamp(min=1).float()
        metrics = {"policy/clip_frac": (clipped & select).float().sum().detach() / tokens,
                   "policy/logp": (logp.detach() * select).sum() / tokens}
        if cfg.kl_coef > 0:
            kl = kl_estimate(logp, self.term(batch, "ref_logp", k), cfg.kl_estimator)
            loss = loss + cfg.kl_coef * (kl * weight).sum()
            metrics["policy/kl"] = (kl.detach() * weight).sum()
        if cfg.self_distillation:
            pairs = totals["distill_pairs"].clamp(min=1).float()
            distill = -(batch["distill_weight"][:, k] * logp).sum() / pairs
            loss = loss + distill
            metrics["distill/cross_entropy"] = distill.detach()
        return loss, metrics
