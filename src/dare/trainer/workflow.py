"""Pieces of the RL / preference workflow shared by the batch sources: the reference policy and attaching old /
reference estimates to stored views (evaluation-mode forwards: :func:`dare.models.loading.evaluating`).

The workflow of one rollout step (``algorithms.md`` §0.3)::

    rollout (current policy, no grad)  ->  reward  ->  advantage (algorithm hook)
    for each inner step k < mu:  views_k = algorithm.corrupt(batch, step + k)        # stored corruptions
                                 old_k   = algorithm.estimate(policy, views_k)        # no grad, if mu > 1, k > 0
                                 ref_k   = algorithm.estimate(reference, views_k)     # no grad, if beta > 0
    optimizer step step + k uses views_k, old_k, ref_k                               # identical inputs

Old and reference quantities are the algorithm's own ``estimate`` outputs (``algorithm.logprob_keys``) stored
under ``old_<key>`` / ``ref_<key>``, so every estimator (one-step, coupled, MC-ELBO, trajectory replay) gets
its ratio and KL terms on exactly the inputs the update will use. At ``k = 0`` the optimizer step still trains
the policy that made the rollouts, so its old estimates are the current ones: they are not computed, and the loss
uses the current estimates detached (``old_or_detached``: ratio 1, as with ``mu = 1``). That saves one of the
``mu`` old forwards per rollout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection

import torch
from tensordict import TensorDict

from dare.models.loading import evaluating


class Reference:
    """The frozen reference policy of KL terms and DPO.

    With LoRA the reference is the policy itself with its adapter disabled (peft ``disable_adapter``), so no
    second copy of the weights exists; otherwise ``frozen`` is a separate frozen model (sharded like the
    policy under FSDP). Use as ``with reference.model() as ref: ...``.
    """

    def __init__(self, policy, frozen=None):
        self.policy = policy
        self.frozen = frozen

    @contextlib.contextmanager
    def model(self):
        if self.frozen is not None:
            yield self.frozen
            return
        if not hasattr(self.policy, "disable_adapter"):
            raise TypeError("a reference without a frozen copy needs a peft (LoRA) policy")
        with evaluating(self.policy), self.policy.disable_adapter():
            yield self.policy


@torch.no_grad()
def attach_estimates(algorithm, batch: TensorDict, model, prefix: str) -> TensorDict:
    """Store ``algorithm.estimate(model, batch)[key]`` as ``batch[prefix + key]`` for every ``logprob_keys`` key
    (computed in eval mode without gradients, on the views already in ``batch``)."""
    with evaluating(model):
        estimates = algorithm.estimate(model, batch)
    for key in algorithm.logprob_keys:
        batch[prefix + key] = estimates[key].detach().float()
    return batch


def corrupted(algorithm, batch: TensorDict, step: int) -> TensorDict:
    """``algorithm.corrupt(batch, step)``: the batch it returns, or ``batch`` itself when it returns None (edited in
    place, as ``assign_advantages`` may); anything else is a one-line :class:`~dare.errors.PluginError`."""
    out = algorithm.corrupt(batch, step)
    if out is None:
        return batch
    if not isinstance(out, TensorDict):
        from dare.errors import PluginError, described

        raise PluginError(f"algorithm '{algorithm.name}': corrupt returned {described(out)}; return the batch (a "
                          "TensorDict), or None after editing it in place")
    return out


def prepare_micro_batches(algorithm, batches: list[TensorDict], steps: list[int], policy=None,
                          reference: Reference | None = None, device=None,
                          precision=contextlib.nullcontext, on_policy_steps: Collection[int] = ()) -> list[TensorDict]:
    """Corrupt ``batches[i]`` for optimizer step ``steps[i]`` and attach old / reference estimates as the algorithm
    needs them (``needs.old_logprobs`` / ``needs.reference``), inside ``precision()`` (the trainer's autocast, so
    old and current log-probs are computed alike). Returns the batches on the CPU.

    ``on_policy_steps``: steps whose update still trains the policy that made the rollouts (the first inner step of
    a rollout). Their old estimates would equal the current ones, so none are attached: the losses fall back to the
    current estimates, detached (ratio exactly 1; no dropout or train / eval-mode difference in it).

    The policy's eval mode and the reference context are entered once for all batches: each entry walks every
    module (with LoRA, disabling the adapter costs ~0.25 s of host time on LLaDA-8B), so doing it per micro-batch
    and inner step would add seconds to every rollout step. Each batch visits ``device`` one at a time.
    """
    if len(batches) != len(steps):
        raise ValueError(f"{len(batches)} batches for {len(steps)} steps")
    batches = [corrupted(algorithm, batch, step) for batch, step in zip(batches, steps)]
    needs = algorithm.needs
    if needs.reference and reference is None:
        raise RuntimeError(f"algorithm '{algorithm.name}' needs a reference model")
    stale = [i for i, step in enumerate(steps) if step not in on_policy_steps]  # the policy has moved by then
    passes = ([("old_", contextlib.nullcontext(policy), stale)] if needs.old_logprobs and stale else []) + \
        ([("ref_", reference.model(), range(len(batches)))] if needs.reference else [])
    for prefix, context, indices in passes:
        with precision(), context as model, evaluating(model):
            for i in indices:
                batch = batches[i]
                on_device = batch.to(device) if device is not None else batch
                batches[i] = attach_estimates(algorithm, on_device, model, prefix).to("cpu")
    return batches


def prepare_micro_batch(algorithm, batch: TensorDict, step: int, policy=None, reference: Reference | None = None,
                        device=None, precision=contextlib.nullcontext) -> TensorDict:
    """:func:`prepare_micro_batches` of one batch."""
    return prepare_micro_batches(algorithm, [batch], [step], policy, reference, device, precision)[0]


__all__ = ["Reference", "attach_estimates", "prepare_micro_batch", "prepare_micro_batches"]
