"""Stopping on Ctrl-C or SIGTERM (``kill``, a scheduler's ``scancel`` or pre-emption); standard library only, so
the ``dare`` command answers SIGTERM from its start, while torch is still being imported.

Every command treats SIGTERM as Ctrl-C (:func:`terminate_as_interrupt`: one ``interrupted`` line, exit status 130).
In a training run's step loop the first signal only asks the loop to stop after the step it is running; the
trainer then saves a checkpoint and raises ``KeyboardInterrupt``, so an interrupted run resumes where it stopped
even with no ``trainer.save_every``. A second signal raises ``KeyboardInterrupt`` at once, as Python does by
default."""
from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def signals_handled(handler, signums):
    """While open, ``handler`` answers ``signums``; the handlers in place before come back on exit. Only the main
    thread can set handlers: elsewhere (a run started from a thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def terminate_as_interrupt():
    """SIGTERM (``kill``, a scheduler's ``scancel``) raises KeyboardInterrupt while open, as Ctrl-C does, so a run
    ends with its resume hint instead of silently (``dare train`` around the whole run; inside the step loop
    :class:`StopAfterStep` answers it)."""
    return signals_handled(_raise_interrupt, (signal.SIGTERM,))


class StopAfterStep:
    """A context manager: while it is open (:func:`signals_handled`), the first of :data:`STOP_SIGNALS` sets
    :attr:`received` and calls ``announce(label)`` once (``label``: :func:`signal_label`), a second one raises
    ``KeyboardInterrupt``."""

    def __init__(self, announce: Callable[[str], None] | None = None):
        self.announce = announce
        self.received: int | None = None
        self._handled = signals_handled(self._handle, STOP_SIGNALS)

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second one: stop now
            raise KeyboardInterrupt
        self.received = signum
        if self.announce is not None:
            self.announce(signal_label(signum))

    def __enter__(self) -> StopAfterStep:
        self._handled.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._handled.__exit__(*exc)


def write_line(text: str) -> None:
    """Print ``text`` on stderr from a signal handler: through ``sys.stderr`` when it is free, else straight to file
    descriptor 2 (the handler may run while the main thread is inside a write to stderr, e.g. a progress bar's,
    and a buffered stream refuses to be re-entered)."""
    try:
        print(f"\n{text}", file=sys.stderr, flush=True)
    except RuntimeError:
        os.write(2, f"\n{text}\n".encode())


__all__ = ["STOP_SIGNALS", "StopAfterStep", "signal_label", "signals_handled", "terminate_as_interrupt", "write_line"]
