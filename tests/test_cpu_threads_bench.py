"""benchmarks/cpu_threads.py --smoke: each setting runs in its own process with the requested torch thread count
and wait policy, and every call is timed."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_threads_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("cpu_threads_benchmark", ROOT / "benchmarks" / "cpu_threads.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--smoke", "--threads", "2", "--passive", "--json", str(tmp_path / "threads.json")])
    settings = [(r["load"], r["threads"], r["wait_policy"]) for r in report["records"]]
    assert settings == [(0, 2, "default"), (0, 2, "passive")]  # the child ran with OMP_NUM_THREADS=2, not ours
    for record in report["records"]:
        for call in ("forward_backward", "decode_forward"):
            assert record[call]["wall_ms"] > 0 and record[call]["cpu_ms"] > 0
    assert (tmp_path / "threads.json").exists()
