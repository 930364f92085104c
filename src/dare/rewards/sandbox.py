"""Run untrusted Python (model-written code and its tests) in a separate, limited process.

``Sandbox().run(Program(code, tests))`` executes ``code`` then each test snippet in one fresh
interpreter and reports how many tests passed. Layers, each probed once and reported by
:meth:`Sandbox.isolation`:

* **bubblewrap** (``backend="bwrap"``, chosen by ``auto`` when ``bwrap`` works): read-only root, private
  tmpfs ``/tmp`` as the working directory, new user/pid/net/ipc/uts namespaces (no network, processes
  die with the sandbox), new session.
* **subprocess** fallback: a fresh temp working directory, no network through a new network namespace
  (``unshare(CLONE_NEWNET)``, root or unprivileged user namespaces); where no namespace can be made,
  the harness replaces the ``socket`` module's constructors, which stops Python-level sockets only.
* Both: rlimits (address space, CPU seconds, file size, open files, processes; no core dumps), a
  wall-clock timeout that kills the whole process group, a minimal environment, ``python -I``. When
  DARE runs as root, each concurrent run has its own unprivileged uid (from ``base_uid`` up): the
  process limit then holds (root ignores ``RLIMIT_NPROC``), the file system is read-only outside
  world-writable directories, and every leftover process of that uid is killed after the run. As
  root the sandbox therefore needs a Python that uid may execute: ``sys.executable`` if readable,
  else the system ``python3`` (standard library only).

**Verdicts** never come from the exit status alone: the harness reads a random per-run token from
stdin (closed before the untrusted code runs; the token is in no file, argument or environment
variable), runs the code and tests, then writes ``<token> <passed> <total> <setup_ok>`` and ends with
``os._exit(0)``. ``sys.exit``/``os._exit``/``raise SystemExit`` anywhere, a crash, a kill, or printed
look-alike markers therefore fail. Limits of the guarantee: code that inspects the harness's own
frames can read the token, and tests that compare with ``==`` can be fooled by objects whose
``__eq__`` always holds (as in every reference harness); the process-level containment does not
depend on either.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from queue import Queue
from typing import Any

from dare.errors import ConfigError


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of sandboxed runs."""

    timeout: float = 10.0
    """Wall-clock seconds for one program (code + all its tests); the process group is then killed."""
    test_timeout: float | None = None
    """Seconds per test snippet (SIGALRM inside the harness; a slow test fails, the others still run)."""
    memory_mb: int = 2048
    """Address-space limit (RLIMIT_AS) of each process, MiB."""
    max_processes: int = 32
    """Processes/threads the program may have at once (RLIMIT_NPROC; stops fork bombs)."""
    max_file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE), MiB; also caps its stdout/stderr."""
    max_open_files: int = 256
    """Open file descriptors (RLIMIT_NOFILE)."""
    backend: str = "auto"
    """``auto`` (bubblewrap when it works, else subprocess), ``bwrap`` or ``subprocess``."""
    workers: int | None = None
    """Programs run in parallel by :meth:`Sandbox.run_many` (default: CPU count)."""
    python: str | None = None
    """Interpreter for the programs (default: ``sys.executable`` when the sandbox user can run it)."""
    base_uid: int = 64000
    """When DARE runs as root, programs run as uids ``base_uid ... base_uid + max(64, 4 * workers) - 1``."""
    keep_output: int = 8192
    """Characters of stdout/stderr kept in each result."""


@dataclass(frozen=True)
class Program:
    """``code`` (solution + setup) runs first; then each snippet of ``tests`` in the same namespace."""

    code: str
    tests: Sequence[str] = ()


@dataclass
class ExecResult:
    """The outcome of one sandboxed program."""

    status: str
    """``passed`` (marker seen, every test passed), ``failed`` (some test failed), ``error`` (the code
    raised before the tests), ``timeout``, or ``no_marker`` (exited/crashed/killed before reporting)."""
    tests_passed: int = 0
    tests_total: int = 0
    returncode: int | None = None
    duration: float = 0.0
    stdout: str = ""
    stderr: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def fraction(self) -> float:
        """Fraction of tests passed (1.0/0.0 for a program without tests)."""
        if self.tests_total == 0:
            return float(self.passed)
        return self.tests_passed / self.tests_total

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "tests_passed": self.tests_passed,
            "tests_total": self.tests_total,
            "returncode": self.returncode,
            "duration": round(self.duration, 3),
            "stderr": self.stderr[-2000:],
        }


# Runs in the sandboxed interpreter (python -I); reads the token from stdin before any untrusted code.
HARNESS = r"""
import json, os, signal, sys, traceback

def _dare_harness():
    token = sys.stdin.readline().strip()
    sys.stdin.close()
    try:
        os.close(0)
    except OSError:
        pass
    with open("program.json", encoding="utf-8") as f:
        spec = json.load(f)
    if spec["guard_network"]:
        import socket
        def _no_network(*args, **kwargs):
            raise OSError("network access is disabled in the DARE sandbox")
        socket.socket = socket.create_connection = socket.socketpair = socket.fromfd = _no_network

    class _TestTimeout(BaseException):
        pass

    def _alarm(signum, frame):
        raise _TestTimeout("test timed out")

    namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    setup_ok, passed, tests = True, 0, spec["tests"]
    try:
        exec(compile(spec["code"], "solution.py", "exec"), namespace)
    except Exception:
        setup_ok = False
        traceback.print_exc()
    if setup_ok:
        for i, test in enumerate(tests):
            if spec["test_timeout"]:
                signal.signal(signal.SIGALRM, _alarm)
                signal.setitimer(signal.ITIMER_REAL, spec["test_timeout"])
            try:
                exec(compile(test, "test_%d.py" % i, "exec"), namespace)
                passed += 1
            except (Exception, _TestTimeout):
                traceback.print_exc()
            finally:
                if spec["test_timeout"]:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os.write(1, ("\n%s %d %d %d\n" % (token, passed, len(tests), int(setup_ok))).encode())
    os._exit(0)

_dare_harness()
"""

# Runs first (python -I -S): applies limits, leaves the network namespace, drops to the slot uid, execs.
LAUNCHER = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
if cfg["unshare"]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(cfg["unshare"]) != 0:
        os.write(2, b"dare-sandbox: unshare failed\n")
        os._exit(97)
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
os.execve(sys.argv[2], sys.argv[2:], cfg["env"])
"""

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _count_user_tasks(uid: int) -> int:
    """Tasks (processes and threads) owned by ``uid``: RLIMIT_NPROC counts them all."""
    total = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    total += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return total


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes of ``uid``."""
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                pids.append(int(pid))
    return pids


class Sandbox:
    """Runs :class:`Program` objects in isolated processes; thread-safe, one instance can be shared."""

    def __init__(self, config: SandboxConfig | None = None, **overrides: Any):
        config = config or SandboxConfig()
        if overrides:
            try:
                config = replace(config, **overrides)
            except TypeError as err:
                raise ConfigError(f"sandbox: {err}") from None
        if config.backend not in ("auto", "bwrap", "subprocess"):
            raise ConfigError(f"sandbox backend must be auto, bwrap or subprocess, not '{config.backend}'")
        if config.timeout <= 0:
            raise ConfigError(f"sandbox timeout must be positive, got {config.timeout}")
        self.config = config
        self.workers = max(1, config.workers or os.cpu_count() or 1)
        self._running = threading.BoundedSemaphore(self.workers)
        # uids are handed out least-recently-used first: processes killed after a run can stay zombies
        # (still counted by RLIMIT_NPROC) until init reaps them, so a uid rests before it is reused
        self.uid_pool = max(64, 4 * self.workers)
        self._slots: Queue[int] = Queue()
        for slot in range(self.uid_pool):
            self._slots.put(slot)

    # ------------------------------------------------------------------------------- probing

    @cached_property
    def _setup(self) -> dict[str, Any]:
        """Decide backend, interpreter, uid dropping and network isolation (probed once)."""
        root = _running_as_root()
        candidates = [self.config.python] if self.config.python else [sys.executable, *self._system_pythons()]
        drop = root and self.config.base_uid is not None
        setup: dict[str, Any] = {}
        for python in candidates:
            if drop and not self._probe(python, uid=self.config.base_uid, backend="subprocess", unshare=0):
                continue
            setup = {"python": python, "drop_uid": drop}
            break
        if not setup:  # nobody but us can run an interpreter: keep our uid (no process limit as root)
            setup = {"python": self.config.python or sys.executable, "drop_uid": False}
        uid = self.config.base_uid if setup["drop_uid"] else None
        want = self.config.backend
        bwrap_ok = want != "subprocess" and shutil.which("bwrap") is not None and self._probe(
            setup["python"], uid=uid, backend="bwrap", unshare=0
        )
        if want == "bwrap" and not bwrap_ok:
            raise ConfigError("sandbox backend 'bwrap' requested but bubblewrap is missing or cannot create namespaces here")
        setup["backend"] = "bwrap" if bwrap_ok else "subprocess"
        setup["unshare"] = 0
        setup["network"] = "namespace" if bwrap_ok else "socket-guard"
        if not bwrap_ok:
            for flags in (CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET):
                if self._probe(setup["python"], uid=uid, backend="subprocess", unshare=flags):
                    setup["unshare"], setup["network"] = flags, "namespace"
                    break
        return setup

    @staticmethod
    def _system_pythons() -> list[str]:
        found = []
        for directory in SAFE_PATH.split(":"):
            path = os.path.join(directory, "python3")
            if os.path.exists(path) and os.path.realpath(path) not in map(os.path.realpath, [sys.executable, *found]):
                found.append(path)
        return found

    def _probe(self, python: str, *, uid: int | None, backend: str, unshare: int) -> bool:
        setup = {"python": python, "drop_uid": uid is not None, "backend": backend, "unshare": unshare, "network": "probe"}
        try:
            result = self._execute(Program("import json, sys\n", ["assert 1 + 1 == 2"]), slot=0, setup=setup, timeout=30)
        except OSError:
            return False
        return result.passed

    def isolation(self) -> dict[str, Any]:
        """What protects the host in this environment (backend, network, uid, python, limits)."""
        setup = self._setup
        root = _running_as_root()
        return {
            "backend": setup["backend"],
            "network": {"namespace": "no network (own network namespace)", "socket-guard": "python socket module disabled only"}[
                setup["network"]
            ],
            "unprivileged_uid": setup["drop_uid"],
            "process_limit_enforced": setup["drop_uid"] or not root,
            "python": setup["python"],
            "timeout_s": self.config.timeout,
            "memory_mb": self.config.memory_mb,
            "max_processes": self.config.max_processes,
        }

    # ---------------------------------------------------------------------------------- running

    def run(self, program: Program) -> ExecResult:
        """Run one program (blocks until done or timed out)."""
        setup = self._setup
        with self._running:
            slot = self._slots.get()
            try:
                return self._execute(program, slot=slot, setup=setup, timeout=self.config.timeout)
            finally:
                self._slots.put(slot)

    def leftover_processes(self) -> list[int]:
        """Live processes still running as one of this sandbox's uids (empty unless a kill failed)."""
        if not self._setup["drop_uid"]:
            return []
        return [pid for slot in range(self.uid_pool) for pid in _pids_of_uid(self.config.base_uid + slot)]

    def run_many(self, programs: Iterable[Program], progress: bool = False, desc: str = "sandbox") -> list[ExecResult]:
        """Run programs on a bounded pool of ``workers``; results keep the input order."""
        programs = list(programs)
        if not programs:
            return []
        self._setup  # probe once, before the threads start
        with ThreadPoolExecutor(max_workers=min(self.workers, len(programs))) as pool:
            futures = pool.map(self.run, programs)
            if progress:
                from tqdm.auto import tqdm

                futures = tqdm(futures, total=len(programs), desc=desc)
            return list(futures)

    def _limits(self, uid: int | None) -> dict[str, int]:
        nproc = self.config.max_processes
        if uid is None:  # RLIMIT_NPROC counts every task of our uid, so leave room for the existing ones
            nproc += _count_user_tasks(os.getuid())
        return {
            "RLIMIT_AS": self.config.memory_mb << 20,
            "RLIMIT_CPU": int(self.config.timeout) + 2,
            "RLIMIT_FSIZE": self.config.max_file_mb << 20,
            "RLIMIT_NOFILE": self.config.max_open_files,
            "RLIMIT_NPROC": nproc,
            "RLIMIT_CORE": 0,
        }

    def _execute(self, program: Program, *, slot: int, setup: dict[str, Any], timeout: float) -> ExecResult:
        uid = self.config.base_uid + slot if setup["drop_uid"] else None
        workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
        token = secrets.token_hex(16)
        try:
            spec = {
                "code": program.code,
                "tests": list(program.tests),
                "test_timeout": self.config.test_timeout,
                "guard_network": setup["network"] == "socket-guard",
            }
            with open(os.path.join(workdir, "program.json"), "w", encoding="utf-8") as f:
                json.dump(spec, f)
            if uid is not None:
                os.chown(workdir, uid, uid)
                os.chown(os.path.join(workdir, "program.json"), uid, uid)
            os.chmod(workdir, 0o700)
            env = {
                "PATH": SAFE_PATH,
                "LANG": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8",
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
            python_cmd = [setup["python"], "-I", "-c", HARNESS]
            if setup["backend"] == "bwrap":
                cwd_inside = "/tmp/work"
                env.update(HOME=cwd_inside, TMPDIR="/tmp")
                bwrap = shutil.which("bwrap")
                command = [
                    bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                    "--size", str(64 << 20), "--tmpfs", "/tmp", "--dir", cwd_inside,
                    "--ro-bind", os.path.join(workdir, "program.json"), f"{cwd_inside}/program.json",
                    "--chdir", cwd_inside, "--unshare-all", "--die-with-parent", "--new-session",
                    "--hostname", "sandbox", *python_cmd,
                ]  # fmt: skip
            else:
                env.update(HOME=workdir, TMPDIR=workdir)
                command = python_cmd
            config = {"unshare": setup["unshare"], "limits": self._limits(uid), "uid": uid, "env": env}
            launcher = [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(config), *command]
            return self._spawn(launcher, workdir, token, timeout, uid, len(program.tests), setup["python"])
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _spawn(self, command, workdir, token, timeout, uid, n_tests, python) -> ExecResult:
        out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
        start = time.monotonic()
        with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=workdir, start_new_session=True, close_fds=True
            )
            try:
                proc.stdin.write(f"{token}\n".encode())
                proc.stdin.close()
            except OSError:  # the program died before reading its token
                pass
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                self._kill(proc, uid, python)
            duration = time.monotonic() - start
            stdout, stderr = self._read(out), self._read(err)
        result = ExecResult("timeout" if timed_out else "no_marker", 0, n_tests, proc.returncode, duration, stdout, stderr)
        if timed_out:
            return result
        marker = self._find_marker(stdout_tail=self._tail(out_path), token=token)
        if marker is None or proc.returncode != 0:
            return result
        passed, total, setup_ok = marker
        result.tests_passed, result.tests_total = passed, total
        result.status = "passed" if setup_ok and passed == total else ("failed" if setup_ok else "error")
        result.stdout = result.stdout.replace(token, "<token>")
        return result

    def _kill(self, proc: subprocess.Popen, uid: int | None, python: str) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if uid is None:
            return
        for _ in range(50):  # processes that left the group (setsid + fork) still run as the slot uid
            if not _pids_of_uid(uid):
                return
            subprocess.run(
                [python, "-I", "-S", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
                user=uid, group=uid, extra_groups=[], env={}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                check=False,
            )  # fmt: skip

    def _read(self, f) -> str:
        f.seek(0)
        data = f.read(self.config.keep_output * 4)
        return data.decode("utf-8", "replace")[: self.config.keep_output]

    @staticmethod
    def _tail(path: str, size: int = 65536) -> str:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", "replace")

    @staticmethod
    def _find_marker(stdout_tail: str, token: str) -> tuple[int, int, bool] | None:
        for line in reversed(stdout_tail.splitlines()):
            parts = line.split()
            if len(parts) == 4 and parts[0] == token and all(p.isdigit() for p in parts[1:]):
                return int(parts[1]), int(parts[2]), parts[3] == "1"
        return None


_DEFAULT: dict[SandboxConfig, Sandbox] = {}
_DEFAULT_LOCK = threading.Lock()


def default_sandbox(config: SandboxConfig | None = None) -> Sandbox:
    """A shared sandbox per configuration (probing happens once per process)."""
    config = config or SandboxConfig()
    with _DEFAULT_LOCK:
        if config not in _DEFAULT:
            _DEFAULT[config] = Sandbox(config)
        return _DEFAULT[config]


__all__ = ["ExecResult", "Program", "Sandbox", "SandboxConfig", "default_sandbox"]
