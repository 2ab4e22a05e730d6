"""No second process: a seccomp filter the harness installs before the student's first line.

A sandbox answers the judge with one process. A helper process started by a cell could compute what a
judged call asks (torch's softmax, say) outside that process's ban; so before any student line runs,
:func:`confine_processes` makes the process unable to start another process or program, for good. The
judge reads the filter from outside (``Seccomp: 2`` in ``/proc/<pid>/status``,
:func:`autograder.isolation.sandbox._own_filter`).

Copied into the sandbox beside the harness; imports only the standard library.
"""

from __future__ import annotations

import os
import sys

# System call numbers per architecture (the audit arch the kernel reports in seccomp_data.arch). x86_64 has fork
# and vfork calls of its own; aarch64 creates processes through clone and clone3 only.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {"x86_64": {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435,
                       "seccomp": 317},
            "aarch64": {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435, "seccomp": 277}}
CLONE_THREAD = 0x10000
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: another numbering, refused as a whole


def _bpf_program(arch: str) -> list[tuple[int, int, int, int]]:
    """The classic BPF program of :func:`confine_processes` for ``arch``: ``(code, jt, jf, k)`` rows.

    fork, vfork, execve, execveat: EPERM; clone: allowed only with ``CLONE_THREAD`` (a thread of this
    process), else EPERM; clone3 (whose flags sit behind a pointer a filter cannot read): ENOSYS, so
    glibc falls back to clone for its threads; another architecture's calls (an i386 ``int 0x80``, x32): EPERM.
    """
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, JSET|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    nr = SYSCALLS[arch]
    denied = [nr[n] for n in ("fork", "vfork", "execve", "execveat") if n in nr]
    # Symbolic program: jumps name labels; resolved to the forward offsets BPF needs below.
    prog: list[tuple] = [(ld, 4), (jeq, AUDIT_ARCH[arch], None, "deny"), (ld, 0)]
    if arch == "x86_64":
        prog.append((jge, X32_SYSCALL_BIT, "deny", None))
    prog.append((jeq, nr["clone"], "clone", None))
    prog += [(jeq, n, "deny", None) for n in denied]
    prog += [(jeq, nr["clone3"], "nosys", None), (ret, allow),
             ("clone",), (ld, 16), (jset, CLONE_THREAD, "allow", "deny"),
             ("allow",), (ret, allow), ("deny",), (ret, eperm), ("nosys",), (ret, enosys)]
    labels, at = {}, 0
    for row in prog:
        if len(row) == 1:
            labels[row[0]] = at
        else:
            at += 1
    out, at = [], 0
    for row in prog:
        if len(row) == 1:
            continue
        code, k, *jumps = row
        jt, jf = ((labels[j] - at - 1 if j else 0) for j in (jumps + [None, None])[:2])
        out.append((code, jt, jf, k))
        at += 1
    return out


def confine_processes() -> str:
    """Make this process unable to start another process or program, for good; '' or why it could not.

    A seccomp filter (Linux): fork, vfork, execve, execveat and clone without ``CLONE_THREAD`` fail with
    EPERM; clone3 fails with ENOSYS and glibc creates its threads with clone instead, so torch's threads and
    Python's work as before. A filter cannot be removed once installed, and it holds for every thread
    (``SECCOMP_FILTER_FLAG_TSYNC``) and every thread started later. The harness installs it before the
    student's first line runs; the judge reads it from outside (``Seccomp: 2`` in ``/proc/<pid>/status``).
    """
    import ctypes
    import platform

    arch = platform.machine()
    if sys.platform != "linux" or arch not in SYSCALLS:
        return f"no seccomp filter for {sys.platform}/{arch}"
    rows = _bpf_program(arch)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(rows))(*[SockFilter(*r) for r in rows])
    prog = SockFprog(len(rows), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to install a filter without privileges
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog): every thread of the process at once.
    ret = libc.syscall(ctypes.c_long(SYSCALLS[arch]["seccomp"]), ctypes.c_long(1), ctypes.c_long(1),
                       ctypes.byref(prog))
    if ret != 0:
        return f"seccomp(SECCOMP_SET_MODE_FILTER) failed: {os.strerror(ctypes.get_errno()) if ret < 0 else ret}"
    return ""
