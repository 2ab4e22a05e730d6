"""What a killed grader leaves behind is found and removed by the next one.

Scratch folders and cgroups are named ``attn-sbx-<pid>.<start time>-...`` after
the grading process that made them. A grader killed before cleaning up leaves
them behind; the next grader sees that their owner is gone (a recycled pid has
another start time) and removes them. Imports only the standard library.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

def owner_tag(pid: int | None = None) -> str | None:
    """``pid.starttime``: names a process for good (a recycled pid has another start time)."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return f"{pid}.{int(stat[stat.rindex(b')') + 2:].split()[19])}"
    except (OSError, ValueError, IndexError):
        return None if pid != os.getpid() else f"{pid}.0"


def owner_dead(tag: str) -> bool:
    """True when the process that ``tag`` names has ended (a recycled pid does not count as alive)."""
    pid, _, start = tag.partition(".")
    if not pid.isdigit() or not start.isdigit():
        return False
    if sys.platform != "linux":
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        return False
    return owner_tag(int(pid)) != tag


SCRATCH_PREFIX = "attn-sbx-"
_SWEPT: set[tuple[int, str]] = set()


def sweep_stale_scratch() -> None:
    """Remove scratch folders of graders that died without cleaning up (once per process)."""
    key = (os.getpid(), tempfile.gettempdir())
    if key in _SWEPT:
        return
    _SWEPT.add(key)
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(SCRATCH_PREFIX):
            continue
        tag = entry.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        try:
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.geteuid() \
                    and owner_dead(tag):
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            pass
