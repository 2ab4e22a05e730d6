"""A fork server for sandboxes: Python and torch are imported once, each submission gets a fresh fork.

Starting Python and importing torch takes about two seconds, more than grading a
notebook. The zygote pays it once per grading process: it imports the harness
(and with it torch and numpy), does the ban's one-off setup
(:func:`autograder.in_sandbox.harness.prepare_guard`: torch's functions guarded, the plans of the bans),
runs nothing else, and waits for requests on a
Unix socket. For every submission it forks a child that, before running any
student code,

0. joins the sandbox's cgroup when the judge made one (memory and processes
   limited for the sandbox as a whole);
1. enters new mount, network, PID, IPC and UTS namespaces (a second fork makes
   the sandboxed process PID 1 of its namespace, so killing it ends everything
   it started; the first fork stays behind to report its exit status);
2. hides what the sandbox asks (:data:`autograder.isolation.sandbox.HIDDEN`, the course,
   the submissions, the grading folder) behind empty tmpfs mounts, leaving only the Python installation
   and the sandbox's folder visible, read-only, with the scratch folder inside it
   on a size-limited tmpfs of its own (a copy of what the student received);
3. makes every mount it can see read-only except its scratch folder (and its
   own ``/proc``): nothing it writes outside the scratch reaches the host or a
   later sandbox, whichever world-writable folder the host has;
4. drops to an unprivileged user of its own (an id no other sandbox uses) with
   no new privileges, applies the limits, and starts from empty kernel
   keyrings (a new session keyring; the user keyrings of its id cleared);
5. runs the harness on the pipes the judge passed over the socket, which bans the process for life for the
   spec's ``bans`` (:func:`autograder.in_sandbox.ban.ban_for_life`) before it reads the first request.

No student code ever runs in the zygote, and no child is reused: each
submission sees a process fresh from the same clean image. Runs as root only;
without root the sandbox uses bubblewrap (:mod:`autograder.isolation.bubblewrap`) or,
failing that, a plain process. Linux only.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import struct
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
STAGING = "/mnt"
MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
# keyctl(2): the call's number per architecture, its operations and the special keyring ids.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "i686": 288, "armv7l": 311, "ppc64le": 289, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR, KEYCTL_GET_PERSISTENT = 1, 7, 22
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(LIBC.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _keyctl(op: int, *args: int | None) -> int:
    nr = SYS_KEYCTL.get(platform.machine())
    if nr is None:
        raise OSError(0, f"keyctl: unknown system call number on {platform.machine()}")
    ret = LIBC.syscall(ctypes.c_long(nr), ctypes.c_long(op), *(ctypes.c_long(a) if a is not None else None for a in args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl {op}: {os.strerror(err)}")
    return ret


def fresh_keyrings(clear_user: bool) -> None:
    """Leave the inherited kernel keyrings behind: join a new, empty session keyring.

    With ``clear_user`` (a process already running as its sandbox's own user id), also empty the
    keyrings the kernel keys by user id (user, user-session and persistent keyrings), which outlive
    the processes that filled them: whatever an earlier process of that id left there is gone.
    A kernel without keyrings (ENOSYS) has nothing to share.
    """
    import errno

    try:
        _keyctl(KEYCTL_JOIN_SESSION_KEYRING, None)
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return
        raise
    if not clear_user:
        return
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        _keyctl(KEYCTL_CLEAR, ring)
    try:  # linked into the new session keyring, then emptied
        _keyctl(KEYCTL_CLEAR, _keyctl(KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_SESSION_KEYRING))
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise


def _mount_points() -> list[tuple[str, set[str]]]:
    """Every mount point this process sees, with its per-mount options (``/proc/self/mountinfo``)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
            out.append((target, set(fields[5].split(","))))
    return out


def _everything_read_only(writable: list[str]) -> None:
    """Remount every mount read-only but ``writable`` and ``/proc``.

    A whole-tree rule rather than a list of folders: any world-writable folder the host has
    (``/var/tmp``, ``/run/lock``, ``/dev/mqueue``, ...) is read-only here, so nothing a sandbox writes
    outside its scratch reaches the host's disk or a later sandbox. Writing to device files such as
    ``/dev/null`` still works on a read-only mount.
    """
    for target, opts in _mount_points():
        if target in writable or target == "/proc" or target.startswith("/proc/") or "ro" in opts:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        for name, flag in MOUNT_FLAGS.items():
            flags |= flag if name in opts else 0
        try:
            _mount(None, target, None, flags)
        except OSError:
            if os.path.exists(target):  # a mount hidden under another one cannot be reached anyway
                raise


def _isolate_filesystem(expose: list[str], hide: list[str], work: str | None = None, scratch_bytes: int = 0) -> None:
    """Hide ``hide`` behind empty tmpfs mounts and bring ``expose`` back (read-only unless last).

    With ``scratch_bytes``, everything exposed is read-only and ``work`` (inside the last exposed folder)
    becomes a tmpfs of that size holding a copy of what was there: student code can fill its scratch
    folder, never the host's disk.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", STAGING, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=700")
    for i, path in enumerate(expose):
        os.mkdir(f"{STAGING}/{i}")
        _mount(path, f"{STAGING}/{i}", None, MS_BIND | MS_REC)
    for path in hide:
        if path != STAGING:
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    for i, path in enumerate(expose):
        os.makedirs(path, exist_ok=True)
        _mount(f"{STAGING}/{i}", path, None, MS_BIND | MS_REC)
        if i < len(expose) - 1 or scratch_bytes:  # everything but the scratch folder is read-only
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    if scratch_bytes and work:
        scratch = f"{STAGING}/scratch"
        os.mkdir(scratch)
        _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(scratch_bytes)},nr_inodes=65536,mode=755")
        shutil.copytree(work, scratch, symlinks=True, dirs_exist_ok=True)
        _mount(scratch, work, None, MS_BIND)
        _mount(None, work, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
    _check(LIBC.umount2(STAGING.encode(), MNT_DETACH), "umount staging")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if scratch_bytes and work:
        _everything_read_only([work])


def _run_child(spec: dict, fds: list[int]) -> None:
    """In the forked child: isolate, drop privileges, run the harness. Never returns."""
    r_req, w_rep, w_status, log_fd = fds
    code = 70
    try:
        os.setsid()
        # Into the sandbox's cgroup first: this process and everything it starts share one memory and
        # process limit. Failing to join is fatal (no sandbox runs without the limits it was promised).
        for group in spec.get("cgroups", []):
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
        pid = os.fork()
        if pid:  # the reporter: tells the judge the sandboxed process's pid, then how it ended
            for fd in (r_req, w_rep, log_fd):
                os.close(fd)
            os.write(w_status, struct.pack("<i", pid))
            _, status = os.waitpid(pid, 0)
            os.write(w_status, struct.pack("<i", status))
            os._exit(0)
        os.close(w_status)
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        _isolate_filesystem(spec["expose"], spec["hide"], spec["work"], spec.get("scratch_bytes", 0))
        uid, work = spec["uid"], spec["work"]
        for dirpath, dirnames, filenames in os.walk(work):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                os.lchown(name, uid, uid)
        os.chmod(work, 0o700)
        lim = spec["limits"]
        for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, lim["file_bytes"]),
                           (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_NPROC, lim["max_processes"])):
            resource.setrlimit(res, (value, value))
        if lim.get("memory_bytes"):
            resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu_seconds"], lim["cpu_seconds"] + 5))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        fresh_keyrings(clear_user=True)
        _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        # Changing credentials cleared the parent-death signal: set it again. (getppid() is 0 across
        # the PID namespace, so a reporter that died in between cannot be detected here; the judge
        # kills this process directly by its pidfd in any case.)
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(work)
        os.environ.clear()
        os.environ.update(spec["env"])
        import harness

        sys.argv = ["harness", str(r_req), str(w_rep), str(spec.get("bans", ""))]
        harness.main()
        code = 0
    except BaseException as e:  # noqa: BLE001 - report, then leave without running anything else
        try:
            os.write(2, f"sandbox set-up failed: {e!r}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Answer spawn requests until the judge closes the socket."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        except OSError:
            return
        if not msg:
            return
        spec = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _run_child(spec, fds)
        for fd in fds:
            os.close(fd)
        sock.sendall(struct.pack("<i", pid))


def main() -> None:
    # If the grading process dies (even by SIGKILL), the zygote follows, then every reporter, then every
    # sandboxed process: parent-death signals all the way down, so no student code outlives the grader.
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # What the zygote and its children create (the mount points of every exposed folder, made inside the hidden
    # tmpfs mounts) must be reachable by the sandbox's own user, whatever the instructor's umask: under the guide's
    # `umask 077` they were made 0700, and student code could import no module that was not loaded in advance.
    os.umask(0o022)
    sock = socket.socket(fileno=int(sys.argv[1]))
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch  # noqa: F401 - the point of the zygote: imported once, inherited by every child

    # The harness and its siblings, as the sandbox runs them: flat modules of ``autograder/in_sandbox``.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "in_sandbox"))
    import harness

    torch.set_num_threads(1)
    harness.prepare_guard(torch)  # once here rather than once per sandbox (each child bans itself for life)
    sock.sendall(b"ready")
    serve(sock)


if __name__ == "__main__":
    main()
