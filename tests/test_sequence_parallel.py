"""Sequence parallelism (Ulysses, ``distributed.sequence_parallel``) under torchrun on CPU (gloo, FSDP2): 2 processes
(one sequence group of 2) and 4 processes (2 data groups x 2, and one group of 4) give the single-process loss and
gradients on the same global batch - SFT on a padded MDLM, packed Dream (shifted logits across shard boundaries,
grouped-query heads), block diffusion ([noisy ; clean] layout, packed and padded rows), d1 and BGPO RL steps - and
the corruption noise does not depend on the topology; one-line errors for degrees that cannot work. Rows (45 tokens,
two-copy rows of 90) do not divide the degrees, so the model's padding to equal shards is exercised too."""

from pathlib import Path

import pytest
import torch
from torchrun_helpers import run_torchrun

from dare.errors import ConfigError

SFT = ["mdlm_padded", "dream_packed", "block_packed", "block_padded"]
RL = ["rl_d1", "rl_sdar_bgpo"]
TOPOLOGIES = {  # name: (processes, sequence-parallel degree, variants); variants are spread over the runs (CI time)
    "sp2": (2, 2, ["mdlm_padded", "block_packed", *RL, "families"]),
    "dp2_sp2": (4, 2, ["mdlm_padded", "block_packed", "rl_d1"]),  # 2 data groups x 2: data sharding + sequence
    "sp4": (4, 4, ["dream_packed", "block_padded", "rl_sdar_bgpo", "families"]),  # 2 KV heads repeated for 4 ranks
}
CASES = [(t, v) for t, (_, _, variants) in TOPOLOGIES.items() for v in variants]


def run(out, nproc: int | None, degree: int = 1, variants: list[str] = ()):
    root = Path(__file__).resolve().parents[1]
    out.mkdir(parents=True)
    if nproc is None:
        import sp_worker

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): same round-off
        try:
            sp_worker.main(out)
        finally:
            torch.set_num_threads(threads)
    else:
        run_torchrun(root / "tests" / "sp_worker.py", [out, degree, ",".join(variants)], out, nproc=nproc,
                     timeout=900)
    return torch.load(out / "result.pt", weights_only=False)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    out = {"single": run(root / "single", None)}
    for name, (nproc, degree, variants) in TOPOLOGIES.items():
        out[name] = run(root / name, nproc, degree, variants)
    return out


def assert_grads_equal(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys() and ours
    for name, grad in ours.items():
        torch.testing.assert_close(theirs[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(("topology", "variant"), [c for c in CASES if c[1] in SFT])
def test_sft_loss_gradients_and_noise_match_single_process(results, topology, variant):
    single, sharded = results["single"][variant], results[topology][variant]
    assert results[topology]["world_size"] == TOPOLOGIES[topology][0]
    assert abs(sharded["loss"] - single["loss"]) <= 1e-6 * max(1.0, abs(single["loss"]))
    assert_grads_equal(single["grads"], sharded["grads"])
    assert single["noise"].keys() == sharded["noise"].keys() and len(single["noise"]) == 8
    for index, noisy in single["noise"].items():  # corruption seeded per example: exactly equal
        assert torch.equal(sharded["noise"][index], noisy), index
    processes, degree, _ = TOPOLOGIES[topology]
    if processes == degree:  # same micro-batches as one process: each rank ran a 1/degree slice of the padded rows
        assert sharded["block_widths"] == [-(-w // degree) for w in single["block_widths"]]
    else:
        assert max(sharded["block_widths"]) <= -(-max(single["block_widths"]) // degree)


@pytest.mark.parametrize(("topology", "variant"), [c for c in CASES if c[1] in RL])
def test_rl_steps_match_single_process(results, topology, variant):
    """d1 (old + reference log-probs, policy gradient) and BGPO (per-MC-term ELBO on the [noisy ; clean] layout):
    rollouts, advantages, old / reference log-probs, every step's loss and the step-0 gradients."""
    single, sharded = results["single"][variant], results[topology][variant]
    assert len(single["rollouts"]) == len(sharded["rollouts"]) == 2
    for ours, theirs in zip(single["rollouts"], sharded["rollouts"]):
        for key in ("row", "completion", "rewards", "advantages"):
            assert torch.equal(theirs[key], ours[key]), key
        assert ours["advantages"].abs().sum() > 0
        for key in ("old_logp", "ref_logp"):
            if key in ours:
                torch.testing.assert_close(theirs[key], ours[key], atol=1e-6, rtol=1e-5, msg=key)
    for ours, theirs in zip(single["losses"], sharded["losses"]):
        assert abs(theirs - ours) <= 1e-6 * max(1.0, abs(ours))
    assert_grads_equal(single["grads"], sharded["grads"])


@pytest.mark.parametrize("topology", ["sp2", "sp4"])
def test_every_family_and_layout_shards_exactly(results, topology):
    """All registered families (LLaDA, Dream, LLaDA-MoE, SDAR, SDAR-MoE, LLaDA2), padded and packed rows: the sharded
    log-probs equal the unsharded ones and the group's summed gradients equal the unsharded gradients."""
    from dare.models.spec import FAMILIES

    record = results[topology]["families"]
    assert {key.split("/")[0] for key in record} == set(FAMILIES)
    for key, value in record.items():
        full, sharded = value["full"], value["sharded"]
        assert full["logp"].abs().sum() > 0, key
        torch.testing.assert_close(sharded["logp"], full["logp"], atol=1e-6, rtol=1e-5, msg=key)
        for name, grad in full["grads"].items():  # embedding gradients (|g| up to ~10) are sums over every token:
            # the group adds P partial sums in another order (seen: <= 2.2e-6 at P = 4)
            torch.testing.assert_close(sharded["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=f"{key} {name}")


def test_degree_must_divide_the_world_size():
    from dare.distributed import DistInfo
    from dare.distributed.sequence import build_sequence_parallel

    with pytest.raises(ConfigError, match=r"sequence_parallel=3 must divide the number of processes \(4\)") as err:
        build_sequence_parallel(DistInfo(world_size=4), 3)
    assert "\n" not in str(err.value)


def test_degree_must_divide_the_heads():
    from dare.distributed.sequence import SequenceParallel, attention_heads
    from dare.models.tiny import tiny_config

    config, _ = tiny_config("llada")
    assert attention_heads(config) == 4
    with pytest.raises(ConfigError, match=r"sequence_parallel=3 must divide the model's 4 attention heads") as err:
        SequenceParallel(group=None, degree=3, rank=0).check_heads(attention_heads(config))
    assert "\n" not in str(err.value)


def test_single_process_run_rejects_a_degree_above_one(tmp_path):
    from dare.trainer import Trainer, load_train_config

    config = load_train_config(None, [f"trainer.output_dir={tmp_path}", "distributed.sequence_parallel=2",
                                      "data.num_examples=8", "trainer.progress=false"])
    with pytest.raises(ConfigError, match=r"must divide the number of processes \(1\)"):
        Trainer(config)
