"""Worker for tests/test_distributed.py: the static rollout engine on an FSDP2-sharded model (gloo, CPU).

Run as ``torchrun --nproc_per_node 2 tests/fsdp_rollout_worker.py OUT_DIR [cuda]``: on the CPU (gloo) the static
step runs eagerly, on CUDA (NCCL, ``tests/test_gpu.py``) it is recorded as CUDA graphs. Every rank builds the same tiny model,
keeps an unsharded reference copy and shards the other; rank 0 writes ``OUT_DIR/result.pt`` with both models'
static decodes before and after an in-place weight update (as an optimizer step makes), inside
``gathered_parameters`` (as RL rollouts run) and outside it.
"""

import copy
import sys
from pathlib import Path

import torch

from dare.distributed import apply_fsdp, gathered_parameters, init_distributed, shutdown
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate
from dare.rollout.engine import engine_stats, owned, release


def decode(model, ids, mask, config, engine):
    out = generate(model, ids, mask, config, engine=engine, example_ids=[0, 1, 2])
    return {"completion": out.completion, "logprobs": out.logprobs, "step_map": out.step_map, "nfe": out.nfe}


def main(out_dir: Path, device: str) -> None:
    info = init_distributed(backend="gloo" if device == "cpu" else "nccl", device=device)
    engine = "static" if device == "cpu" else "graph"
    torch.manual_seed(0)
    model = tiny_model("llada", seed=1).to(info.device).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)  # well-separated logits: no near-ties between the two
    reference = copy.deepcopy(model)
    apply_fsdp(model, model.blocks, info, mixed_precision="fp32")
    ids = torch.randint(5, 200, (3, 7)).to(info.device)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    config = SamplerConfig(sampler="fastdllm", cache="dual", gen_length=16, block_length=8, temperature=0.8, seed=4)
    result = {}
    with gathered_parameters(model):
        result["sharded"] = decode(model, ids, mask, config, engine)
    result["reference"] = decode(reference, ids, mask, config, engine)
    result["twin_captures"] = engine_stats(model).captures  # counted for the sharded model, recorded on its copy
    with torch.no_grad():  # an optimizer step: every parameter changes in place (each rank its own shard)
        for p in list(model.parameters()) + list(reference.parameters()):
            p.mul_(1.25)
    result["sharded_updated"] = decode(model, ids, mask, config, engine)  # outside gathered_parameters: all-gathers
    result["reference_updated"] = decode(reference, ids, mask, config, engine)
    stats = engine_stats(model)
    result["fallbacks"], result["owned_refresh_s"] = stats.fallbacks, stats.owned_refresh_s
    result["twin_captures_after_update"] = stats.captures  # the same graphs replayed

    # a copy that cannot be made: eager decoding, no rebuild at every call, a retry after release()
    builds, real_build = [], owned._build

    def failing_build(*args):
        builds.append(1)
        raise RuntimeError("cannot rebuild this class")

    owned._build = failing_build
    release(model)
    for _ in range(2):
        decode(model, ids, mask, config, engine)
    result["failed_builds"], result["fallbacks_after_failure"] = len(builds), stats.fallbacks
    release(model)
    owned._build = real_build
    result["after_release"] = decode(model, ids, mask, config, engine)
    result["fallbacks_after_release"] = stats.fallbacks
    if info.rank == 0:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cpu")
