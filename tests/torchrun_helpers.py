"""Launch a test worker under torchrun on this machine (gloo on the CPU, NCCL on CUDA), one way for every test file.

``--standalone`` lets the torchrun agent bind its own free rendezvous port: a port picked by the test and bound
later by the agent could be taken in between by another process (the full suite runs many).

A launch that fails is run once more, in an emptied output directory, before the test fails. The gloo workers of
these tests have failed rarely and not reproducibly when they ran after many other tests in one pytest process
(sessions 29-30), while every rerun passed. A retried launch that then passes warns with the first attempt's error
(pytest's warnings summary shows it), so a real intermittent bug stays visible; a launch that fails twice fails the
test with the failing rank's own error first (:func:`first_failure`).
"""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker_env(**extra: str) -> dict:
    """The workers' environment: this process's, with the repository's ``src`` first on the path and one thread per
    process (the workers' reduction order, and the single-process references set the same)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def first_failure(stderr: str) -> str:
    """The failing rank's own error first (the tail alone shows only the peers' "connection closed" errors)."""
    errors = [line for line in stderr.splitlines() if "Error" in line and "Connection closed" not in line]
    return "\n".join(errors[:12]) + "\n...\n" + stderr[-1500:]


def run_torchrun(script: Path, args: list[str], out: Path, nproc: int = 2, timeout: int = 600,
                 env: dict | None = None, attempts: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node NPROC SCRIPT ARGS`` from the repository root; ``out`` is the
    worker's output directory (emptied before a retry). Fails the calling test when every attempt fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(script), *map(str, args)]
    failures = []
    for attempt in range(attempts):
        if attempt:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or worker_env(),
                              cwd=ROOT)
        if proc.returncode == 0:
            if failures:
                warnings.warn(f"{script.name} under torchrun failed once, then passed; first attempt:\n{failures[0]}",
                              stacklevel=2)
            return proc
        failures.append(first_failure(proc.stderr))
    raise AssertionError(f"{script.name} under torchrun failed {attempts} times; last attempt:\n{failures[-1]}")
