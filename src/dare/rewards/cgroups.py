"""A memory limit for a whole process tree: one cgroup per sandbox slot (v2, else v1's memory controller).

``MemoryCgroup.create(name, limit_bytes)`` makes a child of this process's own cgroup and sets the limit
(swap included); sandboxed processes join it by writing their pid to :attr:`procs_file` before they
start the candidate, so every descendant is counted together. None where the cgroup file system is
not writable (no root, no delegation): the sandbox then reports a per-process limit only.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

ROOT = "/sys/fs/cgroup"


def _own_path(controller: str | None) -> str | None:
    """This process's cgroup path for ``controller`` (None: the v2 unified hierarchy)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if (controller is None and names == "") or (controller and controller in names.split(",")):
                    return path
    except OSError:
        pass
    return None


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


@dataclass
class MemoryCgroup:
    path: str
    version: int

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryCgroup | None:
        """A limited cgroup ``name`` under ours (v2 first, then v1), or None if neither is writable."""
        v2 = _own_path(None)
        if v2 is not None and os.path.exists(os.path.join(ROOT, "cgroup.controllers")):
            group = cls._make(os.path.join(ROOT, v2.lstrip("/"), name), 2)
            if group and _write(os.path.join(group.path, "memory.max"), str(limit_bytes)):
                _write(os.path.join(group.path, "memory.swap.max"), "0")
                return group
            if group:
                group.remove()
        v1 = _own_path("memory")
        if v1 is not None and os.path.isdir(os.path.join(ROOT, "memory")):
            group = cls._make(os.path.join(ROOT, "memory", v1.lstrip("/"), name), 1)
            if group and _write(os.path.join(group.path, "memory.limit_in_bytes"), str(limit_bytes)):
                _write(os.path.join(group.path, "memory.memsw.limit_in_bytes"), str(limit_bytes))
                return group
            if group:
                group.remove()
        return None

    @classmethod
    def _make(cls, path: str, version: int) -> MemoryCgroup | None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            return None
        group = cls(path, version)
        _CREATED.append(group)
        return group

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass


_CREATED: list[MemoryCgroup] = []


@atexit.register
def _remove_created() -> None:
    """Empty cgroups left by this process are removed when it exits."""
    for group in _CREATED:
        group.remove()
