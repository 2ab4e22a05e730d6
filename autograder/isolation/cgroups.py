"""cgroups: one sandbox's memory and processes counted together, not per process.

A sandbox gets a cgroup of its own where a writable cgroup v2 (or the v1
``memory`` and ``pids`` controllers) is available, which in practice means the
grader runs as root. :func:`cgroup_plan` finds where (once per process);
:meth:`Cgroup.create` makes and configures one; the sandbox puts its process in
it, reads its OOM kills and removes it. Cgroups of dead graders are swept (see
:mod:`autograder.isolation.leftovers`). Imports only the standard library.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from autograder.isolation.leftovers import SCRATCH_PREFIX, owner_dead, owner_tag


def _mounts() -> list[tuple[str, str, list[str]]]:
    out = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4:
                    target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
                    out.append((target, parts[2], parts[3].split(",")))
    except OSError:
        pass
    return out


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Cgroup:
    """One sandbox's cgroup (v2, or the v1 memory and pids controllers): a limit on all its processes together."""

    _seq = 0

    def __init__(self, kind: str, dirs: list[Path], memory: Path) -> None:
        self.kind, self.dirs, self.memory = kind, dirs, memory
        self.oom_seen = 0

    @classmethod
    def create(cls, memory_bytes: int, max_processes: int) -> "Cgroup":
        """Create and configure a fresh cgroup; OSError when the machine has no usable one."""
        plan = cgroup_plan()
        if plan is None:
            raise OSError("no writable cgroup v2 (or v1 memory and pids controllers)")
        kind, parents = plan
        cls._seq += 1
        name = f"{SCRATCH_PREFIX}{owner_tag()}-{threading.get_ident() % 100000}-{cls._seq}"
        dirs = [p / name for p in parents]
        group = cls(kind, dirs, dirs[0])
        try:
            for d in dirs:
                d.mkdir()
            mem, swap = str(memory_bytes), "0"
            if kind == "v2":
                d = dirs[0]
                _write(d / "memory.max", mem)
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", swap)
                if (d / "memory.oom.group").exists():
                    _write(d / "memory.oom.group", "1")  # an OOM kill ends the whole sandbox, never half of it
                _write(d / "pids.max", str(max_processes))
            else:
                m, pids = dirs
                _write(m / "memory.limit_in_bytes", mem)
                if (m / "memory.memsw.limit_in_bytes").exists():
                    _write(m / "memory.memsw.limit_in_bytes", mem)  # memory + swap = memory: no swap
                if (m / "memory.swappiness").exists():
                    try:
                        _write(m / "memory.swappiness", "0")
                    except OSError:
                        pass
                _write(pids / "pids.max", str(max_processes))
        except OSError:
            group.remove()
            raise
        return group

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this cgroup so far."""
        try:
            text = (self.memory / ("memory.events" if self.kind == "v2" else "memory.oom_control")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def new_oom_kill(self) -> bool:
        n = self.oom_kills()
        seen, self.oom_seen = self.oom_seen, max(self.oom_seen, n)
        return n > seen

    def kill_all(self) -> None:
        for d in self.dirs:
            if (d / "cgroup.kill").exists():
                try:
                    _write(d / "cgroup.kill", "1")
                    continue
                except OSError:
                    pass
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def remove(self, wait: float = 3.0) -> bool:
        """Kill what is left in the cgroup and remove it; False if it could not be removed (yet)."""
        end = time.monotonic() + wait
        left = [d for d in self.dirs if d.exists()]
        while left:
            self.kill_all()
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError:
                    pass
            if not left or time.monotonic() > end:
                break
            time.sleep(0.02)
        return not left


def _sweep_stale_cgroups(parents: list[Path]) -> None:
    for parent in parents:
        try:
            entries = [e for e in os.scandir(parent) if e.name.startswith(SCRATCH_PREFIX) and e.is_dir()]
        except OSError:
            continue
        for e in entries:
            if owner_dead(e.name[len(SCRATCH_PREFIX):].split("-", 1)[0]):
                Cgroup("v1", [Path(e.path)], Path(e.path)).remove(wait=1.0)


def _find_cgroup_plan() -> tuple[str, list[Path]] | None:
    if sys.platform != "linux" or os.geteuid() != 0 or os.environ.get("AUTOGRADER_NO_CGROUP"):
        return None
    mounts = _mounts()
    # cgroup v2 mounted at /sys/fs/cgroup: a shared parent under the root, with the controllers enabled.
    root = Path("/sys/fs/cgroup")
    if any(t == str(root) and fs == "cgroup2" for t, fs, _ in mounts):
        try:
            available = (root / "cgroup.controllers").read_text().split()
            if "memory" in available and "pids" in available:
                parent = root / "attn-autograder"
                for d in (root, parent):
                    if d is parent:
                        parent.mkdir(exist_ok=True)
                    enabled = (d / "cgroup.subtree_control").read_text().split()
                    if "memory" not in enabled or "pids" not in enabled:
                        _write(d / "cgroup.subtree_control", "+memory +pids")
                _sweep_stale_cgroups([parent])
                return "v2", [parent]
        except OSError:
            return None
        return None
    # cgroup v1 (or hybrid): the memory and pids controllers, under the grader's own cgroups.
    own: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(","):
                    own[c] = path
    except (OSError, ValueError):
        return None
    parents = []
    for controller in ("memory", "pids"):
        target = next((t for t, fs, opts in mounts if fs == "cgroup" and controller in opts), None)
        if target is None or controller not in own:
            return None
        parent = Path(target + own[controller])
        if not os.access(parent, os.W_OK):
            return None
        parents.append(parent)
    _sweep_stale_cgroups(parents)
    return "v1", parents


_CGROUP_PLAN: dict[int, tuple[str, list[Path]] | None] = {}


def cgroup_plan() -> tuple[str, list[Path]] | None:
    """``(kind, parent folders)`` of the cgroups sandboxes get here, or None (checked once per process)."""
    pid = os.getpid()
    if pid not in _CGROUP_PLAN:
        _CGROUP_PLAN[pid] = _find_cgroup_plan()
    return _CGROUP_PLAN[pid]
