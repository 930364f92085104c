"""Who may write ``trainer.output_dir``: an earlier ``dare train`` run's directory or a new / empty one
(:func:`check_output_dir`), and one run at a time (:class:`OutputLock`, an exclusive ``flock`` held for the run;
:func:`check_not_in_use` for the dry run)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from dare.errors import ConfigError
from dare.outputs import OUTPUT_MARKER, PROBE_PREFIX, read_marker

try:
    import fcntl
except ImportError:  # not POSIX (Windows): runs are not locked
    fcntl = None

COMMAND = "train"
"""``dare train`` marks its output directories with :func:`dare.outputs.mark_output` (``written_by: dare train``)."""
LOCK_FILE = ".dare-train.lock"
"""The file in ``trainer.output_dir`` that a run holds an exclusive ``flock`` on (its content: the holder's pid)."""
RUN_LAYOUT = ("metrics.jsonl", "checkpoints", "final")
"""What a run writes besides ``config.yaml``: an unmarked directory (written by an older DARE) holding
``config.yaml`` and one of these is an earlier run."""
SHOWN_ENTRIES = 3
"""Entries of a refused output directory named in the error."""


def _entries(directory: Path) -> list[Path]:
    """What ``directory`` holds besides the run's lock, its marker and another process's write probe (a file
    :func:`dare.outputs.can_write_in` makes and deletes at once: another rank of the same run checking the directory
    is writable while this one lists it)."""
    return [entry for entry in directory.iterdir()
            if entry.name not in (LOCK_FILE, OUTPUT_MARKER) and not entry.name.startswith(PROBE_PREFIX)]


def is_earlier_run(directory: Path) -> bool:
    """True when ``directory`` (an existing directory) is empty or an earlier ``dare train`` output: marked by
    :func:`dare.outputs.mark_output`, or unmarked with the run layout (``config.yaml`` and one of
    :data:`RUN_LAYOUT`)."""
    written_by = read_marker(directory).get("written_by")
    if written_by is not None:
        return written_by == f"dare {COMMAND}"
    names = {entry.name for entry in _entries(directory)}
    return not names or ("config.yaml" in names and any(name in names for name in RUN_LAYOUT))


def check_output_dir(output_dir) -> None:
    """One-line error, before anything is written, unless ``trainer.output_dir`` is missing, empty or an earlier
    ``dare train`` output (:func:`is_earlier_run`): a run writes ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``
    and ``final/`` there, over what a model checkpoint or a folder of the user's files holds."""
    directory = Path(output_dir).expanduser()
    if not directory.is_dir() or is_earlier_run(directory):
        return
    written_by = read_marker(directory).get("written_by")
    if written_by is not None:
        holds = f"it is a `{written_by}` output"
    else:
        names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in _entries(directory))
        more = f", ... ({len(names)} entries)" if len(names) > SHOWN_ENTRIES else ""
        holds = f"it holds {', '.join(names[:SHOWN_ENTRIES])}{more}"
    raise ConfigError(f"trainer.output_dir {output_dir}: the directory is not empty and is not an earlier `dare train` "
                      f"run ({holds}); give a new or empty directory (nothing was written)")


BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
"""``flock(..., LOCK_NB)`` errors meaning that another process holds the lock."""


def _in_use(directory, fd: int) -> ConfigError:
    """The one-line error for ``directory``'s lock held elsewhere, naming the pid its holder wrote into ``fd``."""
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    who = f"pid {pid}" if pid else "pid unknown"
    return ConfigError(f"trainer.output_dir {directory} is in use by another `dare train` run ({who}); wait for it "
                       "to end, or use another trainer.output_dir")


_HELD: dict[str, list] = {}
"""``{resolved directory: [lock file descriptor, holders]}``: the output directories this process has locked (two
trainers of one process share the lock; only other processes are kept out)."""


class OutputLock:
    """An exclusive ``fcntl.flock`` on ``directory/.dare-train.lock`` (:data:`LOCK_FILE`), held while a run writes
    there: a second run into the same directory fails at its start with :func:`_in_use`'s one-line error naming the
    holder's pid. The operating system drops the lock when the holder exits, however it ends. No-op without
    ``fcntl`` (non-POSIX platforms)."""

    def __init__(self, directory):
        self.directory = Path(directory).expanduser()
        self.key = str(self.directory.resolve())
        self.held = False

    def acquire(self) -> None:
        if self.held:
            return
        if fcntl is None:
            self.held = True
            return
        entry = _HELD.get(self.key)
        if entry is not None:
            entry[1] += 1
            self.held = True
            return
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            refusal = _in_use(self.directory, fd) if err.errno in BUSY else None
            os.close(fd)
            if refusal is not None:
                raise refusal from None
            raise ConfigError(f"trainer.output_dir {self.directory}: cannot lock {LOCK_FILE} "
                              f"({err.strerror or err})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[self.key] = [fd, 1]
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        entry = _HELD.get(self.key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[self.key]
        fd = entry[0]
        try:
            os.ftruncate(fd, 0)  # no stale pid in the file
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


def check_not_in_use(output_dir) -> None:
    """The error :meth:`OutputLock.acquire` would give when another process runs in ``output_dir`` (the dry run:
    a shared lock taken and dropped at once; creates nothing)."""
    directory = Path(output_dir).expanduser()
    path = directory / LOCK_FILE
    if fcntl is None or not path.is_file() or str(directory.resolve()) in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in BUSY:
            raise _in_use(directory, fd) from None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


__all__ = ["COMMAND", "LOCK_FILE", "RUN_LAYOUT", "OutputLock", "check_not_in_use", "check_output_dir",
           "is_earlier_run"]
