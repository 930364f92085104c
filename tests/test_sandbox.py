"""The code sandbox: verdicts are decided outside the candidate's process, and hostile programs are contained.

Every containment test runs on each backend that works here: the namespace fallback (as root; what a
CI machine without bubblewrap exercises) and bubblewrap when it is installed and usable.
"""

import os
import socket
import threading
import time

import pytest

from dare.errors import ConfigError
from dare.rewards.sandbox import Program, Sandbox, SandboxConfig, _running_as_root


def _backends():
    backends = []
    for backend in ("subprocess", "bwrap"):
        try:
            if Sandbox(backend=backend).isolation()["backend"] == backend:
                backends.append(backend)
        except ConfigError:  # not usable here (the fallback needs root, bwrap needs namespaces)
            pass
    return backends


BACKENDS = _backends()
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no sandbox backend works on this machine")


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    return Sandbox(SandboxConfig(backend=request.param, timeout=2.5, workers=2, memory_mb=768, max_processes=16))


def run(sandbox, code, tests=("assert True",)):
    return sandbox.run(Program(code, list(tests)))


def test_isolation_report_names_backend(sandbox):
    info = sandbox.isolation()
    assert info["backend"] == sandbox.config.backend
    assert info["network"].startswith(("no network", "python socket"))


def test_correct_and_wrong_programs(sandbox):
    ok = run(sandbox, "def inc(x):\n    return x + 1\n", ["assert inc(1) == 2", "assert inc(-1) == 0"])
    assert ok.status == "passed" and ok.passed and (ok.tests_passed, ok.tests_total) == (2, 2) and ok.fraction == 1.0
    bad = run(sandbox, "def inc(x):\n    return x + 2\n", ["assert inc(1) == 3", "assert inc(-1) == 0", "assert inc(0) == 1"])
    assert bad.status == "failed" and not bad.passed and (bad.tests_passed, bad.tests_total) == (1, 3)
    assert "AssertionError" in bad.stderr
    crash = run(sandbox, "def inc(x):\n    return x +\n")
    assert crash.status == "error" and "SyntaxError" in crash.stderr


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(0)\n",
        "raise SystemExit(0)\n",
        "import os\nos._exit(0)\n",
        "def f():\n    import sys; sys.exit(0)\n",  # exits from inside the test below
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    ],
)
def test_exiting_early_is_never_a_pass(sandbox, code):
    result = run(sandbox, code, ["f()" if "def f" in code else "assert True", "assert False"])
    assert not result.passed and result.tests_passed == 0


def test_forged_markers_are_not_a_pass(sandbox):
    # every plausible marker line, printed and then exiting cleanly before the failing test runs
    code = (
        "import os, sys\n"
        "print('PASSED'); print('ok 1 1 1'); print('0' * 32 + ' 1 1 1'); print('<token> 1 1 1')\n"
        "sys.stdout.flush()\n"
        "os.write(1, b'\\n' + b'f' * 32 + b' 1 1 1\\n')\n"
        "os._exit(0)\n"
    )
    result = run(sandbox, code, ["assert False"])
    assert not result.passed and result.status == "crashed"


def test_token_is_not_in_environment_or_arguments(sandbox):
    code = (
        "import os, sys\n"
        "leak = ' '.join(sys.argv) + ' '.join(os.environ.values())\n"
        "secret = [w for w in leak.split() if len(w) == 32 and all(c in '0123456789abcdef' for c in w)]\n"
    )
    result = run(sandbox, code, ["assert not secret, secret"])
    assert result.passed, result.stderr


def test_killing_the_parent_is_contained(sandbox):
    code = "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass\n"
    result = run(sandbox, code, ["assert False"])
    assert not result.passed
    assert run(sandbox, "x = 1", ["assert x == 1"]).passed  # we are alive and the sandbox still works


def test_infinite_loop_times_out(sandbox):
    start = time.monotonic()
    result = run(sandbox, "while True:\n    pass\n")
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - start < sandbox.config.timeout + 3


def test_per_test_timeout_fails_only_that_test():
    box = Sandbox(SandboxConfig(backend=BACKENDS[-1], timeout=8.0, test_timeout=0.5))
    result = box.run(Program("def f(x):\n    while x:\n        pass\n    return 1\n", ["assert f(0) == 1", "f(1)", "assert f(0) == 1"]))
    assert result.status == "failed" and (result.tests_passed, result.tests_total) == (2, 3)


def test_huge_memory_is_refused(sandbox):
    result = run(sandbox, "blob = bytearray(4 * 1024 ** 3)\n")  # 4 GiB > the 768 MiB limit
    assert not result.passed and "MemoryError" in result.stderr


def test_fork_bomb_is_contained(sandbox):
    assert sandbox.isolation()["process_limit_enforced"]
    # how many children can exist at once (they sleep), then a real bomb
    count = (
        "import os, time\nkids = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    kids += 1\n"
    )
    limited = run(sandbox, count, ["assert kids < 16, kids"])
    assert limited.passed, limited.stderr
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    result = run(sandbox, bomb)
    assert not result.passed and time.monotonic() - start < sandbox.config.timeout + 5
    assert sandbox.leftover_processes() == []
    assert run(sandbox, "x = 2", ["assert x == 2"]).passed


def test_escaped_daemon_is_killed(sandbox):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
    assert run(sandbox, code).passed
    assert sandbox.leftover_processes() == []


def test_writes_outside_the_work_dir_are_contained(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    code = (
        "import os\nblocked = 0\n"
        f"for path in [{str(target)!r}, '/escaped_by_sandbox.txt', os.path.expanduser('~/../escaped.txt')]:\n"
        "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        blocked += 1\n"
        "open('inside.txt', 'w').write('fine')\n"
        "inside = open('inside.txt').read()\n"
    )
    result = run(sandbox, code, ["assert inside == 'fine'", "assert blocked >= 2"])  # ~/.. is the private /tmp
    assert result.passed, result.stderr
    assert not target.exists() and not os.path.exists("/escaped_by_sandbox.txt")


def test_network_is_blocked(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted, done = [], threading.Event()

    def accept():
        while not done.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = (
        "import socket\nconnected = False\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n    connected = True\n"
        "except OSError:\n    pass\n"
    )
    result = run(sandbox, code, ["assert not connected"])
    done.set()
    thread.join()
    server.close()
    assert result.passed, result.stderr
    assert accepted == []


def test_run_many_keeps_order_and_runs_in_parallel(sandbox):
    programs = [Program(f"v = {i}", [f"assert v == {i}", "assert v % 2 == 0"]) for i in range(8)]
    results = sandbox.run_many(programs)
    assert [r.passed for r in results] == [i % 2 == 0 for i in range(8)]
    assert [r.tests_passed for r in results] == [2 if i % 2 == 0 else 1 for i in range(8)]


def test_bad_backend_is_config_error():
    with pytest.raises(ConfigError, match="backend"):
        Sandbox(backend="docker")
    with pytest.raises(ConfigError, match="timeout"):
        Sandbox(timeout=0)


def test_root_runs_programs_as_unprivileged_user():
    box = Sandbox(backend="subprocess")
    if not _running_as_root():
        pytest.skip("only root switches uid")
    uid = box.isolation()["unprivileged_uid"]
    result = box.run(Program("import os\nuid = os.getuid()", ["assert uid != 0"]))
    assert uid and result.passed
