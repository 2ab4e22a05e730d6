"""The instructors' guide runs as written: every ``bash`` block of book/instructors.md, in the page's order, on
a scratch course with three students, and the grades, penalties and feedback that come out are checked.

The commands are read from the page itself (fenced ``bash`` blocks; ``sh`` blocks need the network or are a
choice, such as ``--regrade``, and are skipped). The scratch course is a copy of this repository's course
files (autograder/, exercise 01's source and release, nbgrader_config.py) with the virtual environment linked
in, so ``.venv/bin/...`` works there as in a clone. The students:

* alice answers everything right and submits through nbgrader's exchange on time;
* bob forgets the 1/sqrt(d_k) scaling, submits through Canvas a day and a half late (the zip entry's time, with
  Canvas's _LATE_ marker; his own timestamp.txt is backdated), and is granted one day: 10% off his total;
* carol hands in the release untouched, through the exchange, on time.

The exchange's time is when the exchange received a folder (its change time, which cannot be set back), so the
exchange submissions are made now and the guide's due date is moved to two days from now (the one substitution
made in the page's commands); bob's Canvas time is a day and a half after it.

The second half, "one step off", makes each slip a tired teaching assistant makes (issue 28's list: the grading
folder graded as submissions, a hand-copied folder outside the roster, a typo in a student or an assignment, an
export between a hand grade and `feedback`, an assignment nobody submitted, a removed student, Ctrl-C) on the
course the guide left, and checks that nothing is invented, emptied or stale. Issue 36's slips follow on the same
course (``slipped36``): grading/'s own folders given as submissions, one student's folder given as the class's, a
negative extension, a typo'd assignment in the gradebook, a hand grade changed for an on-time student before an
export, released feedback gone stale, an LMS zip with nobody in it, a re-submission graded before it was collected
(beside a classmate's folder in the student's name and a linked notebook), and a roster student with no folder for
an assignment. Every command after the guide's ``umask 077`` runs under it, as in the instructor's one shell.

The one long-running command, ``python -m autograder formgrader``, is started in the background (with a free
port appended) and checked to serve /formgrader; the hand grades it would record are then set through nbgrader's
Gradebook API (tests/test_formgrader.py drives formgrader itself in a browser). A command that fails fails the
test.

The guide runs twice, at once (two threads: the commands are mostly Python starting up, one core each), on two
scratch courses, and every test checks both: as the user running the tests (root in the containers), and as an
unprivileged user (uid 65534, ``nobody``, switched to with ``setpriv`` as tests/test_isolation_batch.py does) who
owns that course and its HOME. That user grades under bubblewrap where user namespaces allow it, else plainly (the
guide does not ask for ``--require-isolation``), and formgrader starts without ``--allow-root``. The second run
skips, saying why, where the tests do not run as root (nobody to switch to: the first run is then the non-root
one), without ``setpriv``, or where the Python installation cannot be reached by that user (a folder on its way
closed to others, such as a pyenv under /root: nothing outside the test's folder is chmod-ed to open it).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import signal
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from autograder import course
from checking import answered_release, closed_folder

pytestmark = pytest.mark.slow
A, NB = "01_single_head", "single_head.ipynb"
B = "02_multi_head"  # an assignment nobody submits
GUIDE_DUE = "2026-10-02 23:59:00 UTC"  # the page's due date, moved to DUE in the commands run
NOW = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)
DUE = (NOW + dt.timedelta(days=2)).replace(hour=23, minute=59, second=0)
BOB_TIME = DUE + dt.timedelta(hours=36)  # a day and a half late
GRADES = f"grades-{A}.csv"
GUIDE = course.ROOT / "book" / "instructors.md"
ROSTER = ("id,first_name,last_name,email,lms_user_id\nalice,Alice,Adams,,1111\nbob,Bob,Smith,,4343\n"
          "carol,Carol,Chen,,2222\n")
HAND = {"alice": 2.0, "bob": 1.0}  # written_scale, as an instructor would grade it in formgrader
NOBODY = 65534  # uid and gid of the unprivileged user (nobody/nogroup on Debian and most distributions)
OWN, UNPRIVILEGED = "own user", "unprivileged user"


@dataclass(frozen=True)
class Instructor:
    """Who runs the guide: a uid and the command prefix that runs a command as that user."""

    uid: int
    gid: int
    prefix: tuple[str, ...]  # () for the tests' own user, setpriv ... for another

    @property
    def name(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)

    def cmd(self, *args: str) -> list[str]:
        return [*self.prefix, *args]


def guide_blocks() -> list[str]:
    """The page's ``bash`` blocks, in order (the ``sh`` ones are not run)."""
    return re.findall(r"^```bash\n(.*?)^```", GUIDE.read_text(), flags=re.MULTILINE | re.DOTALL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_course(base: Path) -> Path:
    """A course root like a fresh clone after `make install`: the course's files, the venv linked in."""
    root = base / "course"
    ignore = shutil.ignore_patterns("__pycache__", "grading")
    shutil.copytree(course.ROOT / "autograder", root / "autograder", ignore=ignore)
    shutil.copytree(course.SOURCE / A, root / "solutions" / "assignments" / A, ignore=ignore)
    shutil.copytree(course.SOURCE / B, root / "solutions" / "assignments" / B, ignore=ignore)
    shutil.copytree(course.RELEASE / B, root / "exercises" / B, ignore=ignore)
    shutil.copytree(course.ROOT / "solutions" / "attnkit", root / "solutions" / "attnkit", ignore=ignore)
    shutil.copytree(course.RELEASE / A, root / "exercises" / A, ignore=ignore)
    shutil.copy(course.ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    (root / "book").mkdir()
    shutil.copy(GUIDE, root / "book" / "instructors.md")
    (root / ".venv").symlink_to(Path(sys.prefix))
    if (course.ROOT / "_vendor").exists():
        (root / "_vendor").symlink_to((course.ROOT / "_vendor").resolve())
    (root / "roster.csv").write_text(ROSTER)
    return root


def notebook(kind: str) -> str:
    if kind == "blank":
        return (course.RELEASE / A / NB).read_text()
    nb = answered_release(A, NB)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == "written_scale":
            cell["source"] = "The dot products grow with d_k, so the softmax saturates."
        if kind == "unscaled" and meta.get("grade_id") == "scaled_dot_product_attention":
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            assert " / math.sqrt(d_k)" in src
            cell["source"] = src.replace(" / math.sqrt(d_k)", "")
    return json.dumps(nb)


def hand_in(root: Path, home: Path) -> None:
    """alice and carol through nbgrader's exchange, bob in a Canvas bulk download in ~/Downloads."""
    inbound = root / "grading" / "exchange" / "attention-course" / "inbound"
    # as `nbgrader submit` names the folder: the moment of handing in, not the module's import (on a busy machine
    # the two are minutes apart, and the collector rightly flags a name that far from the exchange's own time)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    for student, kind in (("alice", "perfect"), ("carol", "blank")):
        folder = inbound / f"{student}+{A}+{stamp}+0123456789abcdef"
        folder.mkdir(parents=True)
        (folder / NB).write_text(notebook(kind))
        (folder / "timestamp.txt").write_text(stamp)
    (home / "Downloads").mkdir(parents=True)
    with zipfile.ZipFile(home / "Downloads" / "submissions.zip", "w") as z:
        z.writestr(zipfile.ZipInfo(f"smithbob_LATE_4343_99210_{NB}", BOB_TIME.timetuple()[:6]), notebook("unscaled"))
        z.writestr(zipfile.ZipInfo("smithbob_LATE_4343_99210_timestamp.txt", BOB_TIME.timetuple()[:6]),
                   "2026-10-01 09:00:00 UTC")  # backdated by bob; not a notebook: never collected


def run_block(block: str, root: Path, env: dict[str, str], log: list[str], who: Instructor) -> None:
    block = block.replace(GUIDE_DUE, f"{DUE:%Y-%m-%d %H:%M:%S} UTC")
    proc = subprocess.run(who.cmd("bash", "-e", "-o", "pipefail", "-c", block), cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    log.append(f"$ {block}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"the guide's command failed (exit {proc.returncode}):\n{block}\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def check_formgrader(block: str, root: Path, env: dict[str, str], who: Instructor) -> None:
    """Start the documented formgrader command, see /formgrader served, stop it."""
    port = free_port()
    logfile = root.parent / "formgrader.log"
    with open(logfile, "w") as out:
        proc = subprocess.Popen(who.cmd("bash", "-c", block.strip() + f" --port {port}"), cwd=root, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        token = None
        while time.monotonic() < deadline and token is None:
            assert proc.poll() is None, f"formgrader stopped:\n{logfile.read_text()[-3000:]}"
            found = re.search(r"token=([0-9a-f]+)", logfile.read_text())
            token = found and found[1]
            time.sleep(0.2)
        assert token, f"formgrader printed no address:\n{logfile.read_text()[-3000:]}"
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/formgrader?token={token}", timeout=30).read().decode()
        assert "Manage Assignments" in page or "formgrader" in page.lower()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


HAND_GRADING = """import sys
from nbgrader.api import Gradebook

with Gradebook(f"sqlite:///{sys.argv[1]}") as gb:
    for student, score in %r.items():
        grade = gb.find_grade("written_scale", "single_head", %r, student)
        grade.manual_score, grade.needs_manual_grade = score, False
    gb.db.commit()
""" % (HAND, A)


def grade_by_hand(root: Path, env: dict[str, str], who: Instructor) -> None:
    """Record the hand grades as the instructor running the guide (the gradebook stays theirs)."""
    proc = subprocess.run(who.cmd(sys.executable, "-c", HAND_GRADING, str(root / "grading" / "gradebook.db")),
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"recording the hand grades failed:\n{proc.stderr[-3000:]}"


def rows(path: Path, key: str) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r[key]: r for r in csv.DictReader(f)}


def unprivileged() -> Instructor | str:
    """The unprivileged instructor, or why the guide cannot be run as one here."""
    who = Instructor(NOBODY, NOBODY, ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"))
    if os.geteuid() != 0:
        return (f"the tests run as uid {os.geteuid()}, not root: no other user can be switched to (the run as the "
                "tests' own user is the non-root run)")
    if shutil.which("setpriv") is None:
        return "no setpriv (util-linux) to switch to an unprivileged user"
    needed = [Path(sys.prefix), Path(sys.executable), Path(os.__file__), Path(tempfile.gettempdir())]
    if (course.ROOT / "_vendor").exists():
        needed.append(course.ROOT / "_vendor")
    closed = closed_folder(needed, who.uid, who.gid)
    if closed:
        return (f"uid {NOBODY} cannot reach the Python installation or the temporary folder: {closed} is closed "
                "to other users (no permission is changed outside the test's own folder)")
    return who


def run_guide(who: Instructor, base: Path) -> dict:
    """Every ``bash`` block of the guide, in order, as ``who``, on a scratch course under ``base``."""
    root, home = scratch_course(base), base / "home"
    hand_in(root, home)
    # No activated virtual environment (the venv's scripts are not on PATH), nor the tests' PYTHONPATH: as a clone.
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if Path(p).resolve() != Path(sys.prefix, "bin").resolve())
    env = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}, "HOME": str(home),
           "USER": who.name, "LOGNAME": who.name, "PATH": path, "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "JUPYTER_CONFIG_DIR": str(base / "jupyter")}
    if who.uid != os.geteuid():
        for p in [base, *base.rglob("*")]:
            os.chown(p, who.uid, who.gid, follow_symlinks=False)  # the course and HOME are the instructor's
        probe = subprocess.run(who.cmd(sys.executable, "-c", "import torch"), env=env, cwd=root,
                               capture_output=True, text=True, timeout=300)
        if probe.returncode != 0:
            pytest.skip(f"uid {who.uid} cannot run this Python installation here: {probe.stderr[-500:]}")
    log: list[str] = []
    timings: list[str] = []
    blocks = guide_blocks()
    assert any("zip_collect" in b for b in blocks) and any("autograder grade" in b for b in blocks)
    umask = ""  # the guide's `umask 077` holds for every later command, as in the instructor's one shell
    for block in blocks:
        start = time.monotonic()
        if block.strip().endswith("autograder formgrader"):
            check_formgrader(umask + block, root, env, who)
            grade_by_hand(root, env, who)
        else:
            run_block(umask + block, root, env, log, who)
        umask = umask or "".join(line + "\n" for line in block.splitlines() if line.strip().startswith("umask "))
        timings.append(f"{time.monotonic() - start:6.1f} s  {block.strip().splitlines()[0][:80]}")
    isolation = re.search(r"^(isolation: [^(]*|WARNING: no isolation)", "\n".join(log), flags=re.MULTILINE)
    print(f"guide as {who.name} (uid {who.uid}), {isolation and isolation[1].strip()}:\n  " + "\n  ".join(timings),
          file=sys.stderr)
    return {"root": root, "grading": root / "grading", "log": "\n".join(log), "env": env, "who": who}


@pytest.fixture(scope="module")
def guides(tmp_path_factory):
    """The guide run as the tests' own user and as an unprivileged one, at once: each run's result, its failure,
    or why it cannot run here."""
    own = Instructor(os.geteuid(), os.getegid(), ())
    other = unprivileged()
    # pytest's folders are closed to other users: the unprivileged instructor's course lies in a folder of its own.
    other_base = Path(tempfile.mkdtemp(prefix="attn-guide-")) if isinstance(other, Instructor) else None
    with ThreadPoolExecutor(2) as pool:
        runs = {OWN: pool.submit(run_guide, own, tmp_path_factory.mktemp("term"))}
        if isinstance(other, Instructor):
            runs[UNPRIVILEGED] = pool.submit(run_guide, other, other_base)
        done = {label: run.exception() or run.result() for label, run in runs.items()}
    yield {UNPRIVILEGED: other, **done}
    if other_base is not None:
        shutil.rmtree(other_base, ignore_errors=True)


@pytest.fixture(scope="module", params=[OWN, UNPRIVILEGED])
def term(request, guides):
    got = guides[request.param]
    if isinstance(got, str):
        pytest.skip(got)
    if isinstance(got, BaseException):
        raise got
    return got


def auto_points(root: Path, student: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'grading' / 'gradebook.db'}") as gb:
        return sum(g.auto_score or 0.0 for g in gb.find_submission_notebook("single_head", A, student).grades)


def test_one_gradebook_and_one_score_everywhere(term):
    grading = term["grading"]
    assert not (grading / "grading").exists(), "a second gradebook was made under grading/grading/"
    ours = rows(grading / GRADES, "student")
    assert sorted(ours) == ["alice", "bob", "carol"]
    max_score = float(ours["alice"]["max_score"])
    assert float(ours["alice"]["score"]) == max_score and max_score == auto_points(term["root"], "alice") + 2
    bob_total = auto_points(term["root"], "bob") + HAND["bob"]
    assert 0 < auto_points(term["root"], "bob") < max_score - 2  # the unscaled attention lost points
    assert float(ours["bob"]["late_penalty"]) == pytest.approx(0.1 * bob_total)  # one started day, hand grade in
    assert float(ours["bob"]["score"]) == pytest.approx(0.9 * bob_total)
    assert float(ours["carol"]["score"]) == 0 and "nothing answered" in ours["carol"]["reason"]
    canvas = list(csv.reader(open(grading / "canvas.csv", newline="")))
    by_login = {r[3]: r for r in canvas[2:]}
    assert sorted(by_login) == ["alice", "bob", "carol"]  # one row per student of the roster
    assert by_login["bob"][1] == "4343" and float(canvas[1][5]) == max_score
    plain = rows(grading / "nbgrader-grades.csv", "student_id")
    for student, row in ours.items():
        assert float(by_login[student][5]) == pytest.approx(float(row["score"]))
        assert float(plain[student]["score"]) == pytest.approx(float(row["score"]))
        html = (grading / "feedback" / student / A / "single_head.html").read_text()
        assert f"(Score: {round(float(row['score']), 2)} / {max_score}" in html, student
    assert re.search(rf"bob: {float(ours['bob']['score']):g} / {max_score:g}", term["log"])  # the console agrees
    assert "recorded score(s) changed" in term["log"]  # hand grades and the extension moved scores: said so
    term_rows = list(csv.reader(open(grading / "grades-term.csv", newline="")))
    assert term_rows[0] == ["student", A, "total"] and term_rows[1] == ["max_score", f"{max_score:g}", f"{max_score:g}"]
    for row in term_rows[2:]:
        assert float(row[1]) == pytest.approx(float(ours[row[0]]["score"]))


def test_grading_records_are_the_instructors_alone(term):
    grading = term["grading"]
    assert grading.stat().st_mode & 0o077 == 0  # grading/: 0700
    for path in [grading / "gradebook.db", grading / GRADES, grading / "grades-term.csv", grading / "canvas.csv",
                 grading / "secret", grading / "lms-feedback" / f"{A}.zip", *(grading / "results" / A).glob("*.json")]:
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in (grading / "feedback").rglob("*.html"))  # released


def test_times_come_from_the_collectors(term):
    ours = rows(term["grading"] / GRADES, "student")
    assert ours["alice"]["time_source"] == "nbgrader exchange" and ours["alice"]["time_review"] == ""
    assert ours["bob"]["time_source"] == "Canvas download"
    assert ours["bob"]["submitted_at"].startswith(f"{BOB_TIME:%Y-%m-%d %H:%M:%S}")
    # Canvas's _LATE_ marker agrees with the recorded time (past his extended due date): the penalty applies as
    # intended, so it is not one more thing to review
    assert "marks it late" not in ours["bob"]["time_review"] and float(ours["bob"]["late_penalty"]) > 0
    assert (term["grading"] / "autograded" / "bob" / A / "timestamp.txt").read_text().startswith(f"{BOB_TIME:%Y-%m-%d %H:%M}")


def test_feedback_is_released_and_says_what_is_missing(term):
    released = list((term["grading"] / "exchange" / "attention-course" / "feedback").glob("*.html"))
    assert len(released) == 3
    carol = (term["grading"] / "feedback" / "carol" / A / "single_head.html").read_text()
    assert "unanswered" in carol
    assert (term["grading"] / "similarity-01.html").read_text().count("alice") >= 1
    # bob came from Canvas: his page is in the zip for Canvas, named with his downloaded prefix (user id 4343)
    with zipfile.ZipFile(term["grading"] / "lms-feedback" / f"{A}.zip") as z:
        assert z.namelist()[:1] == ["smithbob_LATE_4343_99210_single_head.html"]
        assert z.namelist()[1:] in ([], ["attn-mathjax.js"])  # the pages' MathJax, when vendored
        assert "Score:" in z.read(z.namelist()[0]).decode()


# -- one step off the guide: each slip of issue 28, on the course the guide left (as the tests' own user) --------


def sh(term: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """One command in the guide's course, as its instructor ran them."""
    return subprocess.run(term["who"].cmd(*args), cwd=term["root"], env=term["env"], capture_output=True, text=True,
                          timeout=timeout)


def autograder(term: dict, *args: str) -> subprocess.CompletedProcess:
    return sh(term, ".venv/bin/python", "-m", "autograder", *args)


def gradebook_students(root: Path) -> list[str]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'grading' / 'gradebook.db'}") as gb:
        return sorted(s.id for s in gb.students)


def snapshot(grading: Path) -> dict[str, str]:
    """Every grades file and result, as text: what a slip must leave as it was."""
    files = sorted(grading.glob("grades-*.csv")) + sorted((grading / "results").rglob("*.json"))
    return {str(p.relative_to(grading)): p.read_text() for p in files}


@pytest.fixture(scope="module")
def slipped(guides):
    got = guides[OWN]
    if isinstance(got, BaseException):
        raise got
    term, grading, root = got, got["grading"], got["root"]
    out: dict[str, object] = {"term": term}
    before = snapshot(grading)
    roster = gradebook_students(root)
    # 1. `grade grading` instead of `grade grading/submitted`: refused, nothing recorded
    out["grading_folder"] = autograder(term, "grade", "grading", "--assignment", A)
    out["after_grading_folder"] = (snapshot(grading), gradebook_students(root))
    # 1b. a hand-copied folder of someone outside the roster: listed and skipped
    stranger = grading / "submitted" / "mallory" / A
    stranger.mkdir(parents=True)
    (stranger / NB).write_text(notebook("perfect"))
    out["stranger"] = autograder(term, "grade", "grading/submitted", "--assignment", A)
    out["after_stranger"] = (snapshot(grading), gradebook_students(root))
    # 2. extension for a typo of a student
    out["extension_typo"] = autograder(term, "extension", "--assignment", A, "--student", "carrol", "--days", "1")
    out["after_extension_typo"] = gradebook_students(root)
    out["before_typos"] = snapshot(grading)
    # 3. feedback with a typo of an assignment, and with an assignment nobody graded
    out["feedback_typo"] = autograder(term, "feedback", "--assignment", "01_single_haed")
    out["feedback_ungraded"] = autograder(term, "feedback", "--assignment", B)
    out["after_feedback_typos"] = snapshot(grading)
    out["before_nobody"] = snapshot(grading)
    # 8. grading an assignment nobody submitted
    out["nobody"] = autograder(term, "grade", "grading/submitted", "--assignment", B)
    out["after_nobody"] = snapshot(grading)
    # 4. a hand grade changes bob's total; an export before `feedback` refuses; `feedback` fixes it
    hand = dict(HAND, bob=2.0)
    script = HAND_GRADING.replace(repr(HAND), repr(hand))
    done = sh(term, sys.executable, "-c", script, str(grading / "gradebook.db"))
    assert done.returncode == 0, done.stderr[-2000:]
    out["old_csv"] = rows(grading / GRADES, "student")
    out["stale_canvas"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                             "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-stale.csv")
    out["stale_plain"] = sh(term, ".venv/bin/nbgrader", "export", "--to", "grading/plain-stale.csv")
    out["feedback"] = autograder(term, "feedback", "--assignment", A)
    out["new_csv"] = rows(grading / GRADES, "student")
    out["fresh_canvas"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                             "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-fresh.csv")
    # Ctrl-C in the middle of a run: one line, a non-zero exit, and the same command resumes
    proc = subprocess.Popen(term["who"].cmd(".venv/bin/python", "-m", "autograder", "grade", "grading/submitted",
                                            "--assignment", A, "--force"), cwd=root, env=term["env"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a terminal's Ctrl-C must reach it: a background test run ignores SIGINT, and an
                            # ignored signal stays ignored across exec
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120  # interrupt it while it grades (after it says how many it will grade)
    seen = ""
    while time.monotonic() < deadline and "to grade" not in seen:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the whole foreground group
    stdout, stderr = proc.communicate(timeout=300)
    out["interrupted"] = (proc.returncode, stdout, seen + stderr)
    out["resumed"] = autograder(term, "grade", "grading/submitted", "--assignment", A)
    out["resumed_rows"] = rows(grading / GRADES, "student")
    # 7. removing a student: one command, no row anywhere
    out["remove"] = autograder(term, "remove-student", "carol")
    out["removed_export"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                               "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-after.csv")
    out["regraded_after_removal"] = autograder(term, "grade", "grading/submitted", "--assignment", A)
    out["before"], out["roster"] = before, roster
    return out


def test_slip_grading_folder_and_strangers_are_refused_never_recorded(slipped):
    refused = slipped["grading_folder"]
    assert refused.returncode != 0 and "is the grading folder" in refused.stderr and "grading/submitted" in refused.stderr
    assert slipped["after_grading_folder"] == (slipped["before"], slipped["roster"])  # nothing invented
    stranger = slipped["stranger"]
    assert stranger.returncode == 0, stranger.stderr[-3000:]
    assert "'mallory': not a student of the roster" in stranger.stderr
    files, students = slipped["after_stranger"]
    assert students == slipped["roster"] and "mallory" not in students
    assert "mallory" not in files[GRADES] and "mallory" not in files["grades-term.csv"]
    assert not any("mallory" in name for name in files)


def test_slip_typos_name_what_exists_and_change_nothing(slipped):
    ext = slipped["extension_typo"]
    assert ext.returncode == 2 and "'carrol' is not a student of the roster" in ext.stderr and "carol" in ext.stderr
    assert slipped["after_extension_typo"] == slipped["roster"]  # no student "carrol" created
    typo = slipped["feedback_typo"]
    assert typo.returncode == 2 and "unknown assignment '01_single_haed'" in typo.stderr and A in typo.stderr
    assert slipped["feedback_ungraded"].returncode == 2 and "no graded submission" in slipped["feedback_ungraded"].stderr
    assert slipped["after_feedback_typos"] == slipped["before_typos"]  # no grades file emptied or rewritten


def test_slip_nobody_submitted_records_nothing(slipped):
    nobody = slipped["nobody"]
    assert nobody.returncode == 1 and "0 submissions found" in nobody.stderr and "nothing was graded" in nobody.stderr
    assert slipped["after_nobody"] == slipped["before_nobody"]
    assert not (slipped["term"]["grading"] / f"grades-{B}.csv").exists()
    canvas = list(csv.reader(open(slipped["term"]["grading"] / "canvas-fresh.csv", newline="")))
    assert B not in canvas[0]  # no zero column for it in the export


def test_slip_export_between_a_hand_grade_and_feedback_refuses_then_agrees(slipped):
    for name in ("stale_canvas", "stale_plain"):
        proc = slipped[name]
        assert proc.returncode != 0, proc.stderr[-2000:]
        assert "out of date" in proc.stdout + proc.stderr and f"python -m autograder feedback --assignment {A}" in \
            proc.stdout + proc.stderr and "bob" in proc.stdout + proc.stderr
    grading = slipped["term"]["grading"]
    assert not (grading / "canvas-stale.csv").exists() and not (grading / "plain-stale.csv").exists()
    assert slipped["feedback"].returncode == 0, slipped["feedback"].stderr[-3000:]
    old, new = slipped["old_csv"]["bob"]["score"], slipped["new_csv"]["bob"]["score"]
    assert old != new
    assert f"bob/{A}: {old} -> {new}" in slipped["feedback"].stderr  # the change, as the CSVs showed it
    assert slipped["fresh_canvas"].returncode == 0
    canvas = {r[3]: r for r in csv.reader(open(grading / "canvas-fresh.csv", newline=""))}
    assert float(canvas["bob"][5]) == pytest.approx(float(new))
    html = (grading / "feedback" / "bob" / A / "single_head.html").read_text()
    assert f"(Score: {round(float(new), 2)} /" in html


def test_slip_ctrl_c_says_one_line_and_the_same_command_resumes(slipped):
    code, stdout, stderr = slipped["interrupted"]
    assert code != 0 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "interrupted: run the same command again to resume"
    assert stderr.count("interrupted:") == 1
    resumed = slipped["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(slipped["resumed_rows"]) == ["alice", "bob", "carol"]
    assert slipped["resumed_rows"] == slipped["new_csv"]  # the same grades as before the interrupted --force


def test_slip_a_removed_student_leaves_no_row_anywhere(slipped):
    remove = slipped["remove"]
    assert remove.returncode == 0, remove.stderr[-3000:]
    grading = slipped["term"]["grading"]
    assert "carol" not in gradebook_students(slipped["term"]["root"])
    assert "carol" not in rows(grading / GRADES, "student")
    assert "carol" not in {r[0] for r in csv.reader(open(grading / "grades-term.csv", newline=""))}
    assert not (grading / "results" / A / "carol.json").exists() and not (grading / "feedback" / "carol").exists()
    assert not (grading / "autograded" / "carol").exists()
    kept = list(grading.glob(f"grades-{A}.previous-*.csv"))
    assert kept and any("carol" in p.read_text() for p in kept)  # the file that lost a row is kept, and said
    assert "kept as" in remove.stderr
    assert slipped["removed_export"].returncode == 0
    assert "carol" not in {r[3] for r in csv.reader(open(grading / "canvas-after.csv", newline=""))}
    again = slipped["regraded_after_removal"]
    assert again.returncode == 0 and "'carol': removed from the course" in again.stderr
    assert "nbgrader db student add carol" not in again.stderr  # no advice that would bring her back
    assert "carol" not in rows(grading / GRADES, "student")


# -- one step off, issue 36: every record bound to the submission it describes (as the tests' own user) ----------


def exchange_submit(term: dict, student: str, kind: str, stamp: dt.datetime, owner: int | None = None) -> Path:
    """A submission in the exchange's inbound, as `nbgrader submit` names it (``owner``: made by that uid)."""
    inbound = term["grading"] / "exchange" / "attention-course" / "inbound"
    text = f"{stamp:%Y-%m-%d %H:%M:%S}.000000 UTC"
    folder = inbound / f"{student}+{A}+{text}+{os.urandom(4).hex()}"
    folder.mkdir()
    (folder / NB).write_text(notebook(kind))
    (folder / "timestamp.txt").write_text(text)
    if owner is not None:
        for path in (folder, folder / NB, folder / "timestamp.txt"):
            os.chown(path, owner, owner)
    return folder


@pytest.fixture(scope="module")
def slipped36(slipped):
    term = slipped["term"]
    grading, root = term["grading"], term["root"]
    out: dict[str, object] = {"term": term}
    # grading/'s own folders given as the submissions folder: refused, nothing changed
    before = snapshot(grading)
    out["own_folders"] = [autograder(term, "grade", f"grading/{name}", "--assignment", A)
                          for name in ("feedback", "autograded")]
    out["own_folders_after"] = snapshot(grading) == before
    # one student's folder given as the submissions folder: no hint to add a student named after the assignment
    out["one_student"] = autograder(term, "grade", "grading/submitted/alice", "--assignment", A)
    # a negative extension
    out["negative_extension"] = autograder(term, "extension", "--assignment", A, "--student", "bob", "--days", "-2")
    out["after_negative_extension"] = snapshot(grading) == before
    # a typo'd assignment added to the gradebook: no phantom column in any export
    out["phantom"] = sh(term, ".venv/bin/nbgrader", "db", "assignment", "add", "01_single_haed", "--duedate",
                        f"{DUE:%Y-%m-%d %H:%M:%S} UTC")
    # a hand grade changed for alice, on time: every export refuses until `feedback`, which says what released
    # feedback is out of date
    script = HAND_GRADING.replace(repr(HAND), repr({"alice": 1.0}))
    done = sh(term, sys.executable, "-c", script, str(grading / "gradebook.db"))
    assert done.returncode == 0, done.stderr[-2000:]
    out["stale_canvas"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                             "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-36.csv")
    out["stale_plain"] = sh(term, ".venv/bin/nbgrader", "export", "--to", "grading/plain-36.csv")
    out["feedback"] = autograder(term, "feedback", "--assignment", A)
    out["canvas"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                       "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-36.csv")
    out["plain"] = sh(term, ".venv/bin/nbgrader", "export", "--to", "grading/plain-36.csv")
    out["rows_at_export"] = rows(grading / GRADES, "student")
    # nobody collected from an LMS for B: "nothing was done", and no empty zip left
    out["lms_nothing"] = autograder(term, "lms-feedback", "--assignment", B)
    # alice re-submits (unscaled: fewer points) and the instructor grades before collecting it; meanwhile another
    # account makes a folder named for her (as root only: a folder owned by another user)
    out["rows_before"] = rows(grading / GRADES, "student")
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)
    exchange_submit(term, "alice", "unscaled", now)
    if os.geteuid() == 0:
        exchange_submit(term, "alice", "blank", now - dt.timedelta(hours=1), owner=NOBODY)
    # and a folder whose notebook is a link to a file she may edit later (timed by the link)
    linked = exchange_submit(term, "alice", "blank", now - dt.timedelta(hours=2))
    (linked / NB).unlink()
    (linked.parent / f".alice-{A}.ipynb").write_text(notebook("unscaled"))
    (linked / NB).symlink_to(linked.parent / f".alice-{A}.ipynb")
    out["uncollected"] = autograder(term, "grade", "grading/submitted", "--assignment", A)
    out["rows_uncollected"] = rows(grading / GRADES, "student")
    out["collect"] = sh(term, ".venv/bin/nbgrader", "collect", "--update", A)
    out["collected"] = autograder(term, "grade", "grading/submitted", "--assignment", A)
    out["rows_collected"] = rows(grading / GRADES, "student")
    out["resubmitted_at"] = now
    # B: alice submits it, bob (a roster student with a folder for A) does not: bob gets no record for B
    folder = grading / "submitted" / "alice" / B
    folder.mkdir(parents=True)
    shutil.copy(course.RELEASE / B / next(p.name for p in (course.RELEASE / B).glob("*.ipynb")), folder)
    out["grade_b"] = autograder(term, "grade", "grading/submitted", "--assignment", B)
    out["feedback_after_b"] = autograder(term, "feedback", "--assignment", A)
    out["canvas_b"] = sh(term, ".venv/bin/nbgrader", "export", "--exporter",
                         "autograder.records.plugins.CanvasExportPlugin", "--to", "grading/canvas-b.csv")
    out["plain_b"] = sh(term, ".venv/bin/nbgrader", "export", "--to", "grading/plain-b.csv")
    return out


def test_slip36_grading_folders_are_refused_as_submissions(slipped36):
    for proc in slipped36["own_folders"]:
        assert proc.returncode != 0 and "one of the grading folder's own folders" in proc.stderr, proc.stderr[-2000:]
        assert "grading/submitted" in proc.stderr and "Nothing was graded" in proc.stderr
    assert slipped36["own_folders_after"]  # no student re-graded as "no notebook submitted"
    one = slipped36["one_student"]
    assert "an assignment's folder, not a student's" in one.stderr and "student add" not in one.stderr


def test_slip36_a_negative_extension_is_refused(slipped36):
    proc = slipped36["negative_extension"]
    assert proc.returncode == 2 and "--days -2" in proc.stderr and "zero or more" in proc.stderr
    assert slipped36["after_negative_extension"]


def test_slip36_exports_hold_the_course_assignments_and_refuse_any_stale_total(slipped36):
    assert slipped36["phantom"].returncode == 0
    for name in ("stale_canvas", "stale_plain"):
        proc = slipped36[name]
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "alice" in said and f"python -m autograder feedback --assignment {A}" in said
    assert slipped36["feedback"].returncode == 0, slipped36["feedback"].stderr[-3000:]
    assert f"nbgrader release_feedback {A}" in slipped36["feedback"].stderr  # alice's released page is stale
    for name in ("canvas", "plain"):
        assert slipped36[name].returncode == 0, slipped36[name].stderr[-3000:]
    grading = slipped36["term"]["grading"]
    canvas = list(csv.reader(open(grading / "canvas-36.csv", newline="")))
    assert "01_single_haed" not in canvas[0] and A in canvas[0]
    assert "01_single_haed" in slipped36["canvas"].stderr  # named as left out
    plain = list(csv.DictReader(open(grading / "plain-36.csv", newline="")))
    assert {r["assignment"] for r in plain} == {A}
    alice = {r[3]: r for r in canvas[2:]}["alice"]
    assert float(alice[5]) == pytest.approx(float(slipped36["rows_at_export"]["alice"]["score"]))


def test_slip36_released_feedback_out_of_date_names_the_command(slipped):
    said = slipped["feedback"].stderr  # bob's hand grade changed after his feedback went out (exchange and zip)
    assert f"nbgrader release_feedback {A}" in said and "bob" in said
    assert f"python -m autograder lms-feedback --assignment {A}" in said


def test_slip36_nothing_done_leaves_no_empty_zip(slipped36):
    assert slipped36["lms_nothing"].returncode == 2
    assert not (slipped36["term"]["grading"] / "lms-feedback" / f"{B}.zip").exists()


def test_slip36_a_resubmission_not_collected_keeps_its_time_and_names_collect_update(slipped36):
    before, uncollected = slipped36["rows_before"]["alice"], slipped36["rows_uncollected"]["alice"]
    proc = slipped36["uncollected"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert uncollected["score"] == before["score"] and uncollected["submitted_at"] == before["submitted_at"]
    assert uncollected["late_penalty"] == "0"
    assert f"nbgrader collect --update {A}" in uncollected["time_review"]
    assert "none graded in this run" in proc.stdout  # nothing changed in grading/submitted
    if os.geteuid() == 0:  # the folder another account made in her name: flagged, its time never used
        assert "not by alice" in uncollected["time_review"]
    assert "symbolic link" in uncollected["time_review"]
    assert slipped36["collect"].returncode == 0, slipped36["collect"].stderr[-3000:]
    collected = slipped36["rows_collected"]["alice"]
    assert float(collected["score"]) < float(before["score"])  # the unscaled re-submission, graded
    assert collected["submitted_at"] >= f"{slipped36['resubmitted_at']:%Y-%m-%d %H:%M}"
    assert "collect --update" not in collected["time_review"]
    assert "1 graded in this run" in slipped36["collected"].stdout


def test_slip36_no_folder_for_an_assignment_is_no_record(slipped36):
    proc = slipped36["grade_b"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing recorded for them" in proc.stderr and "bob" in proc.stderr
    grading = slipped36["term"]["grading"]
    term_rows = {r[0]: r for r in csv.reader(open(grading / "grades-term.csv", newline=""))}
    header = term_rows["student"]
    assert B in header and term_rows["bob"][header.index(B)] == ""  # an empty cell, not a 0
    assert slipped36["canvas_b"].returncode == 0, slipped36["canvas_b"].stderr[-3000:]
    canvas = list(csv.reader(open(grading / "canvas-b.csv", newline="")))
    assert canvas[{r[3]: i for i, r in enumerate(canvas)}["bob"]][canvas[0].index(B)] == ""
    plain = list(csv.DictReader(open(grading / "plain-b.csv", newline="")))
    assert not any(r["assignment"] == B and r["student_id"] == "bob" for r in plain)
    with __import__("nbgrader.api", fromlist=["Gradebook"]).Gradebook(f"sqlite:///{grading / 'gradebook.db'}") as gb:
        assert [s.student.id for s in gb.find_assignment(B).submissions] == ["alice"]


def test_the_hub_path_releases_the_assignment(term):
    assert (term["grading"] / "exchange" / "attention-course" / "outbound" / A).is_dir()


def test_the_readme_keeps_grades_out_of_git():
    readme = (course.ROOT / "README.md").read_text()
    for out in re.findall(r"-m autograder [^\n]*--out\s+(\S+)", readme):  # the grader's own outputs
        assert out.startswith("grading/"), out
    ignored = subprocess.run(["git", "check-ignore", "-q", "grading/grades-01_single_head.csv"], cwd=course.ROOT)
    assert ignored.returncode == 0
