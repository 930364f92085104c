"""Worker for tests/test_distributed.py: gradients and two optimizer steps of a few training variants.

Run as ``torchrun --nproc_per_node N tests/dist_worker.py OUT_DIR`` (FSDP2 over gloo) or as a plain
``python`` process (no process group). Rank 0 writes ``OUT_DIR/result.pt``: per variant the step-0 loss, the
full gradients and the weights after two optimizer steps (also exported to ``OUT_DIR/VARIANT/final``).
"""

import sys
from pathlib import Path

import torch

VARIANTS = {
    "padded": ["trainer.micro_batch_size=2"],
    "packed": ["data.packing=true", "data.pack_length=48", "data.max_length=48", "algorithm.normalize=masked"],
    "lora": ["lora.enabled=true", "lora.r=4", "model.path=tiny:dream:1", "algorithm.schedule=discrete"],
    "block": ["model.path=tiny:sdar:1", "algorithm.per_block_t=true", "algorithm.normalize=d1", "data.packing=true",
              "data.pack_length=48", "data.fixed_shapes=true"],  # block diffusion: [noisy ; clean] layout
}


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main(out_dir: Path) -> None:
    from dare.distributed import init_distributed, shutdown
    from dare.trainer import Trainer, load_train_config

    info = init_distributed("gloo", "cpu")
    result = {"world_size": info.world_size}
    for name, overrides in VARIANTS.items():
        config = load_train_config(None, [
            f"trainer.output_dir={out_dir / name}", "trainer.progress=false", "data.num_examples=24",
            "data.max_length=48", "trainer.batch_size=8", "trainer.max_steps=2", "optim.lr=1e-3", *overrides,
        ])
        trainer = Trainer(config, info=info)
        metrics = trainer.forward_backward(0)
        grads = {n: full(p.grad).clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.optimizer_step()
        trainer.step = 1
        metrics_1 = trainer.forward_backward(1)
        trainer.optimizer_step()
        state = {n: full(p.detach()).clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        micro = len(trainer.source.batch(0))
        trainer.export(out_dir / name / "final")  # gathers the sharded weights (collective)
        result[name] = {"loss": float(metrics["loss"]), "loss_1": float(metrics_1["loss"]), "grads": grads,
                        "params": state, "micro_batches_rank0": micro}
    if info.is_main:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
