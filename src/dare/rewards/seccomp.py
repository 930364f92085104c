"""A small seccomp-BPF filter for sandboxed code, built without libseccomp.

It refuses (``EPERM``) what the sandbox never needs and an escape would: new namespaces (``unshare``,
``setns``, ``clone`` with a ``CLONE_NEW*`` flag; ``clone3`` gets ``ENOSYS`` so libc falls back to
``clone``, whose flags can be checked), mounts, ``ptrace``, kernel keyrings, ``bpf``,
``perf_event_open``, ``userfaultfd``, ``io_uring`` and unix-domain sockets (``socket(AF_UNIX, ...)``,
so no host socket file can be reached; ``socketpair`` still works). Any other architecture than the
one the filter was built for is killed. :func:`filter_bytes` is None on an unsupported machine.
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000


def _errno(code: int) -> int:
    return 0x00050000 | code


NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
AF_UNIX = 1

# arch -> (AUDIT_ARCH, syscall numbers); "deny" syscalls fail with EPERM
ARCHES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "clone": 56, "clone3": 435,
        "deny": [272, 308, 165, 166, 155, 101, 248, 249, 250, 321, 298, 323, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442],
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "clone": 220, "clone3": 435,
        "deny": [97, 268, 40, 39, 41, 117, 217, 218, 219, 280, 241, 282, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442],
    }),
}  # fmt: skip
# deny order: unshare, setns, mount, umount2, pivot_root, ptrace, add_key, request_key, keyctl, bpf,
# perf_event_open, userfaultfd, io_uring_setup/enter/register, open_tree, move_mount, fsopen, fsconfig,
# fsmount, fspick, mount_setattr


def _assemble(program: list[tuple]) -> bytes:
    """``(code, jt, jf, k)`` rows where jt/jf may be label names; ``("label", name)`` marks a target."""
    labels, rows = {}, []
    for row in program:
        if row[0] == "label":
            labels[row[1]] = len(rows)
        else:
            rows.append(row)
    out = []
    for i, (code, jt, jf, k) in enumerate(rows):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        out.append(struct.pack("=HBBI", code, jt, jf, k))
    return b"".join(out)


def filter_bytes(machine: str | None = None) -> bytes | None:
    """The filter as an array of ``struct sock_filter`` for this machine, or None if unsupported."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    audit_arch, nr = ARCHES[machine]
    program = [
        (LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (JEQ, 1, 0, audit_arch),
        (RET, 0, 0, KILL_PROCESS),
        (LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        program.append((JGE, "eperm", 0, 0x40000000))  # the x32 ABI
    for number in nr["deny"]:
        program.append((JEQ, "eperm", 0, number))
    program += [
        (JEQ, "enosys", 0, nr["clone3"]),
        (JEQ, "clone", 0, nr["clone"]),
        (JEQ, "socket", 0, nr["socket"]),
        (RET, 0, 0, ALLOW),
        ("label", "clone"),
        (LD_W_ABS, 0, 0, 16),  # args[0], low 32 bits (little endian): the clone flags
        (JSET, "eperm", 0, NAMESPACE_FLAGS),
        (RET, 0, 0, ALLOW),
        ("label", "socket"),
        (LD_W_ABS, 0, 0, 16),  # args[0]: the address family
        (JEQ, "eperm", 0, AF_UNIX),
        (RET, 0, 0, ALLOW),
        ("label", "eperm"),
        (RET, 0, 0, _errno(errno.EPERM)),
        ("label", "enosys"),
        (RET, 0, 0, _errno(errno.ENOSYS)),
    ]
    return _assemble(program)


# Installs the filter in the current process (used by the sandbox launcher, standard library only).
INSTALL_SOURCE = r"""
def install_seccomp(filter_hex):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    data = bytes.fromhex(filter_hex)
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    prog = Prog(len(data) // 8, data)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
"""
