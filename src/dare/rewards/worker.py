"""Bounded-time calls into a long-lived helper process (for verifiers such as math-verify that can
hang in C code, where neither threads nor SIGALRM can stop them).

``BoundedWorker("dare.rewards.math_check:verify_pair").call(args, timeout=5)`` runs the function in a
helper interpreter (JSON lines over its stdin/stdout); a call that takes longer kills the helper (a
fresh one starts on the next call) and returns ``default``. Calls are serialised by a lock, so any
thread may use one worker. For a target outside DARE the helper first imports the user plug-ins this process
imported (:func:`dare.plugins.child_setup`: ``imports:`` / ``--import`` items, ``dare.plugins`` entry points), so a
plug-in file's reward can run its own function there: ``BoundedWorker(f"{__name__}:my_check")``; DARE's own targets
(the math reward's) start without them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

import dare

# The helper: import the parent's plug-ins (their prints kept off the reply pipe) and the target, say "ready", then
# answer one JSON line per request.
_SERVER = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
out = sys.stdout
sys.stdout = sys.stderr
plugins = json.loads(sys.argv[3])
if plugins:
    from dare.plugins import load_in_child
    load_in_child(plugins)
module, _, name = sys.argv[2].partition(":")
func = getattr(importlib.import_module(module), name)
out.write('"ready"\n'); out.flush()
for line in sys.stdin:
    try:
        reply = ["ok", func(*json.loads(line))]
    except Exception as err:
        reply = ["error", repr(err)[:200]]
    out.write(json.dumps(reply) + "\n"); out.flush()
"""


class BoundedWorker:
    """One helper process running ``module:function``; :meth:`call` never takes much more than ``timeout``."""

    def __init__(self, target: str, start_timeout: float = 120.0):
        self.target = target
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self.timeouts = 0
        """Calls that were cut off (the helper was killed and restarted)."""

    def _readline(self, timeout: float) -> Any:
        out = self._process.stdout
        deadline = time.monotonic() + timeout
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(out.fileno(), 1 << 16)
            if not chunk:
                raise EOFError
            buf += chunk
        return json.loads(buf)

    def _plugins(self, setup: dict) -> dict:
        """The plug-ins the helper imports: none for DARE's own targets (the math reward's helper would pay every
        plug-in's import, and a plug-in failing there would turn its answers into defaults); the parent's for a
        target of the user's own code."""
        return {} if self.target.startswith("dare.") else setup

    def _start(self) -> None:
        from dare.plugins import child_setup

        src = os.path.dirname(os.path.dirname(os.path.abspath(dare.__file__)))
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, src, self.target, json.dumps(self._plugins(child_setup()))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        if self._readline(self.start_timeout) != "ready":
            raise EOFError

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process.stdin.close()
            self._process.stdout.close()
        self._process = None

    def call(self, args: tuple, timeout: float, default: Any = None) -> Any:
        """``function(*args)`` (JSON-able arguments and result) in the helper, or ``default`` when it
        errs, dies or exceeds ``timeout`` (a call that starts the helper also waits for its imports,
        up to ``start_timeout``)."""
        with self._lock:
            try:
                if self._process is None or self._process.poll() is not None:
                    self._stop()
                    self._start()
                self._process.stdin.write((json.dumps(list(args)) + "\n").encode())
                self._process.stdin.flush()
                status, value = self._readline(timeout)
                return value if status == "ok" else default
            except (OSError, EOFError, TimeoutError, ValueError):
                self.timeouts += 1
                self._stop()
                return default

    def close(self) -> None:
        with self._lock:
            self._stop()


__all__ = ["BoundedWorker"]
