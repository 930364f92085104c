"""Worker for tests/test_distributed.py: resuming a checkpoint under another parallel layout.

Run as ``torchrun --nproc_per_node 2 tests/layout_resume_worker.py OUT_DIR`` (FSDP2 over gloo). For each case a run
trains three SFT steps under one layout (``distributed.sequence_parallel`` / ``distributed.expert_parallel``),
saving a checkpoint after each; a second run in another output directory resumes the step-1 checkpoint under the
other layout (``trainer.resume=PATH``) and trains steps 2 and 3 (step 3 follows from the restored AdamW moments).
Rank 0 writes ``OUT_DIR/result.pt``: per case the logged ``loss`` and ``grad_norm`` of every step of both runs, or
the resume's one-line error.
"""

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["trainer.progress=false", "trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_last=0",
          "trainer.export=false",
          "data.num_examples=16", "trainer.batch_size=8", "trainer.micro_batch_size=2", "optim.lr=1e-2"]
SP = ("configs/llada/sft_tiny.yaml", ["data.max_length=45", "data.eos_padding=false"])  # rows of 45: padded shards
EP = ("configs/llada2/sft_tiny.yaml", [])  # tiny LLaDA2: 8 experts per MoE layer
CASES = {  # name: (recipe, overrides), the first run's layout, the resuming run's layout
    "sp_1_to_2": (SP, "distributed.sequence_parallel=1", "distributed.sequence_parallel=2"),
    "ep_1_to_2": (EP, "distributed.expert_parallel=1", "distributed.expert_parallel=2"),
    "ep_2_to_1": (EP, "distributed.expert_parallel=2", "distributed.expert_parallel=1"),
}


def logged(out: Path) -> list[dict]:
    """The ``step``, ``loss`` and ``grad_norm`` of every line of ``out/metrics.jsonl``."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: row[k] for k in ("step", "loss", "grad_norm")} for row in rows]


def train(recipe: str, overrides: list[str], info) -> None:
    from dare.trainer import Trainer, load_train_config

    Trainer(load_train_config(ROOT / recipe, [*COMMON, *overrides]), info=info).train()


def main(out_dir: Path) -> None:
    from dare.distributed import barrier, init_distributed, shutdown
    from dare.errors import ConfigError

    torch.set_num_threads(1)
    info = init_distributed("gloo", "cpu")
    result = {}
    for name, ((recipe, overrides), first, second) in CASES.items():
        full, resumed = out_dir / name / "full", out_dir / name / "resumed"
        train(recipe, [*overrides, first, f"trainer.output_dir={full}"], info)
        barrier(info)
        try:
            train(recipe, [*overrides, second, f"trainer.output_dir={resumed}",
                           f"trainer.resume={full}/checkpoints/step_00000001"], info)
            result[name] = {"full": logged(full), "resumed": logged(resumed)}
        except ConfigError as err:
            result[name] = {"error": str(err)}
        barrier(info)
    if info.is_main:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
