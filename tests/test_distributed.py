"""torchrun on CPU (gloo, FSDP2): 1 and 2 processes give the single-process loss, gradients and updates (SFT
variants, and RL steps: rollout with the sharded policy, reward, advantages, old / reference log-probs, update);
kill-and-resume reproduces the uninterrupted run's metrics."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrun_helpers import run_torchrun, worker_env

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"


def run_worker(out: Path, nproc: int | None):
    out.mkdir(parents=True)
    if nproc is None:  # plain single process, no process group
        import dist_worker

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): same reduction order, same round-off
        try:
            dist_worker.main(out)
        finally:
            torch.set_num_threads(threads)
        return torch.load(out / "result.pt", weights_only=False)
    run_torchrun(WORKER, [out], out, nproc=nproc)
    return torch.load(out / "result.pt", weights_only=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("dist")


@pytest.fixture(scope="module")
def results(root):
    return {key: run_worker(root / str(key), key) for key in (None, 1, 2)}


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("variant", ["padded", "packed", "lora", "block"])
def test_torchrun_matches_single_process(results, nproc, variant):
    single, dist = results[None][variant], results[nproc][variant]
    assert results[nproc]["world_size"] == nproc
    for key in ("loss", "loss_1"):
        assert abs(dist[key] - single[key]) <= 1e-6 * max(1.0, abs(single[key])), key
    assert single["grads"].keys() == dist["grads"].keys() and single["grads"]
    for name, grad in single["grads"].items():
        torch.testing.assert_close(dist["grads"][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    for name, value in single["params"].items():  # Adam's per-coordinate normalisation turns fp32 round-off
        # in near-zero gradient coordinates into ~lr * 1e-4 differences: tolerance 2e-6 at lr = 1e-3
        torch.testing.assert_close(dist["params"][name], value, atol=2e-6, rtol=1e-5, msg=name)
    if variant == "lora":
        assert all("lora_" in name for name in single["grads"])


RL_VARIANTS = ["rl_d1", "rl_coupled_lora", "rl_sdar_bgpo", "rl_dtreerpo", "rl_igpo", "rl_sdar_dipo"]
NO_REFERENCE = ("rl_sdar_bgpo", "rl_sdar_dipo")


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("variant", RL_VARIANTS)
def test_rl_steps_under_torchrun_match_single_process(results, nproc, variant):
    """d1 (old + frozen-copy reference), coupled-GRPO with LoRA (adapter-disabled reference), SDAR BGPO (block
    cache sampler), d-TreeRPO (tree rollouts), IGPO (re-rolls of failed groups) and SDAR DiPO: every rollout of the run (including the one sampled after the first update(s)), the
    per-step losses, the step-0 gradients and the final parameters equal the single-process run."""
    single, dist = results[None][variant], results[nproc][variant]
    assert len(single["rollouts"]) == len(dist["rollouts"]) == 2
    for ours, theirs in zip(single["rollouts"], dist["rollouts"]):
        assert ours["row"].tolist() == list(range(8))
        for key in ("row", "completion", "rewards", "advantages"):  # per-row sampling streams: exactly equal
            assert torch.equal(theirs[key], ours[key]), key
        assert ours["advantages"].abs().sum() > 0  # a policy-gradient signal, not only the KL term
        for key in ("old_logp", "ref_logp"):  # fp32 forwards on other batch compositions / left-padding widths
            if key in ours:
                torch.testing.assert_close(theirs[key], ours[key], atol=1e-6, rtol=1e-5, msg=key)
    assert ("ref_logp" in single["rollouts"][0]) == (variant not in NO_REFERENCE)
    if variant == "rl_d1":  # mu = 2: the second inner step's stored old log-probs are compared above
        assert "old_logp" in single["rollouts"][0]
    for ours, theirs in zip(single["losses"], dist["losses"]):
        assert abs(theirs - ours) <= 1e-6 * max(1.0, abs(ours))
    assert single["grads"].keys() == dist["grads"].keys() and single["grads"]
    for name, grad in single["grads"].items():
        torch.testing.assert_close(dist["grads"][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert single["params"].keys() == dist["params"].keys()
    for name, value in single["params"].items():  # Adam (lr 1e-3, eps 1e-8) divides a ~1e-8 gradient coordinate
        # (fp32 round-off of a 1e-2 gradient) by ~(|g| + eps): a 1 % relative difference there moves the weight by
        # ~lr * 5e-3. Seen: <= 3e-6 in single coordinates on the CI machine, 5.6e-6 in one of 8192 on another CPU
        # (its vectorised reductions round differently); all others < 2e-6. The gradients above are held to 1e-6,
        # so a real difference in the update (scaling, averaging) cannot hide in this tolerance.
        diff = (dist["params"][name] - value).abs()
        assert diff.max() <= 2e-5, (name, float(diff.max()))
        assert (diff > 2e-6).float().mean() <= 1e-3, (name, int((diff > 2e-6).sum()))
    if variant == "rl_coupled_lora":
        assert all("lora_" in name for name in single["params"])


RL_2026_VARIANTS = ["rl_justgrpo", "rl_justgrpo_skip", "rl_espo", "rl_gdpo_dynamic"]


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("variant", RL_2026_VARIANTS)
def test_2026_rl_steps_under_torchrun_match_single_process(results, nproc, variant):
    """JustGRPO (chunked left-to-right forwards, old + reference; without KL: only the views of rollouts with a
    non-zero advantage, empty views on all-flat micro-batches), ESPO (two-pass sequence gradient, reference) and
    GDPO with dynamic sampling (extra rounds; groups generated on one rank are admitted on another): rollouts,
    losses, gradients and parameters equal the single-process run."""
    single, dist = results[None][variant], results[nproc][variant]
    for ours, theirs in zip(single["rollouts"], dist["rollouts"]):
        assert ours["row"].tolist() == list(range(8))
        for key in ("row", "completion", "rewards", "advantages"):
            assert torch.equal(theirs[key], ours[key]), key
        for key in ("old_logp", "ref_logp", "old_elbo", "ref_elbo"):
            if key in ours:
                torch.testing.assert_close(theirs[key], ours[key], atol=1e-6, rtol=1e-5, msg=key)
    if variant == "rl_justgrpo_skip":  # a flat group (zero advantages) beside informative ones
        advantages = torch.cat([r["advantages"] for r in single["rollouts"]])
        assert bool((advantages == 0).any()) and bool((advantages != 0).any())
    if variant == "rl_gdpo_dynamic":
        for key in ("extra_rounds", "dropped", "filled"):
            key = f"rollout/dynamic/{key}"
            assert [m[key] for m in dist["step_metrics"]] == [m[key] for m in single["step_metrics"]], key
        assert any(m["rollout/dynamic/extra_rounds"] > 0 for m in single["step_metrics"])
    for ours, theirs in zip(single["losses"], dist["losses"]):
        assert abs(theirs - ours) <= 1e-6 * max(1.0, abs(ours))
    for name, grad in single["grads"].items():
        torch.testing.assert_close(dist["grads"][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    for name, value in single["params"].items():
        torch.testing.assert_close(dist["params"][name], value, atol=5e-6, rtol=1e-5, msg=name)


def test_rl_ranks_ran_different_rollouts_without_deadlock(results):
    """The comparisons above cover ranks whose early-stopping samplers ran different numbers of forwards (no
    collective inside generation: parameters are gathered once) and rank-local left padding of other widths."""
    nfe = results[2]["rl_sdar_bgpo"]["nfe_per_rank"]
    assert any(len(set(per_rollout)) > 1 for per_rollout in zip(*nfe)), nfe
    widths = [w for v in RL_VARIANTS for r in results[2][v]["rollouts"] for w in r["width_per_rank"]]
    single = {w for v in RL_VARIANTS for r in results[None][v]["rollouts"] for w in r["width_per_rank"]}
    assert set(widths) - single, (widths, single)


def test_uneven_packing_exercises_empty_micro_batches(results):
    """Rank 0 holds fewer packed rows than a single process: the others ran empty micro-batches."""
    assert results[2]["packed"]["micro_batches_rank0"] < results[None]["packed"]["micro_batches_rank0"]


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    from dare.trainer import load_train_config, run_training

    args = ["trainer.progress=false", "data.num_examples=48", "data.max_length=48", "trainer.batch_size=8",
            "trainer.micro_batch_size=4", "trainer.max_steps=6", "trainer.save_every=2", "optim.lr=1e-2",
            "optim.scheduler=cosine", "optim.warmup_steps=2", "trainer.export=false"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the subprocess (OMP_NUM_THREADS=1): exact comparison needs the same round-off
    try:
        run_training(load_train_config(None, [f"trainer.output_dir={tmp_path / 'full'}", *args]))
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "killed"
    killed = subprocess.run([sys.executable, "-m", "dare.cli", "train", f"trainer.output_dir={out}", *args],
                            capture_output=True, text=True, timeout=600, env=worker_env(DARE_KILL_AT_STEP="3"))
    assert killed.returncode == -9, killed.stderr[-2000:]
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3]  # step 3 was logged after the last checkpoint (step 2): it must be redone
    torch.set_num_threads(1)
    try:
        run_training(load_train_config(None, [f"trainer.output_dir={out}", *args]))
    finally:
        torch.set_num_threads(threads)

    def records(path):
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

    expected = records(tmp_path / "full")
    assert [r["step"] for r in expected] == [1, 2, 3, 4, 5, 6]
    assert records(out) == expected  # exact: model, optimizer, scheduler, data position and noise restored


@pytest.mark.parametrize("variant", ["padded", "lora"])
def test_sharded_export_loads_and_matches(results, root, variant):
    """RUN/final written from FSDP2 shards: a strict HF checkpoint (or adapter) equal to the 1-process one."""
    from dare.models.loading import adapter_base, load_model

    ids = torch.randint(0, 256, (2, 10))
    logits = []
    for key in (None, 2):
        final = root / str(key) / variant / "final"
        base = adapter_base(str(final)) if variant == "lora" else str(final)
        model = load_model(base, adapter=str(final) if variant == "lora" else None)
        with torch.no_grad():
            logits.append(model(ids).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("variant", ["padded", "lora"])
def test_dare_export_reads_a_checkpoint_of_two_fsdp_processes(results, root, variant, tmp_path):
    """``dare export`` in one process reads the FSDP2 shards two processes saved: the latest checkpoint's weights are
    exactly what the run exported as ``final/`` (a full checkpoint, or the LoRA adapter)."""
    from safetensors.torch import load_file

    from dare.trainer.export import export_checkpoint

    run = root / "2" / variant
    out, state = export_checkpoint(run, tmp_path / "export", progress=False)
    assert state["world_size"] == 2
    name = "adapter_model.safetensors" if variant == "lora" else "model.safetensors"
    final, exported = load_file(run / "final" / name), load_file(out / name)
    assert final and final.keys() == exported.keys()
    assert all(torch.equal(final[key], exported[key]) for key in final)

def test_the_static_engine_decodes_an_fsdp_model_with_its_own_refreshed_copy(tmp_path):
    """FSDP2 moves gathered parameters between addresses, so the engine decodes a sharded model with an unsharded
    copy it owns (the addresses CUDA graphs read), refreshed at every call: 2 gloo processes decode exactly what the
    unsharded model decodes, before and after an in-place update (the copy follows it), with no eager fallback."""
    check_fsdp_rollout(run_fsdp_rollout_worker(tmp_path, nproc=2, device="cpu"))


def run_fsdp_rollout_worker(tmp_path, nproc: int, device: str) -> dict:
    """``tests/fsdp_rollout_worker.py`` under torchrun (gloo on the CPU, NCCL on CUDA); rank 0's result."""
    out = tmp_path / "fsdp_rollout"
    out.mkdir()
    run_torchrun(ROOT / "tests" / "fsdp_rollout_worker.py", [out, device], out, nproc=nproc,
                 env=worker_env(NCCL_NVLS_ENABLE="0"))
    return torch.load(out / "result.pt", weights_only=False, map_location="cpu")


def check_fsdp_rollout(result: dict) -> None:
    """The sharded model decodes what its unsharded twin decodes, follows an update, and falls back cleanly."""
    for sharded, reference in (("sharded", "reference"), ("sharded_updated", "reference_updated")):
        for field in ("completion", "step_map", "logprobs"):
            assert torch.equal(result[sharded][field], result[reference][field]), (sharded, field)
        assert result[sharded]["nfe"] == result[reference]["nfe"]
    assert not torch.equal(result["sharded"]["completion"], result["sharded_updated"]["completion"])
    assert result["fallbacks"] == 0 and result["owned_refresh_s"] > 0
    # when the copy cannot be made: two eager decodes, one attempt; release() lets the next call build it again
    assert result["failed_builds"] == 1 and result["fallbacks_after_failure"] == 2
    assert result["fallbacks_after_release"] == 2
    assert torch.equal(result["after_release"]["completion"], result["sharded_updated"]["completion"])
    lora = result["lora"]  # a LoRA-wrapped sharded model: its copy carries the adapter, on and off as the model's
    for sharded, reference in (("sharded", "reference"), ("sharded_on_again", "reference"),
                               ("sharded_off", "reference_off")):
        for field in ("completion", "step_map", "logprobs"):
            assert torch.equal(lora[sharded][field], lora[reference][field]), (sharded, field)
    assert not torch.equal(lora["reference"]["completion"], lora["reference_off"]["completion"])  # the adapter counts
    assert lora["fallbacks"] == 0 and lora["twin_trainable"] == 0
    bf16 = result["bf16"]  # fp32 masters, bf16 mixed precision: the copy decodes as the bf16 model
    assert bf16["dtypes"] == ["torch.bfloat16"] and bf16["same_copy"] and bf16["fallbacks"] == 0
    for call in ("sharded", "unsharded_call"):
        for field in ("completion", "step_map", "logprobs"):
            assert torch.equal(bf16[call][field], bf16["reference"][field]), (call, field)
    copies = result["copies"]  # LoRA + bf16 mixed precision + FP8 / merged copies (the d1 8B recipe with weights=fp8)
    assert copies["fallbacks"] == 0
    for weights in ("fp8", "merged"):
        for field in ("completion", "step_map", "logprobs"):
            assert torch.equal(copies[weights][field], copies[f"{weights}_reference"][field]), (weights, field)
    assert not torch.equal(copies["fp8_reference"]["logprobs"], copies["model_reference"]["logprobs"])  # FP8 applied


def test_a_checkpoint_resumes_exactly_under_another_parallel_layout(tmp_path):
    """``distributed.sequence_parallel`` and ``distributed.expert_parallel`` are free for resume: a step-1 checkpoint
    of a 2-process run resumed under the other layout (``tests/layout_resume_worker.py``) logs the losses and
    gradient norms of steps 2 and 3 that the run gave continuing (weights and AdamW moments reshard)."""
    run_torchrun(ROOT / "tests" / "layout_resume_worker.py", [tmp_path], tmp_path)
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    assert set(result) == {"sp_1_to_2", "ep_1_to_2", "ep_2_to_1"}
    for case, record in result.items():
        assert "error" not in record, (case, record.get("error"))
        full, resumed = record["full"], record["resumed"]
        assert [r["step"] for r in full] == [1, 2, 3] and [r["step"] for r in resumed] == [2, 3], case
        assert full[1]["loss"] != full[0]["loss"]  # step 1 changed the weights: the checkpoint is needed
        for ours, theirs in zip(full[1:], resumed):
            for key in ("loss", "grad_norm"):
                assert abs(theirs[key] - ours[key]) <= 1e-6 * max(1.0, abs(ours[key])), (case, ours, theirs)


def test_rank_state_is_restored_only_where_the_ranks_hold_the_same_data(tmp_path):
    """A rank's saved source state (an RL run's cached rollouts within a cycle of algorithm.inner_steps) belongs to
    the data that rank held: a resume under another distributed.sequence_parallel (the same world size, other data
    per rank) drops it, and the source rolls out again, as after a change of world size."""
    from dare.distributed import DistInfo
    from dare.trainer.checkpoint import load_checkpoint, save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, DistInfo(), rank_state={"source": {"start": 0}},
                           extra={"config": {"distributed": {"sequence_parallel": 1}}})
    same = load_checkpoint(path, model, optimizer, scheduler, DistInfo(), sequence_parallel=1)
    assert same["rank_state"] == {"source": {"start": 0}}
    assert "rank_state" not in load_checkpoint(path, model, optimizer, scheduler, DistInfo(), sequence_parallel=2)
