"""The grader's side of the zygote (see :mod:`autograder.isolation.zygote`): start it, ask it for a sandboxed process.

:func:`zygote_spawn` sends one sandbox's spec and its pipes over the zygote's
socket and returns a :class:`ZygoteChild`, which the sandbox waits on and kills
like a ``Popen``. One zygote per grading process, started on first use.
Imports only the standard library.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class ZygoteError(RuntimeError):
    """The zygote could not be started."""


class ZygoteChild:
    """A sandboxed process forked by the zygote; quacks like the part of ``Popen`` the sandbox uses."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.status_fd = status_fd
        self.returncode: int | None = None
        # pidfds name the processes themselves, so a kill never hits a recycled pid.
        self.pidfd = os.pidfd_open(pid)  # the reporter
        self.inner_pidfd = -1  # the sandboxed process: PID 1 of its namespace; killing it ends the namespace
        self.inner_pid = -1  # its pid as this machine's /proc names it (the judge reads its status from outside)
        if select.select([status_fd], [], [], 30)[0]:
            data = os.read(status_fd, 4)
            if len(data) == 4:
                try:
                    self.inner_pid = struct.unpack("<i", data)[0]
                    self.inner_pidfd = os.pidfd_open(self.inner_pid)
                except ProcessLookupError:
                    pass

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.status_fd], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        data = b""
        try:
            data = os.read(self.status_fd, 4)
        except OSError:
            pass
        self.returncode = os.waitstatus_to_exitcode(struct.unpack("<i", data)[0]) if len(data) == 4 else -signal.SIGKILL

    def wait(self, timeout: float = 10.0) -> int:
        if self.returncode is None:
            if select.select([self.status_fd], [], [], timeout)[0]:
                self._read_status()
            else:
                self.kill()
        return self.returncode if self.returncode is not None else -signal.SIGKILL

    def kill(self) -> None:
        """SIGKILL the sandboxed process (and with it its namespace) and its reporter."""
        if self.pidfd < 0:
            return
        for fd in (self.inner_pidfd, self.pidfd):
            if fd >= 0:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.returncode is None:
            self.returncode = -signal.SIGKILL if not select.select([self.status_fd], [], [], 5)[0] else None
            if self.returncode is None:
                self._read_status()
        for fd in (self.pidfd, self.inner_pidfd, self.status_fd):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.inner_pidfd = self.status_fd = -1


_ZYGOTE: tuple[int, subprocess.Popen, socket.socket] | None = None


def _zygote(env: dict[str, str]) -> socket.socket:
    """This process's zygote, started on first use (and again if it died)."""
    global _ZYGOTE
    if _ZYGOTE is not None and _ZYGOTE[0] == os.getpid() and _ZYGOTE[1].poll() is None:
        return _ZYGOTE[2]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    base = {k: v for k, v in env.items() if k not in ("HOME", "TMPDIR", "MPLCONFIGDIR")}
    proc = subprocess.Popen([sys.executable, "-S", "-B", str(HERE / "zygote.py"), str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),), env=base, cwd="/", stdin=subprocess.DEVNULL,
                            start_new_session=True)
    theirs.close()
    ours.settimeout(120)
    if ours.recv(16) != b"ready":
        proc.kill()
        raise ZygoteError("the sandbox zygote did not start")
    ours.settimeout(None)
    _ZYGOTE = (os.getpid(), proc, ours)
    return ours


_ZYGOTE_LOCK = threading.Lock()


def zygote_spawn(env: dict[str, str], spec: dict[str, Any], fds: list[int], status_fd: int) -> ZygoteChild:
    with _ZYGOTE_LOCK:  # one request at a time on the socket (Dask workers may grade in threads)
        sock = _zygote(env)
        socket.send_fds(sock, [json.dumps(spec).encode()], fds)
        (pid,) = struct.unpack("<i", sock.recv(4))
    return ZygoteChild(pid, status_fd)
