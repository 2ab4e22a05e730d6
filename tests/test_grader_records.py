"""The grader as a citizen of nbgrader: manual grades survive, written answers reach formgrader, time and
late penalties, stable grades, feedback nbgrader can release, LMS collect and export, odd file names.

Exercise 01 (with its written answer, ``written_scale``) is graded once (in-process, one worker,
through the sandbox); each test then checks one behaviour, and the later tests change the records
(a manual grade, an extension, a changed grader). Points are read from the source notebook.
"""

from __future__ import annotations

import csv
import datetime
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import batch, course
from autograder.isolation.sandbox import Limits
from autograder.records.written import is_manual
from checking import answered_release

pytestmark = pytest.mark.slow
A, NB = "01_single_head", "single_head.ipynb"
LIMITS = Limits(cell_timeout=20, call_timeout=10, notebook_timeout=120)
WRITTEN = "written_scale"
DUE = "2026-10-02 23:59:00 UTC"
ON_TIME = "2026-10-01 10:00:00.000000 UTC"
A_DAY_LATE = "2026-10-04 12:00:00.000000 UTC"  # 1 day 12 h late: two started days
ENV = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def nbgrader(*args: str) -> subprocess.CompletedProcess:
    """nbgrader's own command, from the course root (its nbgrader_config.py), as an instructor runs it."""
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course.ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def points(manual: bool) -> float:
    """Exercise 01's points graded by the judge (``manual=False``) or by hand, from its source notebook."""
    cells = json.loads((course.SOURCE / A / NB).read_text())["cells"]
    return sum(float(c["metadata"]["nbgrader"].get("points", 0)) for c in cells
               if c["metadata"].get("nbgrader", {}).get("grade") and is_manual(c) == manual)


AUTO, BY_HAND = points(manual=False), points(manual=True)


def submit(subs: Path, student: str, written: str | None = None, timestamp: str | None = None,
           helper: bool = False, answered: bool = True) -> Path:
    folder = subs / student / A
    folder.mkdir(parents=True, exist_ok=True)
    nb = answered_release(A, NB) if answered else json.loads((course.RELEASE / A / NB).read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == WRITTEN and written is not None:
            cell["source"] = written
    for i, cell in enumerate(nb["cells"]):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid == "softmax" and helper:
            nb["cells"][i + 1:i + 1] = [
                {"cell_type": "markdown", "metadata": {}, "source": "My note: subtract the max first."},
                {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                 "source": "def my_helper(x):\n    return x - x.amax(-1, keepdim=True)\n"},
            ]
            break
    (folder / NB).write_text(json.dumps(nb))
    if timestamp:
        (folder / "timestamp.txt").write_text(timestamp)
    return folder


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("records")
    # The course's own exercise 01 (tests/test_exercises_sync.py keeps its release current).
    subs, work = base / "submitted", base / "grading"
    submit(subs, "alice", written="Because the dot products grow with d_k.", timestamp=ON_TIME, helper=True)
    submit(subs, "late", written="No idea.", timestamp=A_DAY_LATE)
    blank = submit(subs, "blank", answered=False)
    (blank / os.fsdecode(b"copy of single_h\xe9ad.ipynb")).write_bytes(b"{}")  # a name that is not UTF-8
    os.mkdir(os.fsencode(subs) + b"/\xff\xfe")  # a student folder whose name is not UTF-8
    work.mkdir()
    nbgrader("db", "assignment", "add", A, "--duedate", DUE, f"--db=sqlite:///{work / 'gradebook.db'}")
    logs: list[str] = []
    out = base / "grades.csv"
    grade = lambda **kw: batch.run(subs, A, out, work, LIMITS, workers=1, log=logs.append, **kw)  # noqa: E731
    grade()
    yield {"base": base, "subs": subs, "work": work, "out": out, "logs": logs, "grade": grade}


def read_csv_by(path: Path, key: str) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {r[key]: r for r in csv.DictReader(f)}


def summary(logs: list[str]) -> str:
    return next(line for line in logs if "to grade" in line)


def gradebook(work: Path):
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{work / 'gradebook.db'}")


def test_written_answers_and_added_cells_reach_formgrader(graded):
    book = json.loads((graded["work"] / "autograded" / "alice" / A / NB).read_text())
    texts = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in book["cells"]]
    written = [c for c in book["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == WRITTEN]
    assert len(written) == 1 and "grow with d_k" in "".join(written[0]["source"])
    assert any("def my_helper" in t for t in texts) and any("My note" in t for t in texts)
    assert texts.index(next(t for t in texts if "My note" in t)) < texts.index(next(t for t in texts if "def scaled_dot" in t))
    assert not any("run_local" in t for t in texts), "hidden tests leaked into the autograded notebook"
    with gradebook(graded["work"]) as gb:
        sub = gb.find_submission(A, "alice")
        assert sub.needs_manual_grade
        grade = gb.find_grade(WRITTEN, "single_head", A, "alice")
        assert grade.needs_manual_grade and grade.auto_score is None and grade.max_score == BY_HAND > 0
        assert not gb.find_grade("test_softmax_basic", "single_head", A, "alice").needs_manual_grade
        left_blank = gb.find_grade(WRITTEN, "single_head", A, "blank")  # "YOUR ANSWER HERE": 0, nothing to grade
        assert left_blank.auto_score == 0 and not left_blank.needs_manual_grade
    assert set((graded["work"] / "feedback" / "alice" / A).iterdir()) >= {
        graded["work"] / "feedback" / "alice" / A / f for f in ("single_head.html", "timestamp.txt", "submission_secret.txt")}


def test_odd_file_names_do_not_stop_the_batch(graded):
    rows = read_csv(graded["out"])
    assert sorted(rows) == ["alice", "blank", "late"]
    assert "not graded: copy of single_h" in rows["blank"]["reason"]
    assert any("not a valid student id" in line for line in graded["logs"])


def test_feedback_files_are_readable_and_release_feedback_succeeds(graded):
    work, base = graded["work"], graded["base"]
    for path in (work / "feedback").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o644, path
    nbgrader("release_feedback", A, f"--Exchange.root={work / 'exchange'}",  # Records made it
             f"--CourseDirectory.feedback_directory={work / 'feedback'}")
    released = list((work / "exchange" / "attention-course" / "feedback").glob("*.html"))
    assert len(released) == 3


def test_late_penalty_and_extension(graded):
    row = read_csv(graded["out"])["late"]
    assert float(row["late_penalty"]) == pytest.approx(AUTO * 0.2)  # 10% per started day, two days
    assert float(row["score"]) == pytest.approx(AUTO * 0.8)
    assert float(read_csv(graded["out"])["alice"]["late_penalty"]) == 0
    with gradebook(graded["work"]) as gb:
        assert str(gb.find_assignment(A).duedate).startswith("2026-10-02 23:59")
    proc = subprocess.run([sys.executable, "-m", "autograder", "extension", "--assignment", A, "--student", "late",
                           "--days", "2", "--workdir", str(graded["work"]),
                           "--separate-gradebook"], cwd=course.ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    graded["grade"]()
    row = read_csv(graded["out"])["late"]
    assert float(row["late_penalty"]) == 0 and float(row["score"]) == AUTO
    html = (graded["work"] / "feedback" / "late" / A / "single_head.html").read_text()
    assert "Late submission penalty" not in html or "-0" in html or "(0" in html
    # the math renders offline: the page loads the course's MathJax (make install vendors it) from the shared
    # copy two folders up, written by the course's preprocessor, not nbconvert's CDN copy; the CDN's tex-svg.js
    # only as a fallback, checked against the course's copy (tests/test_feedback_mathjax.py opens the pages)
    if (course.ROOT / "_vendor" / "mathjax" / "tex-svg.js").exists():
        from autograder.records.plugins import MATHJAX, shared_mathjax

        shared = graded["work"] / "feedback" / "attn-mathjax.js"
        assert shared.read_bytes() == MATHJAX.read_bytes() and shared.stat().st_mode & 0o777 == 0o644
        assert "'../../attn-mathjax.js'" in html and shared_mathjax()["integrity"] in html
        assert "cdnjs.cloudflare.com" not in html and 'type="application/octet-stream"' not in html
        assert len(html.encode()) < 350_000  # 1,089,961 bytes with MathJax embedded


def test_manual_grades_and_comments_survive_rerun_regrade_and_resubmission(graded):
    work = graded["work"]
    with gradebook(work) as gb:
        grade = gb.find_grade(WRITTEN, "single_head", A, "alice")
        grade.manual_score = 1.5
        grade.needs_manual_grade = False
        override = gb.find_grade("test_softmax_basic", "single_head", A, "alice")
        override.extra_credit = 0.5
        comment = gb.find_comment(WRITTEN, "single_head", A, "alice")
        comment.manual_comment = "Right idea: say what happens to the softmax."
        gb.db.commit()
    for kw in ({}, {"regrade": True}):
        graded["logs"].clear()
        graded["grade"](**kw)
        with gradebook(work) as gb:
            assert gb.find_grade(WRITTEN, "single_head", A, "alice").manual_score == 1.5
            assert gb.find_grade("test_softmax_basic", "single_head", A, "alice").extra_credit == 0.5
            assert gb.find_comment(WRITTEN, "single_head", A, "alice").manual_comment.startswith("Right idea")
            assert not gb.find_submission(A, "alice").needs_manual_grade
        assert float(read_csv(graded["out"])["alice"]["score"]) == AUTO + 1.5 + 0.5
        html = (work / "feedback" / "alice" / A / "single_head.html").read_text()
        assert "Right idea: say what happens to the softmax." in html
    assert "3 to grade" in summary(graded["logs"])  # --regrade graded everyone again
    # A re-submission is graded again; its manual grades stay and are flagged for review.
    submit(graded["subs"], "alice", written="Because dot products of d_k terms have variance d_k.", timestamp=ON_TIME)
    graded["logs"].clear()
    graded["grade"]()
    assert "1 to grade" in summary(graded["logs"])
    with gradebook(work) as gb:
        grade = gb.find_grade(WRITTEN, "single_head", A, "alice")
        assert grade.manual_score == 1.5 and grade.needs_manual_grade
        assert gb.find_submission(A, "alice").needs_manual_grade


def test_roster_and_exports_carry_names_timestamps_and_canvas_columns(graded):
    db = f"--db=sqlite:///{graded['work'] / 'gradebook.db'}"
    roster = graded["base"] / "roster.csv"
    roster.write_text("id,first_name,last_name,email,lms_user_id\nalice,Alice,Liddell,alice@example.edu,98765\n")
    nbgrader("db", "student", "import", str(roster), db)
    graded["grade"]()  # a re-run keeps the roster's names
    plain = graded["base"] / "plain.csv"
    nbgrader("export", f"--to={plain}", db)
    row = read_csv_by(plain, "student_id")["alice"]
    assert (row["first_name"], row["last_name"]) == ("Alice", "Liddell")
    assert row["timestamp"].startswith("2026-10-01 10:00:00")
    dest = graded["base"] / "canvas.csv"
    nbgrader("export", "--exporter=autograder.records.plugins.CanvasExportPlugin", f"--to={dest}",
             f"--db=sqlite:///{graded['work'] / 'gradebook.db'}")
    with open(dest, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A]
    assert rows[1][0] == "Points Possible" and float(rows[1][5]) == AUTO + BY_HAND
    by_login = {r[3]: r for r in rows[2:]}
    assert sorted(by_login) == ["alice", "blank", "late"]
    assert by_login["alice"][:2] == ["Liddell, Alice", "98765"]
    assert float(by_login["blank"][5]) == 0
    csv_rows = read_csv(graded["out"])
    assert float(by_login["late"][5]) == float(csv_rows["late"]["score"])


def test_every_csv_neutralises_cells_a_spreadsheet_would_run(graded):
    """A student id shaped like a formula (`-2+3` shows as 1 in a spreadsheet) reaches no CSV raw: the term file,
    the Canvas export and the plain export give it a leading quote."""
    from autograder.records.gradebook import write_term
    from autograder.records.results import csv_cell, is_number

    assert [csv_cell(v) for v in ("-2+3", "=HYPERLINK(1)", "+1", "@SUM(A1)", "alice", "")] == \
        ["'-2+3", "'=HYPERLINK(1)", "'+1", "'@SUM(A1)", "alice", ""]
    with gradebook(graded["work"]) as gb:
        gb.add_student("-2+3", first_name="=cmd|' /C calc'!A0")
        gb.add_submission(A, "-2+3", timestamp=datetime.datetime(2026, 10, 1))  # a submission: exported
    try:
        term = graded["base"] / "term.csv"
        write_term(graded["work"] / "gradebook.db", term)
        dest = graded["base"] / "canvas-formula.csv"
        nbgrader("export", "--exporter=autograder.records.plugins.CanvasExportPlugin", f"--to={dest}",
                 f"--db=sqlite:///{graded['work'] / 'gradebook.db'}")
        plain = graded["base"] / "plain-formula.csv"
        nbgrader("export", f"--to={plain}", f"--db=sqlite:///{graded['work'] / 'gradebook.db'}")
        for path in (term, dest, plain):
            cells = [c for row in csv.reader(open(path, newline="")) for c in row]
            assert "'-2+3" in cells, path
            assert not [c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and not is_number(c))], path
        assert dest.stat().st_mode & 0o077 == 0 and term.stat().st_mode & 0o077 == 0  # the instructor's alone
    finally:
        with gradebook(graded["work"]) as gb:
            gb.remove_student("-2+3")


def test_the_autograded_note_quotes_file_names_as_text():
    """The reason, quoting a student's file name, is markdown-escaped in the note formgrader renders."""
    from autograder.records.feedback import autograded_notebook
    from autograder.records.results import NotebookResult, Result

    name = "[Read my notes](javascript:alert(document.domain)).ipynb"
    result = Result("notes", A, "fp", "v", f"graded {name} in place of the expected single_head.ipynb", 0.0,
                    [NotebookResult("single_head", [])])
    note = json.loads(autograded_notebook(result, 0))["cells"][0]["source"]
    note = note if isinstance(note, str) else "".join(note)
    assert "](" not in note and "\\[Read my notes\\]\\(javascript\\:alert" in note


def test_changed_grader_keeps_recorded_grades_until_regrade(graded, monkeypatch):
    before = {s: r["score"] for s, r in read_csv(graded["out"]).items()}
    real = batch.grade_notebook

    def stricter(*args, **kwargs):  # the "new grader": test_softmax_basic now fails everyone
        result = real(*args, **kwargs)
        for t in result.tests:
            if t.grade_id == "test_softmax_basic":
                t.points, t.message = 0.0, "stricter now"
        return result

    monkeypatch.setattr(batch, "grade_notebook", stricter)
    monkeypatch.setattr(batch, "grader_version", lambda assignment, limits=None: "a-changed-grader")
    graded["logs"].clear()
    graded["grade"]()
    assert {s: r["score"] for s, r in read_csv(graded["out"]).items()} == before
    report = next(line for line in graded["logs"] if "would change with --regrade" in line)
    assert "alice" in report and "late" in report and "blank" not in report.split("would change")[1]
    graded["logs"].clear()
    graded["grade"](regrade=True)
    after = read_csv(graded["out"])
    assert float(after["alice"]["score"]) == float(before["alice"]) - 1
    assert after["blank"]["score"] == before["blank"]
    with gradebook(graded["work"]) as gb:
        assert gb.find_grade(WRITTEN, "single_head", A, "alice").manual_score == 1.5


def test_the_grader_version_covers_the_grading_code_and_only_this_chapters_checks(tmp_path, monkeypatch):
    code = {str(p.relative_to(batch.HERE)) for p in batch.grading_code("03_self_attention")}
    assert {"judging/judge.py", "judging/checks/__init__.py", "judging/checks/common.py", "in_sandbox/harness.py",
            "isolation/zygote.py", "notebook.py", "judging/checks/ch03_self_attention.py"} <= code
    assert not any(c.startswith("judging/checks/ch") and "ch03" not in c for c in code), code
    copy = tmp_path / "autograder"
    shutil.copytree(batch.HERE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(batch, "HERE", copy)
    v01, v03 = batch.grader_version("01_single_head"), batch.grader_version("03_self_attention")
    ch01 = copy / "judging" / "checks" / "ch01_single_head.py"
    ch01.write_text(ch01.read_text() + "\n# a change to chapter 01's checks\n")
    assert batch.grader_version("01_single_head") != v01
    assert batch.grader_version("03_self_attention") == v03  # no chapter's checks import another's
    common = copy / "judging" / "checks" / "common.py"
    common.write_text(common.read_text() + "\n# a change to what the chapters share\n")
    assert batch.grader_version("03_self_attention") != v03


def test_zip_collect_maps_lms_ids_through_the_roster_and_keeps_the_collectors_time(tmp_path):
    """Canvas and Moodle file names carry the LMS id: it is looked up in the roster's lms_user_id, an id not in
    the roster is listed and skipped (no invented student), and the zip entry's time (not a file the student
    wrote) becomes timestamp.txt, with Canvas's _LATE_ marker kept for the grader."""
    import zipfile

    nb = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    db = f"--CourseDirectory.db_url=sqlite:///{tmp_path / 'grading' / 'gradebook.db'}"
    (tmp_path / "grading").mkdir()
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name,email,lms_user_id\njdoe,Jane,Doe,,4242\nrsmith,Rob,Smith,,4343\n"
                      "alee,Ann,Lee,,5151\n")
    nbgrader("db", "student", "import", str(roster), db)
    archive = tmp_path / "grading" / "downloaded" / A / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "submissions.zip", "w") as z:
        z.writestr(zipfile.ZipInfo("doejane_4242_991_single_head.ipynb", (2026, 10, 1, 9, 30, 0)), nb)
        z.writestr(zipfile.ZipInfo("smithrob_LATE_4343_992_single_head-1.ipynb", (2026, 10, 3, 8, 0, 0)), nb)
        z.writestr(zipfile.ZipInfo("Ann Lee_5151_assignsubmission_file_/single_head.ipynb", (2026, 10, 2, 1, 0, 0)), nb)
        z.writestr(zipfile.ZipInfo("strangerx_9999_993_single_head.ipynb", (2026, 10, 1, 0, 0, 0)), nb)
    proc = nbgrader("zip_collect", A, f"--CourseDirectory.root={tmp_path}", db)
    submitted = tmp_path / "grading" / "submitted"
    got = sorted(p.relative_to(submitted).as_posix() for p in submitted.rglob("*.ipynb"))
    assert got == [f"alee/{A}/{NB}", f"jdoe/{A}/{NB}", f"rsmith/{A}/{NB}"]  # roster ids, no "9999"
    assert "9999" in proc.stdout + proc.stderr and "not the lms_user_id" in proc.stdout + proc.stderr
    collected = tmp_path / "grading" / "collected" / A
    assert json.loads((collected / "unknown.json").read_text())["lms_user_ids"] == {
        "9999": ["strangerx_9999_993_single_head.ipynb"]}
    assert (submitted / "jdoe" / A / "timestamp.txt").read_text().startswith("2026-10-01 09:30:00")
    late = json.loads((collected / "rsmith.json").read_text())
    assert late["late_marker"] and late["time"] == "2026-10-03T08:00:00" and late["source"] == "Canvas download"
    assert json.loads((collected / "alee.json").read_text())["source"] == "Moodle download"


def test_require_isolation_refuses_before_grading(tmp_path):
    submit_dir = tmp_path / "submitted" / "bob" / A
    submit_dir.mkdir(parents=True)
    (submit_dir / NB).write_text("{}")
    env = {**ENV, "AUTOGRADER_NO_NAMESPACES": "1", "AUTOGRADER_NO_BWRAP": "1"}  # no namespaces, no bubblewrap
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "submitted"), "--assignment", A,
                           "--out", str(tmp_path / "grades.csv"), "--require-isolation"], cwd=course.ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "refusing to grade" in proc.stderr and "nothing was graded" in proc.stderr
    assert not (tmp_path / "grades.csv").exists() and not (tmp_path / "grading").exists()


def test_feedback_of_several_students_is_rendered_in_one_run_and_each_error_stays_its_owners(graded, monkeypatch):
    from nbgrader.apps import NbGraderAPI

    from autograder.records.feedback import generate_feedback
    from autograder.records.gradebook import Records

    records = Records(graded["work"], A)
    page = lambda s: graded["work"] / "feedback" / s / A / "single_head.html"  # noqa: E731
    untouched = page("blank").stat().st_mtime_ns
    for student in ("alice", "late"):
        page(student).unlink()
    runs: list[object] = []
    real = NbGraderAPI.generate_feedback
    monkeypatch.setattr(NbGraderAPI, "generate_feedback",
                        lambda self, *a, **kw: runs.append(a[1]) or real(self, *a, **kw))
    assert generate_feedback(records.config, A, ["late", "alice"]) == {"alice": "", "late": ""}
    assert runs == [None]  # one run of nbgrader's converter for both
    assert page("alice").is_file() and page("late").is_file()
    assert page("blank").stat().st_mtime_ns == untouched  # the other students were excluded
    # a run that fails is retried student by student, so the error is told to its owner alone
    runs.clear()
    monkeypatch.setattr(NbGraderAPI, "generate_feedback", lambda self, assignment, student, force=True: (
        runs.append(student) or {"success": student == "alice", "error": f"broken page of {student}"}))
    errors = generate_feedback(records.config, A, ["alice", "late"])
    assert runs == [None, "alice", "late"] and errors == {"alice": "", "late": "broken page of late"}


def test_the_feedback_exporter_skips_nbconverts_second_parse_but_keeps_alt_text_and_sanitising():
    import nbformat

    from autograder.records.plugins import FeedbackHTMLExporter

    config = course.nbgrader_config()
    assert config.GenerateFeedback.exporter_class.endswith("FeedbackHTMLExporter")  # what nbgrader will use
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("hi <img src=x onerror=alert(1)>"),
        nbformat.v4.new_code_cell("plot()", outputs=[nbformat.v4.new_output(
            "display_data", {"image/png": "iVBORw0KGgo="})])])
    html, _ = FeedbackHTMLExporter(config=config).from_notebook_node(nb)
    assert not re.search(r"<img[^>]*onerror", html)  # nbconvert's sanitiser still runs: the tag is inert text
    assert 'alt="No description has been provided for this image"' in html


def test_exports_refuse_any_stale_total_and_hold_the_course_assignments_only(graded):
    """Issue 36: a hand grade changed for an on-time student (no late penalty to go stale) is refused by both
    exports, naming her and the command that fixes it, until `feedback` has rewritten the feedback and the CSVs; a
    typo'd assignment added to the gradebook is no column of the export."""
    from autograder import cli

    db = f"--db=sqlite:///{graded['work'] / 'gradebook.db'}"
    nbgrader("db", "assignment", "add", "01_single_haed", db)
    with gradebook(graded["work"]) as gb:
        grade = gb.find_grade(WRITTEN, "single_head", A, "alice")
        grade.manual_score = 0.5 if grade.manual_score != 0.5 else 1.0
        gb.db.commit()
    canvas, plain = graded["base"] / "canvas-stale.csv", graded["base"] / "plain-stale.csv"
    for args in ([f"--exporter=autograder.records.plugins.CanvasExportPlugin", f"--to={canvas}"], [f"--to={plain}"]):
        proc = subprocess.run([sys.executable, "-m", "nbgrader", "export", *args, db], cwd=course.ROOT, env=ENV,
                              capture_output=True, text=True, timeout=300)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "alice" in said and f"python -m autograder feedback --assignment {A}" in said
    assert not canvas.exists() and not plain.exists()
    assert cli.main(["feedback", "--assignment", A, "--workdir", str(graded["work"]), "--separate-gradebook",
                     "--out", str(graded["out"])]) == 0
    nbgrader("export", "--exporter=autograder.records.plugins.CanvasExportPlugin", f"--to={canvas}", db)
    nbgrader("export", f"--to={plain}", db)
    with open(canvas, newline="") as f:
        header = next(csv.reader(f))
    assert header[5:] == [A]
    assert {r["assignment"] for r in csv.DictReader(open(plain, newline=""))} == {A}
    assert float(read_csv_by(canvas, "SIS Login ID")["alice"][A]) == float(read_csv(graded["out"])["alice"]["score"])


def test_a_missing_mathjax_is_said_at_grade_time(graded, monkeypatch, tmp_path):
    """Without the course's MathJax (`make install` not run) the feedback pages would fetch it from a CDN and show
    raw $...$ offline: the run says so, instead of falling back silently."""
    from autograder.records import plugins

    monkeypatch.setattr(plugins, "MATHJAX", tmp_path / "missing" / "tex-svg.js")
    graded["logs"].clear()
    graded["grade"]()
    assert any("MathJax" in line and "make install" in line for line in graded["logs"]), graded["logs"]
