"""Progress bars that suit where stderr goes: tqdm's bar on a terminal, plain lines in a log.

tqdm redraws its bar with ``\\r``, which a terminal turns into one changing line but a log file (slurm output,
``dare train ... 2> log``, ``| tee``) keeps as one enormous line. :func:`progress_bar` returns a tqdm bar when
stderr is a terminal (or a Jupyter kernel draws it), and otherwise a :class:`PlainProgress` with the methods the
callers use (``update``, ``close``, ``set_postfix``, ``set_description``, iteration, ``with``), which writes
whole ``\\n``-ended lines and never ``\\r``: at most one every ``DARE_PROGRESS_INTERVAL`` seconds (default 30)
while work goes on, and one final line when it is closed.

Every progress bar of DARE is made here; :func:`close_progress_bars` ends the open ones (the CLI calls it on
Ctrl-C so that "interrupted" gets a line of its own), and :func:`quiet_transformers` keeps transformers' own bars
and info logs out of a command's output.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import weakref
from collections.abc import Iterable, Mapping
from time import monotonic
from typing import Any

from dare.errors import ConfigError

INTERVAL_VARIABLE = "DARE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
"""Seconds between two progress lines when stderr is not a terminal (``DARE_PROGRESS_INTERVAL`` changes it)."""

_OPEN: weakref.WeakSet = weakref.WeakSet()
"""The plain-line bars not closed yet (for :func:`close_progress_bars`)."""


def progress_interval() -> float:
    """``DARE_PROGRESS_INTERVAL`` in seconds (:data:`DEFAULT_INTERVAL` when unset or empty): a number >= 0 (0: a
    line at every update; ``inf``: the final lines only). Anything else is a one-line :class:`ConfigError` naming
    the variable (the ``dare`` command reads it before any work, :func:`dare.rollout.engine.check_environment`)."""
    value = os.environ.get(INTERVAL_VARIABLE)
    if value is None or not value.strip():
        return DEFAULT_INTERVAL
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # also NaN
        raise ConfigError(f"{INTERVAL_VARIABLE} must be a number of seconds >= 0 (the time between two progress "
                          f"lines when stderr is not a terminal; default {DEFAULT_INTERVAL:g}), got {value!r}")
    return seconds


def draws_bars(stream) -> bool:
    """Whether tqdm's redrawn bar suits ``stream``: a terminal, or a Jupyter kernel (tqdm.auto draws a widget)."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
    except Exception:  # noqa: BLE001 - an odd IPython: not a notebook as far as bars go
        return False


def progress_bar(total: int | None, desc: str = "", *, unit: str = "it", leave: bool = True, disable: bool = False,
                 initial: int = 0, iterable: Iterable | None = None, **tqdm_options: Any):
    """A progress bar of ``total`` units named ``desc``, on stderr.

    On a terminal: ``tqdm.auto.tqdm(iterable, total=..., desc=..., unit=..., leave=..., initial=...,
    **tqdm_options)`` (``tqdm_options`` apply to this bar only, e.g. ``dynamic_ncols``). Otherwise a
    :class:`PlainProgress` writing whole lines. ``disable``: a bar that shows nothing (iterating it still yields
    ``iterable``). ``leave=False`` (a transient bar: each rollout's decoding, tokenizing) writes its final line
    only if it wrote a progress line before, i.e. lasted at least the interval: an RL run's short rollouts leave
    no line per step in the log, a long ``dare generate`` still reports."""
    file = sys.stderr
    if disable or file is None:
        return PlainProgress(total, desc, unit=unit, initial=initial, iterable=iterable, disable=True)
    if draws_bars(file):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, initial=initial, **tqdm_options)
    return PlainProgress(total, desc, unit=unit, initial=initial, iterable=iterable, file=file, transient=not leave,
                         interval=progress_interval())


class PlainProgress:
    """A progress "bar" for logs: ``desc: 120/512 tok (23%), 45.1 tok/s, 8s left`` at most every ``interval``
    seconds while it advances, and ``desc: 512/512 tok (100%), 45.3 tok/s, in 11s`` when closed (no line when
    nothing was done, when disabled, or for a ``transient`` bar that wrote no line before). The methods are the
    subset of tqdm's that DARE's callers use."""

    def __init__(self, total: int | None, desc: str = "", *, unit: str = "it", initial: int = 0,
                 iterable: Iterable | None = None, file=None, interval: float = DEFAULT_INTERVAL,
                 disable: bool = False, transient: bool = False):
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                pass
        self.total, self.desc, self.unit = total, desc or "", unit
        self.n = self.initial = initial
        self.iterable, self.file, self.interval = iterable, file, interval
        self.disable = disable or file is None
        self.postfix = ""
        self.closed = False
        self.transient, self.wrote = transient, False
        self.start = self.last_line = monotonic()
        if not self.disable:
            _OPEN.add(self)

    # --------------------------------------------------------------------------------- tqdm's methods

    def update(self, n: float = 1) -> None:
        if self.disable or self.closed:
            return
        self.n += n
        now = monotonic()
        if now - self.last_line >= self.interval and (self.total is None or self.n < self.total):
            self._write(self.line(now))
            self.last_line, self.wrote = now, True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        if not self.disable and self.n != self.initial and (self.wrote or not self.transient):
            self._write(self.line(monotonic(), final=True))

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        values = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{key}={_postfix_value(value)}" for key, value in values.items())

    def __iter__(self):
        """The wrapped iterable's items, one unit each; the bar closes when they are exhausted. An iteration
        abandoned by an error leaves it open and writes nothing more (the error is the last line; Ctrl-C's
        :func:`close_progress_bars` still closes it)."""
        if self.iterable is None:
            raise TypeError("this progress bar wraps no iterable")
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- the lines

    def line(self, now: float, final: bool = False) -> str:
        """The line describing the progress at time ``now`` (``final``: the closing line)."""
        done, elapsed = self.n - self.initial, max(now - self.start, 0.0)
        if self.total:
            count = f"{_number(self.n)}/{_number(self.total)} {self.unit} ({int(100 * self.n / self.total)}%)"
        else:
            count = f"{_number(self.n)} {self.unit}"
        parts = [count]
        rate = done / elapsed if elapsed > 0 else None
        if rate:
            parts.append(f"{_rate(rate)} {self.unit}/s")
        if final:
            parts.append(f"in {_duration(elapsed)}")
        elif rate and self.total and self.total > self.n:
            parts.append(f"{_duration((self.total - self.n) / rate)} left")
        if self.postfix:
            parts.append(self.postfix)
        text = ", ".join(parts)
        return f"{self.desc}: {text}" if self.desc else text

    def _write(self, line: str) -> None:
        try:
            print(line.replace("\r", " ").replace("\n", " "), file=self.file, flush=True)
        except (OSError, ValueError):  # a closed or broken stderr: progress is not worth an error
            self.disable = True


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _rate(rate: float) -> str:
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2f}"


def _duration(seconds: float) -> str:
    """``8s``, ``2m05s``, ``1h02m``."""
    if not math.isfinite(seconds):
        return "?"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _postfix_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value).strip()


def close_progress_bars() -> None:
    """Close every open progress bar: tqdm's (only when tqdm is loaded; each ends its line) and the plain-line
    ones (each writes its final line), so that a message after them (e.g. "interrupted") starts a line."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        bar.close()
    for bar in list(_OPEN):
        bar.close()


__all__ = ["DEFAULT_INTERVAL", "INTERVAL_VARIABLE", "PlainProgress", "close_progress_bars", "draws_bars",
           "hf_progress_bars", "progress_bar", "progress_interval", "quiet_transformers"]


@contextlib.contextmanager
def hf_progress_bars(enabled: bool):
    """transformers' own progress bars ("Loading checkpoint shards", "Writing model shards") off for the block
    unless ``enabled`` (as ``trainer.progress``) and stderr draws bars (a terminal: in a log their ``\\r`` redraws
    would run together, :func:`draws_bars`); left as they are otherwise (a caller may have turned them off), and
    restored after."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    if not enabled or not draws_bars(sys.stderr):
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


@contextlib.contextmanager
def quiet_transformers():
    """transformers' own output kept out of a ``dare`` command's log for the block, restored after: its progress bars
    and the hub's ("Loading weights", "Writing model shards", downloads) off where stderr draws no bars (a log or a
    pipe, where their ``\r`` redraws run together; on a terminal the loading code shows them, :func:`hf_progress_bars`),
    and its info-level logging off (warnings stay visible; ``TRANSFORMERS_VERBOSITY`` set by the user wins)."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    bars, downloads, verbosity = (hf_logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled(),
                                  hf_logging.get_verbosity())
    if not draws_bars(sys.stderr):
        hf_logging.disable_progress_bar()
        hub.disable_progress_bars()
    if verbosity < hf_logging.WARNING and not os.environ.get("TRANSFORMERS_VERBOSITY"):
        hf_logging.set_verbosity_warning()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        (hub.enable_progress_bars if downloads else hub.disable_progress_bars)()
        hf_logging.set_verbosity(verbosity)
