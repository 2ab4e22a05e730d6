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

The one long-running command, ``python -m autograder formgrader``, is started in the background (with a free
port appended) and checked to serve /formgrader; the hand grades it would record are then set through nbgrader's
Gradebook API (tests/test_formgrader.py drives formgrader itself in a browser). A command that fails fails the
test. Runs as the user running the tests (root in the containers; the sandbox tests cover unprivileged grading).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from autograder import course
from checking import answered_release

pytestmark = pytest.mark.slow
A, NB = "01_single_head", "single_head.ipynb"
GUIDE = course.ROOT / "book" / "instructors.md"
ROSTER = ("id,first_name,last_name,email,lms_user_id\nalice,Alice,Adams,,1111\nbob,Bob,Smith,,4343\n"
          "carol,Carol,Chen,,2222\n")
HAND = {"alice": 2.0, "bob": 1.0}  # written_scale, as an instructor would grade it in formgrader


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
    for student, kind, stamp in (("alice", "perfect", "2026-10-01 10:00:00.000000 UTC"),
                                 ("carol", "blank", "2026-10-02 20:00:00.000000 UTC")):
        folder = inbound / f"{student}+{A}+{stamp}+0123456789abcdef"
        folder.mkdir(parents=True)
        (folder / NB).write_text(notebook(kind))
        (folder / "timestamp.txt").write_text(stamp)
    (home / "Downloads").mkdir(parents=True)
    with zipfile.ZipFile(home / "Downloads" / "submissions.zip", "w") as z:
        z.writestr(zipfile.ZipInfo(f"smithbob_LATE_4343_99210_{NB}", (2026, 10, 4, 12, 0, 0)), notebook("unscaled"))
        z.writestr(zipfile.ZipInfo("smithbob_LATE_4343_99210_timestamp.txt", (2026, 10, 4, 12, 0, 0)),
                   "2026-10-01 09:00:00 UTC")  # backdated by bob; not a notebook: never collected


def run_block(block: str, root: Path, env: dict[str, str], log: list[str]) -> None:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=root, env=env, capture_output=True,
                          text=True, timeout=900)
    log.append(f"$ {block}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"the guide's command failed (exit {proc.returncode}):\n{block}\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def check_formgrader(block: str, root: Path, env: dict[str, str]) -> None:
    """Start the documented formgrader command, see /formgrader served, stop it."""
    port = free_port()
    logfile = root / "formgrader.log"
    with open(logfile, "w") as out:
        proc = subprocess.Popen(["bash", "-c", block.strip() + f" --port {port}"], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        token = None
        while time.monotonic() < deadline and token is None:
            assert proc.poll() is None, f"formgrader stopped:\n{logfile.read_text()[-3000:]}"
            found = re.search(r"token=([0-9a-f]+)", logfile.read_text())
            token = found and found[1]
            time.sleep(0.5)
        assert token, f"formgrader printed no address:\n{logfile.read_text()[-3000:]}"
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/formgrader?token={token}", timeout=30).read().decode()
        assert "Manage Assignments" in page or "formgrader" in page.lower()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def grade_by_hand(root: Path) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'grading' / 'gradebook.db'}") as gb:
        for student, score in HAND.items():
            grade = gb.find_grade("written_scale", "single_head", A, student)
            grade.manual_score, grade.needs_manual_grade = score, False
        gb.db.commit()


def rows(path: Path, key: str) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r[key]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    base = tmp_path_factory.mktemp("term")
    root, home = scratch_course(base), base / "home"
    hand_in(root, home)
    # No activated virtual environment: the venv's scripts are not on PATH.
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if Path(p).resolve() != Path(sys.prefix, "bin").resolve())
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "HOME": str(home), "PATH": path,
           "JUPYTER_RUNTIME_DIR": str(base / "runtime"), "JUPYTER_CONFIG_DIR": str(base / "jupyter")}
    log: list[str] = []
    blocks = guide_blocks()
    assert any("zip_collect" in b for b in blocks) and any("autograder grade" in b for b in blocks)
    for block in blocks:
        if block.strip().endswith("autograder formgrader"):
            check_formgrader(block, root, env)
            grade_by_hand(root)
        else:
            run_block(block, root, env, log)
    return {"root": root, "grading": root / "grading", "log": "\n".join(log)}


def auto_points(root: Path, student: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'grading' / 'gradebook.db'}") as gb:
        return sum(g.auto_score or 0.0 for g in gb.find_submission_notebook("single_head", A, student).grades)


def test_one_gradebook_and_one_score_everywhere(term):
    grading = term["grading"]
    assert not (grading / "grading").exists(), "a second gradebook was made under grading/grading/"
    ours = rows(grading / "grades.csv", "student")
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


def test_times_come_from_the_collectors(term):
    ours = rows(term["grading"] / "grades.csv", "student")
    assert ours["alice"]["time_source"] == "nbgrader exchange" and ours["alice"]["time_review"] == ""
    assert ours["bob"]["time_source"] == "Canvas download"
    assert ours["bob"]["submitted_at"].startswith("2026-10-04 12:00:00")
    assert "marks it late" in ours["bob"]["time_review"]
    assert (term["grading"] / "autograded" / "bob" / A / "timestamp.txt").read_text().startswith("2026-10-04 12:00")


def test_feedback_is_released_and_says_what_is_missing(term):
    released = list((term["grading"] / "exchange" / "attention-course" / "feedback").glob("*.html"))
    assert len(released) == 3
    carol = (term["grading"] / "feedback" / "carol" / A / "single_head.html").read_text()
    assert "unanswered" in carol
    assert (term["grading"] / "similarity-01.html").read_text().count("alice") >= 1
