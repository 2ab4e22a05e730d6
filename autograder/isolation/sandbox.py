"""Run one submission's code in an isolated, disposable process.

A :class:`Sandbox` starts ``harness.py`` in a scratch folder that holds only
what the student received, and talks to it over two pipes (see :mod:`wire`).
How it is isolated depends on the machine (:func:`isolation_mode`):

* as root (``namespaces``), the process is forked by the zygote
  (:mod:`autograder.isolation.zygote`) into its own network (no network), PID, IPC, UTS
  and mount namespaces; the folders of :data:`HIDDEN`, the course, the
  submissions and the grading folder are hidden behind empty tmpfs mounts, the
  Python installation is visible, and every mount is read-only but the scratch
  folder; it runs as a user id of its own (:func:`sandbox_uid`, no new
  privileges) with fresh keyrings, and where a writable cgroup is available
  (:mod:`autograder.isolation.cgroups`) the memory limit (without swap) and the process
  limit count all its processes together, an OOM kill stops the request with a
  clear reason, and the cgroup is removed with the sandbox;
* without root, where user namespaces are allowed (``bubblewrap``), the same
  namespaces, hidden folders and read-only file system through ``bwrap``
  (:mod:`autograder.isolation.bubblewrap`), in a user namespace of its own; memory and
  processes are limited per process (rlimits);
* elsewhere (``none``), a plain process with rlimits only:
  :func:`isolation_summary` says so before grading, every result's log records
  it, and :func:`require_isolation` (``Limits.require_isolation``) refuses.

In the first two, the scratch folder is a tmpfs of ``Limits.scratch_bytes``
holding a copy of what the student received: student code can fill it but
never the host's disk, and nothing it writes reaches a later sandbox.

In every mode the student's side is one process: the harness installs a seccomp filter before the
student's first line (:func:`autograder.in_sandbox.confine.confine_processes`: no fork, clone of a process or exec),
the sandbox reads it from outside once the harness answers (``Seccomp: 2`` in ``/proc/<pid>/status``)
and records the sandbox's processes then, and before every request ends any other process it finds
below the sandbox or in its cgroup (:meth:`Sandbox.end_others`), so none can help a judged call.

No GPU is visible to student code (``CUDA_VISIBLE_DEVICES`` is empty): the checks
compare on the CPU. Everywhere it gets resource limits (address space, CPU time,
file size, open files, no core dumps), a wall-clock limit on every request and
on the whole notebook, enforced from outside with SIGKILL, and a byte cap on
what it prints. Writing a request and reading its reply share the request's
deadline (the pipes are non-blocking), so a process that stops reading or
stalls mid-reply is stopped like one that hangs. Scratch folders and cgroups
are named after their grading process (see :mod:`autograder.isolation.leftovers`): a
grader killed before cleaning up leaves them to the next one, which removes
them. :attr:`Sandbox.isolation` lists what was applied, for the grading log.
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import secrets
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.isolation import bubblewrap
from autograder.in_sandbox import wire
from autograder.isolation.cgroups import Cgroup
from autograder.isolation.leftovers import SCRATCH_PREFIX, owner_tag, sweep_stale_scratch
from autograder.isolation.zygote import fresh_keyrings
from autograder.isolation.zygote_client import ZygoteChild, ZygoteError, zygote_spawn

HERE = Path(__file__).resolve().parent
IN_SANDBOX = HERE.parent / "in_sandbox"  # what is copied into every sandbox


def sandbox_uid() -> int:
    """A user id for one sandbox, drawn at random from about two billion (no passwd entry needed).

    Every sandbox runs as an id of its own, so what the kernel keys by user id
    (process limits, keyrings) is not shared with a classmate graded before,
    after or beside it; the keyrings of the id are emptied before student code
    runs in any case (:func:`autograder.isolation.zygote.fresh_keyrings`), so even a
    repeated draw inherits nothing.
    """
    return 100_000 + secrets.randbelow((1 << 31) - 200_000)


@dataclass
class Limits:
    """Resource limits for one submission.

    ``grade``'s options set the three time limits, ``memory_bytes``,
    ``max_processes``, ``scratch_bytes`` and ``require_isolation``; the other
    fields keep these defaults.
    """

    cell_timeout: float = 60.0  # seconds for one notebook cell
    call_timeout: float = 30.0  # seconds for one call into the student's code
    notebook_timeout: float = 600.0  # seconds for everything one submission runs
    memory_bytes: int = 6 << 30  # address space of the student's process
    max_processes: int = 512  # threads and processes of the sandbox user
    file_bytes: int = 64 << 20  # largest file the student's process may write
    scratch_bytes: int = 256 << 20  # size of the scratch folder (a tmpfs of its own where namespaces are available)
    reply_bytes: int = 256 << 20  # largest reply accepted from the sandbox
    start_timeout: float = 120.0  # seconds to start Python and import torch
    cpu_seconds: int = 600  # CPU time of each of the student's processes (RLIMIT_CPU)
    # Refuse to run student code where no isolation can be had. Not part of the repr, which the grader's
    # fingerprint hashes: asking for isolation changes no grade, so it must not trigger a regrade.
    require_isolation: bool = field(default=False, repr=False, compare=False)


class SandboxError(RuntimeError):
    """The sandbox could not answer: it timed out, died or broke the protocol."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "timeout", "crash", "protocol"


def _namespaces_work() -> bool:
    if os.environ.get("AUTOGRADER_NO_NAMESPACES") or sys.platform != "linux" or os.geteuid() != 0:
        return False
    if not shutil.which("unshare"):
        return False
    try:
        subprocess.run(["unshare", "--net", "--mount", "--pid", "--ipc", "--fork", "true"], check=True, timeout=20,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


NAMESPACES, BUBBLEWRAP, NONE = "namespaces", "bubblewrap", "none"
_MODE: dict[int, str] = {}


def isolation_mode() -> str:
    """How sandboxes are isolated here (checked once per process).

    ``"namespaces"``: as root, namespaces, cgroups and a user per sandbox set up by :mod:`autograder.isolation.zygote`;
    ``"bubblewrap"``: without root, the same namespaces through ``bwrap`` (:mod:`autograder.isolation.bubblewrap`);
    ``"none"``: neither is possible, student code runs as a plain process under rlimits.
    ``AUTOGRADER_NO_NAMESPACES`` and ``AUTOGRADER_NO_BWRAP`` switch the first two off.
    """
    pid = os.getpid()
    if pid not in _MODE:
        _MODE[pid] = NAMESPACES if _namespaces_work() else BUBBLEWRAP if bubblewrap.works() else NONE
    return _MODE[pid]


def can_isolate() -> bool:
    """True when student code runs with no network, the course hidden and a file system of its own."""
    return isolation_mode() != NONE


class IsolationUnavailable(SandboxError):
    """Isolation was required and cannot be had on this machine."""

    def __init__(self, message: str) -> None:
        super().__init__("isolation", message)


NO_ISOLATION = ("no isolation: not root, and user namespaces are not available to bubblewrap (bwrap), so student code "
                "would run as this user with rlimits only, able to read the course, the grading folder and its "
                "secret, and to reach the network")


def isolation_summary() -> str:
    """One line for the grading log, before grading: what isolation student code gets here."""
    mode = isolation_mode()
    if mode == NAMESPACES:
        return "isolation: namespaces, cgroups and a user per sandbox (running as root)"
    if mode == BUBBLEWRAP:
        return ("isolation: bubblewrap (user, network, PID, IPC namespaces; file system read-only but the scratch "
                "folder; course hidden), without root: no cgroup, so memory and processes are limited per process")
    return "WARNING: " + NO_ISOLATION


def require_isolation() -> None:
    """Raise :class:`IsolationUnavailable` with a clear message when no isolation can be had here."""
    if not can_isolate():
        raise IsolationUnavailable(
            f"refusing to grade ({NO_ISOLATION}). Run as root, or install bubblewrap (Debian: apt-get install "
            "bubblewrap) where the kernel allows unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0), or grade without "
            "--require-isolation to accept running student code unisolated.")


def _outermost_existing(paths: list[Path]) -> list[Path]:
    """The existing paths of ``paths`` that lie inside no other of them (so one mount covers each)."""
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


def _tasks_of(uid: int) -> int:
    """How many processes and threads ``uid`` runs now (what RLIMIT_NPROC counts)."""
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return n


# -- the student's processes, seen from outside -------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (``/proc/<pid>/task/<tid>/children``); [] once it is gone."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (an orphan in a PID namespace is re-parented to its PID 1, below it too)."""
    seen, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += _children(p)
    return seen


def _status(pid: int, field: str) -> int | None:
    """An integer field of ``/proc/<pid>/status`` (``Seccomp``, ``Seccomp_filters``, ``PPid``), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _seccomp(pid: int) -> int | None:
    """The seccomp mode of ``pid`` (2: filtered), or None."""
    return _status(pid, "Seccomp")


def _own_filter(pid: int) -> bool:
    """Whether ``pid`` runs under a seccomp filter of its own: one more than its parent's (a container's or
    bwrap's filters, inherited by every process, do not count)."""
    mine, parent = _status(pid, "Seccomp_filters"), _status(_status(pid, "PPid") or -1, "Seccomp_filters")
    return _seccomp(pid) == 2 and mine is not None and mine > (parent or 0)


def _end(pid: int) -> bool:
    """SIGKILL ``pid`` through a pidfd (so a recycled pid is never hit); False if it was already gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# Hidden from student code, besides the course, the submissions and the grading folder: the one list.
HIDDEN = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm", "/srv", "/mnt", "/media", "/opt", "/work")


@dataclass
class Sandbox:
    """One student's process. Use as a context manager; it is killed and its files removed on exit."""

    files: Path | None = None  # folder whose contents the student received (copied into the scratch folder)
    limits: Limits = field(default_factory=Limits)
    hide: list[Path] = field(default_factory=list)  # extra folders to hide (course, submissions, grading state)
    isolation: list[str] = field(default_factory=list)
    # What this process is banned for, for its whole life (the runtime fragments of the parts it answers, see
    # autograder.in_sandbox.ban): torch's attention always, and these. A part whose bans differ gets its own.
    bans: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | ZygoteChild | None = None
        sweep_stale_scratch()
        # The owner's pid and start time in the name: a grader killed before its clean-up leaves a folder
        # that the next grader recognises as orphaned and removes.
        self.root = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{owner_tag()}-"))
        self.deadline = time.monotonic() + self.limits.notebook_timeout
        self._r = self._w = -1
        self.cgroup: Cgroup | None = None
        self.worker = -1  # the harness's pid, as this machine names it; found from outside once it answered
        self.confined = False  # the worker cannot start a process (its seccomp filter, read from outside)
        self.expected: set[int] = set()  # the sandbox's processes before any student code ran
        self.events: list[str] = []  # what the outside checks did (processes ended), for the result's log

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
        tools.chmod(0o755)  # modes set, not left to the instructor's umask (077 in the guide)
        for module in IN_SANDBOX.glob("*.py"):  # the whole subpackage, as flat modules
            if module.name != "__init__.py":
                shutil.copy2(module, tools / module.name)
                (tools / module.name).chmod(0o644)
        work = self.root / "work"
        if self.files is not None and self.files.is_dir():
            shutil.copytree(self.files, work, ignore=shutil.ignore_patterns("*.ipynb", ".*", "__pycache__"))
        else:
            work.mkdir()
        (work / "tmp").mkdir(exist_ok=True)
        return work

    def _env(self, work: Path) -> dict[str, str]:
        # Resolved: a venv reached through a link in a hidden folder (a course's .venv linked to a shared one)
        # is exposed to bubblewrap only where the link points.
        site_dirs = [str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("purelib", "platlib")]
        return {
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
            "CUDA_VISIBLE_DEVICES": "",  # grading runs on the CPU: no GPU is visible to student code
        }

    def _visible(self) -> tuple[list[Path], list[Path]]:
        """``(expose, hide)``: the Python installation (read-only) and the folders hidden behind empty mounts."""
        site_dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        # Resolved, and as Python names them: a virtual environment reached through a symbolic link (a
        # checkout's .venv linking to a shared one) keeps the paths of its python and of the modules torch
        # was imported from, so bwrap finds sys.executable and torch's lazy imports work inside the sandbox.
        expose = _outermost_existing([Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()]
                                     + [Path(d).resolve() for d in site_dirs] + [Path(sys.prefix)]
                                     + [Path(d) for d in site_dirs])
        hide = _outermost_existing([Path(p) for p in HIDDEN] + [p.resolve() for p in self.hide])
        return expose, hide

    def _rlimits(self, processes: bool) -> None:
        """In the child about to exec: the per-process limits (``processes``: RLIMIT_NPROC too)."""
        lim = self.limits
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim.file_bytes, lim.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_AS, (lim.memory_bytes, lim.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (lim.cpu_seconds, lim.cpu_seconds + 5))
        if processes:  # counted per real user id: this user's processes now, plus the sandbox's allowance
            resource.setrlimit(resource.RLIMIT_NPROC, (_tasks_of(os.getuid()) + lim.max_processes,) * 2)

    def start(self) -> None:
        mode = isolation_mode()
        if mode == NONE and self.limits.require_isolation:
            require_isolation()
        work = self._prepare()
        env = self._env(work)
        r_req, w_req = os.pipe()
        r_rep, w_rep = os.pipe()
        log_fd = os.open(self.root / "process.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if mode == NAMESPACES:
                self._start_zygote(work, env, [r_req, w_rep, log_fd])
            else:
                self._start_process(work, env, [r_req, w_rep, log_fd], mode == BUBBLEWRAP)
        finally:
            for fd in (r_req, w_rep, log_fd):
                os.close(fd)
        self._w, self._r = w_req, r_rep
        # Every read and write is bounded by a deadline (see request): a process that stops reading its
        # requests, or stalls half-way through a reply, cannot block the grader.
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        # A first round trip proves the harness is up; no student code has run yet, so what the sandbox's
        # processes are now (and the worker's seccomp filter) is the harness's own doing.
        self.request({"op": "names"}, timeout=self.limits.start_timeout)
        self._find_worker()

    # -- one process: found from outside, others ended before every request ----------------------------
    def _root_pid(self) -> int:
        """The outermost process the judge started for this sandbox (the zygote's reporter, ``bwrap``, or
        the harness itself)."""
        return self.proc.pid if self.proc is not None else -1

    def _find_worker(self) -> None:
        """Before any student code: record the sandbox's processes and whether the worker is confined.

        The worker (the harness) must run under the seccomp filter it installed
        (:func:`autograder.in_sandbox.confine.confine_processes`) before it answered its first request: one filter
        more than its parent has (a container's or bwrap's own filters are inherited by both). Without
        it (an architecture with no filter, a kernel without seccomp), the log says so.
        """
        root = self._root_pid()
        if isinstance(self.proc, ZygoteChild):
            self.expected, self.worker = {root, self.proc.inner_pid}, self.proc.inner_pid
        else:  # bwrap (and its PID 1) above the harness, or the harness itself: the harness is the one leaf
            self.expected = _descendants(root)
            leaves = [p for p in self.expected if not _children(p)]
            self.worker = leaves[0] if len(leaves) == 1 else root
        self.confined = _own_filter(self.worker)
        if self.confined:
            self.isolation.append("one process: the harness's seccomp filter, installed before the student's "
                                  "first line and read from outside, refuses fork, clone and exec (threads "
                                  "work); any other process is ended before every request")
        else:
            self.isolation.append("processes NOT confined (no seccomp filter here: see the process log): the "
                                  "student's code can start processes; any but the worker are ended from "
                                  "outside before every request, but not during a call")

    def end_others(self) -> list[int]:
        """End every process of the sandbox but those it had before student code ran (the worker and the
        processes that started it), from outside; the pids ended. Called before every request."""
        if not self.expected or self.proc is None:
            return []
        now = _descendants(self._root_pid())
        if self.cgroup is not None:
            for d in self.cgroup.dirs:
                try:
                    now.update(int(x) for x in (d / "cgroup.procs").read_text().split())
                except (OSError, ValueError):
                    pass
        ended = [pid for pid in sorted(now - self.expected) if _end(pid)]
        if ended:
            self.events.append(f"ended {len(ended)} process(es) the notebook started beside the worker "
                               "(only the worker may run student code when a check calls it)")
        return ended

    def _start_zygote(self, work: Path, env: dict[str, str], fds: list[int]) -> None:
        """As root: a process forked by the zygote, which isolates it (see :mod:`autograder.isolation.zygote`)."""
        uid = sandbox_uid()
        expose, hide = self._visible()
        try:
            self.cgroup = Cgroup.create(self.limits.memory_bytes, self.limits.max_processes)
            whole = (f"cgroup {self.cgroup.kind} (memory {self.limits.memory_bytes >> 20} MiB without swap and "
                     f"{self.limits.max_processes} processes for the whole sandbox)")
        except OSError as e:
            self.cgroup = None
            whole = (f"no cgroup ({e.strerror or e}): memory and process limits apply per process only "
                     "(rlimits), so several processes together can use more")
        lim = self.limits
        spec = {"expose": [str(p) for p in expose] + [str(self.root)], "hide": [str(p) for p in hide],
                "uid": uid, "work": str(work), "env": env,
                "cgroups": [str(d) for d in self.cgroup.dirs] if self.cgroup else [],
                "scratch_bytes": lim.scratch_bytes, "bans": ",".join(self.bans),
                "limits": {"file_bytes": lim.file_bytes, "max_processes": lim.max_processes,
                           "memory_bytes": lim.memory_bytes, "cpu_seconds": lim.cpu_seconds}}
        r_status, w_status = os.pipe()
        try:
            self.proc = zygote_spawn(env, spec, [fds[0], fds[1], w_status, fds[2]], r_status)
        except ZygoteError as e:
            raise SandboxError("crash", str(e)) from None
        finally:
            os.close(w_status)
        self.isolation = ["network namespace (no network)", "pid namespace", "ipc namespace",
                          "mount namespace (course hidden, every mount read-only but the scratch folder)",
                          f"scratch folder on its own tmpfs of {lim.scratch_bytes >> 20} MiB",
                          f"unprivileged user {uid} of its own, fresh keyrings",
                          f"rlimits (CPU {lim.cpu_seconds} s per process)", whole, "forked from a clean zygote"]

    def _start_process(self, work: Path, env: dict[str, str], fds: list[int], bwrap: bool) -> None:
        """Without root: a new process, under bubblewrap where it works, else with rlimits only."""
        r_req, w_rep, log_fd = fds
        harness = self.root / "harness" / "harness.py"
        if bwrap:
            expose, hide = self._visible()
            received = self.root / "received"
            received.mkdir()
            uid = sandbox_uid()
            # The interpreter by its folder's real path (exposed), keeping its own name so a venv stays one.
            python = str(Path(sys.executable).parent.resolve() / Path(sys.executable).name)
            cmd = bubblewrap.command(expose, hide, self.root, received, work, self.limits.scratch_bytes, uid,
                                     python, harness, [str(r_req), str(w_rep), ",".join(self.bans)])
        else:
            cmd = [sys.executable, "-S", "-B", str(harness), str(r_req), str(w_rep), ",".join(self.bans)]

        def preexec() -> None:
            os.setsid()
            _die_with_parent()
            self._rlimits(processes=bwrap)
            if bwrap:  # the grader's session keyring stays behind (user keyrings are per user namespace)
                fresh_keyrings(clear_user=False)

        self.proc = subprocess.Popen(cmd, cwd=str(work), env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                                     stderr=log_fd, pass_fds=(r_req, w_rep), preexec_fn=preexec, close_fds=True)
        lim = self.limits
        if bwrap:
            self.isolation = ["bubblewrap without root: user, network (no network), pid, ipc, uts namespaces",
                              "mount namespace (course hidden, every mount read-only but the scratch folder)",
                              f"scratch folder on its own tmpfs of {lim.scratch_bytes >> 20} MiB",
                              f"user {uid} in a user namespace of its own, fresh keyrings",
                              f"rlimits (CPU {lim.cpu_seconds} s per process; no cgroup without root: memory "
                              "and processes are limited per process)"]
        else:
            self.isolation = ["rlimits only: " + NO_ISOLATION]

    def close(self) -> None:
        self.kill()
        for fd in (self._r, self._w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = -1
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
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
        """Send one request and wait for its reply, at most ``timeout`` seconds (and the notebook's budget).

        Sending the request and waiting for the reply share one deadline: a process that stops reading
        its requests is stopped like one that hangs. Once the reply has started to arrive, it must be
        complete within ``max(budget, 5)`` more seconds.
        """
        if self.proc is None or self.proc.poll() is not None:
            raise SandboxError("crash", self._death_reason())
        self.end_others()  # whatever the request runs, the worker runs it alone
        budget = min(timeout, self.deadline - time.monotonic())
        if budget <= 0:
            self.kill()
            raise SandboxError("timeout", f"the notebook used up its total time limit of {self.limits.notebook_timeout:.0f} s")
        limit = "its total time limit" if budget < timeout else f"the limit of {timeout:.0f} s"
        deadline = time.monotonic() + budget
        try:
            wire.send(self._w, msg, deadline)
            sent = True
        except TimeoutError:
            sent = False
        except OSError:  # a broken pipe: the process is gone
            self._check_oom()
            raise SandboxError("crash", self._death_reason()) from None
        if not sent:
            self._check_oom()
            self.kill()
            raise SandboxError("timeout", f"stopped reading its requests: still not done after {budget:.0f} s, "
                                          f"stopped at {limit}")
        # While waiting, look at the cgroup twice a second: an OOM kill stops the request at once
        # (the kernel may have killed only a child, leaving the cell waiting for it).
        while not wire.wait(self._r, select.POLLIN, min(deadline, time.monotonic() + 0.5) if self.cgroup else deadline):
            self._check_oom()
            if time.monotonic() < deadline:
                continue
            self.kill()
            raise SandboxError("timeout", f"still running after {budget:.0f} s: stopped at {limit}")
        try:
            reply = wire.recv(self._r, self.limits.reply_bytes, time.monotonic() + max(budget, 5.0))
        except EOFError:
            self.proc.wait()
            raise SandboxError("crash", self._death_reason()) from None
        except TimeoutError:
            self._check_oom()
            self.kill()
            raise SandboxError("timeout", f"stalled half-way through its reply: stopped after {max(budget, 5.0):.0f} s") from None
        except wire.WireError as e:
            self.kill()
            raise SandboxError("protocol", f"the notebook's process sent a malformed reply ({e})") from None
        self._check_oom()
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            self.kill()
            raise SandboxError("protocol", "the notebook's process sent a malformed reply")
        if not reply["ok"] and "No space left on device" in str(reply.get("error", "")) and can_isolate():
            reply["error"] = (f"{reply['error']} (the scratch folder holds at most "
                              f"{self.limits.scratch_bytes >> 20} MiB)")
        return reply

    def _check_oom(self) -> None:
        """If the cgroup's OOM killer struck during the request, stop the sandbox and say so."""
        if self.cgroup is not None and self.cgroup.new_oom_kill():
            self.kill()
            raise SandboxError("crash", self._oom_message())

    def _oom_message(self) -> str:
        return (f"the notebook's process ran out of memory (limit {self.limits.memory_bytes >> 20} MiB for all "
                "its processes together) and was killed")

    def _death_reason(self) -> str:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return "the notebook's process stopped answering"
        if self.cgroup is not None and (self.cgroup.new_oom_kill() or self.cgroup.oom_seen):
            return self._oom_message()
        tail = self.log_tail(600)
        if code < 0:
            sig = signal.Signals(-code).name
            why = {"SIGKILL": "killed (often: memory exhausted)", "SIGSEGV": "crashed (segmentation fault)",
                   "SIGXFSZ": "stopped for writing a file over the size limit",
                   "SIGXCPU": f"stopped for using more than its {self.limits.cpu_seconds} s of CPU time"}.get(sig, f"ended by {sig}")
            msg = f"the notebook's process was {why}"
        else:
            msg = f"the notebook's process exited with status {code} (sys.exit, os._exit or a crash)"
        if "MemoryError" in tail or "Cannot allocate memory" in tail or "std::bad_alloc" in tail:
            msg = "the notebook's process ran out of memory (limit %d MiB)" % (self.limits.memory_bytes >> 20)
        return msg
