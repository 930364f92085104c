"""Output paths: checked before any work, written atomically, interrupted writes cleaned up.

* :func:`ensure_dir` / :func:`check_file_target` turn an output path that cannot be created or written into a
  one-line :class:`~dare.errors.ConfigError` naming the flag or key, before a command spends minutes computing
  (a probe file tells, :func:`can_write_in`: permission bits say yes to root where writes fail, e.g. ``/proc``).
* :func:`atomic_write_text` writes a file next to its target and renames it into place: a reader never sees a
  half-written file.
* :func:`staging_dir` / :func:`publish_dir` write a directory (e.g. a run's ``final/`` checkpoint) under a hidden
  sibling name and rename it into place when complete; :func:`remove_strays` deletes what an interrupted writer
  left behind (run at the start of the next run).
* :func:`check_replaceable` / :func:`mark_output` keep a command from writing over what it did not write: a
  command's output directory (``dare merge-lora --out``, ``dare tiny --out``, ``dare demo --out``) must be new,
  empty, or an earlier output of the same command, recognised by the :data:`OUTPUT_MARKER` file the command
  writes into it. :func:`check_apart` refuses an output directory that is, or contains, one of the command's
  inputs (replacing it would delete them). :func:`check_file_replaceable` does the same for an output file
  (``dare eval run/score --out``): new, an earlier output of the command, and not one of its input files.

This module imports nothing heavy (the CLI validates paths before loading torch).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from dare.errors import ConfigError

STAGING_SUFFIX = ".partial"
"""``.NAME.partial``: a directory being written (renamed to ``NAME`` when complete)."""
REPLACED_SUFFIX = ".replaced"
"""``.NAME.replaced``: the previous ``NAME`` while the new one is renamed into place (deleted right after)."""
OUTPUT_MARKER = ".dare-output.json"
"""A file in a command's output directory: ``{"written_by": "dare COMMAND", ...}`` (see :func:`mark_output`)."""


def _reason(err: OSError) -> str:
    return err.strerror or str(err)


def ensure_dir(path: str | os.PathLike, what: str, target: str | os.PathLike | None = None) -> Path:
    """Create directory ``path`` (with parents) and check that it is writable (:func:`can_write_in`); ``what`` names
    the flag/key in the one-line error (``--out``, ``trainer.output_dir``), ``target`` the output path when ``path``
    is only the directory it goes in (a file, or a directory written beside it and renamed)."""
    path = Path(path).expanduser()
    subject = f"{what} {target}: cannot write in {path}" if target is not None else f"{what} {path}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{subject}: exists and is not a directory") from None
    except OSError as err:
        raise ConfigError(f"{subject}: cannot create the directory ({_reason(err)})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{subject}: the directory is not writable")
    failure = can_write_in(path)
    if failure is not None:
        raise ConfigError(f"{subject}: the directory is not writable ({failure})")
    return path


PROBE_PREFIX = ".dare-probe-"
"""The name of :func:`can_write_in`'s probe file starts so (a hidden ``.tmp`` name: :func:`remove_strays`)."""


def can_write_in(directory: Path) -> str | None:
    """None when a file can be created in existing ``directory`` (a probe file is made and deleted), else why not:
    permission bits (``os.access``) say yes to root in ``/proc`` or ``/sys``, where every write fails."""
    import tempfile

    try:
        handle, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, suffix=".tmp", dir=directory)
    except FileNotFoundError:  # the directory exists, yet a new file in it does not: /proc, /sys
        return "no file can be created in it: a virtual file system"
    except OSError as err:
        return _reason(err)
    os.close(handle)
    Path(probe).unlink(missing_ok=True)
    return None


def check_dir_target(path: str | os.PathLike, what: str) -> None:
    """The errors :func:`ensure_dir` gives for ``path``, without creating anything (``dare train --dry-run``): a file
    there or in the way of its parents, or a directory that is not writable."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{what} {target}: exists and is not a directory")
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigError(f"{what} {target}: cannot create the directory ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        detail = "the directory is not writable" if existing == target else f"cannot create it in {existing}"
        raise ConfigError(f"{what} {target}: {detail}")


def check_file_target(path: str | os.PathLike, what: str, example: str | None = None) -> Path:
    """Check that file ``path`` can be written (its directory is created when missing); writes nothing else. A
    directory - an existing one, or a path ending in ``/`` (which would otherwise become a file of that name) - is a
    one-line error, suggesting the file ``example`` in it when given."""
    names_directory = str(path).endswith(("/", os.sep))
    path = Path(path).expanduser()
    if path.is_dir() or names_directory:
        suggestion = f", e.g. {path / example}" if example else ""
        why = "is a directory" if path.is_dir() else "ends in '/', so it names a directory"
        raise ConfigError(f"{what} {path}{'/' if names_directory else ''}: {why}; give a file name{suggestion}")
    ensure_dir(path.parent if str(path.parent) else Path("."), what, target=path)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path}: the file is not writable")
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` through a temporary sibling file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding=encoding)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def absolute_path(path: str | os.PathLike) -> Path:
    """``path`` made absolute and normalised (``.``, ``..`` removed; symlinks kept): ``Path(".").name`` is empty."""
    return Path(os.path.abspath(Path(path).expanduser()))


def staging_dir(final: str | os.PathLike) -> Path:
    """An empty hidden sibling directory of ``final`` to write into (then :func:`publish_dir`)."""
    final = absolute_path(final)
    tmp = final.with_name(f".{final.name}{STAGING_SUFFIX}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Rename the complete directory ``tmp`` to ``final``, replacing an existing ``final``; returns ``final`` made
    absolute. It replaces whatever ``final`` holds: a command writing where a user points it checks the target
    first (:func:`check_replaceable`, :func:`check_apart`)."""
    tmp, final = Path(tmp), absolute_path(final)
    old = final.with_name(f".{final.name}{REPLACED_SUFFIX}")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def mark_output(directory: str | os.PathLike, command: str, **details) -> Path:
    """Record in ``directory`` that ``dare COMMAND`` wrote it (with JSON ``details``, e.g. its settings), so a
    later run of the same command may replace it (:func:`check_replaceable`); returns the marker file."""
    record = {"written_by": f"dare {command}", **details}
    return atomic_write_text(Path(directory) / OUTPUT_MARKER, json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_marker(directory: str | os.PathLike) -> dict:
    """The :func:`mark_output` record of ``directory``; ``{}`` when it has none (or an unreadable one)."""
    try:
        record = json.loads((Path(directory) / OUTPUT_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def check_replaceable(path: str | os.PathLike, what: str, command: str) -> bool:
    """Check that ``dare COMMAND`` may write directory ``path`` (``what`` names the flag in the error): True when
    it holds an earlier output of the same command (to be replaced), False when it is missing or empty. Anything
    else (a file, a directory with other contents: a trained model, a run, a user's files) is a one-line
    :class:`~dare.errors.ConfigError`; nothing is written."""
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():  # writing it would fail after the work
        raise ConfigError(f"{what} {path}: is a broken symbolic link (to {os.readlink(path)}); remove it or give "
                          "another directory (nothing was written)")
    if not path.exists():
        return False
    if not path.is_dir():
        raise ConfigError(f"{what} {path}: exists and is not a directory")
    if not any(path.iterdir()):
        return False
    if read_marker(path).get("written_by") == f"dare {command}":
        return True
    raise ConfigError(f"{what} {path}: the directory is not empty and is not an earlier `dare {command}` output; "
                      f"give a new or empty directory (nothing was written)")


def check_file_replaceable(path: str | os.PathLike, what: str, earlier: str, is_earlier: Callable[[Path], bool],
                           inputs: dict[str, str | os.PathLike | None] | None = None,
                           example: str | None = None) -> bool:
    """The file analogue of :func:`check_replaceable`: check that a command may write file ``path`` (``what`` names
    the flag in the errors). True when it holds an earlier output of the command (``is_earlier(path)``, to be
    replaced), False when it is missing. A one-line :class:`~dare.errors.ConfigError`, before anything is written,
    when ``path`` is the same file as one of the command's ``inputs`` (``{flag: path}``; symlinks and hard links
    followed, missing paths and hub names skipped), when it exists and is not ``earlier`` (e.g. ``"an earlier `dare
    eval run`/`dare eval score` results file"``), and for :func:`check_file_target`'s cases (a directory, suggesting
    the file ``example`` in it, an unwritable file or directory)."""
    if str(path).endswith(("/", os.sep)):  # Path() drops the slash that says "a directory"
        check_file_target(path, what, example)
    path = Path(path).expanduser()
    for flag, source in (inputs or {}).items():
        if source is not None and _same_file(path, Path(source).expanduser()):
            raise ConfigError(f"{what} {path}: is the same file as {flag} {source}; give another file name "
                              f"(nothing was written)")
    existing = path.exists() and not path.is_dir()
    if existing and not is_earlier(path):
        raise ConfigError(f"{what} {path}: exists and is not {earlier}; give a new file name (nothing was written)")
    check_file_target(path, what, example)
    return existing


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file (symlinks followed, hard links included)."""
    try:
        return a.is_file() and b.is_file() and os.path.samefile(a, b)
    except OSError:
        return False


def check_apart(path: str | os.PathLike, what: str, inputs: dict[str, str | os.PathLike]) -> None:
    """One-line :class:`~dare.errors.ConfigError` when output directory ``path`` is, or contains, one of the
    ``inputs`` (``{description: directory}``; entries that are not existing directories, e.g. hub names, are
    skipped): writing ``path`` would replace them. Symlinks are followed."""
    target = Path(path).expanduser().resolve()
    for description, directory in inputs.items():
        directory = Path(directory).expanduser()
        if not directory.is_dir():
            continue
        directory = directory.resolve()
        if directory == target or target in directory.parents:
            relation = "is" if directory == target else "contains"
            raise ConfigError(f"{what} {path}: {relation} {description} ({directory}); give another directory")


def remove_strays(root: str | os.PathLike) -> list[Path]:
    """Delete the leftovers of interrupted :func:`staging_dir` / :func:`publish_dir` / :func:`atomic_write_text`
    calls directly under ``root``; returns what was removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for entry in root.iterdir():
        name = entry.name
        stray = name.startswith(".") and (name.endswith((STAGING_SUFFIX, REPLACED_SUFFIX)) or ".tmp" in name)
        if not stray:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


__all__ = ["OUTPUT_MARKER", "PROBE_PREFIX", "absolute_path", "atomic_write_text", "can_write_in", "check_apart",
           "check_dir_target", "check_file_replaceable", "check_file_target", "check_replaceable", "ensure_dir",
           "mark_output", "publish_dir", "read_marker", "remove_strays", "staging_dir"]
