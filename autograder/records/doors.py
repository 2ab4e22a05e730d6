"""nbgrader's own doors (formgrader, ``nbgrader autograde``) kept in agreement with the grader.

Instructors use nbgrader's pages and commands beside ``python -m autograder``. Left as nbgrader ships them,
they disagree with the grader in three ways, which :func:`install` (called by ``autograder/nbgrader_config.py``,
so in every process that reads the course's configuration, formgrader's server included: it reads the file
again on every request) puts right:

* **nbgrader's autograde is refused.** It runs the student's code in the instructor's own process, outside
  the sandbox, and re-creates any student it meets in the gradebook (a removed one too). Formgrader's
  autograde button and ``nbgrader autograde`` both build nbgrader's ``Autograde`` converter, whose exporter
  is :class:`AutogradeRefused`: it stops the run before any notebook is read or any record is written, and
  its message (shown in formgrader's error box) names the command that grades in the sandbox.
* **Formgrader lists the gradebook's students only.** nbgrader's API lists every folder of ``submitted/``,
  so a removed student (``python -m autograder remove-student``), a typo'd folder or one the roster skips
  came back as a "None, None" student needing autograding. The roster is the truth, here as in ``grade``.
* **Work the grader graded looks graded.** nbgrader's API calls a submission autograded only when the
  gradebook's time equals the submitted folder's ``timestamp.txt``; the grader records the collector's
  time (the exchange's, the LMS download's), which never equals the student's ``timestamp.txt``, so every
  exchange-collected submission read "needs autograding". A submission also counts as autograded when the
  grader's result for it was made from the ``timestamp.txt`` the submitted folder holds now and its
  autograded folder's ``timestamp.txt`` is the gradebook's time (the grader writes both); a re-submission
  collected since (a new ``timestamp.txt``) still reads "needs autograding".

Imports: :mod:`autograder.records.results` (reading a result). Third party: nbgrader, nbconvert.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nbconvert.exporters import NotebookExporter

REFUSED = ("nbgrader's autograde is turned off for this course: it would run the student's code in this process, "
           "outside the grader's sandbox, with your files and the network in reach. Grade in the sandbox from the "
           "course root instead:\n    .venv/bin/python -m autograder grade grading/submitted --assignment {assignment}\n"
           "(the students already graded are kept; new and re-collected submissions are graded), then reload "
           "formgrader: it shows the grader's scores.")


class AutogradeRefused(NotebookExporter):
    """The exporter of nbgrader's ``Autograde`` (``c.Autograde.exporter_class``): made before any submission
    is converted, it refuses, so nothing of the student's runs and nothing is recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        parent = kwargs.get("parent")
        coursedir = getattr(parent, "coursedir", None)
        assignment = getattr(coursedir, "assignment_id", "") or "ASSIGNMENT"
        message = REFUSED.format(assignment=assignment if assignment != "*" else "ASSIGNMENT")
        log = getattr(parent, "log", None)
        if log is not None:
            log.error(message)
        from nbgrader.converters.base import NbGraderException  # nbgrader reports it as a failed run, with the log

        raise NbGraderException(message)


def install(c: Any) -> None:
    """Configure ``c`` (the course's nbgrader config) and nbgrader's API as the module's docstring says."""
    c.Autograde.exporter_class = f"{__name__}.AutogradeRefused"
    _patch_api()


def _patch_api() -> None:
    from nbgrader.apps import api as nbapi

    cls = nbapi.NbGraderAPI
    if getattr(cls, "_attn_doors", False):
        return
    listed, autograded = cls.get_submitted_students, cls.get_autograded_students

    def get_submitted_students(self: Any, assignment_id: str) -> set[str]:
        """nbgrader's list (folders of ``submitted/``), less every student who is not in the gradebook."""
        with self.gradebook as gb:
            roster = {s.id for s in gb.students}
        return {s for s in listed(self, assignment_id) if s in roster}

    def get_autograded_students(self: Any, assignment_id: str) -> set[str]:
        """nbgrader's list, plus the submissions the course's grader graded (see the module's docstring)."""
        done = set(autograded(self, assignment_id))
        with self.gradebook as gb:
            times = {sub.student.id: sub.timestamp for sub in gb.find_assignment(assignment_id).submissions} \
                if _has_assignment(gb, assignment_id) else {}
        for student, when in times.items():
            if student not in done and graded_by_the_grader(self, assignment_id, student, when):
                done.add(student)
        return done

    cls.get_submitted_students = get_submitted_students
    cls.get_autograded_students = get_autograded_students
    cls._attn_doors = True


def _has_assignment(gb: Any, assignment_id: str) -> bool:
    from nbgrader.api import MissingEntry

    try:
        gb.find_assignment(assignment_id)
    except MissingEntry:
        return False
    return True


def graded_by_the_grader(api: Any, assignment_id: str, student: str, recorded: Any) -> bool:
    """True when the course's grader graded the submission ``submitted/`` holds now: its result was made from
    the same ``timestamp.txt`` (or from none, where there is none), and the autograded folder's
    ``timestamp.txt`` is ``recorded``, the gradebook's time."""
    from nbgrader.utils import parse_utc

    from autograder.records.results import load_result

    coursedir = api.coursedir
    autograded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment_id))
    submitted = Path(coursedir.format_path(coursedir.submitted_directory, student, assignment_id))
    db_url = str(coursedir.db_url)
    if recorded is None or not db_url.startswith("sqlite:///") or not autograded.is_dir():
        return False
    results = Path(db_url.removeprefix("sqlite:///")).parent / "results" / assignment_id
    result = load_result(results / f"{student}.json", student)
    if result is None:
        return False
    try:
        if parse_utc(_text(autograded / "timestamp.txt")) != recorded:
            return False
    except (ValueError, TypeError, OverflowError):
        return False
    return _text(submitted / "timestamp.txt").strip() == result.timestamp.strip()


def _text(path: Path, limit: int = 4096) -> str:
    """A small text file's content, or "" (missing, a link, too big, unreadable)."""
    try:
        if path.is_symlink() or not path.is_file() or os.path.getsize(path) > limit:
            return ""
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


__all__ = ["AutogradeRefused", "REFUSED", "graded_by_the_grader", "install"]
