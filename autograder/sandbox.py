"""Run one submission's code in an isolated, disposable process.

A :class:`Sandbox` starts ``harness.py`` in a scratch folder that holds only
what the student received, and talks to it over two pipes (see :mod:`wire`).
Where the machine allows (root and ``unshare``), the process also gets

* its own network namespace with no interfaces but a down loopback (no network),
* its own PID namespace (killing the harness kills everything it started),
* its own mount namespace in which the course, the submissions, the grading
  folder, ``/root``, ``/home`` and ``/tmp`` are hidden behind empty tmpfs
  mounts and only the Python installation and the scratch folder are visible
  (the Python installation read-only),
* an unprivileged user of its own (see :func:`sandbox_uid`) with no new privileges.

Everywhere it gets resource limits (address space, processes, file size, open
files, no core dumps), a wall-clock limit on every request and on the whole
notebook, enforced from outside with SIGKILL, and a byte cap on what it prints.
:attr:`Sandbox.isolation` lists what was applied, for the grading log.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder import wire

HERE = Path(__file__).resolve().parent


def sandbox_uid() -> int:
    """An unprivileged user id of this grading process's own (no passwd entry needed).

    Process limits count per user, so parallel workers use different ids: one
    student's fork bomb cannot use up another student's processes.
    """
    return 100_000 + (os.getpid() * 7919 + threading.get_ident()) % 100_000


@dataclass
class Limits:
    """Resource limits for one submission; every field can be set from the command line."""

    cell_timeout: float = 60.0  # seconds for one notebook cell
    call_timeout: float = 30.0  # seconds for one call into the student's code
    notebook_timeout: float = 600.0  # seconds for everything one submission runs
    memory_bytes: int = 6 << 30  # address space of the student's process
    max_processes: int = 512  # threads and processes of the sandbox user
    file_bytes: int = 64 << 20  # largest file the student's process may write
    reply_bytes: int = 256 << 20  # largest reply accepted from the sandbox
    start_timeout: float = 120.0  # seconds to start Python and import torch


class SandboxError(RuntimeError):
    """The sandbox could not answer: it timed out, died or broke the protocol."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "timeout", "crash", "protocol"


def _can_isolate() -> bool:
    if os.environ.get("AUTOGRADER_NO_NAMESPACES") or sys.platform != "linux" or os.geteuid() != 0:
        return False
    if not shutil.which("unshare") or not shutil.which("setpriv") or not shutil.which("mount"):
        return False
    try:
        subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "true"], check=True, timeout=20,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


_ISOLATE: bool | None = None


def can_isolate() -> bool:
    """True when namespaces and an unprivileged user are available (checked once per process)."""
    global _ISOLATE
    if _ISOLATE is None:
        _ISOLATE = _can_isolate()
    return _ISOLATE


def _top_level(paths: list[Path]) -> list[Path]:
    """Drop paths that lie inside another path of the list."""
    paths = sorted({p for p in paths if p.exists()}, key=lambda p: len(p.parts))
    out: list[Path] = []
    for p in paths:
        if not any(p == q or q in p.parents for q in out):
            out.append(p)
    return out


def _die_with_parent() -> None:
    """In a child about to exec: receive SIGKILL when the grading process dies (Linux; a no-op elsewhere)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm", "/srv", "/mnt", "/media", "/opt", "/work")


class ZygoteChild:
    """A sandboxed process forked by the zygote; quacks like the part of ``Popen`` the sandbox uses."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.status_fd = status_fd
        self.returncode: int | None = None
        # pidfds name the processes themselves, so a kill never hits a recycled pid.
        self.pidfd = os.pidfd_open(pid)  # the reporter
        self.inner_pidfd = -1  # the sandboxed process: PID 1 of its namespace; killing it ends the namespace
        if select.select([status_fd], [], [], 30)[0]:
            data = os.read(status_fd, 4)
            if len(data) == 4:
                try:
                    self.inner_pidfd = os.pidfd_open(struct.unpack("<i", data)[0])
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
        raise SandboxError("crash", "the sandbox zygote did not start")
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


@dataclass
class Sandbox:
    """One student's process. Use as a context manager; it is killed and its files removed on exit."""

    files: Path | None = None  # folder whose contents the student received (copied into the scratch folder)
    limits: Limits = field(default_factory=Limits)
    hide: list[Path] = field(default_factory=list)  # extra folders to hide (course, submissions, grading state)
    device: str = "cpu"
    isolation: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | ZygoteChild | None = None
        self.root = Path(tempfile.mkdtemp(prefix="attn-sbx-"))
        self.deadline = time.monotonic() + self.limits.notebook_timeout
        self._r = self._w = -1

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self) -> Path:
        os.chmod(self.root, 0o755)
        tools = self.root / "harness"
        tools.mkdir()
        for name in ("harness.py", "wire.py"):
            shutil.copy2(HERE / name, tools / name)
        work = self.root / "work"
        if self.files is not None and self.files.is_dir():
            shutil.copytree(self.files, work, ignore=shutil.ignore_patterns("*.ipynb", ".*", "__pycache__"))
        else:
            work.mkdir()
        (work / "tmp").mkdir(exist_ok=True)
        return work

    def _env(self, work: Path) -> dict[str, str]:
        site_dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": str(work / "tmp"),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            # -S skips site.py, so editable installs (attnkit, the autograder) are not importable;
            # the installed packages are reached through this path instead.
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(site_dirs)),
            "LANG": "C.UTF-8",
        }
        if self.device.startswith("cuda"):
            env["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
        return env

    def start(self) -> None:
        work = self._prepare()
        env = self._env(work)
        r_req, w_req = os.pipe()
        r_rep, w_rep = os.pipe()
        log_fd = os.open(self.root / "process.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if can_isolate():
            uid = sandbox_uid()
            site_dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
            expose = _top_level([Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()]
                                + [Path(d).resolve() for d in site_dirs])
            hide = _top_level([Path(p) for p in HIDDEN] + [p.resolve() for p in self.hide])
            spec = {"expose": [str(p) for p in expose] + [str(self.root)], "hide": [str(p) for p in hide],
                    "uid": uid, "work": str(work), "env": env, "device": self.device,
                    "limits": {"file_bytes": self.limits.file_bytes, "max_processes": self.limits.max_processes,
                               "memory_bytes": 0 if self.device.startswith("cuda") else self.limits.memory_bytes}}
            r_status, w_status = os.pipe()
            try:
                self.proc = zygote_spawn(env, spec, [r_req, w_rep, w_status, log_fd], r_status)
            finally:
                for fd in (r_req, w_rep, w_status, log_fd):
                    os.close(fd)
            self.isolation = ["network namespace (no network)", "pid namespace", "mount namespace (course hidden)",
                              f"unprivileged user {uid}", "rlimits", "forked from a clean zygote"]
        else:
            limits = self.limits
            cuda = self.device.startswith("cuda")

            def preexec() -> None:
                os.setsid()
                _die_with_parent()
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
                resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
                if not cuda:
                    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))

            cmd = [sys.executable, "-S", "-B", str(self.root / "harness" / "harness.py"), str(r_req), str(w_rep),
                   self.device]
            try:
                self.proc = subprocess.Popen(cmd, cwd=str(work), env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                                             stderr=log_fd, pass_fds=(r_req, w_rep), preexec_fn=preexec, close_fds=True)
            finally:
                for fd in (r_req, w_rep, log_fd):
                    os.close(fd)
            self.isolation = ["rlimits only: namespaces or root unavailable, so no network or filesystem isolation"]
        self._w, self._r = w_req, r_rep
        # A first round trip proves the harness is up.
        self.request({"op": "names"}, timeout=self.limits.start_timeout)

    def close(self) -> None:
        self.kill()
        for fd in (self._r, self._w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = -1
        shutil.rmtree(self.root, ignore_errors=True)

    def kill(self) -> None:
        if self.proc is None:
            return
        if isinstance(self.proc, ZygoteChild):
            self.proc.kill()
        elif self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.root / "process.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    # -- requests ----------------------------------------------------------------------
    def request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its reply, at most ``timeout`` seconds (and the notebook's budget)."""
        if self.proc is None or self.proc.poll() is not None:
            raise SandboxError("crash", self._death_reason())
        budget = min(timeout, self.deadline - time.monotonic())
        if budget <= 0:
            self.kill()
            raise SandboxError("timeout", f"the notebook used up its total time limit of {self.limits.notebook_timeout:.0f} s")
        try:
            wire.send(self._w, msg)
        except (BrokenPipeError, OSError):
            raise SandboxError("crash", self._death_reason()) from None
        ready, _, _ = select.select([self._r], [], [], budget)
        if not ready:
            self.kill()
            limit = "its total time limit" if budget < timeout else f"the limit of {timeout:.0f} s"
            raise SandboxError("timeout", f"still running after {budget:.0f} s: stopped at {limit}")
        try:
            reply = self._recv_with_deadline(time.monotonic() + max(budget, 5.0))
        except EOFError:
            self.proc.wait()
            raise SandboxError("crash", self._death_reason()) from None
        except wire.WireError as e:
            self.kill()
            raise SandboxError("protocol", f"the notebook's process sent a malformed reply ({e})") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self.kill()
            raise SandboxError("protocol", "the notebook's process sent a malformed reply")
        return reply

    def _recv_with_deadline(self, deadline: float) -> Any:
        # The reply has started to arrive; a process that stalls half-way is killed at the deadline.
        import threading

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.kill)
        timer.start()
        try:
            return wire.recv(self._r, self.limits.reply_bytes)
        finally:
            timer.cancel()

    def _death_reason(self) -> str:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return "the notebook's process stopped answering"
        tail = self.log_tail(600)
        if code < 0:
            sig = signal.Signals(-code).name
            why = {"SIGKILL": "killed (often: memory exhausted)", "SIGSEGV": "crashed (segmentation fault)",
                   "SIGXFSZ": "stopped for writing a file over the size limit"}.get(sig, f"ended by {sig}")
            msg = f"the notebook's process was {why}"
        else:
            msg = f"the notebook's process exited with status {code} (sys.exit, os._exit or a crash)"
        if "MemoryError" in tail or "Cannot allocate memory" in tail or "std::bad_alloc" in tail:
            msg = "the notebook's process ran out of memory (limit %d MiB)" % (self.limits.memory_bytes >> 20)
        return msg
