#!/usr/bin/env python
"""Roofline fractions of recorded rollout runs under the current definition (CPU, seconds)::

    python benchmarks/recompute_roofline.py benchmarks/results/rollout_h200.json --session "sixth H200" --peak 810
    python benchmarks/recompute_roofline.py benchmarks/results/bd_rollout_h200.json --session "sixth H200" --peak 810

Records written before the sixth H200 session counted the LM head on every query row, at one timing of the matmul
peak. This script recomputes a record's roofline time as ``rollout.py`` / ``bd_rollout.py`` compute it now:
* the LM head counts only on the rows whose logits a step reads;
* the peak is ``--peak`` (TFLOP/s; default: the record's own ``run_peak_flops``).
The model is the 8B shape of each family, built on the meta device. Each run's forward shapes are replayed with the
tiny model of that family and the benchmark's settings (LLaDA: prompt 128, block 32, first 4 blocks; SDAR: prompt 130,
block 4). These shapes do not depend on the model size. The measured seconds, nfe and bandwidth are the record's
own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import bd_rollout  # noqa: E402
import rollout  # noqa: E402
from common import LLADA_8B, SDAR_8B, ForwardShapes, Roofline  # noqa: E402


def meta_model(family: str):
    """The 8B-shaped model of ``family`` on the meta device (parameter counts only)."""
    import dare  # noqa: F401  (registers the families)
    from dare.models.llada import LLaDAConfig, LLaDAModelLM, tiny_llada_config
    from dare.models.sdar import SDARConfig, SDARForCausalLM, tiny_sdar_config

    cls, config_class, tiny, shape = {"llada": (LLaDAModelLM, LLaDAConfig, tiny_llada_config, LLADA_8B),
                                      "sdar": (SDARForCausalLM, SDARConfig, tiny_sdar_config, SDAR_8B)}[family]
    raw = tiny(**shape)
    raw.pop("model_type")
    with torch.device("meta"):
        return cls(config_class.from_dict(raw)).to(torch.bfloat16)


def llada_config(record: dict) -> str:
    """``rollout.py``'s config name of a record (quota decoders: the cache and the tokens per step)."""
    per_step = round(record["tokens_per_forward"])
    name = {"none": "naive", "prefix": "prefix", "dual": "dual"}[record["cache"]]
    return name if per_step == 1 else f"{name}/{per_step}"


def forwards_of(record: dict) -> list[tuple[int, int, int, int]]:
    """The run's ``(batch, query, cached keys, logit rows)`` per forward, replayed with the tiny model."""
    batch, gen = record["batch"], record["gen_length"]
    if record["family"] == "llada":
        config = llada_config(record)
        args = rollout.parse_args(["--tiny", "--batch", str(batch), "--gen", str(gen), "--prompt-length", "128",
                                   "--block", "32", "--engines", "eager"])
        model, prompt = rollout.build_model(True, torch.device("cpu")), 128
        hook = ForwardShapes(model)
        rollout.run_once(model, torch.randint(0, 256, (batch, prompt)), gen, args, rollout.CONFIGS[config], 4)
        hook.remove()
        cached = rollout.CONFIGS[config]["cache"] != "none"
        width = prompt + gen
        return [(b, w, width - w if cached else 0, min(w, args.block)) for b, w in hook.shapes]
    args = bd_rollout.parse_args(["--tiny", "--batch", str(batch), "--gen", str(gen), "--prompt-length", "130",
                                  "--engines", "eager"])
    model = bd_rollout.build_model(True, torch.device("cpu"))
    hook = ForwardShapes(model)
    bd_rollout.run_once(model, torch.randint(0, 256, (batch, 130)), args, "static", record["cache"])
    hook.remove()
    return bd_rollout._forwards(hook.shapes, args, record["cache"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", help="a results file with a 'records' list (benchmarks/results/*rollout_h200.json)")
    p.add_argument("--session", default="", help="only records whose 'session' contains this text")
    p.add_argument("--peak", type=float, help="matmul peak in TFLOP/s (default: each record's run_peak_flops)")
    args = p.parse_args(argv)
    path = Path(args.records)
    if not path.is_file():
        p.error(f"no records file at {path}")
    records = [r for r in json.loads(path.read_text()).get("records", [])
               if r["engine"] != "eager" and args.session in (r.get("session") or "")
               and r.get("decoder") == "quota" and r["family"] in ("llada", "sdar")]
    if not records:
        p.error(f"no non-eager quota-decoder records of session {args.session!r} in {path}")
    torch.set_num_threads(1)
    models = {}
    print("| family | B | cache | TPF | variant | ms per forward | recorded roofline | recomputed | peak TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        peak = args.peak * 1e12 if args.peak else r.get("run_peak_flops")
        bandwidth = r.get("run_bandwidth")
        if peak is None or bandwidth is None:
            p.error("records before the sixth H200 session carry no run_bandwidth/run_peak_flops: select newer ones "
                    "with --session")
        forwards = forwards_of(r)
        if len(forwards) != r["nfe"]:
            p.error(f"replayed {len(forwards)} forwards for a record of nfe {r['nfe']}: not this benchmark's settings")
        model = models.setdefault(r["family"], meta_model(r["family"]))
        fraction = Roofline(model, bandwidth, peak).roofline_s(forwards) / r["seconds"]
        print(f"| {r['family']} | {r['batch']} | {r['cache']} | {r['tokens_per_forward']:.0f} | {r.get('variant')} | "
              f"{r['ms_per_forward']:.2f} | {100 * r['roofline_fraction']:.1f} % | {100 * fraction:.1f} % | "
              f"{peak / 1e12:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
