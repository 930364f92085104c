"""Source code that runs inside the sandbox (standard library only; built into ``python -I -c`` strings).

* :data:`LAUNCHER` (``python -I -S``, as root or the DARE user): joins the slot's memory cgroup; for
  the namespace fallback it also makes new mount/pid/net/ipc/uts namespaces, forks the pid-1 init (which forks the candidate),
  mounts private size-limited tmpfs on ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run`` (and over hidden
  paths), a fresh ``/proc``; then applies rlimits, drops to the slot uid, sets the parent-death signal,
  ``PR_SET_NO_NEW_PRIVS`` and the seccomp filter, and execs the interpreter (or bubblewrap).
* :data:`SERVER` (the candidate's process): loads the candidate as module ``solution``, reports its
  public names, then answers call requests from stdin with plain-data results on the message fd.
* :data:`RUNNER` (a test runner that never loads candidate code): runs script tests whose candidate
  names are proxies; each call goes to the parent, which forwards it to the server. It reports one
  verdict per test on its own message fd, which no candidate process can reach.
"""

from __future__ import annotations

import os

from dare.rewards.seccomp import INSTALL_SOURCE

with open(os.path.join(os.path.dirname(__file__), "plain_data.py"), encoding="utf-8") as _f:
    PLAIN_DATA_SOURCE = _f.read()

LAUNCHER = INSTALL_SOURCE + r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)

def fail(what):
    os.write(2, ("dare-sandbox: %s failed (errno %d)\n" % (what, ctypes.get_errno())).encode())
    os._exit(97)

def mount(source, target, fstype, flags, data):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        fail("mount " + target)

if cfg["cgroup"]:
    with open(cfg["cgroup"], "w") as f:
        f.write(str(os.getpid()))
if cfg["namespaces"]:
    if libc.unshare(0x20000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000) != 0:
        fail("unshare")
    child = os.fork()
    if child:  # the waiter, outside the namespaces: exits with the sandbox's status
        _, status = os.waitpid(child, 0)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 99)
    MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    for path, size in cfg["tmpfs"]:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=1777" % size)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    libc.sethostname(b"sandbox", 7)
    os.makedirs(cfg["cwd"], exist_ok=True)
    if cfg["uid"] is not None:
        os.chown(cfg["cwd"], cfg["uid"], cfg["uid"])
    os.chdir(cfg["cwd"])
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: this init (and so the namespace) dies with the waiter
    main = os.fork()
    if main:  # pid 1 of the namespace: reap everything, exit with the candidate's status (killing the rest)
        while True:
            pid, status = os.wait()
            if pid == main:
                os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 99)
    os.setsid()
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
if cfg["namespaces"]:
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: the candidate dies with the namespace's init
if cfg["seccomp"]:
    install_seccomp(cfg["seccomp"])
os.execve(sys.argv[2], sys.argv[2:], cfg["env"])
"""

_COMMON = PLAIN_DATA_SOURCE + r"""
import builtins, os, sys, traceback

class _Channel:
    def __init__(self, fd):
        self.fd = fd
    def send(self, obj):
        data = (dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

def _describe(err):
    try:
        return type(err).__name__, str(err)[:500]
    except BaseException:
        return "Exception", "(unprintable)"
"""

SERVER = _COMMON + r"""
def _dare_server():
    import types
    channel = _Channel(int(sys.argv[1]))
    requests = sys.stdin
    job = loads(requests.readline())
    module = types.ModuleType("solution")
    sys.modules["solution"] = module
    try:
        exec(compile(job["code"], "solution.py", "exec"), module.__dict__)
    except BaseException:
        traceback.print_exc()
        channel.send({"loaded": False})
        sys.stderr.flush()
        os._exit(0)
    names, values, modules = [], {}, {}
    for name, value in list(module.__dict__.items()):
        if name.startswith("__"):
            continue
        if type(value) is types.ModuleType:
            modules[name] = str(value.__name__)
        elif callable(value):
            names.append(name)
        else:
            try:
                values[name] = encode(value)
            except BaseException:
                pass
    channel.send({"loaded": True, "names": names, "values": values, "modules": modules})
    for line in requests:
        request = loads(line)
        try:
            func = module.__dict__[request["name"]]
            value = func(*decode(request["args"]), **decode(request["kwargs"]))
            reply = {"seq": request["seq"], "value": encode(value)}
        except BaseException as err:
            kind, message = _describe(err)
            reply = {"seq": request["seq"], "error": kind, "message": message}
        channel.send(reply)

_dare_server()
"""

RUNNER = _COMMON + r"""
def _dare_runner():
    channel = _Channel(int(sys.argv[1]))
    replies = sys.stdin
    job = loads(replies.readline())
    counter = [0]

    class CandidateError(Exception):
        pass

    def proxy(name):
        def call(*args, **kwargs):
            counter[0] += 1
            channel.send({"call": name, "seq": counter[0], "args": encode(list(args)), "kwargs": encode(kwargs)})
            reply = loads(replies.readline())
            if "value" in reply:
                return decode(reply["value"])
            kind = getattr(builtins, str(reply.get("error")), None)
            # re-raised by type (tests may expect ValueError), except the ones that end iterations: a
            # StopIteration out of a candidate call would end map() / a generator silently, as if it succeeded
            if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(
                    kind, (StopIteration, StopAsyncIteration)):
                raise kind(reply.get("message", ""))
            raise CandidateError("%s: %s" % (reply.get("error"), reply.get("message", "")))
        call.__name__ = call.__qualname__ = name
        return call

    import importlib
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    if job.get("trusted"):  # the task's own code (e.g. HumanEval's prompt and its helpers)
        try:
            exec(compile(job["trusted"], "task.py", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
    entry = job.get("entry")
    hidden = set(dir(builtins)) | set(namespace)

    def candidates(names):  # the candidate's names that may reach the tests: none that hides trusted code
        return [n for n in names if n == entry or not (n.startswith("__") or n in hidden)]

    for name in candidates(job["modules"]):  # modules the candidate imported (installed code only)
        try:
            namespace[name] = importlib.import_module(job["modules"][name])
        except BaseException:
            pass
    for name in candidates(job["values"]):
        namespace[name] = decode(job["values"][name])
    for name in candidates(job["names"]):
        namespace[name] = proxy(name)
    try:
        exec(compile(job["setup"], "setup.py", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, "test_%d.py" % i, "exec"), namespace)
            ok = True
        except BaseException:
            traceback.print_exc()
            ok = False
        channel.send({"test": i, "ok": ok})
    channel.send({"done": True})

_dare_runner()
"""
