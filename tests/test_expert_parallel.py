"""Expert parallelism over 2 gloo processes equals the unsharded model (outputs and gradients), plus errors."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dare.distributed import DistInfo
from dare.distributed.expert_parallel import expert_parallel_mesh, shard_experts
from dare.errors import ConfigError
from dare.models.tiny import tiny_model
from torchrun_helpers import run_torchrun

WORKER = Path(__file__).with_name("ep_worker.py")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep")
    run_torchrun(WORKER, [out], out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("case", ["llada_moe", "sdar_moe", "llada2", "llada2_uneven"])
@pytest.mark.parametrize("rank", [0, 1])
def test_expert_parallel_equals_unsharded(ranks, case, rank):
    result = ranks[rank][case]
    assert result["local_experts"] == [4]  # 8 experts over 2 ranks
    torch.testing.assert_close(*result["logits"], atol=1e-5, rtol=1e-5)
    grads, reference = result["replicated"]
    assert set(grads) == set(reference) and any("gate.weight" in k for k in grads)
    for key in reference:
        torch.testing.assert_close(grads[key], reference[key], atol=1e-5, rtol=1e-4, msg=key)
    assert result["experts"]
    for key, (grad, reference) in result["experts"].items():
        torch.testing.assert_close(grad, reference, atol=1e-5, rtol=1e-4, msg=key)
        assert grad.abs().sum() > 0


def test_sharding_keeps_frozen_experts_frozen(ranks):
    assert ranks[0]["frozen_experts_stay_frozen"] and ranks[1]["frozen_experts_stay_frozen"]


def test_trainer_with_expert_parallel_equals_plain_fsdp(ranks):
    plain, sharded = ranks[0]["trainer"][1], ranks[0]["trainer"][2]
    torch.testing.assert_close(sharded["loss"], plain["loss"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(sharded["grad_norm"], plain["grad_norm"], atol=1e-5, rtol=1e-5)
    assert plain["loss"][1] != plain["loss"][0]  # the first step changed the weights
    exported = sharded["exported"]
    assert set(exported) == set(plain["exported"])
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in exported  # all experts, released names
    for key, value in plain["exported"].items():
        torch.testing.assert_close(exported[key], value, atol=1e-6, rtol=1e-5, msg=key)


def test_degree_must_divide_world_size():
    with pytest.raises(ConfigError, match="expert_parallel=3 must divide the world size 4"):
        expert_parallel_mesh(DistInfo(world_size=4), 3)


def test_degree_must_divide_experts_and_model_must_be_moe():
    three_ranks = SimpleNamespace(size=lambda: 3, get_local_rank=lambda: 0)
    with pytest.raises(ConfigError, match="expert_parallel=3 must divide the number of experts 8"):
        shard_experts(tiny_model("llada2"), three_ranks)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        shard_experts(tiny_model("sdar"), three_ranks)


def test_config_errors(tmp_path):
    from dare.trainer import Trainer, load_train_config

    with pytest.raises(ConfigError, match="distributed.expert_parallel must be positive; got 0"):
        load_train_config(ROOT / "configs/llada2/sft_tiny.yaml", ["distributed.expert_parallel=0"])
    config = load_train_config(ROOT / "configs/llada2/sft_tiny.yaml", [
        f"trainer.output_dir={tmp_path}", "distributed.expert_parallel=2"])
    with pytest.raises(ConfigError, match="expert_parallel=2 needs a torchrun launch"):
        Trainer(config)
