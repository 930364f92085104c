"""Worker for tests/test_distributed.py and tests/test_gpu.py: the static rollout engine on FSDP2-sharded models.

Run as ``torchrun --nproc_per_node 2 tests/fsdp_rollout_worker.py OUT_DIR [cuda]``: on the CPU (gloo) the static
step runs eagerly, on CUDA (NCCL) it is recorded as CUDA graphs. Every rank builds the same tiny model, keeps an
unsharded reference copy and shards the other; rank 0 writes ``OUT_DIR/result.pt`` with both models' static decodes
before and after an in-place weight update (as an optimizer step makes), inside ``gathered_parameters`` (as RL
rollouts run) and outside it. Two more cases: a LoRA-wrapped model (adapter on, and off inside peft's
``disable_adapter``), fp32 master weights sharded with bf16 mixed precision (decoded as the reference cast to
bf16), and such a LoRA policy decoded with FP8 / merged copies of its projections.
"""

import copy
import sys
from pathlib import Path

import torch

from dare.distributed import apply_fsdp, gathered_parameters, init_distributed, shutdown
from dare.models.lora import apply_lora
from dare.models.tiny import tiny_model
from dare.rollout import SamplerConfig, generate
from dare.rollout.engine import engine_stats, owned, release


def decode(model, ids, mask, config, engine):
    out = generate(model, ids, mask, config, engine=engine, example_ids=[0, 1, 2])
    return {"completion": out.completion, "logprobs": out.logprobs, "step_map": out.step_map, "nfe": out.nfe}


def sharp_model(seed: int, device):
    """A tiny LLaDA with a scaled LM head: well-separated logits, so no near-ties between two decodes."""
    torch.manual_seed(0)
    model = tiny_model("llada", seed=seed).to(device).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20.0)
    return model


def main(out_dir: Path, device: str) -> None:
    info = init_distributed(backend="gloo" if device == "cpu" else "nccl", device=device)
    engine = "static" if device == "cpu" else "graph"
    model = sharp_model(1, info.device)
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
    result["lora"] = lora_case(info, ids, mask, config, engine)
    result["bf16"] = mixed_precision_case(info, ids, mask, config, engine)
    result["copies"] = copies_case(info, ids, mask, config, engine)
    if info.rank == 0:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


def sharp_lora_model(seed: int, device):
    """``sharp_model`` wrapped with a LoRA adapter (r 4) whose B is random: peft starts it at zero, which would
    leave the logits unchanged."""
    model = apply_lora(sharp_model(seed, device), r=4, alpha=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p))
    return model


def lora_case(info, ids, mask, config, engine) -> dict:
    """A LoRA-wrapped model sharded as the trainer does it (peft wrapper at the root, blocks sharded)."""
    model = sharp_lora_model(2, info.device)
    reference = copy.deepcopy(model)
    apply_fsdp(model, model.get_base_model().blocks, info, mixed_precision="fp32")
    out = {}
    with gathered_parameters(model):
        out["sharded"] = decode(model, ids, mask, config, engine)
        with model.disable_adapter():
            out["sharded_off"] = decode(model, ids, mask, config, engine)
        out["sharded_on_again"] = decode(model, ids, mask, config, engine)
    out["reference"] = decode(reference, ids, mask, config, engine)
    with reference.disable_adapter():
        out["reference_off"] = decode(reference, ids, mask, config, engine)
    out["fallbacks"] = engine_stats(model).fallbacks
    out["twin_trainable"] = sum(p.requires_grad for p in owned.twin_of(model).parameters())
    return out


def mixed_precision_case(info, ids, mask, config, engine) -> dict:
    """fp32 master weights sharded with bf16 mixed precision: the copy computes in bf16, as the sharded forwards."""
    model = sharp_model(3, info.device)
    reference = copy.deepcopy(model).to(torch.bfloat16)
    apply_fsdp(model, model.blocks, info, mixed_precision="bf16")
    unsharded_call = decode(model, ids, mask, config, engine)  # first call outside: the fp32 shards all-gathered
    first_copy = owned.twin_of(model)
    with gathered_parameters(model):  # inside: FSDP2's gathered bf16 parameters
        sharded = decode(model, ids, mask, config, engine)
    return {"sharded": sharded, "unsharded_call": unsharded_call, "reference": decode(reference, ids, mask, config,
            engine), "dtypes": sorted({str(p.dtype) for p in owned.twin_of(model).parameters()}),
            "same_copy": first_copy is owned.twin_of(model), "fallbacks": engine_stats(model).fallbacks}


def copies_case(info, ids, mask, config, engine) -> dict:
    """``weights`` ``fp8`` / ``merged`` on a LoRA policy with fp32 masters sharded with bf16 mixed precision (the
    8-GPU d1 recipe's setting): the copy's FP8 / merged projections decode as the unsharded bf16 model's do."""
    import dataclasses

    model = sharp_lora_model(4, info.device)
    reference = copy.deepcopy(model).to(torch.bfloat16)
    apply_fsdp(model, model.get_base_model().blocks, info, mixed_precision="bf16")
    out = {}
    for weights in ("fp8", "merged"):
        copies = dataclasses.replace(config, weights=weights)
        with gathered_parameters(model):
            out[weights] = decode(model, ids, mask, copies, engine)
        out[f"{weights}_reference"] = decode(reference, ids, mask, copies, engine)
    out["model_reference"] = decode(reference, ids, mask, config, engine)
    out["fallbacks"] = engine_stats(model).fallbacks
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "cpu")
