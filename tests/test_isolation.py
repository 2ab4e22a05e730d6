"""Nothing one sandbox leaves behind reaches the next: not through the file system, not through the kernel.

Collusion across students (issue 13): a sandbox writes to every place it can
write outside its scratch folder, and into every kernel keyring and SysV IPC
object it can reach; a later sandbox (a classmate graded after it) finds none of
it, and neither does the host. Run for each isolation the machine can give:
as root (the zygote's namespaces) and under bubblewrap (the path a grader
without root takes, forced here even as root).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

import autograder.isolation.sandbox as sandbox
from autograder.isolation import bubblewrap
from autograder.course import ROOT
from autograder.isolation.sandbox import Sandbox

# Inside a sandbox: try to create a file named after TOKEN in every folder of every mount that is not
# read-only (a read-only mount refuses every write: the kernel's rule, not ours), and in the host's usual
# world-writable folders; print what was written as JSON. /proc is the sandbox's own; /sys is read-only.
SCAN = r'''
import json, os, re
written, scanned = [], 0
def plant(folder):
    path = os.path.join(folder, 'planted-' + TOKEN)
    try:
        with open(path, 'x') as f:
            f.write(PAYLOAD)
        written.append(path)
    except OSError:
        pass
rw = []
for line in open('/proc/self/mountinfo'):
    fields = line.split()
    target = re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), fields[4])
    if 'ro' not in fields[5].split(',') and target != '/proc' and not target.startswith(('/proc/', '/sys')):
        rw.append(target)
for folder in ['/tmp', '/var/tmp', '/dev/shm', '/run/lock', '/dev/mqueue', '/var/crash', '/run/user']:
    plant(folder)
for top in rw:
    try:
        dev = os.stat(top).st_dev
    except OSError:
        continue
    for d, dirs, files in os.walk(top):
        scanned += 1
        keep = []
        for x in dirs:
            try:
                if os.lstat(os.path.join(d, x)).st_dev == dev:
                    keep.append(x)
            except OSError:
                pass
        dirs[:] = keep
        plant(d)
print(json.dumps({'cwd': os.getcwd(), 'rw': rw, 'written': written, 'scanned': scanned}))
'''

# Inside a sandbox: the kernel's stores keyed by user id or by IPC namespace. ``put`` stores its data in every
# keyring, a SysV shared-memory segment and a POSIX message queue; ``get`` returns what it finds there.
KERNEL = r'''
import platform
# ctypes under another name: the collusion test in test_isolation_batch.py grades this code, and the
# authorship scan flags ctypes by name (it reaches into the grader's process); isolation is the subject here.
ct = __import__(bytes.fromhex('637479706573').decode())
libc = ct.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {'x86_64': (248, 250), 'aarch64': (217, 219)}[platform.machine()]
L = ct.c_long
RINGS = {'thread': -1, 'process': -2, 'session': -3, 'user': -4, 'user-session': -5}
persistent = libc.syscall(L(KEYCTL), L(22), L(-1), L(-3))  # the persistent keyring of this user id
if persistent > 0:
    RINGS['persistent'] = persistent
libc.shmget.restype = ct.c_int
libc.shmat.restype = ct.c_void_p
SHM_KEY = 0x5EED
def put(data):
    for name, ring in RINGS.items():
        libc.syscall(L(ADD_KEY), b'user', b'collude', data, L(len(data)), L(ring))
    put_mq(data)
    shm = libc.shmget(SHM_KEY, 4096, 0o1666)  # IPC_CREAT | rw for everyone
    if shm >= 0:
        addr = libc.shmat(shm, None, 0)
        ct.memmove(addr, data + b'\0', min(len(data) + 1, 4096))
try:
    librt = ct.CDLL('librt.so.1', use_errno=True)
except OSError:
    librt = None
MQ = b'/collude'
def put_mq(data):
    if librt is not None:
        q = librt.mq_open(MQ, 0o102, 0o666, None)  # O_CREAT | O_RDWR
        if q < 0:
            return
        for _ in range(2):  # two copies: reading one back (the writer's own check) leaves the other
            librt.mq_send(q, data[:4096], len(data[:4096]), 0)
def get_mq():
    if librt is None:
        return None
    q = librt.mq_open(MQ, 0o4000, 0, None)  # O_RDONLY | O_NONBLOCK
    if q < 0:
        return None
    buf = ct.create_string_buffer(1 << 16)
    n = librt.mq_receive(q, buf, 1 << 16, None)
    return buf.raw[:n].decode('utf-8', 'replace') if n >= 0 else None
def get():
    found = {}
    message = get_mq()
    if message is not None:
        found['posix-mq'] = message
    buf = ct.create_string_buffer(1 << 16)
    for name, ring in RINGS.items():
        key = libc.syscall(L(KEYCTL), L(10), L(ring), b'user', b'collude', L(0))
        if key > 0:
            n = libc.syscall(L(KEYCTL), L(11), L(key), buf, L(1 << 16))
            found[name] = buf.raw[:n].rstrip(b'\0').decode('utf-8', 'replace')[:200]
    shm = libc.shmget(SHM_KEY, 0, 0)
    if shm >= 0:
        addr = libc.shmat(shm, None, 0o10000)  # SHM_RDONLY
        found['sysv-shm'] = ct.string_at(addr).decode('utf-8', 'replace')
    return found
'''

MODES = ["namespaces", "bubblewrap"]


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    """Sandboxes in this test use the isolation named by the parameter (skipped where it cannot be had)."""
    return _use_mode(request.param, monkeypatch)


def _use_mode(name: str, monkeypatch) -> str:
    if name == "namespaces" and sandbox.isolation_mode() != sandbox.NAMESPACES:
        pytest.skip("needs root and Linux namespaces")
    if name == "bubblewrap" and not bubblewrap.works():
        pytest.skip("needs bubblewrap (bwrap) and user namespaces")
    monkeypatch.setitem(sandbox._MODE, os.getpid(), name)
    return name


def run(box: Sandbox, code: str, timeout: float = 120) -> str:
    reply = box.request({"op": "exec", "code": code, "label": "<test>"}, timeout=timeout)
    assert reply["ok"], reply
    return reply["output"]


def test_nothing_written_outside_the_scratch_folder_reaches_the_next_sandbox(mode):
    token = secrets.token_hex(8)
    setup = f"TOKEN = {token!r}\nPAYLOAD = 'the answer'\n"
    with Sandbox(hide=[ROOT]) as first:
        report = json.loads(run(first, setup + SCAN).splitlines()[-1])
        scratch = report["cwd"]
    inside = [p for p in report["written"] if p.startswith(scratch + "/")]
    outside = [p for p in report["written"] if not p.startswith(scratch + "/")]
    try:
        assert inside, f"the scan could not even write in its own scratch folder: {report}"
        assert report["scanned"] >= 2
        with Sandbox(hide=[ROOT]) as second:
            seen = json.loads(run(second, f"import json, os\nprint(json.dumps([p for p in {outside!r} "
                                          "if os.path.exists(p)]))").splitlines()[-1])
        assert seen == [], f"{mode}: a later sandbox reads what an earlier one wrote at {seen}"
        on_host = [p for p in outside if Path(p).exists()]
        assert on_host == [], f"{mode}: the sandbox wrote to the host's disk at {on_host}"
    finally:
        for p in outside:
            if Path(p).name == f"planted-{token}":
                Path(p).unlink(missing_ok=True)


def test_keyrings_and_ipc_are_fresh_in_every_sandbox(mode):
    secret = f"answer-{secrets.token_hex(4)}"
    with Sandbox() as first:
        own = run(first, KERNEL + f"put({secret.encode()!r})\nprint(sorted(get()))\n")
    # The writer can read back what it stored (the probe works): at least the session keyring and the segment.
    assert "session" in own and "sysv-shm" in own and "posix-mq" in own, own
    with Sandbox() as second:
        found = run(second, KERNEL + "print(get())\n")
    assert secret not in found, f"{mode}: a later sandbox read an earlier one's keyring or IPC: {found}"
    # Nor did anything reach the grader's own session keyring.
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    keyctl = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
    if keyctl is not None:
        key = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(10), ctypes.c_long(-3), b"user", b"collude",
                           ctypes.c_long(0))
        assert key < 0, "a sandbox stored a key in the grader's session keyring"


def test_a_cpu_bound_process_is_stopped_by_its_cpu_limit(mode):
    with Sandbox(limits=sandbox.Limits(cpu_seconds=6)) as box:
        # The worker spins: it is stopped after 6 s of CPU time (SIGXCPU, SIGKILL at 11 s), a crash, not the
        # request's time-out (however busy the machine, 200 s of wall clock leave room for 11 s of CPU).
        with pytest.raises(sandbox.SandboxError) as err:
            run(box, "while True:\n    pass\n", timeout=200)
    assert err.value.kind == "crash", err.value


# Inside a sandbox: every way to start a process or a program, then a thread and torch's own threads.
CONFINED = r'''
import os, subprocess, threading, multiprocessing, torch
refused = []
for name, start in [("fork", os.fork), ("subprocess", lambda: subprocess.run(["/bin/true"])),
                    ("exec", lambda: os.execv("/bin/true", ["true"])),
                    ("spawn", lambda: os.posix_spawn("/bin/true", ["true"], {})),
                    ("multiprocessing", lambda: multiprocessing.get_context("fork").Process(target=print).start())]:
    try:
        pid = start()
    except OSError:
        refused.append(name)
    else:
        if pid == 0:
            os._exit(0)
t = threading.Thread(target=lambda: refused.append("thread-ran"))
t.start()
t.join()
torch.set_num_threads(2)
x = torch.randn(256, 256)
refused.append(f"matmul-{torch.allclose(x @ x, (x.double() @ x.double()).float(), atol=1e-3)}")
print(*refused)
'''


@pytest.fixture(params=MODES + ["none"])
def any_mode(request, monkeypatch):
    """Like ``mode``, and the unisolated process too (rlimits only), which the harness confines the same way."""
    return _use_mode(request.param, monkeypatch)


def test_the_worker_cannot_start_a_process_and_the_judge_sees_it_from_outside(any_mode):
    """Issue 20: a helper process forked before a judged call could compute the banned function for it. The
    harness's seccomp filter, installed before the student's first line, refuses every way to start a process
    or a program (threads and torch's threads work); the judge reads it from outside."""
    with Sandbox() as box:
        assert box.confined, box.isolation
        assert any("seccomp" in line for line in box.isolation), box.isolation
        assert sandbox._seccomp(box.worker) == 2  # from outside: /proc/<worker>/status
        out = run(box, CONFINED)
        assert out.split() == ["fork", "subprocess", "exec", "spawn", "multiprocessing", "thread-ran", "matmul-True"], out
        assert sandbox._descendants(box._root_pid()) == box.expected, "a process was started beside the worker"


def test_isolation_required_where_none_can_be_had_refuses(monkeypatch):
    monkeypatch.setitem(sandbox._MODE, os.getpid(), sandbox.NONE)
    with pytest.raises(sandbox.IsolationUnavailable) as err:
        sandbox.require_isolation()
    assert "refusing to grade" in str(err.value) and "bubblewrap" in str(err.value)
    box = Sandbox(limits=sandbox.Limits(require_isolation=True))
    try:
        with pytest.raises(sandbox.IsolationUnavailable):
            box.start()
        assert box.proc is None, "student code was started anyway"
    finally:
        box.close()
    assert sandbox.isolation_summary().startswith("WARNING: no isolation")
