"""The grading folder as the record of grades: results, nbgrader's gradebook and the CSV.

nbgrader is the system of record. The grader writes auto scores only: manual
scores, extra credit and comments that an instructor set in formgrader are never
touched, whatever is re-run. A re-submission keeps its earlier manual grades and
flags them for review (``needs_manual_grade``), and written answers stay flagged
until an instructor grades them. The submission's timestamp goes into the
gradebook, and late penalties are assigned by nbgrader's own
``AssignLatePenalties`` with the plugin configured in ``nbgrader_config.py``
(extensions granted in the gradebook count).

The submission's time is the collector's (:mod:`autograder.records.collector`): the LMS download or
nbgrader's exchange; ``timestamp.txt`` is checked against it and every doubt is flagged.

Imports: :mod:`autograder.course`, :mod:`autograder.records.collector`, :mod:`autograder.records.results`.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any

from autograder import course
from autograder.records.collector import SubmissionTime, collected_record, decide, exchange_time
from autograder.records.results import Result, atomic_write, load_result, save_result


@functools.cache
def alembic_head() -> str:
    """nbgrader's newest gradebook schema revision, read from its alembic scripts in this process."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader import dbutil

    config = Config()
    config.set_main_option("script_location", dbutil.ALEMBIC_DIR)
    return ScriptDirectory.from_config(config).get_current_head()


class Records:
    """The grading folder of one assignment: results, nbgrader gradebook, autograded notebooks and feedback."""

    def __init__(self, workdir: Path, assignment: str) -> None:
        self.workdir = workdir.resolve()
        self.assignment = assignment
        self.results = self.workdir / "results" / assignment
        self.results.mkdir(parents=True, exist_ok=True)
        self.db = self.workdir / "gradebook.db"
        self.config = course.nbgrader_config(
            submitted_directory=str(self.workdir / "submitted"),
            autograded_directory=str(self.workdir / "autograded"),
            feedback_directory=str(self.workdir / "feedback"),
            db_url=f"sqlite:///{self.db}",
        )
        self.config.Exchange.root = str(self.workdir / "exchange")
        (self.workdir / "exchange").mkdir(exist_ok=True)

    # -- files ---------------------------------------------------------------------------------------

    def secret(self) -> str:
        """The seed of the private test inputs: random once per grading folder, then fixed (re-runs agree)."""
        path = self.workdir / "secret"
        if not path.exists():
            atomic_write(path, secrets.token_hex(16), mode=0o600)
        return path.read_text().strip()

    def load(self, student: str) -> Result | None:
        return load_result(self.results / f"{student}.json", student)

    def save(self, result: Result) -> None:
        save_result(self.results / f"{result.student}.json", result)

    def pinned_version(self, version: str, replace: bool = False) -> str:
        """The grader version this assignment is graded with: the first one used, unless ``replace``."""
        path = self.results / "grader_version.txt"
        try:
            pinned = json.loads(path.read_text())["version"]
        except (OSError, ValueError, KeyError, TypeError):
            pinned = None
        if pinned is None or (replace and pinned != version):
            atomic_write(path, json.dumps({"version": version}), mode=0o600)
            pinned = version
        return pinned

    def feedback_state(self, student: str) -> str:
        """The :meth:`grades_state` the student's feedback was last rendered from ("" if never)."""
        try:
            return (self.results / "feedback_state" / f"{student}.txt").read_text().strip()
        except OSError:
            return ""

    def set_feedback_state(self, student: str, state: str) -> None:
        atomic_write(self.results / "feedback_state" / f"{student}.txt", state, mode=0o600)

    @property
    def time_policy(self) -> str:
        """``c.SubmissionTime.policy`` of the course's config (see :mod:`autograder.records.collector`)."""
        return str(self.config.SubmissionTime.get("policy", "collector"))

    def submission_time(self, result: Result) -> SubmissionTime:
        """The time to record for ``result``: the collector's (LMS download or nbgrader's exchange), checked
        against the student's ``timestamp.txt``, with the flags an instructor should see."""
        collected = collected_record(self.workdir, self.assignment, result.student) or exchange_time(
            Path(str(self.config.Exchange.root)), str(self.config.CourseDirectory.course_id), self.assignment,
            result.student)
        return decide(result.timestamp, collected, self.time_policy, result.first_seen)

    # -- the gradebook --------------------------------------------------------------------------------

    def prepare_gradebook(self) -> None:
        """Record the assignment's cells and points in the gradebook (nbgrader generate_assignment does it)."""
        import nbgrader.api
        from nbgrader.api import Gradebook, MissingEntry

        # A new gradebook records nbgrader's newest schema revision, which nbgrader reads by running `alembic
        # heads` as a subprocess: that needs this environment's alembic first on PATH, and costs a Python start.
        # Read it here instead, from nbgrader's own migration scripts.
        nbgrader.api.get_alembic_version = alembic_head
        with Gradebook(f"sqlite:///{self.db}") as gb:
            try:  # known with its notebooks (`nbgrader db assignment add --duedate` makes an empty one)
                known = bool(gb.find_assignment(self.assignment).notebooks)
            except MissingEntry:
                known = False
        if not known:
            with tempfile.TemporaryDirectory() as tmp:
                course.generate_release(self.assignment, Path(tmp), db_path=self.db)

    def record(self, result: Result, resubmitted: bool = False) -> None:
        """Store the auto scores and the timestamp in the gradebook, then assign the late penalty.

        Idempotent: the same result gives the same rows. Only ``auto_score`` is
        written; a grade's ``manual_score``, ``extra_credit`` and comments are the
        instructor's. ``resubmitted``: the submission differs from the one graded
        before, so grades set by hand are flagged for review.
        """
        from nbgrader.api import Gradebook, MissingEntry

        student = result.student
        timestamp = self.submission_time(result).when
        with Gradebook(f"sqlite:///{self.db}") as gb, warnings.catch_warnings():
            # nbgrader's add_submission trips SQLAlchemy's autoflush warnings; they are harmless here.
            warnings.simplefilter("ignore")
            try:
                gb.find_student(student)
            except MissingEntry:
                gb.add_student(student)  # never update_or_create: that would blank a roster's names
            try:
                submission = gb.find_submission(self.assignment, student)
            except MissingEntry:
                submission = gb.add_submission(self.assignment, student)
            submission.timestamp = timestamp
            auto = {(nb.notebook, t.grade_id): t for nb in result.notebooks for t in nb.tests}
            blank = {(name, gid) for name, cells in result.cells.items() for gid in cells.unanswered}
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    t = auto.get((notebook.name, grade.name))
                    if t is not None:
                        grade.auto_score = float(min(t.points, t.max_points))
                        grade.needs_manual_grade = bool(resubmitted and grade.manual_score is not None) or \
                            (grade.needs_manual_grade and grade.manual_score is not None)
                    elif (notebook.name, grade.name) in blank and grade.manual_score is None:
                        grade.auto_score = 0.0  # left as released: nothing to grade (as nbgrader's autograde)
                        grade.needs_manual_grade = False
                    else:  # graded by hand (a written answer or a task)
                        grade.auto_score = None
                        grade.needs_manual_grade = grade.manual_score is None or resubmitted or \
                            bool(grade.needs_manual_grade)
            gb.db.commit()
        self.assign_late_penalties(result)

    def assign_late_penalties(self, result: Result) -> None:
        """nbgrader's ``AssignLatePenalties`` for each notebook, with the configured plugin."""
        import nbformat
        from nbgrader.preprocessors import AssignLatePenalties

        penalties = AssignLatePenalties(config=self.config)
        for nb in result.notebooks:
            resources = {"nbgrader": {"notebook": nb.notebook, "assignment": self.assignment,
                                      "student": result.student, "db_url": f"sqlite:///{self.db}"}}
            penalties.preprocess(nbformat.v4.new_notebook(), resources)

    def grades_state(self, student: str) -> str:
        """A hash of everything the student's feedback shows from the gradebook: scores (auto, manual,
        extra credit), comments, late penalties, the timestamp."""
        import hashlib

        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.db}") as gb:
            sub = gb.find_submission(self.assignment, student)
            rows: list[Any] = [str(sub.timestamp), str(sub.extension)]
            for nb in sorted(sub.notebooks, key=lambda n: n.name):
                rows.append((nb.name, nb.late_submission_penalty))
                rows += sorted((g.name, g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade)
                               for g in nb.grades)
                rows += sorted((c.name, c.auto_comment, c.manual_comment) for c in nb.comments)
        return hashlib.sha256(repr(rows).encode()).hexdigest()

    def scores(self) -> dict[str, tuple[float, float, float]]:
        """``student -> (score, max_score, late penalty)`` as the gradebook has them (manual grades included)."""
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{self.db}") as gb:
            try:
                submissions = gb.find_assignment(self.assignment).submissions
            except MissingEntry:
                return {}
            return {sub.student.id: (float(sub.score), float(sub.max_score), float(sub.late_submission_penalty or 0))
                    for sub in submissions}

    def final_scores(self) -> dict[str, tuple[float, float, float]]:
        """``student -> (score after the late penalty, max_score, penalty)``: the one score every place shows
        (console, CSV, feedback, ``nbgrader export``, the Canvas file); ``max_score`` includes hand-graded points."""
        return {s: (max(0.0, score - penalty), max_score, penalty) for s, (score, max_score, penalty)
                in self.scores().items()}

    def changes(self, before: dict[str, tuple[float, float, float]]) -> list[str]:
        """Say which recorded scores differ from ``before`` (a :meth:`final_scores`), and by how much."""
        after = self.final_scores()
        moved = [(s, before[s][0], after[s][0]) for s in sorted(before) if s in after and
                 abs(before[s][0] - after[s][0]) > 1e-9]
        if not moved:
            return []
        return [f"{self.assignment}: {len(moved)} recorded score(s) changed:"] + [
            f"  {s}: {old:g} -> {new:g} ({new - old:+g})" for s, old, new in moved]


# The CSV's columns (documented in autograder/README.md, "The CSV"):
#   score         points after the late penalty (hand grades included): what the feedback, `nbgrader export`
#                 and the Canvas file show
#   max_score     every point of the assignment, the hand-graded ones included
#   reason        why a submission could not be graded normally, and what needs a look (unanswered cells)
#   late_penalty  points taken for lateness (already subtracted from score)
#   submitted_at  the time recorded in the gradebook (UTC), which the late penalty is computed from
#   time_source   where that time came from: "Canvas download", "Moodle download", "nbgrader exchange",
#                 "timestamp.txt" (unconfirmed), "first seen by the grader"
#   time_review   why the time needs a look ("" when nothing does): a missing, unparsable or implausible
#                 timestamp.txt, one that disagrees with the collector's time, the LMS's late marker
CSV_COLUMNS = ["student", "assignment", "score", "max_score", "reason", "late_penalty", "submitted_at",
               "time_source", "time_review"]


def write_csv(path: Path, records: Records, results: dict[str, Result], final: bool = True) -> None:
    """One row per student. The final CSV takes its scores from the gradebook, so the two agree (score
    after the late penalty); the progress CSVs written during a batch take them from the results."""
    scores = records.final_scores() if final else {s: (*r.total, 0.0) for s, r in results.items()}
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_COLUMNS)
    for student in sorted(results):
        score, max_score, penalty = scores.get(student, (0.0, 0.0, 0.0))
        when = records.submission_time(results[student])
        writer.writerow([student, records.assignment, f"{score:g}", f"{max_score:g}",
                         results[student].reason, f"{penalty:g}", when.text, when.source, "; ".join(when.flags)])
    atomic_write(path, buf.getvalue(), mode=0o600)


__all__ = ["Records", "write_csv"]
