"""nbgrader's own doors agree with the grader (autograder/records/doors.py), read through nbgrader's API, the
one formgrader's handlers call (``NbGraderAPI(coursedir, authenticator, parent=...)`` after reading the
course's nbgrader_config.py):

* a student removed with ``python -m autograder remove-student`` is listed nowhere (her submitted folder stays);
* the autograde button (``NbGraderAPI.autograde``) runs no student code: a notebook that would write a marker
  file writes none, the gradebook is unchanged, and the answer names the command that grades;
* an exchange-collected submission graded by the grader reads autograded, with the grader's score, and a
  re-submission collected since reads "needs autograding" again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from autograder import batch, cli, course
from test_grader_records import A, AUTO, LIMITS, NB, ON_TIME, submit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A course root of its own (the course's configuration, this root), with an exchange: alice submitted
    through it and was collected; gone was graded and then removed with ``remove-student``."""
    root = tmp_path_factory.mktemp("doors")
    work = root / "grading"
    with pytest.MonkeyPatch.context() as mp:
        shutil.copytree(course.SOURCE / A, root / "source" / A)
        mp.setattr(course, "SOURCE", root / "source")
        shutil.copytree(course.RELEASE / A, root / "release" / A)
        mp.setattr(course, "RELEASE", root / "release")
        (root / "nbgrader_config.py").write_text(
            "c = get_config()  # noqa: F821\n"
            f"load_subconfig({str(course.ROOT / 'autograder' / 'nbgrader_config.py')!r})  # noqa: F821\n"
            f"c.CourseDirectory.root = {str(root)!r}\n"
            f"c.CourseDirectory.source_directory = {str(root / 'source')!r}\n"
            f"c.CourseDirectory.release_directory = {str(root / 'release')!r}\n"
            f"c.CourseDirectory.db_url = 'sqlite:///{work / 'gradebook.db'}'\n"
            f"c.Exchange.root = {str(work / 'exchange')!r}\n")
        submitted = work / "submitted"
        for student in ("alice", "gone"):
            folder = submit(submitted, student, written="The scores grow with d_k.", timestamp=ON_TIME)
            # as `nbgrader submit` then `nbgrader collect` leave it: the inbound folder, copied into submitted/
            inbound = work / "exchange" / "attention-course" / "inbound" / f"{student}+{A}+{ON_TIME}+abc"
            shutil.copytree(folder, inbound)
        batch.run(submitted, A, work / "grades.csv", work, LIMITS, workers=1, log=print)
        assert cli.main(["remove-student", "gone", "--workdir", str(work), "--separate-gradebook"]) == 0
        assert (submitted / "gone" / A).is_dir()  # her work stays where it was
        yield {"root": root, "work": work}


def api(root: Path):
    """nbgrader's API as formgrader builds it: the course root's nbgrader_config.py read, then the API."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def test_a_removed_student_is_listed_nowhere_in_formgrader(graded):
    nb_api = api(graded["root"])
    assert "gone" not in {s["id"] for s in nb_api.get_students()}
    assert not [s for s in nb_api.get_students() if s["last_name"] is None and s["id"] != "alice"]
    assert "gone" not in {s["student"] for s in nb_api.get_submissions(A)}
    assert "gone" not in nb_api.get_submitted_students(A) and "gone" not in nb_api.get_submitted_students("*")
    assert nb_api.get_student("gone") is None  # formgrader's student page: not found
    assert not [s for s in nb_api.get_student_submissions("gone") if s["submitted"]]
    assert "gone" not in {s["student"] for s in nb_api.get_notebook_submissions(A, "single_head")}
    assert [s["student"] for s in nb_api.get_submissions(A)] == ["alice"]


def test_formgraders_autograde_runs_no_student_code_and_names_the_command(graded, tmp_path):
    """The button's call, for a submission whose code would write a marker file in this process: no marker,
    no gradebook change (a removed student stays removed), and the answer says what to run."""
    from nbgrader.api import Gradebook

    marker = tmp_path / "ran-outside-the-sandbox"
    for student in ("alice", "gone"):
        path = graded["work"] / "submitted" / student / A / NB
        nb = json.loads(path.read_text())
        nb["cells"].insert(0, {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                               "source": f"open({str(marker)!r}, 'a').write('{student}')\n"})
        path.write_text(json.dumps(nb))
    nb_api = api(graded["root"])
    for student in ("alice", "gone"):
        answer = nb_api.autograde(A, student)
        assert answer["success"] is False, answer
        said = answer.get("log", "") + answer.get("error", "")
        assert "outside the grader's sandbox" in said and f"python -m autograder grade grading/submitted " \
                                                               f"--assignment {A}" in said, said
    assert not marker.exists(), "nbgrader's autograde ran the student's code in the instructor's process"
    with Gradebook(f"sqlite:///{graded['work'] / 'gradebook.db'}") as gb:
        assert [s.id for s in gb.students] == ["alice"]  # gone was not re-created
    assert not (graded["work"] / "autograded" / "gone").exists()


def test_an_exchange_collected_submission_graded_by_the_grader_reads_graded(graded):
    """The gradebook's time is the exchange's (not the student's timestamp.txt), yet formgrader shows alice as
    autograded with the grader's score, and no autograde prompt; a re-submission collected since reads
    "needs autograding" again."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['work'] / 'gradebook.db'}") as gb:
        recorded = gb.find_submission(A, "alice").timestamp
    nb_api = api(graded["root"])
    assert nb_api.get_submitted_timestamp(A, "alice") != recorded  # the two times nbgrader compares differ
    assert nb_api.get_autograded_students(A) == {"alice"}
    (alice,) = nb_api.get_submissions(A)
    assert alice["autograded"] is True and alice["score"] == pytest.approx(AUTO), alice
    assert nb_api.get_submission(A, "alice")["autograded"] is True
    stamp = graded["work"] / "submitted" / "alice" / A / "timestamp.txt"
    old = stamp.read_text()
    try:
        stamp.write_text("2026-10-02 08:00:00.000000 UTC")  # collected again: the student's new submission
        assert nb_api.get_autograded_students(A) == set()
        assert api(graded["root"]).get_submission(A, "alice")["autograded"] is False
    finally:
        stamp.write_text(old)
        os.utime(stamp)
