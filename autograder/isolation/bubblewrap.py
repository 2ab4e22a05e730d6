"""Isolation without root: the sandbox's process started under bubblewrap (``bwrap``).

Where the kernel lets an ordinary user create user namespaces (most Linux
distributions, JupyterHub servers included), ``bwrap`` gives a non-root grader
the isolation the root path builds by hand in :mod:`autograder.isolation.zygote`: its own
user, network (nothing but a private loopback), PID, IPC, UTS and cgroup
namespaces, and a file system in which

* everything the host has is mounted read-only (``--ro-bind / /``), so no
  world-writable folder of the host (``/tmp``, ``/var/tmp``, ``/dev/shm``,
  ``/run/lock``, ...) can carry data to a later sandbox;
* the hidden folders are empty read-only tmpfs mounts, with the Python
  installation and the sandbox's folder brought back read-only;
* the scratch folder is a size-limited tmpfs of its own, filled with a copy of
  what the student received before the harness starts;
* ``/dev`` holds only the usual device files, read-only, and ``/proc`` is its own.

Each sandbox has its own user namespace, so the kernel state keyed by user id
(keyrings, IPC) is its own too; the session keyring it would inherit is left
behind in :func:`autograder.isolation.zygote.fresh_keyrings`. Debian package:
``bubblewrap``. Imports only the standard library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Run inside the sandbox before the harness: copy what the student received into the fresh scratch tmpfs.
BOOT = ("import os, shutil, sys\n"
        "received, work, harness = sys.argv[1:4]\n"
        "shutil.copytree(received, work, symlinks=True, dirs_exist_ok=True)\n"
        "os.chdir(work)\n"
        "sys.argv = [harness] + sys.argv[4:]\n"
        "sys.path.insert(0, os.path.dirname(harness))\n"
        "import harness\n"
        "harness.main()\n")


def bwrap() -> str | None:
    """The ``bwrap`` executable, or None."""
    return shutil.which("bwrap")


def works() -> bool:
    """True when ``bwrap`` can create the namespaces the sandbox uses, as this user, here."""
    exe = bwrap()
    if exe is None or os.environ.get("AUTOGRADER_NO_BWRAP"):
        return False
    try:
        # Every option the sandbox uses (--disable-userns needs bubblewrap 0.8, --size 0.7 or later).
        subprocess.run([exe, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                        "--new-session", "--ro-bind", "/", "/", "--size", str(1 << 20), "--tmpfs", "/tmp",
                        "--remount-ro", "/tmp", "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc", "true"],
                       check=True, timeout=20,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


def command(expose: list[Path], hide: list[Path], root: Path, received: Path, work: Path, scratch_bytes: int,
            uid: int, python: str, harness: Path, args: list[str]) -> list[str]:
    """The ``bwrap`` command line that runs ``harness`` with ``args`` in ``work``, isolated as described above.

    ``received`` (inside ``root``) holds what the student received; ``work`` becomes a tmpfs of
    ``scratch_bytes`` holding a copy of it.
    """
    cmd = [bwrap() or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
           "--new-session", "--uid", str(uid), "--gid", str(uid), "--ro-bind", "/", "/"]
    for path in hide:
        cmd += ["--size", str(16 << 20), "--tmpfs", str(path)]
    for path in expose + [root]:
        cmd += ["--ro-bind", str(path), str(path)]
    for path in hide:
        cmd += ["--remount-ro", str(path)]
    cmd += ["--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc",
            "--ro-bind", str(work), str(received),
            "--size", str(scratch_bytes), "--tmpfs", str(work),
            "--chdir", "/"]
    return cmd + [python, "-S", "-B", "-c", BOOT, str(received), str(work), str(harness), *args]
