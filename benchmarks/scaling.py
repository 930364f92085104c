#!/usr/bin/env python
"""Data-parallel scaling of ``dare train`` (FSDP2 under torchrun): 1 process vs N with the same global batch.

For each recipe (``sft``: ``configs/llada/sft_tiny.yaml``; ``d1``: one diffu-GRPO RL step per optimizer step,
``configs/llada/d1_tiny.yaml``) and each process count of ``--nproc`` (1 is always run: the baseline), the real CLI
runs in a subprocess::

    python -m torch.distributed.run --nproc_per_node N ... -m dare.cli train RECIPE trainer.max_steps=S ...

with the recipe's global batch (``trainer.batch_size``) split over the N ranks, and writes its metrics and final
weights (``OUT/final``). Nothing is re-implemented here: data, rollouts, rewards, losses, FSDP2 sharding,
gradient reduction and the export are the trainer's.

GPU (2 GPUs, ``--model 1b``: a randomly initialised LLaDA of ~1.1B parameters written once into the work
directory; full fine-tuning, fp32 master weights, bf16 compute; each run hard-stopped at ``--hard-limit-s``)::

    python benchmarks/scaling.py --model 1b --json benchmarks/results/scaling_h200x2.json

CPU smoke test (tiny LLaDA, gloo, one thread per process; seconds; part of the test suite)::

    python benchmarks/scaling.py --model tiny --device cpu --steps 2

The numbers, per recipe and process count:

* ``losses``: the logged loss of every step; ``loss rel diff`` = max over steps of
  ``|loss_N - loss_1| / max(|loss_1|, 1e-3)`` (the floor: d1's first inner step has a loss of ~0 by construction,
  ratio 1 and zero-mean advantages); ``equal`` = that difference is within 2e-2 on CUDA (bf16 compute, other
  reduction orders) or 1e-4 on the CPU (fp32);
* ``step s``: median ``time/step_s`` over the steps after the first two (after the first one with fewer than 3
  steps): the first steps pay for allocations and warm-up. d1 alternates a step with rollout + update and an
  update-only step (``algorithm.inner_steps`` 2); ``steps/s`` = 1 / step s; ``scaling`` = steps/s(N) / steps/s(1)
  (ideal: N for compute-bound steps, since each rank does 1/N of the work);
* ``weights``: the final weights against the 1-process run's: the max absolute difference over all parameters
  and the max relative (Frobenius) difference ``||w_N - w_1|| / ||w_1||`` over the tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

LLADA_1B = dict(d_model=2048, n_heads=16, n_kv_heads=16, n_layers=22, mlp_hidden_size=5632,
                max_sequence_length=1024)
"""A 1B-shaped LLaDA (the config's names; TinyLlama-1.1B's widths, full multi-head attention): 22 x (4 x 2048^2 +
3 x 2048 x 5632) = 1.13B block parameters, with the byte tokenizer's vocabulary of 264."""

RECIPES = {"sft": "configs/llada/sft_tiny.yaml", "d1": "configs/llada/d1_tiny.yaml"}
DEFAULT_STEPS = {"sft": 8, "d1": 4}
EXTRA = {
    ("sft", "1b"): ["trainer.batch_size=32", "trainer.micro_batch_size=8", "data.pad_response_to=448",
                    "data.max_length=512"],
    ("sft", "tiny"): ["trainer.batch_size=16", "trainer.micro_batch_size=4"],
    # lr 1e-5 (the 8B recipes' scale): the tiny recipe's 1e-3 made full fine-tuning of the 1B model diverge
    ("d1", "1b"): ["rollout.sampler.gen_length=64", "rollout.sampler.block_length=32", "rollout.sampler.steps=32",
                   "optim.lr=1.0e-5"],
    ("d1", "tiny"): [],
}
"""Per (recipe, model) overrides that give each step real work (valid with either model)."""
LOSS_RTOL = {"cuda": 2e-2, "cpu": 1e-4}  # bf16 compute on CUDA; fp32 on the CPU
LOSS_FLOOR = 1e-3  # relative loss differences are taken against max(|loss|, this)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
STDERR_LINES = 40


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "1b"], default="tiny", help="tiny:llada, or a random 1B LLaDA")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--nproc", type=int, nargs="+", help="process counts (default 1 2; CUDA: 1 and every GPU)")
    p.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    p.add_argument("--steps", type=int, help="optimizer steps per run (default: sft 8, d1 4)")
    p.add_argument("--hard-limit-s", type=int, default=300, help="kill a run (all its processes) after this long")
    p.add_argument("--workdir", help="run directories and the 1B checkpoint (default: a temporary directory)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        p.error("--device cuda: no CUDA GPU is visible (use --device cpu)")
    if args.nproc is None:
        args.nproc = [1, gpus] if args.device == "cuda" else [1, 2]
    if min(args.nproc) < 1:
        p.error(f"--nproc takes process counts >= 1, got {min(args.nproc)}")
    if args.device == "cuda" and max(args.nproc) > gpus:
        p.error(f"--nproc {max(args.nproc)}: only {gpus} CUDA GPU(s) are visible (one process per GPU)")
    args.nproc = sorted({1, *args.nproc})
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps takes a number >= 1, got {args.steps}")
    if args.hard_limit_s < 1:
        p.error(f"--hard-limit-s takes a number of seconds >= 1, got {args.hard_limit_s}")
    return args


def model_path(args: argparse.Namespace, workdir: Path) -> str:
    """``tiny:llada``, or the path of a random bf16 1B-shaped LLaDA checkpoint written into ``workdir``."""
    if args.model == "tiny":
        return "tiny:llada"
    from dare.models.tiny import write_tiny_checkpoint

    print(f"writing a random 1B LLaDA checkpoint ({LLADA_1B}) ...", flush=True)
    return str(write_tiny_checkpoint("llada", workdir / "llada_1b", dtype=torch.bfloat16, **LLADA_1B))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(recipe: str, nproc: int, out: Path, steps: int, model: str, args: argparse.Namespace) -> list[str]:
    """``dare train`` of one recipe under torchrun (no intermediate checkpoint: ``save_every=null``; the final
    weights are exported to ``out/final``)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), "-m", "dare.cli", "train", str(ROOT / RECIPES[recipe]),
            f"trainer.output_dir={out}", "trainer.progress=false", "trainer.log_every=1", f"trainer.max_steps={steps}",
            "trainer.save_every=null", "trainer.export=true", f"distributed.device={args.device}",
            f"model.path={model}", *EXTRA[recipe, args.model]]


def run_env(device: str) -> dict[str, str]:
    """The environment of a run: this checkout's ``src`` first, NVLink multicast off, and on the CPU one thread per
    process unless ``OMP_NUM_THREADS`` is set (torchrun sets 1 only for several processes: a fair comparison)."""
    env = dict(os.environ, **NO_MULTICAST,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run(cmd: list[str], env: dict[str, str], limit_s: int) -> str | None:
    """Run ``cmd`` in its own process group (killed whole after ``limit_s``); None, or the error's text: a
    one-line head and the last lines of stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        head = f"killed after the hard limit of {limit_s} s"
    else:
        if proc.returncode == 0:
            return None
        head = f"exit status {proc.returncode}"
    tail = "\n".join(stderr.splitlines()[-STDERR_LINES:])
    return f"{head}; last {STDERR_LINES} lines of stderr:\n{tail}"


def read_metrics(out: Path) -> tuple[list[float], list[float]]:
    """The losses and step times (``time/step_s``) of the run's logged steps."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "loss" in r]
    return [r["loss"] for r in records], [r["time/step_s"] for r in records]


def steady_step_s(times: list[float]) -> float:
    """Median step time after the first two steps (after the first one when there are fewer than 3)."""
    skip = 2 if len(times) > 2 else len(times) - 1
    return statistics.median(times[skip:])


def weight_differences(final: Path, baseline: Path) -> dict[str, float]:
    """Max absolute difference over all parameters, and the max relative Frobenius difference over the tensors, of
    two exported checkpoints."""
    from transformers.utils import logging

    from dare.models.loading import load_model

    logging.disable_progress_bar()
    ours, theirs = (load_model(str(path), dtype="auto").state_dict() for path in (final, baseline))
    if ours.keys() != theirs.keys():
        raise ValueError(f"{final} and {baseline} hold different tensors")
    max_abs = max_rel = 0.0
    for name, ref in theirs.items():
        diff = ours[name].float() - ref.float()
        max_abs = max(max_abs, float(diff.abs().max()))
        max_rel = max(max_rel, float(diff.norm() / ref.float().norm().clamp_min(1e-30)))
    return {"weights_max_abs_diff": max_abs, "weights_max_rel_diff": max_rel}


def compare(result: dict, baseline: dict, rtol: float) -> None:
    """Add the scaling and the loss / weight differences against the 1-process ``baseline`` to ``result``."""
    result["scaling"] = result["steps_per_s"] / baseline["steps_per_s"]
    diffs = [abs(a - b) / max(abs(b), LOSS_FLOOR) for a, b in zip(result["losses"], baseline["losses"])]
    result["loss_max_rel_diff"] = max(diffs) if len(result["losses"]) == len(baseline["losses"]) else float("inf")
    result["equal_within_tolerance"] = result["loss_max_rel_diff"] <= rtol
    if result is baseline:  # nothing to load
        result.update(weights_max_abs_diff=0.0, weights_max_rel_diff=0.0)
    else:
        result.update(weight_differences(Path(result["out"]) / "final", Path(baseline["out"]) / "final"))


def run_recipe(recipe: str, args: argparse.Namespace, model: str, workdir: Path) -> list[dict]:
    """Every process count of one recipe; a failed run is reported (its error recorded) and the next one runs."""
    steps = args.steps or DEFAULT_STEPS[recipe]
    results, baseline = [], None
    for nproc in args.nproc:
        out = workdir / f"{recipe}_np{nproc}"
        result = {"recipe": recipe, "nproc": nproc, "steps": steps, "out": str(out)}
        print(f"run   {recipe} nproc={nproc} steps={steps} ...", flush=True)
        error = run(train_command(recipe, nproc, out, steps, model, args), run_env(args.device), args.hard_limit_s)
        if error is not None:
            print(f"FAILED {recipe} nproc={nproc}: {error}", flush=True)
            results.append({**result, "error": error})
            continue
        result["losses"], result["step_times_s"] = read_metrics(out)
        result["step_s"] = steady_step_s(result["step_times_s"])
        result["steps_per_s"] = 1.0 / result["step_s"]
        if nproc == 1:
            baseline = result
        if baseline is not None:
            compare(result, baseline, LOSS_RTOL[args.device])
        results.append(result)
    return results


def cell(result: dict, key: str, spec: str) -> str:
    return format(result[key], spec) if key in result else "-"


def print_table(results: list[dict], device: str) -> None:
    print(f"\n| recipe | nproc | losses | step s | steps/s | scaling | loss rel diff | weights max abs diff | "
          f"weights max rel diff | equal within {'bf16' if device == 'cuda' else 'fp32'} tolerance "
          f"({LOSS_RTOL[device]:g}) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['recipe']} | {r['nproc']} | FAILED: {r['error'].splitlines()[0]} | | | | | | | |")
            continue
        equal = {True: "yes", False: "no"}.get(r.get("equal_within_tolerance"), "-")
        print(f"| {r['recipe']} | {r['nproc']} | {' '.join(f'{x:.5g}' for x in r['losses'])} | "
              f"{r['step_s']:.4f} | {r['steps_per_s']:.2f} | {cell(r, 'scaling', '.2f')} | "
              f"{cell(r, 'loss_max_rel_diff', '.2e')} | {cell(r, 'weights_max_abs_diff', '.2e')} | "
              f"{cell(r, 'weights_max_rel_diff', '.2e')} | {equal} |")


def device_name(device: str) -> str:
    if device == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"cuda ({torch.cuda.device_count()} x {torch.cuda.get_device_name(0)})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dare_scaling_") as scratch:
        workdir = Path(args.workdir or scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        model = model_path(args, workdir)
        results = [r for recipe in args.recipes for r in run_recipe(recipe, args, model, workdir)]
    print_table(results, args.device)
    if args.json:
        report = {"benchmark": "scaling", "args": vars(args), "device": device_name(args.device),
                  "torch": torch.__version__, "nproc": args.nproc, "results": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
