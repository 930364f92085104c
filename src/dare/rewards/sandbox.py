"""Run untrusted Python (model-written code) in separate, limited processes, and decide the verdict
outside them.

``Sandbox().run(Program(code, tests))`` reports how many of ``tests`` pass. The candidate's code never
shares an interpreter, a stack or writable state with the code that decides pass/fail:

* **Call-and-compare tests** (``assert f(1) == 2``, HumanEval's ``check(candidate)`` of such asserts;
  :mod:`dare.rewards.test_cases`): the candidate runs in a sandboxed *server* process that loads it as
  module ``solution`` and answers calls; results come back as plain data (:mod:`dare.rewards.plain_data`:
  None/bool/int/float/str/bytes/list/tuple/dict/set with size and depth limits; anything else, such as
  an object whose ``__eq__`` always holds, fails), and the trusted parent compares them with the
  expected values, which never enter the sandbox.
* **Other tests** run in a second sandboxed process, the *runner*, which never loads candidate code:
  candidate names are proxies whose calls the parent forwards to the server. The runner's verdicts come
  over its own pipe, which no candidate process holds. Nothing is parsed from stdout.
* Timeouts are enforced by the parent per call (``test_timeout``) and per program (``timeout``); a
  server that hangs or dies is killed and restarted for the next test (at most ``max_restarts`` times).
* Zero tests is never a pass.

Backends (probed once, reported by :meth:`Sandbox.isolation`; ``docs/security.md`` has the threat model):

* **bwrap** (bubblewrap; ``auto`` picks it when it works): read-only root, new user/pid/net/ipc/uts
  namespaces, private size-limited tmpfs on ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run`` and over the
  home directories, a new session, dies with its parent.
* **subprocess** (the fallback, needs root): the launcher makes new mount/pid/net/ipc/uts namespaces
  itself with the same private tmpfs mounts and a fresh ``/proc``; without root (and without
  bubblewrap) the sandbox refuses to run and says how to install bubblewrap.
* Both: rlimits (address space, CPU, file size, open files, processes, no core), a memory limit for
  the whole process tree (a cgroup per slot where the cgroup file system is writable), the seccomp
  filter of :mod:`dare.rewards.seccomp` (no new namespaces, no unix sockets, no mounts/ptrace/bpf) with
  ``PR_SET_NO_NEW_PRIVS``, and, as root, a separate unprivileged uid per slot, checked unused by any
  account or process before each run; every process of that uid is killed after the run.
"""

from __future__ import annotations

import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from queue import Queue
from typing import Any

from dare.errors import ConfigError
from dare.rewards import plain_data
from dare.rewards.cgroups import MemoryCgroup
from dare.rewards.sandbox_scripts import LAUNCHER, RUNNER, SERVER
from dare.rewards.seccomp import filter_bytes
from dare.rewards.test_cases import CallCase, split_test

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
WORKDIR = "/tmp/work"
INSTALL_BWRAP = "install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap, or your distribution's package)"


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and isolation of sandboxed runs."""

    timeout: float = 10.0
    """Wall-clock seconds for one program (loading the code + all its tests); its processes are then killed."""
    test_timeout: float | None = None
    """Seconds per call into the candidate (enforced by the parent; a slow test fails, the others still run)."""
    memory_mb: int = 2048
    """Memory of the whole process tree (cgroup, where available) and address space of each process, MiB."""
    max_processes: int = 32
    """Processes/threads the program may have at once (RLIMIT_NPROC; stops fork bombs)."""
    max_file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE), MiB."""
    max_open_files: int = 256
    """Open file descriptors (RLIMIT_NOFILE)."""
    tmp_mb: int = 64
    """Size of each private tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run``), MiB."""
    backend: str = "auto"
    """``auto`` (bubblewrap when it works, else subprocess), ``bwrap`` or ``subprocess``."""
    workers: int | None = None
    """Programs run in parallel by :meth:`Sandbox.run_many` (default: CPU count)."""
    python: str | None = None
    """Interpreter for the programs (default: ``sys.executable`` when the sandbox user can run it)."""
    base_uid: int = 64000
    """When DARE runs as root, programs run as unused uids from ``base_uid`` up (one per slot)."""
    keep_output: int = 8192
    """Characters of stdout/stderr kept in each result."""
    max_restarts: int = 8
    """Times the candidate's server is restarted after a test killed it (timeout, crash, exit)."""
    hidden_paths: tuple[str, ...] = ("/home", "/root")
    """Directories replaced by an empty tmpfs in the sandbox (plus ``$HOME``), unless they hold its Python."""


@dataclass(frozen=True)
class Program:
    """``code`` (solution + setup) is loaded as a module; each snippet of ``tests`` is one test; ``setup``
    (e.g. MBPP's ``test_setup_code``) also runs in the test runner before script tests.

    Script tests see the candidate's module-level names as calls into its process, except names that would hide
    trusted code: Python's builtins and the names ``trusted`` defines (the task's own code, e.g. HumanEval's
    prompt with its helpers ``poly`` / ``encode_cyclic``, run in the test runner), so a candidate that defines
    ``abs`` or ``encode_cyclic`` changes what its own code calls, not what the tests call. ``entry_point`` (the
    function the task asks for) is the candidate's whatever its name."""

    code: str
    tests: Sequence[str] = ()
    setup: str = ""
    trusted: str = ""
    """Trusted source the test runner runs before the tests (not the candidate's: e.g. the task's prompt)."""
    entry_point: str | None = None
    """The name the task asks the candidate to define."""


@dataclass
class ExecResult:
    """The outcome of one sandboxed program."""

    status: str
    """``passed`` (every test passed, at least one test), ``failed`` (some test failed, or no tests),
    ``error`` (the code raised while loading), ``crashed`` (the candidate's process ended before
    loading finished) or ``timeout`` (the program's time ran out)."""
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
        """Fraction of tests passed (0.0 for a program without tests)."""
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "tests_passed": self.tests_passed,
            "tests_total": self.tests_total,
            "returncode": self.returncode,
            "duration": round(self.duration, 3),
            "stderr": self.stderr[-2000:],
        }


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


def _pids_of_uids(uids: Iterable[int | None]) -> list[int]:
    """Live (non-zombie) processes owned by any of ``uids`` (one pass over /proc)."""
    wanted = {uid for uid in uids if uid is not None}
    pids = []
    if not wanted:
        return pids
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid not in wanted:
                    continue
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                pids.append(int(pid))
    return pids


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


TIMEOUT, DEAD = "timeout", "dead"


class _Sandboxed:
    """One sandboxed interpreter: requests on its stdin, messages on a private pipe, output drained
    with a cap (the host only reads pipes it created; nothing inside the sandbox is ever opened)."""

    def __init__(self, command: list[str], msg_read: int, pass_fds: Sequence[int], keep: int):
        self.msg = msg_read
        self.closed = False
        self.buffer = b""
        self.output = {"stdout": bytearray(), "stderr": bytearray()}
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds), start_new_session=True,
        )  # fmt: skip
        self.drains = [
            threading.Thread(target=self._drain, args=(stream, self.output[name], keep), daemon=True)
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for thread in self.drains:
            thread.start()

    @staticmethod
    def _drain(stream, sink: bytearray, keep: int) -> None:
        try:
            while True:
                chunk = os.read(stream.fileno(), 1 << 16)
                if not chunk:
                    return
                if len(sink) < keep * 4:
                    sink.extend(chunk[: keep * 4 - len(sink)])
        except (OSError, ValueError):
            return

    def send(self, obj: Any) -> bool:
        try:
            self.proc.stdin.write((plain_data.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def recv(self, deadline: float) -> Any:
        """The next message (a JSON object), ``TIMEOUT`` or ``DEAD`` (exited, closed, garbage)."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            if not select.select([self.msg], [], [], left)[0]:
                return TIMEOUT
            try:
                chunk = os.read(self.msg, 1 << 16)
            except OSError:
                return DEAD
            if not chunk or len(self.buffer) > plain_data.MAX_MESSAGE_BYTES:
                return DEAD
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = plain_data.loads(line)
        except plain_data.NotPlainData:
            return DEAD
        return message if isinstance(message, dict) else DEAD

    def kill(self) -> None:
        """Kill the process group (the sandbox's namespaces die with it) and close our pipe ends (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for thread in self.drains:
            thread.join(timeout=2)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        os.close(self.msg)

    def text(self, name: str, keep: int) -> str:
        return bytes(self.output[name]).decode("utf-8", "replace")[:keep]


class _Slot:
    """Two uids (as root: the candidate's and the runner's, so neither can use up the other's process
    limit) and a memory cgroup (where writable), used by one program at a time."""

    def __init__(self, index: int, uids: tuple[int, int] | tuple[None, None], cgroup: MemoryCgroup | None):
        self.index, self.cgroup = index, cgroup
        self.uid, self.runner_uid = uids


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
        self._slots: Queue[_Slot] = Queue()
        self._all_slots: list[_Slot] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------- probing

    @cached_property
    def _setup(self) -> dict[str, Any]:
        """Decide backend, interpreter, uids, cgroups and filters (probed once)."""
        root = _running_as_root()
        want = self.config.backend
        bwrap = shutil.which("bwrap") if want != "subprocess" else None
        if not root and not bwrap:
            raise ConfigError(f"the code sandbox needs bubblewrap when DARE does not run as root: {INSTALL_BWRAP}")
        seccomp = filter_bytes()
        pythons = [self.config.python] if self.config.python else [sys.executable, *self._system_pythons()]
        free = self._free_uids(2 * max(8, 2 * self.workers)) if root else [None, None]
        uids = list(zip(free[::2], free[1::2]))
        cgroups = [MemoryCgroup.create(f"dare-sandbox-{os.getpid()}-{id(self)}-{i}", self.config.memory_mb << 20)
                   for i in range(len(uids))]  # fmt: skip
        backends = (["bwrap"] if bwrap else []) + (["subprocess"] if root and want != "bwrap" else [])
        for backend in backends:
            for python in pythons:
                setup = {"backend": backend, "python": python, "bwrap": bwrap, "seccomp": seccomp, "root": root}
                setup["hidden"] = self._hidden_paths(python)
                slot = _Slot(0, uids[0], cgroups[0])
                if self._probe(setup, slot):
                    for i, (uid, cgroup) in enumerate(zip(uids, cgroups)):
                        self._all_slots.append(_Slot(i, uid, cgroup))
                        self._slots.put(self._all_slots[-1])
                    return setup
        for cgroup in cgroups:
            if cgroup:
                cgroup.remove()
        if want == "bwrap":
            raise ConfigError("sandbox backend 'bwrap' requested but bubblewrap cannot create namespaces here")
        raise ConfigError(f"the code sandbox cannot create namespaces here (neither bubblewrap nor its root fallback works): {INSTALL_BWRAP}")

    def _free_uids(self, count: int) -> list[int]:
        busy = set()  # uids of live processes, one pass over /proc
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    busy.add(os.stat(f"/proc/{pid}").st_uid)
                except OSError:
                    pass
        uids, uid = [], self.config.base_uid
        while len(uids) < count and uid < self.config.base_uid + 100_000:
            if uid not in busy and not _has_account(uid):  # so killing everything of that uid hurts nobody
                uids.append(uid)
            uid += 1
        if len(uids) < count:
            raise ConfigError(f"sandbox: fewer than {count} unused uids from base_uid={self.config.base_uid}")
        return uids

    @staticmethod
    def _system_pythons() -> list[str]:
        found = []
        for directory in SAFE_PATH.split(":"):
            path = os.path.join(directory, "python3")
            if os.path.exists(path) and os.path.realpath(path) not in map(os.path.realpath, [sys.executable, *found]):
                found.append(path)
        return found

    def _hidden_paths(self, python: str) -> list[str]:
        """Existing directories hidden by an empty tmpfs; never one the interpreter lives in."""
        keep = [os.path.realpath(python)]
        paths = []
        for path in [*self.config.hidden_paths, os.path.expanduser("~")]:
            real = os.path.realpath(path)
            if os.path.isdir(real) and real != "/" and real not in paths and not any(
                k == real or k.startswith(real + "/") for k in keep
            ):
                paths.append(real)
        return paths

    def _probe(self, setup: dict[str, Any], slot: _Slot) -> bool:
        try:
            result = self._execute(Program("x = 1\ndef f(y):\n    return y + x\n", ["assert f(1) == 2", "assert x == 1"]),
                                   slot=slot, setup=setup, timeout=30)  # fmt: skip
        except OSError:
            return False
        return result.passed

    def isolation(self) -> dict[str, Any]:
        """What protects the host in this environment, property by property (see docs/security.md)."""
        setup = self._setup
        slot = self._all_slots[0]
        tree = {1: "cgroup v1 memory controller", 2: "cgroup v2"}.get(slot.cgroup.version if slot.cgroup else 0)
        return {
            "backend": setup["backend"],
            "network": "no network (own network namespace)",
            "pid_namespace": True,
            "parent_signalable": False,
            "private_tmp": f"tmpfs of {self.config.tmp_mb} MiB each on /tmp, /var/tmp, /dev/shm, /run",
            "hidden_paths": list(setup["hidden"]),
            "file_system": "read-only root" if setup["backend"] == "bwrap" else (
                "host root; the sandbox uid can write only world-writable directories outside the private tmpfs"),
            "unprivileged_uid": slot.uid is not None,
            "uids_checked_unused": slot.uid is not None,
            "process_limit_enforced": True,
            "memory_limit": f"process tree ({tree})" if tree else "per process only (RLIMIT_AS; no writable cgroup)",
            "no_new_privs": True,
            "seccomp": setup["seccomp"] is not None,
            "nested_user_namespaces": "blocked (seccomp)" if setup["seccomp"] else "allowed (no seccomp filter for this CPU)",
            "unix_sockets": "blocked (seccomp)" if setup["seccomp"] else "file-path sockets reachable",
            "verdict": "parent compares plain-data results; script tests run in a separate runner",
            "python": setup["python"],
            "timeout_s": self.config.timeout,
            "memory_mb": self.config.memory_mb,
            "max_processes": self.config.max_processes,
        }

    def close(self) -> None:
        """Remove the slot cgroups (also safe to skip: empty cgroups cost nothing)."""
        for slot in self._all_slots:
            if slot.cgroup:
                slot.cgroup.remove()

    # ---------------------------------------------------------------------------------- running

    def run(self, program: Program) -> ExecResult:
        """Run one program (blocks until done or timed out)."""
        setup = self._setup
        with self._running:
            slot = self._take_slot()
            try:
                return self._execute(program, slot=slot, setup=setup, timeout=self.config.timeout)
            finally:
                self._slots.put(slot)

    def _take_slot(self) -> _Slot:
        for _ in range(len(self._all_slots)):
            slot = self._slots.get()
            if not _pids_of_uids((slot.uid, slot.runner_uid)):
                return slot
            self._slots.put(slot)  # some other process took this uid meanwhile: skip it
        raise ConfigError(f"sandbox: all sandbox uids from {self.config.base_uid} are in use by other processes")

    def leftover_processes(self) -> list[int]:
        """Live processes still running as one of this sandbox's uids (empty unless a kill failed)."""
        return _pids_of_uids(uid for slot in self._all_slots for uid in (slot.uid, slot.runner_uid))

    def run_many(self, programs: Iterable[Program], progress: bool = False, desc: str = "sandbox") -> list[ExecResult]:
        """Run programs on a bounded pool of ``workers``; results keep the input order."""
        programs = list(programs)
        if not programs:
            return []
        self._setup  # probe once, before the threads start
        with ThreadPoolExecutor(max_workers=min(self.workers, len(programs))) as pool:
            futures = pool.map(self.run, programs)
            if progress:
                from dare.progress import progress_bar

                futures = progress_bar(len(programs), desc, iterable=futures)
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

    def _spawn(self, script: str, slot: _Slot, setup: dict[str, Any], uid: int | None) -> _Sandboxed:
        msg_read, msg_write = os.pipe()
        env = {
            "PATH": SAFE_PATH, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": WORKDIR, "TMPDIR": "/tmp", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        }  # fmt: skip
        python_cmd = [setup["python"], "-I", "-c", script, str(msg_write)]
        tmp_bytes = self.config.tmp_mb << 20
        private = [p for p in ("/tmp", "/var/tmp", "/dev/shm", "/run") if os.path.isdir(p)]
        if setup["backend"] == "subprocess" and os.path.isdir("/dev/mqueue"):  # bwrap's /dev is new anyway
            private.append("/dev/mqueue")
        pass_fds = [msg_write]
        seccomp_fd = None
        config = {"cgroup": slot.cgroup.procs_file if slot.cgroup else None, "limits": self._limits(uid),
                  "uid": uid, "env": env, "cwd": WORKDIR}  # fmt: skip
        if setup["backend"] == "bwrap":
            command = [setup["bwrap"], "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
            for path in private + [p for p in setup["hidden"] if p not in private]:
                command += ["--size", str(tmp_bytes), "--tmpfs", path]
            command += ["--dir", WORKDIR, "--chdir", WORKDIR, "--unshare-all", "--die-with-parent", "--new-session",
                        "--hostname", "sandbox"]  # fmt: skip
            if setup["seccomp"]:
                seccomp_fd = os.memfd_create("dare-seccomp", 0)
                os.write(seccomp_fd, setup["seccomp"])
                os.lseek(seccomp_fd, 0, os.SEEK_SET)
                command += ["--seccomp", str(seccomp_fd)]
                pass_fds.append(seccomp_fd)
            command += python_cmd
            config.update(namespaces=False, tmpfs=[], seccomp=None)
        else:
            command = python_cmd
            tmpfs = [(p, tmp_bytes) for p in private + [p for p in setup["hidden"] if p not in private]]
            config.update(namespaces=True, tmpfs=tmpfs, seccomp=setup["seccomp"].hex() if setup["seccomp"] else None)
        launcher = [sys.executable, "-I", "-S", "-c", LAUNCHER, plain_data.dumps(config), *command]
        try:
            return _Sandboxed(launcher, msg_read, pass_fds, self.config.keep_output)
        except OSError:
            os.close(msg_read)
            raise
        finally:
            os.close(msg_write)
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _execute(self, program: Program, *, slot: _Slot, setup: dict[str, Any], timeout: float) -> ExecResult:
        run = _Run(self, program, slot, setup, timeout)
        try:
            return run.result()
        finally:
            run.cleanup()


class _Run:
    """One program: the candidate's server (restarted after a fatal test), the runner, the verdicts."""

    def __init__(self, sandbox: Sandbox, program: Program, slot: _Slot, setup: dict[str, Any], timeout: float):
        self.sandbox, self.program, self.slot, self.setup = sandbox, program, slot, setup
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.server: _Sandboxed | None = None
        self.loaded: dict[str, Any] | None = None
        self.processes: list[_Sandboxed] = []
        self.restarts = 0
        self.load_status = ""
        self.timed_out = False
        self.sequence = 0
        self.notes: list[str] = []
        """Why call tests failed (host side only: never shown to the candidate)."""

    # the candidate's server ---------------------------------------------------------------
    def _start_server(self) -> bool:
        """A loaded server, or False (load failed, crashed, out of time or restarts)."""
        if self.server is not None:
            return True
        if self.load_status or self.restarts > self.sandbox.config.max_restarts or time.monotonic() >= self.deadline:
            return False
        self.restarts += 1
        server = self.sandbox._spawn(SERVER, self.slot, self.setup, self.slot.uid)
        self.processes.append(server)
        server.send({"code": self.program.code})
        message = server.recv(self.deadline)
        if message == TIMEOUT:
            self.timed_out = True
        if not isinstance(message, dict) or message.get("loaded") is not True:
            self.load_status = "error" if isinstance(message, dict) and message.get("loaded") is False else (
                "timeout" if message == TIMEOUT else "crashed")
            server.kill()
            return False
        names, values, modules = message.get("names"), message.get("values"), message.get("modules")
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(values, dict)
                and isinstance(modules, dict) and all(isinstance(m, str) for m in modules.values())):
            self.load_status = "crashed"
            server.kill()
            return False
        self.loaded = {"names": names, "values": values, "modules": modules}
        self.server = server
        return True

    def call(self, name: str, args: Any, kwargs: Any) -> dict[str, Any]:
        """``{"value": encoded}`` or ``{"error": kind, "message": ...}``; a hung or dead server is killed."""
        if not self._start_server():
            return {"error": "RuntimeError", "message": "the candidate's process is not running"}
        self.sequence += 1
        seq = self.sequence
        if not self.server.send({"name": name, "seq": seq, "args": args, "kwargs": kwargs}):
            return self._lost("RuntimeError", "the candidate's process exited")
        test_timeout = self.sandbox.config.test_timeout
        deadline = min(self.deadline, time.monotonic() + test_timeout) if test_timeout else self.deadline
        while True:
            reply = self.server.recv(deadline)
            if reply == TIMEOUT:
                self.timed_out = time.monotonic() >= self.deadline
                return self._lost("TimeoutError", "the call timed out")
            if reply == DEAD:
                return self._lost("RuntimeError", "the candidate's process exited")
            if reply.get("seq") == seq and ("value" in reply or "error" in reply):
                if "value" in reply:
                    return {"value": reply["value"]}
                return {"error": str(reply.get("error"))[:100], "message": str(reply.get("message", ""))[:500]}

    def _lost(self, kind: str, message: str) -> dict[str, Any]:
        self.server.kill()
        self.server = None
        return {"error": kind, "message": message}

    # tests ---------------------------------------------------------------------------------
    def _call_test(self, index: int, cases: list[CallCase]) -> bool:
        for case in cases:
            try:
                args, kwargs = plain_data.encode(list(case.args)), plain_data.encode(dict(case.kwargs))
            except plain_data.NotPlainData:
                self.notes.append(f"test {index}: arguments of {case.name}() are not plain data")
                return False
            reply = self.call(case.name, args, kwargs)
            if "value" not in reply:
                self.notes.append(f"test {index}: {case.name}() raised {reply['error']}: {reply['message'][:200]}")
                return False
            try:
                value = plain_data.decode(reply["value"])
                same = value == case.expected
            except (plain_data.NotPlainData, RecursionError):
                self.notes.append(f"test {index}: {case.name}() returned something that is not plain data")
                return False
            if not same:
                self.notes.append(f"test {index}: AssertionError: {case.name}() returned {repr(value)[:200]}")
                return False
        return True

    def _script_tests(self, scripts: list[str]) -> list[bool]:
        verdicts = [False] * len(scripts)
        if not scripts or not self._start_server():
            return verdicts
        runner = self.sandbox._spawn(RUNNER, self.slot, self.setup, self.slot.runner_uid)
        self.processes.append(runner)
        runner.send({"tests": scripts, "setup": self.program.setup, "trusted": self.program.trusted,
                     "entry": self.program.entry_point, **self.loaded})
        while True:
            message = runner.recv(self.deadline)
            if message in (TIMEOUT, DEAD):
                self.timed_out = self.timed_out or message == TIMEOUT
                return verdicts
            if "call" in message:
                reply = self.call(str(message["call"]), message.get("args"), message.get("kwargs"))
                if not runner.send(reply):
                    return verdicts
            elif "test" in message:
                index = message["test"]
                if type(index) is int and 0 <= index < len(verdicts):
                    verdicts[index] = message.get("ok") is True
            elif message.get("done"):
                return verdicts

    def result(self) -> ExecResult:
        tests = list(self.program.tests)
        split = [split_test(t) for t in tests]
        verdicts: list[bool] = [False] * len(tests)
        if self._start_server():
            for i, cases in enumerate(split):
                if cases is not None:
                    verdicts[i] = bool(cases) and self._call_test(i, cases)
            script_index = [i for i, cases in enumerate(split) if cases is None]
            for i, ok in zip(script_index, self._script_tests([tests[i] for i in script_index])):
                verdicts[i] = ok
        passed = sum(verdicts)
        if self.load_status and self.loaded is None:
            status = self.load_status
        elif self.timed_out:
            status = "timeout"
        else:
            status = "passed" if tests and passed == len(tests) else "failed"
        keep = self.sandbox.config.keep_output
        for process in self.processes:
            process.kill()
        stdout = "".join(p.text("stdout", keep) for p in self.processes)[:keep]
        stderr = ("".join(p.text("stderr", keep) for p in self.processes) + "".join(n + "\n" for n in self.notes))[-keep:]
        returncode = self.processes[0].proc.returncode if self.processes else None
        return ExecResult(status, passed, len(tests), returncode, time.monotonic() - self.start, stdout, stderr)

    def cleanup(self) -> None:
        for process in self.processes:
            process.kill()
        for _ in range(20):  # the slot's uids were unused before the run: all their processes are ours
            pids = _pids_of_uids((self.slot.uid, self.slot.runner_uid))
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)


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
