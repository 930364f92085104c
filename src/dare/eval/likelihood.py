"""Likelihood scoring of continuations under a diffusion LM: Monte-Carlo ELBO estimates.

A masked-diffusion model has no left-to-right factorisation, so ``log p(y | x)`` of a continuation ``y``
(an answer option) is estimated by the ELBO (``algorithms.md`` section 0)::

    ELBO(y | x) = E_l E_M [ (L / l) * sum_{j in M} log p(y_j | x, y with M masked) ]  <=  log p(y | x)

with ``l ~ U{1..L}`` masked tokens (``schedule="discrete"``, LLaDA's ``get_log_likelihood``) or a masking
ratio ``t ~ U(t_min, t_max)`` and weight ``1/t`` (``continuous``). ``n`` Monte-Carlo corruptions are drawn
with stratified levels (VRPO's one-mask-per-level allocation) from :func:`dare.diffusion.corrupt_mc`, seeded
by ``(seed, group)`` only: every option of one question (same ``group``) with the same token length gets
the **same** corruptions, so differences between options are not noise differences, and results do not
depend on batching or order. Identical corruptions (a one-token answer has only one) are evaluated once.

The prompt is never masked. Full-attention families score the row ``[x ; noisy y]``; block-causal
families (SDAR, LLaDA2) use the ``[noisy ; clean]`` two-copy forward, so each block of ``y`` is predicted
from the clean blocks before it (the block-diffusion ELBO): the training denoiser,
:func:`dare.algorithms.logprobs.denoiser_outputs`. Dream's logit shift comes from the family spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dare.errors import ConfigError, InputError, closest, unknown_choice

LENGTH_NORMS = {
    "none": "the summed ELBO (a log-likelihood bound)",
    "tokens": "ELBO / number of continuation tokens",
    "chars": "ELBO / number of continuation characters (lm-eval's acc_norm)",
}


@dataclass
class LikelihoodConfig:
    """How ``log p(continuation | prompt)`` is estimated (see the module docstring)."""

    mc_samples: int = 32
    """Monte-Carlo corruptions ``n`` per continuation (duplicates are evaluated once: a one-token answer
    costs one forward whatever ``n``)."""
    schedule: str = "discrete"
    """``discrete``: mask exactly ``l ~ U{1..L}`` tokens, weight ``L/l`` (LLaDA). ``continuous``: mask each
    token with probability ``t ~ U(t_min, t_max)``, weight ``1/t``."""
    stratified: bool = True
    """Spread the ``n`` masking levels over strata (lower variance); False = independent draws."""
    t_min: float = 1e-3
    """Lower end of ``t`` (continuous schedule)."""
    t_max: float = 1.0
    """Upper end of ``t`` (continuous schedule); ``t_min = t_max = 1`` masks the whole continuation."""
    length_norm: str = "none"
    """Option score used for the prediction: ``none`` (ELBO), ``tokens`` (per token), ``chars`` (per
    character). ``acc`` (none) and ``acc_norm`` (chars) are always reported as well."""
    full_logits: bool = False
    """Compute logits inside the model's forward (for wrappers such as FSDP that gather weights only there);
    default: run the LM head only on the masked answer positions."""

    @classmethod
    def from_dict(cls, values: dict) -> LikelihoodConfig:
        """Build from a mapping; an unknown key is a one-line error naming the closest valid key."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                hint = closest(key, names)
                raise ConfigError(f"unknown likelihood option '{key}'" + (f" (did you mean '{hint}'?)" if hint else ""))
        return cls(**values).validated()

    def validated(self) -> LikelihoodConfig:
        from dare.diffusion import ForwardProcess

        if not isinstance(self.mc_samples, int) or isinstance(self.mc_samples, bool) or self.mc_samples < 1:
            raise ConfigError(f"mc_samples must be a positive integer; got {self.mc_samples!r}")
        self.check_types()
        if self.length_norm not in LENGTH_NORMS:
            raise unknown_choice("length normalisation", self.length_norm, LENGTH_NORMS)
        ForwardProcess(schedule=self.schedule, t_low=self.t_min, t_high=self.t_max)  # validates both
        return self

    def check_types(self) -> None:
        """One-line :class:`ConfigError` for a field of the wrong type (``t_min='a'``, ``stratified='no'``), before a
        comparison with it fails with a stack trace or a truthy string is taken for True."""
        kinds = {"t_min": (int, float), "t_max": (int, float), "stratified": bool, "full_logits": bool,
                 "schedule": str, "length_norm": str}
        names = {int: "a number", bool: "True or False", str: "a string"}
        for name, kind in kinds.items():
            value = getattr(self, name)
            if not isinstance(value, kind) or (kind != bool and isinstance(value, bool)):
                expected = names[kind if isinstance(kind, type) else kind[0]]
                raise ConfigError(f"LikelihoodConfig.{name} must be {expected}; got {value!r}")

    @property
    def process(self):
        from dare.diffusion import ForwardProcess

        return ForwardProcess(schedule=self.schedule, t_low=self.t_min, t_high=self.t_max)


@dataclass(frozen=True)
class Request:
    """One continuation to score: ``context`` ids (never masked), ``continuation`` ids, noise ``group``."""

    context: Sequence[int]
    continuation: Sequence[int]
    group: int
    """Corruptions are seeded by ``(seed, group)``: give every option of a question the same group."""


@dataclass
class LikelihoodStats:
    """Work done by :func:`continuation_elbo`."""

    requests: int = 0
    rows: int = 0
    """Distinct corrupted rows forwarded (after removing duplicate corruptions)."""
    mc_terms: int = 0
    """Monte-Carlo terms estimated (requests x n)."""
    forwards: int = 0
    tokens: int = 0
    """Tokens in the forwarded rows (padding excluded)."""


# ------------------------------------------------------------------------------------- forwards

# ------------------------------------------------------------------------------------- estimator

def _corruptions(length: int, group: int, mask_id: int, config: LikelihoodConfig, seed: int):
    """``(mask [n, L] bool, p_mask [n] float)`` of a continuation of ``length`` tokens in ``group``."""
    from dare.diffusion import corrupt_mc

    ids = torch.zeros(1, length, dtype=torch.long)
    views = corrupt_mc(ids, torch.ones(1, length, dtype=torch.bool), torch.full((1, length), group), mask_id,
                       seed=seed, step=0, n=config.mc_samples, process=config.process, stratified=config.stratified)
    mask = views.mask[0]
    p_mask = views.p_mask[0].amax(-1)  # one level per sample (1 where nothing is maskable)
    return mask, p_mask


@torch.no_grad()
def continuation_elbo(model, requests: Sequence[Request], config: LikelihoodConfig | None = None, *, seed: int = 0,
                      batch_size: int = 16, progress: bool | str = False, stats: LikelihoodStats | None = None
                      ) -> torch.Tensor:
    """Per-sample Monte-Carlo ELBO terms ``[N, n]`` (float64) of every request's continuation given its
    context; ``terms.mean(1)`` is the estimate of ``log p(continuation | context)`` (a lower bound in
    expectation). ``batch_size`` counts corrupted rows per forward; rows are sorted by length. ``progress``: a
    transient bar (True), or one named by the text that keeps its final line (``dare eval run``'s end-of-run line,
    as generation's)."""
    from dare.algorithms.logprobs import denoiser_outputs
    from dare.models.loading import unwrap
    from dare.models.spec import family_of
    from dare.rollout.samplers import left_pad, model_device

    config = (config or LikelihoodConfig()).validated()
    spec = family_of(model)
    token_ids = spec.token_ids(model.config)
    head = None if config.full_logits else unwrap(model).head
    device = model_device(model)
    n = config.mc_samples
    stats = stats if stats is not None else LikelihoodStats()
    stats.requests += len(requests)
    stats.mc_terms += len(requests) * n

    # Distinct corrupted rows: (request, mask, p) -> which MC samples use it.
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    rows: list[tuple[int, torch.Tensor, float, list[int]]] = []
    for r, req in enumerate(requests):
        length = len(req.continuation)
        if length == 0:
            raise InputError(f"request {r}: empty continuation")
        key = (int(req.group), length)
        if key not in cache:
            cache[key] = _corruptions(length, int(req.group), token_ids.mask, config, seed)
        mask, p_mask = cache[key]
        distinct: dict[tuple[bytes, float], list[int]] = {}
        for m in range(n):
            distinct.setdefault((mask[m].numpy().tobytes(), float(p_mask[m])), []).append(m)
        for members in distinct.values():
            rows.append((r, mask[members[0]], float(p_mask[members[0]]), members))

    terms = torch.zeros(len(requests), n, dtype=torch.float64)
    order = sorted(range(len(rows)), key=lambda i: -(len(requests[rows[i][0]].context) + len(rows[i][1])))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    bar = None
    if progress:
        from dare.progress import progress_bar

        named = isinstance(progress, str)  # a named bar keeps its final line (dare eval run's end-of-run line)
        bar = progress_bar(len(rows), progress if named else "likelihood", unit="row", leave=named)
    for batch in batches:
        clean_rows, noisy_rows = [], []
        for i in batch:
            r, mask, _, _ = rows[i]
            req = requests[r]
            cont = torch.as_tensor(list(req.continuation), dtype=torch.long)
            noisy = torch.where(mask, torch.full_like(cont, token_ids.mask), cont)
            clean_rows.append([*req.context, *cont.tolist()])
            noisy_rows.append([*req.context, *noisy.tolist()])
        clean, attention_mask = left_pad(clean_rows, token_ids.pad, device)
        noisy, _ = left_pad(noisy_rows, token_ids.pad, device)
        width = clean.shape[1]
        layout = {} if bool(attention_mask.all()) else {"attention_mask": attention_mask}
        output = denoiser_outputs(model, noisy, clean, hidden=head is not None, **layout)
        # The hidden state predicting every masked continuation token (Dream: the previous position; the
        # first real token reuses its own, as ``FamilySpec.align_logits`` does).
        owner, hidden_pos, target_pos = [], [], []
        for b, i in enumerate(batch):
            mask = rows[i][1]
            start, first_real = width - len(mask), width - len(clean_rows[b])
            for j in torch.nonzero(mask).flatten().tolist():
                owner.append(b)
                target_pos.append(start + j)
                hidden_pos.append(max(start + j - spec.logit_shift, first_real))
        owner_t = torch.tensor(owner, dtype=torch.long, device=device)
        targets = clean[owner_t, torch.tensor(target_pos, dtype=torch.long, device=device)]
        picked = output[owner_t, torch.tensor(hidden_pos, dtype=torch.long, device=device)]
        logits = (picked if head is None else head(picked)).float()
        logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0].double().cpu()
        sums = torch.zeros(len(batch), dtype=torch.float64).index_add(0, owner_t.cpu(), logp)
        for b, i in enumerate(batch):
            r, _, p, members = rows[i]
            terms[r, members] = sums[b] / p
        stats.rows += len(batch)
        stats.forwards += 1
        stats.tokens += int(attention_mask.sum())
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return terms


def normalise(scores: torch.Tensor, tokens: Sequence[int], chars: Sequence[int], length_norm: str) -> torch.Tensor:
    """Option scores under a length normalisation (see :data:`LENGTH_NORMS`)."""
    if length_norm == "none":
        return scores
    lengths = torch.as_tensor(list(tokens if length_norm == "tokens" else chars), dtype=torch.float64)
    return scores / lengths.clamp_min(1)


__all__ = ["LENGTH_NORMS", "LikelihoodConfig", "LikelihoodStats", "Request",
           "continuation_elbo", "normalise"]
