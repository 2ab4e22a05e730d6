"""The sandbox itself: what student code can see and do, and that nothing it starts outlives it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from autograder.course import ROOT
from autograder.sandbox import Limits, Sandbox, SandboxError, can_isolate

isolated = pytest.mark.skipif(not can_isolate(), reason="needs root and Linux namespaces")


def run(box: Sandbox, code: str, timeout: float = 20) -> dict:
    return box.request({"op": "exec", "code": code, "label": "<test>"}, timeout=timeout)


def processes_of(uid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,cmd="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split() and line.split()[0] == str(uid)]


@isolated
def test_isolation_hides_course_network_and_privileges():
    with Sandbox(hide=[ROOT]) as box:
        reply = run(box, "import os, socket\n"
                         f"print(os.getuid(), os.getpid(), sorted(os.listdir({str(ROOT)!r})))\n"
                         "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\nexcept OSError as e:\n    print('no network', e.errno)\n")
        uid, pid, listing = reply["output"].splitlines()[0].split(" ", 2)
        assert int(uid) >= 100_000, "the student's code runs as root"
        assert pid == "1", "the student's process should be PID 1 of its own namespace"
        assert listing in ("[]", "['.venv']"), f"the course is visible: {listing}"
        assert "no network" in reply["output"], "the network is reachable"
        assert not run(box, "import attnkit")["ok"], "the reference package is importable in the sandbox"


@isolated
def test_nothing_outlives_the_sandbox():
    with Sandbox(hide=[ROOT]) as box:
        uid = int(run(box, "import os\nprint(os.getuid())")["output"])
        with pytest.raises(SandboxError) as err:
            run(box, "import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                     "for _ in range(8):\n    if os.fork() == 0:\n        os.setsid()\n        while True:\n            pass\n"
                     "while True:\n    pass\n", timeout=3)
        assert err.value.kind == "timeout"
    deadline = time.monotonic() + 10
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(uid) == []


def test_limits_and_protocol():
    with Sandbox(limits=Limits(memory_bytes=3 << 30)) as box:
        reply = run(box, "hog = []\ntry:\n    while True:\n        hog.append(bytearray(1 << 27))\nexcept MemoryError:\n    print('capped')\nhog = None\n")
        assert "capped" in reply["output"]
        assert run(box, "print('x' * 10_000_000)")["output"].endswith("more characters of output cut]")
        run(box, "def double(x):\n    return x * 2\nclass Sub(__import__('torch').Tensor):\n    pass\n"
                 "def sneaky(x):\n    return x.as_subclass(Sub)\n")
        reply = box.request({"op": "call", "target": "double", "args": [np.ones(3, dtype=np.float32)]}, timeout=10)
        assert reply["ok"] and np.array_equal(reply["value"], np.full(3, 2.0, dtype=np.float32))
        reply = box.request({"op": "call", "target": "sneaky", "args": [np.ones(2)]}, timeout=10)
        assert not reply["ok"] and "subclass" in reply["error"]
        with pytest.raises(SandboxError) as err:
            run(box, "import os\nos._exit(3)")
        assert "status 3" in str(err.value)


@isolated
def test_student_code_dies_with_a_killed_grader():
    import signal
    import sys

    code = (f"import sys, time\nsys.path.insert(0, {str(ROOT)!r})\nfrom autograder import wire\n"
            "from autograder.sandbox import Sandbox\nbox = Sandbox()\nbox.start()\n"
            "print(box.request({'op': 'exec', 'code': 'import os\\nprint(os.getuid())', 'label': 'x'}, 30)['output'], flush=True)\n"
            "wire.send(box._w, {'op': 'exec', 'code': 'while True:\\n    pass', 'label': 'x'})\ntime.sleep(600)\n")
    grader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    uid = int(grader.stdout.readline())
    assert processes_of(uid), "the sandbox should be running"
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    deadline = time.monotonic() + 10
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(uid) == [], "student code outlived the grader that started it"
