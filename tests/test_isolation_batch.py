"""Isolation end to end, through the batch: colluding classmates, and a grader without root.

* Collusion (issue 13): in one batch, a student writes the answers to every place
  outside the scratch folder it can write, every keyring and a SysV segment; a
  classmate graded after it, who wrote stubs, looks for them in every such
  place and runs what it finds. The classmate must get no code points. A control student who
  does both in one notebook gets full marks: the reading cell works when the
  answers are there.
* Without root (issue 12): a few corpus cases graded by an unprivileged user get
  the grades root gives them, or, where no isolation can be had,
  ``--require-isolation`` refuses with a clear message.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.batch import run
from autograder.course import ROOT
from autograder.isolation.sandbox import Limits, can_isolate
from checking import closed_folder
from corpus import A, CASES, FULL, SDPA, SDPA_POINTS, SOFTMAX, SOFTMAX_POINTS, notebook, write_nb
from test_isolation import KERNEL

pytestmark = pytest.mark.slow
LIMITS = Limits(cell_timeout=20, call_timeout=10, notebook_timeout=180, memory_bytes=3 << 30, max_processes=128)
FILE = "collude-answers.py"
WELL_KNOWN = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue", "/var/crash", "/run/user"]

# Every folder of every mount the sandbox can write (outside /proc and /sys), and the usual world-writable ones.
PLACES = f'''
import os, re
def _places():
    out = list({WELL_KNOWN!r})
    for line in open('/proc/self/mountinfo'):
        f = line.split()
        top = re.sub(r'\\\\([0-7]{{3}})', lambda m: chr(int(m.group(1), 8)), f[4])
        if 'ro' in f[5].split(',') or top == '/proc' or top.startswith(('/proc/', '/sys')):
            continue
        for d, dirs, files in os.walk(top):
            out.append(d)
    return out
'''
WRITE = PLACES + KERNEL + f'''
_ANSWERS = {(SOFTMAX + chr(10) + SDPA)!r}
for _d in _places():
    try:
        with open(os.path.join(_d, {FILE!r}), 'w') as _f:
            _f.write(_ANSWERS)
    except OSError:
        pass
put(_ANSWERS.encode())
'''
READ = PLACES + KERNEL + f'''
_found = [open(os.path.join(_d, {FILE!r})).read() for _d in _places() if os.path.isfile(os.path.join(_d, {FILE!r}))]
_found += list(get().values())
_found = [_s for _s in _found if 'def softmax' in _s]
if _found:
    exec(_found[0])
'''
STUB = "def {name}(*args, **kwargs):\n    raise NotImplementedError()\n"


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def test_a_classmate_cannot_pick_up_answers_left_by_an_earlier_sandbox(tmp_path):
    if not can_isolate():
        pytest.skip("no isolation here: the grader says so and --require-isolation refuses (see test_isolation)")
    subs = tmp_path / "submitted"
    empty = dict(softmax=STUB.format(name="softmax"), sdpa=STUB.format(name="scaled_dot_product_attention"))
    write_nb(notebook(extra=[WRITE]))(subs / "collude_a_writer" / A)
    write_nb(notebook(extra=[READ], **empty))(subs / "collude_b_reader" / A)
    write_nb(notebook(extra=[WRITE, READ], **empty))(subs / "collude_c_both" / A)
    try:
        run(subs, A, tmp_path / "grades.csv", tmp_path / "grading", LIMITS, workers=1, log=print)
        rows = read_csv(tmp_path / "grades.csv")
    finally:
        for d in WELL_KNOWN:
            Path(d, FILE).unlink(missing_ok=True)
    assert float(rows["collude_a_writer"]["score"]) == FULL, rows["collude_a_writer"]
    assert float(rows["collude_c_both"]["score"]) == FULL, ("the reading cell does not work even within one "
                                                            f"notebook, so the test proves nothing: {rows}")
    # The reader keeps only what it answered itself (the corpus notebook's other parts), none of the code points.
    alone = FULL - SOFTMAX_POINTS - SDPA_POINTS
    assert float(rows["collude_b_reader"]["score"]) == alone, f"the reader picked up the writer's answers: {rows}"


# A few corpus cases, among them those that attack the machine (the course, a marker for the next student).
NONROOT_CASES = ["reference", "reads_course_files", "plants_marker_for_next_student", "sees_no_marker",
                 "network_blocked"]


def _as_nobody(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="runs the grader as an unprivileged user: needs root and setpriv to switch to one")
def test_an_unprivileged_grader_gives_the_grades_root_gives():
    base = Path(tempfile.mkdtemp(prefix="attn-nonroot-"))  # pytest's own folders are closed to other users
    try:
        _grade_as_nobody_and_as_root(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _grade_as_nobody_and_as_root(base: Path) -> None:
    from corpus import MARKER

    os.chmod(base, 0o777)
    subs = base / "submitted"
    by_name = {c.name: c for c in CASES}
    for name in NONROOT_CASES:
        by_name[name].build(subs / name / A)
    for p in [base, *base.rglob("*")]:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base), "TMPDIR": str(base), "LANG": "C.UTF-8"}
    if _as_nobody([sys.executable, "-c", "import torch, autograder"], env, 120).returncode != 0:
        pytest.skip("an unprivileged user cannot run this Python installation here")
    MARKER.unlink(missing_ok=True)
    grade = [sys.executable, "-m", "autograder", "grade", str(subs), "--assignment", A, "--workers", "1",
             "--cell-timeout", "8", "--call-timeout", "4", "--notebook-timeout", "120", "--memory-mb", "3072",
             "--max-processes", "128", "--workdir", str(base / "grading"), "--separate-gradebook"]
    done = _as_nobody(grade + ["--out", str(base / "nobody.csv"), "--require-isolation"], env, 900)
    if done.returncode != 0:
        # Only acceptable failure: no isolation without root here, and the refusal says so clearly.
        assert "refusing to grade" in done.stderr + done.stdout and "bubblewrap" in done.stderr + done.stdout, \
            done.stderr[-3000:]
        assert not (base / "nobody.csv").exists()
        return
    assert "isolation: bubblewrap" in done.stderr, done.stderr[-2000:]
    # Inside bubblewrap the sandbox starts this Python by its real path: every folder on the way must be open.
    closed = closed_folder([Path(sys.prefix), Path(sys.executable), Path(os.__file__)], 65534, 65534)
    if closed:
        pytest.skip(f"uid 65534 cannot reach the Python installation: {closed} is closed to other users")
    # The grades root gives these cases (tests/test_grader_corpus.py checks them as root).
    nobody = read_csv(base / "nobody.csv")
    assert {s: float(r["score"]) for s, r in nobody.items()} == {n: by_name[n].score for n in NONROOT_CASES}, \
        ({s: (r['score'], r['reason'][:300]) for s, r in nobody.items()}, done.stdout[-3000:])
    assert not MARKER.exists(), "a submission graded without root planted a file on the host"
    # Where bubblewrap cannot be had either, --require-isolation refuses before grading anything.
    refused = _as_nobody(grade + ["--out", str(base / "refused.csv"), "--require-isolation"],
                         dict(env, AUTOGRADER_NO_BWRAP="1"), 300)
    assert refused.returncode != 0 and "refusing to grade" in refused.stderr, refused.stderr[-2000:]
    assert "bubblewrap" in refused.stderr and not (base / "refused.csv").exists()
