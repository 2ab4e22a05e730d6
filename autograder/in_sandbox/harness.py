"""The sandbox's request loop: the process that answers the judge for one notebook and one set of bans.

:func:`main` (started by :mod:`autograder.isolation.sandbox`, or forked by the zygote, with two pipe
descriptors and the bans of the parts this process answers) does, in this order, before any student line:

1. :func:`confine.confine_processes`: no second process or program, ever (a seccomp filter);
2. :func:`ban.ban_for_life`: torch's attention, and the parts' own bans, refused in this process for the rest
   of its life: at the dispatcher, in torch's Python re-implementations, and by an audit hook;
3. only then puts the working folder on ``sys.path`` (a ``torch.py`` beside the notebook is imported, if at
   all, after torch and the ban).

Then :func:`serve` answers requests (run a cell, call a function, ...) with a :class:`runner.Runner`
until the judge closes the channel. **No window:** every line this process runs from the first request
on, the student's and the loop's alike, runs under the ban, so a cell that rebinds what the loop calls
(``json.loads``, ``numpy.frombuffer``, ``numpy.ascontiguousarray``, ``wire.send``, the Runner's methods)
only moves the student's own code to another place in the same banned process
(``tests/test_sandbox.py`` rebinds every function the loop touches, found by tracing it, not from a list).
The loop's own calls are looked up at start-up all the same, and the code of this folder's functions cannot be
rewritten (the ban's audit hook refuses), so such a cell cannot break the channel by accident.

Whatever the student does to this process can only change the numbers it sends back, never the verdict:
the judge decides, in a process the student never ran in. This folder is copied into the sandbox and
imports only itself, the standard library, numpy and torch.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import numpy as np  # noqa: F401 - imported before any student line, like everything the loop uses

if __package__:  # imported as autograder.in_sandbox.harness (the judge's local runner, the tests)
    from autograder.in_sandbox import ban, confine, torch_names, wire
    from autograder.in_sandbox.ban import Delegated, Tampered
    from autograder.in_sandbox.confine import confine_processes
    from autograder.in_sandbox import runner as runner_module
    from autograder.in_sandbox.runner import Runner
else:  # run as a script in the sandbox, beside copies of its sibling modules
    import ban  # type: ignore[no-redef]
    import confine  # type: ignore[no-redef]
    import torch_names  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]
    from ban import Delegated, Tampered  # type: ignore[no-redef]
    from confine import confine_processes  # type: ignore[no-redef]
    import runner as runner_module  # type: ignore[no-redef]
    from runner import Runner  # type: ignore[no-redef]

__all__ = ["main", "serve", "prepare_guard", "Runner", "Delegated", "Tampered", "confine_processes", "confine"]

MAX_REQUEST = 256 << 20
OUT_CAP = 64 << 10


def prepare_guard(torch: Any) -> None:
    """The ban's one-off work (:func:`ban.prepare`), done by the zygote once before it forks, so every sandbox it
    forks inherits it (no student code has run in the zygote)."""
    ban.prepare(torch)


class _Capped(io.TextIOBase):
    """A text sink that keeps the first ``cap`` characters and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.parts, self.size, self.dropped = cap, [], 0, 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[... {self.dropped} more characters of output cut]"
        self.parts, self.size, self.dropped = [], 0, 0
        return text



def _one_process_compile(torch: Any) -> None:
    """``torch.compile`` with its default backend (inductor) compiles in helper processes and with a C++ compiler,
    which this process may not start: say so, and what to use, when it is asked for, rather than let it fail
    deep inside inductor (a message only: the seccomp filter is what stops the processes)."""
    original = torch.compile

    def compile(model: Any = None, *args: Any, backend: Any = "inductor", **kwargs: Any) -> Any:
        if backend in (None, "inductor"):
            raise RuntimeError(runner_module.ONE_PROCESS)
        return original(model, *args, backend=backend, **kwargs)

    compile.__doc__, compile.__wrapped__ = original.__doc__, original  # type: ignore[attr-defined]
    torch.compile = compile


def serve(rfd: int, wfd: int, runner: Runner) -> None:
    """Answer the judge's requests on ``rfd`` with ``runner``, replies on ``wfd``, until the channel closes.

    Everything it calls is looked up here, before the first request: a cell that rebinds ``wire.recv`` or
    ``Runner.handle`` later does not change what this loop calls. (What those functions call in turn, a cell
    may rebind; it then runs banned like every other line of this process.)"""
    sink = _Capped(OUT_CAP)
    recv, send, handle, take, wire_error = wire.recv, wire.send, runner.handle, sink.take, wire.WireError
    while True:
        try:
            req = recv(rfd, MAX_REQUEST)
        except EOFError:
            return
        req = req if isinstance(req, dict) else {}
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = sink
        try:
            reply = handle(req)
        finally:
            sys.stdout, sys.stderr = old_out, old_err
        reply["output"] = take()
        try:
            send(wfd, reply)
        except wire_error as e:
            send(wfd, {"ok": False, "error": f"the result could not be sent: {e}", "output": ""})


def main() -> None:
    # 1. No second process, ever (see confine). Where this fails the judge sees it from outside (no
    # "Seccomp: 2") and says so in the result's log.
    unconfined = confine_processes()
    if unconfined:
        os.write(2, f"harness: processes not confined: {unconfined}\n".encode())
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    fragments = tuple(f for f in (sys.argv[3] if len(sys.argv) > 3 else "").split(",") if f)
    device_name = sys.argv[4] if len(sys.argv) > 4 else "cpu"
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch

    torch.set_num_threads(1)
    # 2. The ban, for the rest of this process's life, before any student line.
    fragments = tuple(torch_names.runtime_fragments(fragments))
    ban.ban_for_life(torch, fragments)
    _one_process_compile(torch)
    runner = Runner(torch, device=device_name, banned_for_life=fragments)
    # 3. Only now the working folder is importable, as in Jupyter (%%writefile modules).
    sys.path.insert(0, os.getcwd())
    serve(rfd, wfd, runner)


if __name__ == "__main__":
    main()
