"""Stopping a training run cleanly on Ctrl-C or SIGTERM (``kill``, a scheduler's ``scancel`` or pre-emption).

The first signal during the step loop only asks the loop to stop after the step it is running; the trainer then
saves a checkpoint and raises ``KeyboardInterrupt``, so an interrupted run resumes where it stopped even with no
``trainer.save_every``. A second signal raises ``KeyboardInterrupt`` at once, as Python does by default."""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run after its current step."""


def signal_label(signum: int) -> str:
    """``SIGINT (Ctrl-C)`` or ``SIGTERM``: how the messages name the signal received."""
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


class StopAfterStep:
    """A context manager: while it is open (in the main thread; elsewhere it changes nothing), the first of
    :data:`STOP_SIGNALS` sets :attr:`received` and calls ``announce(label)`` once (``label``: :func:`signal_label`),
    a second one raises ``KeyboardInterrupt``. The handlers in place before come back on exit."""

    def __init__(self, announce: Callable[[str], None] | None = None):
        self.announce = announce
        self.received: int | None = None
        self._before: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second one: stop now
            raise KeyboardInterrupt
        self.received = signum
        if self.announce is not None:
            self.announce(signal_label(signum))

    def __enter__(self) -> StopAfterStep:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._before[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        self._before.clear()


def write_line(text: str) -> None:
    """Print ``text`` on stderr from a signal handler: through ``sys.stderr`` when it is free, else straight to file
    descriptor 2 (the handler may run while the main thread is inside a write to stderr, e.g. a progress bar's,
    and a buffered stream refuses to be re-entered)."""
    try:
        print(f"\n{text}", file=sys.stderr, flush=True)
    except RuntimeError:
        os.write(2, f"\n{text}\n".encode())


__all__ = ["STOP_SIGNALS", "StopAfterStep", "signal_label", "write_line"]
