"""What a rollout returns: :class:`RolloutOutput` (and, on request, its :class:`Trajectory`).

Conventions (``B`` rows, ``P`` padded prompt width, ``G`` generated positions, ``S`` steps):

* **Steps are counted per row.** Step ``s`` of row ``b`` is the ``s``-th forward in which that row still had
  masked positions in its current block (0-based). Rows of a batch share forwards, but a row whose block is
  already filled while another row's is not does not advance its step counter and draws no random numbers,
  so a row's steps, samples and step map are the same whether it is decoded alone or in any batch.
* ``step_map[b, j]`` is the step at which completion position ``j`` was committed; every decoded position
  is committed exactly once (no remasking) and ``-1`` marks positions never decoded (after an early stop or
  past ``max_blocks``; they hold the pad id).
* ``logprobs[b, j]`` is the log-probability of the committed token under the distribution it was drawn
  from at that step: ``softmax(logits / T)`` restricted to the tokens that survive top-p/top-k and
  renormalised, in float32. The mask token is never proposed (it is removed from that distribution; a
  reference sampler that proposes it leaves the position masked). With ``T = 0`` (argmax) the log-prob is
  taken under the same distribution at temperature 1 (the point mass would always give 0). 0 for undecoded
  positions.
* ``confidence_map[b, j]`` is the decoder's selection confidence of the committed token at the step it was
  committed, in float32: for ``confidence="prob"`` the token's probability under the confidence distribution
  (which, unlike the sampling distribution, keeps the mask token: with ``T = 0``, no top-p/top-k and float32
  confidences it is ``exp(logprob) x (1 - p(mask))``); for ``margin`` / ``neg_entropy`` / ``random`` their score (not a probability). 0 for undecoded
  positions.
* ``completion_mask[b, j]`` is 1 up to and including the first stop token (EOS/EOT of the family) and 0
  after it and at undecoded positions.
* ``nfe`` counts model forward passes of the batch (each forward serves one step of every row still in it).
  A block's loop tests for remaining masks before each forward, so a block filled by its first forward costs
  no further one (Fast-dLLM's prefix/dual loops in some versions run one more cached forward there: README,
  Rollout, "NFE").
* Block samplers (:mod:`dare.rollout.block`) also return ``block_step_map``: the step counted from the start of
  the token's block. With LLaDA2.1 token editing a position can be written more than once; the step map,
  block step map, log-prob and confidence then describe its last write.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


def finished_rows(completion: torch.Tensor, mask_id: int, stop_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: rows whose first stop token is committed with every earlier position decoded."""
    is_stop = torch.isin(completion, stop_ids)
    either = is_stop | (completion == mask_id)
    first = either.to(torch.uint8).argmax(-1, keepdim=True)  # first mask-or-stop position
    return either.any(-1) & is_stop.gather(-1, first).squeeze(-1)


def completion_mask(completion: torch.Tensor, stop_ids, decoded: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, G]`` bool: positions up to and including the first stop token (all, if there is none)."""
    stops = torch.as_tensor(list(stop_ids), device=completion.device)
    is_stop = torch.isin(completion, stops).long()
    before = is_stop.cumsum(-1) - is_stop  # stop tokens strictly before each position
    mask = before == 0
    return mask if decoded is None else mask & decoded


@dataclass
class Trajectory:
    """Per-step record of a rollout (``record_trajectory=True``), padded to the longest row.

    Attributes:
        states: ``[B, S, G]`` completion before step ``s`` (mask id at undecided positions).
        predictions: ``[B, S, G]`` the state with the step's proposals filled in at its candidate positions
            (MDPO's ``x0_s``); candidates are the masked positions of the current block.
        confidences: ``[B, S, G]`` float32 selection score of each candidate (0 elsewhere).
        logprobs: ``[B, S, G]`` float32 log-probability of each proposal (0 elsewhere).
        candidates: ``[B, S, G]`` bool, positions eligible at step ``s``.
        transfers: ``[B, S, G]`` bool, positions committed at step ``s`` (CJ-GRPO's ``U_s``; they partition the
            decoded positions and equal ``step_map == s``).
        step_mask: ``[B, S]`` bool, valid steps of each row.
    """

    states: torch.Tensor
    predictions: torch.Tensor
    confidences: torch.Tensor
    logprobs: torch.Tensor
    candidates: torch.Tensor
    transfers: torch.Tensor
    step_mask: torch.Tensor

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def concat(cls, parts: list[Trajectory], mask_id: int) -> Trajectory:
        """The rows of ``parts`` in order, each padded to the longest part's steps as a single recording pads
        its rows (``mask_id`` in states and predictions, zeros elsewhere, ``step_mask`` False)."""
        length = max(part.step_mask.shape[1] for part in parts)

        def padded(part: Trajectory, name: str) -> torch.Tensor:
            value = getattr(part, name)
            missing = length - value.shape[1]
            if missing == 0:
                return value
            fill = mask_id if name in ("states", "predictions") else 0
            pad = value.new_full((value.shape[0], missing, *value.shape[2:]), fill)
            return torch.cat([value, pad], dim=1)

        return cls(**{f.name: torch.cat([padded(part, f.name) for part in parts]) for f in fields(cls)})


@dataclass
class RolloutOutput:
    """Result of :func:`dare.rollout.generate` (see the module docstring for the exact semantics).

    Attributes:
        sequences: ``[B, P + G]`` left-padded prompt followed by the completion.
        attention_mask: ``[B, P + G]`` 1 for real prompt tokens and for every completion position.
        prompt_length: ``P``, the padded prompt width (completion starts at this column).
        completion: ``[B, G]`` generated tokens.
        completion_mask: ``[B, G]`` bool, up to the first stop token inclusive.
        logprobs: ``[B, G]`` float32 log-probability of each committed token when it was sampled.
        step_map: ``[B, G]`` step at which each token was committed (-1: never decoded).
        num_steps: ``[B]`` denoising steps taken by each row.
        nfe: model forward passes of the whole batch.
        trajectory: per-step record when ``record_trajectory`` was set.
        block_step_map: ``[B, G]`` block samplers: step of each token counted from the start of its block
            (-1: never decoded); None for masked-diffusion samplers.
        confidence_map: ``[B, G]`` float32 selection confidence of each committed token at its commit step (0:
            never decoded); None when a sampler does not record it.
        given: ``[B, G]`` bool, positions taken from the ``canvas`` of :func:`dare.rollout.generate` (kept as
            given, never decoded: ``step_map`` -1, ``logprobs`` 0, inside ``completion_mask``); None without a
            canvas.
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_length: int
    completion: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    step_map: torch.Tensor
    num_steps: torch.Tensor
    nfe: int
    trajectory: Trajectory | None = None
    block_step_map: torch.Tensor | None = None
    confidence_map: torch.Tensor | None = None
    given: torch.Tensor | None = None

    @classmethod
    def concat(cls, outputs: list[RolloutOutput], mask_id: int | None = None) -> RolloutOutput:
        """The rows of ``outputs`` (chunks of one batch, same prompt width) in order, as one output. ``nfe`` is the
        largest chunk's: the forwards a row's batch took at most. Trajectories are joined with
        :meth:`Trajectory.concat` (``mask_id`` needed then)."""
        first = outputs[0]
        if any(o.prompt_length != first.prompt_length for o in outputs):
            raise ValueError("chunks of one batch share its prompt width")
        trajectory = None
        if first.trajectory is not None:
            if mask_id is None or any(o.trajectory is None for o in outputs):
                raise ValueError("joining trajectories needs every chunk's and the mask id")
            trajectory = Trajectory.concat([o.trajectory for o in outputs], mask_id)

        def cat(name: str):
            values = [getattr(o, name) for o in outputs]
            return None if values[0] is None else torch.cat(values)

        return cls(sequences=cat("sequences"), attention_mask=cat("attention_mask"), prompt_length=first.prompt_length,
                   completion=cat("completion"), completion_mask=cat("completion_mask"), logprobs=cat("logprobs"),
                   step_map=cat("step_map"), num_steps=cat("num_steps"), nfe=max(o.nfe for o in outputs),
                   trajectory=trajectory, block_step_map=cat("block_step_map"),
                   confidence_map=cat("confidence_map"), given=cat("given"))

    def state(self, mask_id: int) -> torch.Tensor:
        """``[B, G]`` the canvas this rollout left: given and decoded tokens, ``mask_id`` at undecoded positions
        (the ``canvas`` to resume it with, e.g. after a ``step_range`` window)."""
        kept = self.step_map >= 0
        if self.given is not None:
            kept = kept | self.given
        return torch.where(kept, self.completion, torch.full_like(self.completion, mask_id))

    def to_tensordict(self):
        """The output as a ``tensordict.TensorDict`` with batch size ``[B]`` (trajectory under ``trajectory``;
        ``nfe`` and ``prompt_length`` repeated per row)."""
        from tensordict import TensorDict

        batch = self.sequences.shape[0]
        device = self.sequences.device
        data = {
            "sequences": self.sequences,
            "attention_mask": self.attention_mask,
            "completion": self.completion,
            "completion_mask": self.completion_mask,
            "logprobs": self.logprobs,
            "step_map": self.step_map,
            "num_steps": self.num_steps,
            "nfe": torch.full((batch,), self.nfe, device=device),
            "prompt_length": torch.full((batch,), self.prompt_length, device=device),
        }
        if self.block_step_map is not None:
            data["block_step_map"] = self.block_step_map
        if self.confidence_map is not None:
            data["confidence_map"] = self.confidence_map
        if self.given is not None:
            data["given"] = self.given
        if self.trajectory is not None:
            data["trajectory"] = TensorDict(self.trajectory.to_dict(), batch_size=[batch])
        return TensorDict(data, batch_size=[batch])


class TrajectoryRecorder:
    """Collects per-step records of the rows taking a step, then pads them into a :class:`Trajectory`."""

    def __init__(self):
        self._chunks: list[tuple[torch.Tensor, ...]] = []

    def record(self, rows: torch.Tensor, steps: torch.Tensor, state: torch.Tensor, predictions: torch.Tensor,
               confidences: torch.Tensor, logprobs: torch.Tensor, candidates: torch.Tensor,
               transfers: torch.Tensor) -> None:
        """Store the step ``steps[i]`` of batch row ``rows[i]`` (all tensors indexed by ``i``)."""
        self._chunks.append((rows, steps, state, predictions, confidences.float(), logprobs.float(), candidates,
                             transfers))

    def build(self, batch: int, gen_length: int, num_steps: torch.Tensor, mask_id: int) -> Trajectory:
        length = max(int(num_steps.max()) if num_steps.numel() else 0, 1)
        device = num_steps.device
        shape = (batch, length, gen_length)
        out = Trajectory(
            states=torch.full(shape, mask_id, dtype=torch.long, device=device),
            predictions=torch.full(shape, mask_id, dtype=torch.long, device=device),
            confidences=torch.zeros(shape, device=device),
            logprobs=torch.zeros(shape, device=device),
            candidates=torch.zeros(shape, dtype=torch.bool, device=device),
            transfers=torch.zeros(shape, dtype=torch.bool, device=device),
            step_mask=torch.arange(length, device=device)[None, :] < num_steps[:, None],
        )
        targets = (out.states, out.predictions, out.confidences, out.logprobs, out.candidates, out.transfers)
        for rows, steps, *values in self._chunks:
            for target, value in zip(targets, values):
                target[rows, steps] = value
        return out
