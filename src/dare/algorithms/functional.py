"""Pure tensor math shared by the RL / preference algorithm plug-ins (algorithms.md).

Nothing here touches a model: inputs are log-probabilities, rewards and masks; outputs are losses,
advantages and statistics. Every function documents the algorithms.md section it implements.

Shape conventions: ``N`` rollouts (``N = num_prompts * G``, grouped contiguously, ``G`` per prompt),
``L`` completion length, ``K`` Monte-Carlo samples, ``T`` denoising steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dare.errors import ConfigError, InputError, unknown_choice

ADVANTAGE_MODES = ("mean", "zscore", "loo", "none")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0  # |log ratio| beyond this is clamped before exp (exp(20) ~ 5e8, finite in fp32)


# ---------------------------------------------------------------------------------------------------
# Advantages (algorithms.md §0.1, §0.3; 13b)
# ---------------------------------------------------------------------------------------------------
def _groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or values.shape[0] % group_size:
        raise InputError(f"{values.shape[0]} rollouts cannot be split into groups of {group_size}")
    return values.reshape(-1, group_size, *values.shape[1:])


def group_advantages(
    rewards: torch.Tensor, group_size: int, mode: str = "zscore", *, eps: float = 1e-4, unbiased_std: bool = True
) -> torch.Tensor:
    """GRPO-style advantages within each group of ``group_size`` consecutive rollouts.

    ``mean``: ``r - mean_G r`` (d1, CJ-GRPO, SPG, wd1); ``zscore``: ``(r - mean) / (std + eps)`` (verl's
    GRPO default, BGPO/EBPO); ``loo``: leave-one-out ``r_i - mean_{k != i} r_k`` (Coupled-GRPO);
    ``none``: the raw reward. ``unbiased_std=False`` gives the population std (TraceRL), and groups
    whose std is 0 get advantage 0 in z-score mode. ``rewards`` may be ``[N]`` or ``[N, S]`` (per step,
    MDPO), normalised along the group axis.
    """
    if mode not in ADVANTAGE_MODES:
        raise unknown_choice("advantage mode", mode, ADVANTAGE_MODES)
    r = _groups(rewards.float(), group_size)
    mean = r.mean(dim=1, keepdim=True)
    if mode == "mean":
        adv = r - mean
    elif mode == "zscore":
        std = r.std(dim=1, keepdim=True, unbiased=unbiased_std) if group_size > 1 else torch.zeros_like(mean)
        adv = torch.where(std > 0, (r - mean) / (std + eps), torch.zeros_like(r))
    elif mode == "loo":
        if group_size < 2:
            raise ConfigError("leave-one-out advantages need a group size of at least 2")
        adv = r - (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    else:
        adv = r
    return adv.reshape(rewards.shape)


def mdpo_step_advantages(step_rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """MDPO per-step advantages (algorithms.md §5).

    ``step_rewards [N, T]`` are the verifier rewards of the decoded prediction at every denoising step.
    ``Â_s = (r_s - r_{s-1}) + 1 + F_s`` with ``r_{-1} = 0``, ``F_s = mean(r_{s+1..T-1})`` and
    ``F_{T-1} = r_{T-1}``; then a z-score per step across the group (population std is not used by the
    reference: it uses ``std`` + 1e-4, the unbiased estimator).
    """
    r = step_rewards.float()
    prev = F.pad(r[:, :-1], (1, 0))
    T = r.shape[1]
    suffix_sum = r.flip(1).cumsum(1).flip(1)  # sum_{s'>=s} r_s'
    counts = torch.arange(T - 1, -1, -1, device=r.device, dtype=r.dtype)  # number of steps after s
    future = torch.where(counts > 0, (suffix_sum - r) / counts.clamp(min=1), r[:, -1:].expand_as(r))
    raw = (r - prev) + 1.0 + future
    g = _groups(raw, group_size)
    adv = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps) if group_size > 1 else torch.zeros_like(g)
    return adv.reshape(raw.shape)


def top_advantage_steps(step_advantages: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` steps with the largest ``sum_batch |A_s|`` (MDPO step selection)."""
    score = step_advantages.abs().sum(0)
    return torch.topk(score, min(k, score.numel())).indices.sort().values


# ---------------------------------------------------------------------------------------------------
# KL estimators and the clipped surrogate (algorithms.md §0.3)
# ---------------------------------------------------------------------------------------------------
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from samples of ``pi``.

    ``k1 = log pi - log pi_ref``; ``k2 = 0.5 (log pi - log pi_ref)^2`` (MDPO); ``k3 = exp(ref - logp) -
    (ref - logp) - 1`` (d1, Coupled-GRPO, CJ-GRPO, TraceRL; always >= 0). For k3 the log-ratio is clamped
    to ``±20`` so ``exp`` never overflows.
    """
    if kind not in KL_ESTIMATORS:
        raise unknown_choice("KL estimator", kind, KL_ESTIMATORS)
    delta = ref_logp - logp
    if kind == "k1":
        return -delta
    if kind == "k2":
        return 0.5 * delta.pow(2)
    delta = delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(delta) - delta


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO per-token loss ``-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)`` and the clipped mask.

    ``advantages`` broadcast against ``logp`` (``[N, 1]`` for sequence-level advantages). With
    ``dual_clip = c`` (> 1) the loss of negative-advantage tokens is additionally capped at ``-c A``
    (verl's dual clip). Returns ``(loss, clipped)`` where ``clipped`` marks tokens whose gradient the
    clip removed.
    """
    eps_high = eps_low if eps_high is None else eps_high
    log_ratio = (logp - old_logp).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ConfigError(f"dual_clip must be > 1 (got {dual_clip})")
        cap = -advantages * dual_clip
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap.expand_as(loss), loss)
        clipped = clipped | capped
    return loss, clipped


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | torch.Tensor | None = None) -> torch.Tensor:
    """``sum(values * mask) / denominator`` (default ``max(sum(mask), 1)``)."""
    mask = mask.to(values.dtype)
    total = (values * mask).sum()
    if denominator is None:
        denominator = mask.sum().clamp(min=1.0)
    return total / denominator


# ---------------------------------------------------------------------------------------------------
# wd1 (algorithms.md §3.2)
# ---------------------------------------------------------------------------------------------------
def wd1_loss(seq_logp: torch.Tensor, advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """``-sum_i w+_i S_i + sum_i w-_i S_i`` with ``w± = softmax(±A)`` inside each group, summed over groups.

    ``seq_logp [N]`` is the token-sum ``S_i`` of the one-step log-probs over the completion mask.
    """
    s = _groups(seq_logp, group_size)
    a = _groups(advantages.float(), group_size)
    w_pos, w_neg = torch.softmax(a, dim=1), torch.softmax(-a, dim=1)
    return (-(w_pos * s) + (w_neg * s)).sum()


# ---------------------------------------------------------------------------------------------------
# Coupled-GRPO (algorithms.md §4)
# ---------------------------------------------------------------------------------------------------
def coupled_logp(
    full_logp: torch.Tensor, logp_a: torch.Tensor, logp_b: torch.Tensor, in_a: torch.Tensor, t: torch.Tensor | float
) -> torch.Tensor:
    """``½[log p(y|z0) + (j in C ? log p(y|z1)/t : log p(y|z2)/(1-t))]`` per completion token.

    ``z0`` masks the whole completion, ``z1`` masks ``C`` (``in_a``), ``z2`` masks the complement; every
    token is scored once across the complementary pair. ``t`` is a scalar or ``[N, 1]``.
    """
    t = torch.as_tensor(t, dtype=full_logp.dtype, device=full_logp.device)
    pair = torch.where(in_a, logp_a / t, logp_b / (1.0 - t))
    return 0.5 * (full_logp + pair)


# ---------------------------------------------------------------------------------------------------
# SPG (algorithms.md §7)
# ---------------------------------------------------------------------------------------------------
def spg_elbo(token_logp: torch.Tensor, masked: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """ELBO-type sequence estimate ``mean_k [sum_{j in M_k} m_j log p / sum_j m_j 1[j in M_k]]``.

    ``token_logp, masked [N, K, L]`` (log-prob of y_j in MC sample k, whether j was masked in sample k),
    ``completion_mask [N, L]``. Samples with no masked completion token contribute 0 (guarded).
    """
    m = masked & completion_mask[:, None, :].bool()
    per_sample = (token_logp * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_sample.mean(dim=1)


def spg_eubo(token_logp: torch.Tensor, masked: torch.Tensor, completion_mask: torch.Tensor, beta: float) -> torch.Tensor:
    """EUBO-type sequence estimate ``(1/beta) mean_{j: q_j > 0} log q_j``.

    ``t̂_k = |M_k ∩ m| / |m|``, ``q_j = mean_k[1[j in M_k] m_j p_j^beta / t̂_k]``; computed in log space
    (fp32 logsumexp) so ``p^beta`` cannot underflow. Tokens never masked in any sample are excluded.
    """
    m = masked & completion_mask[:, None, :].bool()
    K = masked.shape[1]
    n_comp = completion_mask.sum(-1).clamp(min=1).float()  # |m|
    t_hat = m.sum(-1).float() / n_comp[:, None]  # [N, K]
    log_terms = beta * token_logp.float() - torch.log(t_hat.clamp(min=1e-12))[..., None]
    log_terms = torch.where(m, log_terms, torch.full_like(log_terms, -math.inf))
    log_q = torch.logsumexp(log_terms, dim=1) - math.log(K)  # [N, L]
    valid = m.any(dim=1)
    log_q = torch.where(valid, log_q, torch.zeros_like(log_q))
    return (log_q * valid).sum(-1) / valid.sum(-1).clamp(min=1) / beta


def spg_loss(seq_estimate: torch.Tensor, advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``-sum_i |y_i| A_i l_i / sum_i |y_i|`` (REINFORCE on the sandwiched likelihood, no ratio/clip/KL)."""
    lengths = lengths.to(seq_estimate.dtype)
    return -(lengths * advantages * seq_estimate).sum() / lengths.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------------
# BGPO (algorithms.md §8) and EBPO (§9)
# ---------------------------------------------------------------------------------------------------
def bgpo_ratio(elbo_term: torch.Tensor, old_elbo_term: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Per-MC-term surrogate ratio: ``1 + Δ_k`` (tangent of exp) for ``A > 0``, ``exp(Δ_k)`` otherwise.

    Both are lower bounds of ``A * exp(mean Δ)`` whose value and gradient coincide on-policy. The
    positive branch is computed directly (not ``exp(log(1 + Δ))``, which is NaN for ``Δ <= -1``).
    """
    delta = (elbo_term - old_elbo_term).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.where(advantages > 0, 1.0 + delta, torch.exp(delta))


def ratio_policy_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, eps: float = 0.2, dual_clip: float | None = 3.0
) -> torch.Tensor:
    """``-min(r A, clip(r) A)`` (+ dual clip for ``A < 0``) for an explicit ratio (BGPO applies it per MC term)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps, 1.0 + eps)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss


def ebpo_sequence_losses(
    elbo: torch.Tensor, old_elbo: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample sequence-level PPO loss on the composite ELBO in log space (algorithms.md §9) and the clipped mask.

    ``log rho = Ê_θ - Ê_old`` (computed in fp32), clipped to ``[log(1-eps_low), log(1+eps_high)]``; the loss
    ``max(-A rho, -A clip(rho))`` equals the one-sided clip of the sign of A (the usual PPO pessimism) and never
    exponentiates beyond ``exp(20)``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    log_ratio = (elbo.float() - old_elbo.float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    clipped = log_ratio.clamp(math.log(1.0 - eps_low), math.log(1.0 + eps_high))
    advantages = advantages.float()
    unclipped_loss, clipped_loss = -advantages * torch.exp(log_ratio), -advantages * torch.exp(clipped)
    return torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


def ebpo_sequence_loss(
    elbo: torch.Tensor, old_elbo: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None
) -> torch.Tensor:
    """:func:`ebpo_sequence_losses` averaged over samples."""
    return ebpo_sequence_losses(elbo, old_elbo, advantages, eps_low, eps_high)[0].mean()


# ---------------------------------------------------------------------------------------------------
# VRPO / DPO (algorithms.md §2)
# ---------------------------------------------------------------------------------------------------
def dpo_loss(
    policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float
) -> torch.Tensor:
    """``-log sigmoid(beta [(B_θ(y_w) - B_ref(y_w)) - (B_θ(y_l) - B_ref(y_l))])`` averaged over pairs."""
    logits = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(logits).mean()


# ---------------------------------------------------------------------------------------------------
# Trajectories: CJ-GRPO (§6) and TraceRL (§10)
# ---------------------------------------------------------------------------------------------------
def _group_keys(values: torch.Tensor, valid: torch.Tensor, groups: torch.Tensor | None):
    """Distinct ``(row, group, value)`` triples of the valid positions, sorted.

    Returns ``(distinct values [U], inverse [n_valid], rank [U], count [U])``: ``rank`` is each distinct value's
    0-based rank inside its (row, group), ``count`` the number of distinct values of that (row, group).
    """
    valid = valid.bool()
    rows = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(values)
    groups = torch.zeros_like(values) if groups is None else groups.to(values.device).long()
    v, g, r = values[valid].long(), groups[valid], rows[valid]
    if v.numel() == 0:
        empty = v.new_zeros(0)
        return empty, empty, empty, empty
    if bool((v < 0).any()) or bool((g < 0).any()):
        raise InputError("step ids and group ids of valid positions must be >= 0")
    span = int(v.max()) + 1
    width = int(g.max()) + 1
    key = (r * width + g) * span + v
    distinct, inverse = torch.unique(key, sorted=True, return_inverse=True)
    group_key = distinct // span
    first = torch.searchsorted(distinct, group_key * span)
    after = torch.searchsorted(distinct, (group_key + 1) * span)
    rank = torch.arange(distinct.numel(), device=values.device) - first
    return distinct % span, inverse, rank, after - first


def step_ranks(step_map: torch.Tensor, valid: torch.Tensor, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Dense rank of every valid position's step id among the distinct step ids of its row and group (``groups``:
    e.g. the block of each position; None = one group per row); -1 elsewhere. TraceRL's round of a token:
    round ``r`` holds, in every block, the tokens of that block's ``r``-th distinct (shrunk) step."""
    out = torch.full_like(step_map, -1)
    _, inverse, rank, _ = _group_keys(step_map, valid, groups)
    out[valid.bool()] = rank[inverse] if inverse.numel() else out[valid.bool()]
    return out


def shrink_step_map(step_map: torch.Tensor, valid: torch.Tensor, shrink: int, block_size: int | None = None, *,
                    groups: torch.Tensor | None = None) -> torch.Tensor:
    """TraceRL shrinkage (algorithms.md §10): group each row's sorted distinct step ids (per group: ``groups``
    gives each position's block, or ``block_size`` cuts the columns into blocks from column 0; neither = the
    whole row) in consecutive runs of ``shrink`` and map every id to its run's last id. Invalid positions: -1."""
    if shrink < 1:
        raise ConfigError(f"shrink must be >= 1; got {shrink}")
    if groups is None and block_size is not None:
        groups = (torch.arange(step_map.shape[1], device=step_map.device) // block_size)[None].expand_as(step_map)
    out = torch.full_like(step_map, -1)
    values, inverse, rank, count = _group_keys(step_map, valid, groups)
    if inverse.numel() == 0:
        return out
    last = torch.minimum((rank // shrink + 1) * shrink - 1, count - 1)  # rank of the run's last id
    index = torch.arange(values.numel(), device=values.device) - rank + last
    out[valid.bool()] = values[index][inverse]
    return out


def gae_over_steps(
    step_rewards: torch.Tensor, step_values: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a trajectory's denoising steps (TraceRL with a value model, algorithms.md §10).

    ``step_rewards, step_values [S]`` are step-level means ``r*_k, V*_k`` in decoding order.
    Returns step advantages ``A*_k = δ*_k + γλ A*_{k+1}`` and returns ``R*_k = r*_k + γ R*_{k+1}``
    with ``δ*_k = r*_k - V*_k + γ V*_{k+1}`` (terminal values 0).
    """
    S = step_rewards.shape[0]
    adv = torch.zeros_like(step_values, dtype=torch.float32)
    ret = torch.zeros_like(adv)
    next_adv = next_ret = next_value = 0.0
    for k in range(S - 1, -1, -1):
        delta = step_rewards[k] - step_values[k] + gamma * next_value
        next_adv = delta + gamma * lam * next_adv
        next_ret = step_rewards[k] + gamma * next_ret
        adv[k], ret[k] = next_adv, next_ret
        next_value = step_values[k]
    return adv, ret


def tracerl_token_advantages(
    token_rewards: torch.Tensor,
    token_values: torch.Tensor,
    token_steps: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level TraceRL advantages/returns of one trajectory (algorithms.md §10).

    ``token_steps [L]`` are (shrunk) step ids, ``-1`` for tokens outside the trajectory. With step means
    ``r*_k, V*_k`` and step-level GAE ``A*_k, R*_k`` (:func:`gae_over_steps`), a token of step k gets
    ``A_j = (r_j - V_j) + γ V*_{k+1} + γλ A*_{k+1}`` and ``R_j = r_j + γ R*_{k+1}``. With ``γ = λ = 1``
    this is ``A_j = R_j - V_j``.
    """
    valid = token_steps >= 0
    adv = torch.zeros_like(token_rewards, dtype=torch.float32)
    ret = torch.zeros_like(adv)
    if not valid.any():
        return adv, ret
    steps, index = torch.unique(token_steps[valid], return_inverse=True)
    S = steps.numel()
    r = token_rewards[valid].float()
    v = token_values[valid].float()
    r_star = torch.zeros(S).index_add_(0, index, r) / torch.bincount(index, minlength=S)
    v_star = torch.zeros(S).index_add_(0, index, v) / torch.bincount(index, minlength=S)
    a_star, R_star = gae_over_steps(r_star, v_star, gamma, lam)
    zero = torch.zeros(1)
    next_v, next_a, next_R = (torch.cat([x[1:], zero]) for x in (v_star, a_star, R_star))
    adv[valid] = (r - v) + gamma * next_v[index] + gamma * lam * next_a[index]
    ret[valid] = r + gamma * next_R[index]
    return adv, ret


def transition_weights(select: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Block-diffusion CJ-GRPO weights (algorithms.md §6): tokens averaged within each (sample, block, local
    step) transition, transitions averaged within the sample: ``w = 1 / (|U_ibk| T_i)`` at the selected tokens.

    ``select [N, K, L]`` marks the tokens committed at local step ``k``; ``groups [N, L]`` is each position's
    block. Every sample with a transition has total weight 1; 0 elsewhere."""
    rows, steps, _ = select.shape
    blocks = groups.long()[:, None].expand_as(select)
    width = int(blocks.max()) + 1 if blocks.numel() else 1
    key = (torch.arange(rows, device=select.device)[:, None, None] * steps
           + torch.arange(steps, device=select.device)[None, :, None]) * width + blocks
    counts = torch.zeros(rows * steps * width, device=select.device).index_add_(
        0, key[select], torch.ones(int(select.sum()), device=select.device))
    transitions = (counts.reshape(rows, -1) > 0).sum(-1).float()  # T_i
    weight = 1.0 / (counts[key] * transitions[:, None, None]).clamp(min=1)
    return torch.where(select, weight, torch.zeros_like(weight))


def step_partition(step_map: torch.Tensor, completion_mask: torch.Tensor) -> list[torch.Tensor]:
    """CJ-GRPO's ``U_s``: for every step id present, the boolean ``[N, L]`` set of tokens committed at it."""
    valid = completion_mask.bool() & (step_map >= 0)
    return [(step_map == s) & valid for s in torch.unique(step_map[valid]).tolist()]
