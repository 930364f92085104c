"""Pieces of the RL / preference workflow shared by the batch sources: the reference policy, evaluation-mode
forwards, and attaching old / reference estimates to stored views.

The workflow of one rollout step (``algorithms.md`` §0.3)::

    rollout (current policy, no grad)  ->  reward  ->  advantage (algorithm hook)
    for each inner step k < mu:  views_k = algorithm.corrupt(batch, step + k)        # stored corruptions
                                 old_k   = algorithm.estimate(policy, views_k)        # no grad, if mu > 1
                                 ref_k   = algorithm.estimate(reference, views_k)     # no grad, if beta > 0
    optimizer step step + k uses views_k, old_k, ref_k                               # identical inputs

Old and reference quantities are the algorithm's own ``estimate`` outputs (``algorithm.logprob_keys``) stored
under ``old_<key>`` / ``ref_<key>``, so every estimator (one-step, coupled, MC-ELBO, trajectory replay) gets
its ratio and KL terms on exactly the inputs the update will use.
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict


@contextlib.contextmanager
def evaluating(model):
    """Eval mode (no dropout) for the duration of the block, then the previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


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


def prepare_micro_batch(algorithm, batch: TensorDict, step: int, policy=None, reference: Reference | None = None,
                        device=None, precision=contextlib.nullcontext) -> TensorDict:
    """Corrupt ``batch`` for optimizer step ``step`` and attach old / reference estimates as the algorithm
    needs them (``needs.old_logprobs`` / ``needs.reference``), inside ``precision()`` (the trainer's autocast,
    so old and current log-probs are computed alike). Returns the batch on the CPU."""
    batch = algorithm.corrupt(batch, step)
    needs = algorithm.needs
    if needs.old_logprobs or needs.reference:
        on_device = batch.to(device) if device is not None else batch
        with precision():
            if needs.old_logprobs:
                attach_estimates(algorithm, on_device, policy, "old_")
            if needs.reference:
                if reference is None:
                    raise RuntimeError(f"algorithm '{algorithm.name}' needs a reference model")
                with reference.model() as ref:
                    attach_estimates(algorithm, on_device, ref, "ref_")
        batch = on_device.to("cpu")
    return batch


__all__ = ["Reference", "attach_estimates", "evaluating", "prepare_micro_batch"]
