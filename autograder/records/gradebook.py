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
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any

from autograder import course
from autograder.records.collector import (ExchangeFolder, SubmissionTime, collected_record, decide, exchange_collected,
                                         exchange_folders, folder_fingerprint)
from autograder.records.results import Result, atomic_write, csv_cell, load_result, save_result


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
        try:  # the grader's records (roster, grades, secret, students' work): the instructor's alone
            if self.workdir.stat().st_uid == os.geteuid():
                self.workdir.chmod(0o700)
        except OSError:
            pass
        self.db = self.workdir / "gradebook.db"
        self.config = course.nbgrader_config(
            submitted_directory=str(self.workdir / "submitted"),
            autograded_directory=str(self.workdir / "autograded"),
            feedback_directory=str(self.workdir / "feedback"),
            db_url=f"sqlite:///{self.db}",
        )
        # The exchange is configuration (c.Exchange.root: a JupyterHub's shared exchange, e.g. /srv/nbgrader/
        # exchange); the course's default, grading/exchange, follows a --workdir with a gradebook of its own.
        configured = Path(str(self.config.Exchange.get("root", "") or course.grading_dir() / "exchange"))
        if configured.resolve() == (course.grading_dir() / "exchange").resolve():
            configured = self.workdir / "exchange"
            configured.mkdir(exist_ok=True)
        self.exchange = configured
        self.config.Exchange.root = str(configured)
        self._times: dict[tuple[str, str, str], SubmissionTime] = {}
        self._exchange_folders: dict[str, list[ExchangeFolder]] | None = None
        self._due: tuple[Any, dict[str, Any]] | None = None

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
        against the student's ``timestamp.txt``, with the flags an instructor should see. Decided once per
        result and run (the exchange is listed once). The exchange's time is that of the folder whose content was
        graded (matched by the result's fingerprint, :func:`~autograder.records.collector.exchange_collected`),
        never a newer, a linked or another student's folder."""
        key = (result.student, result.timestamp, result.first_seen, result.fingerprint)
        if key not in self._times:
            if self._exchange_folders is None:
                self._exchange_folders = exchange_folders(self.exchange, str(self.config.CourseDirectory.course_id),
                                                          self.assignment)
            collected = collected_record(self.workdir, self.assignment, result.student)
            if collected is None and result.student in self._exchange_folders:
                secret = self.secret()
                collected = exchange_collected(self._exchange_folders[result.student], self.assignment,
                                               result.fingerprint, lambda folder: folder_fingerprint(secret, folder))
            decided = decide(result.timestamp, collected, self.time_policy, result.first_seen)
            due = self.due(result.student)
            if collected and collected.late_marker and decided.when and due and decided.when > due:
                # the LMS's late marker and the recorded time agree: the penalty applies as intended, nothing
                # to review (a marker on a time recorded as on time, say a wrong zip_timezone, stays flagged)
                decided.flags = [f for f in decided.flags if not f.endswith("marks it late")]
            self._times[key] = decided
        return self._times[key]

    def due(self, student: str) -> Any:
        """The student's due date (naive UTC, the extension included), or None; read once per run."""
        from nbgrader.api import Gradebook, MissingEntry

        if self._due is None:
            self._due = (None, {})
            if self.db.exists():
                with Gradebook(f"sqlite:///{self.db}") as gb:
                    try:
                        assignment = gb.find_assignment(self.assignment)
                    except MissingEntry:
                        assignment = None
                    if assignment is not None and assignment.duedate is not None:
                        self._due = (assignment.duedate, {sub.student_id: sub.extension
                                                          for sub in assignment.submissions if sub.extension})
        base, extensions = self._due
        if base is None:
            return None
        return base + extensions[student] if student in extensions else base

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
        try:
            self.db.chmod(0o600)  # names, emails and grades: the instructor's alone
        except OSError:
            pass

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
                self.note_added(student)
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
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.db}") as gb:
            return submission_state(gb.find_submission(self.assignment, student))

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
        (console, CSV, feedback, ``nbgrader export``, the Canvas file); ``max_score`` includes hand-graded points.
        Reads the whole assignment: call it once per run, never per student (:meth:`final_score` is one's)."""
        return {s: (max(0.0, score - penalty), max_score, penalty) for s, (score, max_score, penalty)
                in self.scores().items()}

    def final_score(self, student: str) -> tuple[float, float, float] | None:
        """:meth:`final_scores` of one student (one query, whatever the size of the class)."""
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(f"sqlite:///{self.db}") as gb:
            try:
                sub = gb.find_submission(self.assignment, student)
            except MissingEntry:
                return None
            penalty = float(sub.late_submission_penalty or 0)
            return max(0.0, float(sub.score) - penalty), float(sub.max_score), penalty

    def roster(self) -> list[str]:
        """The students of the course's gradebook (``nbgrader db student import roster.csv``), sorted."""
        return roster(self.db)

    @property
    def added_file(self) -> Path:
        """The students the grader itself added to the gradebook (graded before any roster was imported)."""
        return self.workdir / "results" / "added-by-grader.txt"

    def note_added(self, student: str) -> None:
        with open(self.added_file, "a") as f:
            f.write(student + "\n")
        self.added_file.chmod(0o600)

    def roster_imported(self) -> bool:
        """Whether an instructor put students in the gradebook (a roster import, ``nbgrader db student add``):
        a student the grader did not add, or one with a name, an email or an LMS id. Until then ``grade``
        takes every student folder (and says so); from then on only the gradebook's students."""
        from nbgrader.api import Gradebook

        if not self.db.exists():
            return False
        try:
            added = set(self.added_file.read_text().split())
        except OSError:
            added = set()
        with Gradebook(f"sqlite:///{self.db}") as gb:
            return any(s.id not in added or s.first_name or s.last_name or s.email or s.lms_user_id
                       for s in gb.students)

    def stale_penalties(self) -> list[tuple[str, str]]:
        """:func:`stale_penalties` of this assignment."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.db}") as gb:
            return stale_penalties(gb, self.config, [self.assignment])


# -- the roster, whatever the assignment -----------------------------------------------------------


def roster(db: Path) -> list[str]:
    """The student ids of the gradebook at ``db``, sorted ([] when it does not exist yet)."""
    from nbgrader.api import Gradebook

    if not db.exists():
        return []
    with Gradebook(f"sqlite:///{db}") as gb:
        return sorted(s.id for s in gb.students)


def submission_state(sub: Any) -> str:
    """:meth:`Records.grades_state` of a submission of an open gradebook."""
    import hashlib

    rows: list[Any] = [str(sub.timestamp), str(sub.extension)]
    for nb in sorted(sub.notebooks, key=lambda n: n.name):
        rows.append((nb.name, nb.late_submission_penalty))
        rows += sorted((g.name, g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade)
                       for g in nb.grades)
        rows += sorted((c.name, c.auto_comment, c.manual_comment) for c in nb.comments)
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def submitted(sub: Any) -> bool:
    """Whether a gradebook submission is one the grader recorded (it has a time), not the empty entry that
    granting an extension makes for a student who has not submitted yet."""
    return sub.timestamp is not None


def course_assignments(gb: Any, names: list[str] | None = None) -> list[Any]:
    """The gradebook's assignments that belong to the course and were graded (``names``: only those), by name: a
    typo'd ``nbgrader db assignment add`` or an assignment nobody submitted is no column of any grades file."""
    known = set(course.assignments())
    return sorted((a for a in gb.assignments if a.name in known and (names is None or a.name in names)
                   and any(submitted(s) for s in a.submissions)), key=lambda a: a.name)


def stale_totals(gb: Any, workdir: Path, assignments: list[str] | None = None) -> list[tuple[str, str]]:
    """``(assignment, student)`` for every submission whose gradebook entries (scores, hand grades, comments, late
    penalty, extension, time) changed since its feedback and the grades files were last written (``grade`` or
    ``feedback``): a total an export would post that no other place shows. A submission the grader never wrote
    feedback for is not listed."""
    out = []
    for assignment in course_assignments(gb, assignments):
        states = workdir / "results" / assignment.name / "feedback_state"
        for sub in assignment.submissions:
            if not submitted(sub):
                continue
            try:
                recorded = (states / f"{sub.student.id}.txt").read_text().strip()
            except OSError:
                continue  # no feedback or grades file was ever written from it: nothing to disagree with
            if recorded != submission_state(sub):
                out.append((assignment.name, sub.student.id))
    return out


def stale_penalties(gb: Any, config: Any, assignments: list[str] | None = None) -> list[tuple[str, str]]:
    """``(assignment, "student (recorded -> right)")`` for every submission in the open gradebook ``gb`` whose
    recorded late penalty differs from the one the late-penalty plugin of ``config`` gives its current total
    (hand grades included). nbgrader recomputes a penalty only when ``AssignLatePenalties`` runs (``grade``,
    ``feedback``); a hand grade set in formgrader in between leaves the old one, and an export would then post
    a score no other place shows."""
    from nbgrader.preprocessors import AssignLatePenalties

    plugin = AssignLatePenalties(config=config).plugin_class(config=config)
    out = []
    for assignment in gb.assignments:
        if assignments is not None and assignment.name not in assignments:
            continue
        for sub in assignment.submissions:
            late = float(sub.total_seconds_late or 0)
            recorded = right = 0.0
            for nb in sub.notebooks:
                recorded += float(nb.late_submission_penalty or 0)
                if late > 0:
                    right += float(plugin.late_submission_penalty(sub.student.id, float(nb.score), late) or 0)
            if abs(recorded - right) > 1e-6:
                out.append((assignment.name, f"{sub.student.id} ({recorded:g} -> {right:g})"))
    return out


STALE_FIX = "python -m autograder feedback --assignment {}"


def stale_message(stale: list[tuple[str, str]], totals: list[tuple[str, str]] = ()) -> str:
    """What an export that refuses stale records says: whose late penalties no longer fit their totals, whose
    totals changed since the feedback and the grades files were written, and the command that fixes each
    assignment."""
    by: dict[str, list[str]] = {}
    for assignment, line in stale:
        by.setdefault(assignment, []).append(line)
    changed: dict[str, list[str]] = {}
    for assignment, student in totals:
        if not any(line.startswith(f"{student} (") for line in by.get(assignment, [])):
            changed.setdefault(assignment, []).append(student)
    said = []
    if by:
        said.append("late penalties are out of date (a total changed since they were assigned, for example a hand "
                    "grade in formgrader): " + "; ".join(f"{a}: {', '.join(v)}" for a, v in sorted(by.items())))
    if changed:
        said.append("grades changed since the feedback and the grades files were written (a hand grade, a comment, "
                    "an extension, a late penalty): " + "; ".join(f"{a}: {', '.join(v)}"
                                                                   for a, v in sorted(changed.items())))
    fix = sorted(set(by) | set(changed))
    return (". ".join(said) + ". Nothing was exported. Run " + " and ".join(f"`{STALE_FIX.format(a)}`" for a in fix) +
            " (it reassigns the penalties, renders the feedback and rewrites the grades files), then export again.")


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


def write_csv(path: Path, records: Records, results: dict[str, Result]) -> list[str]:
    """One row per student of ``results``, scores from the gradebook (after the late penalty, hand grades in),
    written through :func:`replace_grades`; returns what it said (changed scores, a kept old file)."""
    scores = records.final_scores()
    times = {s: records.submission_time(r) for s, r in results.items()}
    rows = [CSV_COLUMNS]
    for student in sorted(results):
        score, max_score, penalty = scores.get(student, (0.0, 0.0, 0.0))
        when = times[student]
        rows.append([csv_cell(student), csv_cell(records.assignment), f"{score:g}", f"{max_score:g}",
                     csv_cell(results[student].reason), f"{penalty:g}", when.text, csv_cell(when.source),
                     csv_cell("; ".join(when.flags))])
    return replace_grades(path, rows, ["student", "assignment"], "score")


def replace_grades(path: Path, rows: list[list[str]], key: list[str], score: str | None) -> list[str]:
    """Write ``rows`` (a header first) to the grades file ``path``; returns lines saying what changed.

    Every score that differs from the file being replaced is listed, old and new as the files show them. A
    file holding a row (``key`` columns) the new one lacks is never overwritten silently: it is kept beside
    it as ``NAME.previous-N.csv`` and the lost rows are named. Files are the instructor's alone (0600)."""
    header, new = rows[0], rows[1:]
    col = lambda r, names: tuple(r[header.index(k)] for k in names)  # noqa: E731
    old: dict[tuple, dict[str, str]] = {}
    try:
        with open(path, newline="") as f:
            old = {tuple(r.get(k, "") for k in key): r for r in csv.DictReader(f)}
    except (OSError, UnicodeDecodeError, csv.Error):
        old = {}
    said = []
    now = {col(r, key): r for r in new}
    lost = sorted(set(old) - set(now))
    if lost:
        n = 1
        while (keep := path.with_name(f"{path.stem}.previous-{n}{path.suffix}")).exists():
            n += 1
        path.replace(keep)
        said.append(f"{path.name}: {len(lost)} row(s) of the old file are not in the new one "
                    f"({', '.join('/'.join(k) for k in lost[:20])}{' ...' if len(lost) > 20 else ''}); "
                    f"the old file is kept as {keep}")
    if score is not None:
        moved = [(k, old[k].get(score, ""), r[header.index(score)]) for k, r in sorted(now.items())
                 if k in old and old[k].get(score, "") != r[header.index(score)]]
        if moved:
            said.append(f"{path.name}: {len(moved)} recorded score(s) changed:")
            said += [f"  {'/'.join(k)}: {a or '(none)'} -> {b or '(none)'}" for k, a, b in moved]
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    atomic_write(path, buf.getvalue(), mode=0o600)
    return said


def write_term(db: Path, path: Path) -> list[str]:
    """The term's grades from the gradebook at ``db``: one row per roster student, one column per assignment
    (score after the late penalty, "" where nothing was submitted) and the total; the first row, ``max_score``,
    holds each assignment's points. Returns what it said (see :func:`replace_grades`)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gb:
        assignments = course_assignments(gb)
        names = [a.name for a in assignments]
        scores: dict[str, dict[str, float]] = {s.id: {} for s in gb.students}
        for a in assignments:
            for sub in a.submissions:
                if not submitted(sub):
                    continue
                scores.setdefault(sub.student.id, {})[a.name] = max(
                    0.0, float(sub.score) - float(sub.late_submission_penalty or 0))
        maxima = [float(a.max_score) for a in assignments]
    rows = [["student", *names, "total"], ["max_score", *[f"{m:g}" for m in maxima], f"{sum(maxima):g}"]]
    for student in sorted(scores):
        got = scores[student]
        rows.append([csv_cell(student), *[f"{got[a]:g}" if a in got else "" for a in names],
                     f"{sum(got.values()):g}"])
    return replace_grades(path, rows, ["student"], None)  # each assignment's file lists its changed scores


__all__ = ["CSV_COLUMNS", "Records", "course_assignments", "replace_grades", "roster", "stale_message", "stale_penalties",
           "stale_totals", "submission_state", "submitted", "write_csv", "write_term"]
