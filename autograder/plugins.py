"""nbgrader plugins of the course: late penalties, LMS bulk downloads and the Canvas export.

All three are configured in ``autograder/nbgrader_config.py`` and used by
nbgrader's own machinery:

* :class:`PercentPerDayLatePenalty` through ``AssignLatePenalties.plugin_class``
  (nbgrader's ``LateSubmissionPlugin`` offers only "none" or "zero");
* :class:`LmsFileNameCollector` through ``ZipCollectApp.collector_plugin``
  (``nbgrader zip_collect``), for Canvas's and Moodle's bulk-download names;
* :class:`CanvasExportPlugin` through ``nbgrader export --exporter
  autograder.plugins.CanvasExportPlugin --to canvas.csv``;
* :class:`FeedbackGrades` through ``GenerateFeedback.preprocessors`` (``nbgrader
  generate_feedback`` and ``python -m autograder feedback``): the grades as nbgrader's
  ``GetGrades`` reads them, plus which ones still await a hand grade, and the course's
  MathJax for the page.

Imports: nbgrader only.
"""

from __future__ import annotations

import base64
import csv
import functools
import gzip
import math
import os
import re
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin, FileNameCollectorPlugin, LateSubmissionPlugin
from nbgrader.preprocessors import GetGrades
from traitlets import Dict, Float, List, Unicode

DAY = 86400.0


class PercentPerDayLatePenalty(LateSubmissionPlugin):
    """Take ``percent_per_day`` of a notebook's score for each day (or part of one) past the due date,
    after ``grace_minutes``, and at most ``max_percent``. The due date includes the student's extension."""

    percent_per_day = Float(10.0, help="percent of the score taken per day late (a part of a day counts whole)").tag(config=True)
    max_percent = Float(100.0, help="largest penalty, in percent of the score").tag(config=True)
    grace_minutes = Float(0.0, help="minutes after the due date that cost nothing").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float | None:
        late = total_seconds_late - 60.0 * self.grace_minutes
        if late <= 0:
            return None
        percent = min(self.max_percent, self.percent_per_day * math.ceil(late / DAY))
        return score * percent / 100.0


# Canvas: "doejane_12345_678901_single_head.ipynb", "doejane_LATE_12345_678901_single_head-1.ipynb"
# (user id, then submission id; "-N" when the student uploaded the file again).
CANVAS = re.compile(r"^[^_/]+_(?:late_)?(?P<student_id>\d+)_\d+_(?P<file_id>.+?)(?:-\d+)?(?P<ext>\.[A-Za-z0-9]+)$",
                    re.IGNORECASE)
# Moodle: "Jane Doe_4321_assignsubmission_file_/single_head.ipynb" (a folder per student) or the same
# without the slash (flat download); the number is the participant id.
MOODLE = re.compile(r"^[^/]+?_(?P<student_id>\d+)_assignsubmission_file_/?(?P<file_id>[^/]+?)(?P<ext>\.[A-Za-z0-9]+)$")


class LmsFileNameCollector(FileNameCollectorPlugin):
    """Read the student and the notebook from the file names of a Canvas or Moodle bulk download.

    The student id is the LMS's numeric user (Canvas) or participant (Moodle) id;
    import the roster with the same ids (``nbgrader db student import``, column
    ``id``, and ``lms_user_id`` for the export).
    """

    lms = List(["canvas", "moodle"], help="download formats tried, in order").tag(config=True)

    def collect(self, submitted_file: str) -> dict[str, Any] | None:
        parent, name = os.path.split(submitted_file)
        if os.path.splitext(name)[1] not in self.valid_ext:
            return None
        candidates = {"canvas": (CANVAS, name), "moodle": (MOODLE, f"{os.path.basename(parent)}/{name}")}
        for lms in self.lms:
            pattern, text = candidates[lms]
            m = pattern.match(text) or (pattern.match(name) if lms == "moodle" else None)
            if m:
                return {"student_id": m["student_id"], "file_id": m["file_id"] + m["ext"]}
        self.log.warning("not a Canvas or Moodle submission file name: %s", name)
        return None


class CanvasExportPlugin(ExportPlugin):
    """Grades as a CSV that Canvas's gradebook imports.

    Columns: ``Student, ID, SIS User ID, SIS Login ID, Section`` then one per
    assignment, headed with its Canvas name (``assignment_columns`` maps an
    nbgrader assignment to an existing Canvas column such as ``"Attention 1
    (4321)"``; by default the nbgrader name, which Canvas adds as a new
    assignment). The second row is ``Points Possible``. ``ID`` is the student's
    ``lms_user_id`` (from the roster) or, when that is empty, the nbgrader id;
    ``SIS Login ID`` is the nbgrader id. Scores are after the late penalty;
    a missing submission is left empty (Canvas then changes nothing).
    """

    assignment_columns = Dict({}, help="nbgrader assignment -> Canvas gradebook column heading").tag(config=True)
    section = Unicode("", help="the Section column's value").tag(config=True)

    HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "canvas_grades.csv"
        assignments = [a for a in gradebook.assignments if not self.assignment or a.name in self.assignment]
        students = [s for s in gradebook.students if not self.student or s.id in self.student]
        self.log.info("Exporting grades for Canvas to %s", dest)
        with open(dest, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.HEADER + [self.assignment_columns.get(a.name, a.name) for a in assignments])
            writer.writerow(["Points Possible", "", "", "", ""] + [f"{a.max_score:g}" for a in assignments])
            for student in students:
                name = ", ".join(p for p in (student.last_name, student.first_name) if p) or student.id
                row = [name, student.lms_user_id or student.id, "", student.id, self.section]
                for a in assignments:
                    try:
                        sub = gradebook.find_submission(a.name, student.id)
                    except MissingEntry:
                        row.append("")
                        continue
                    row.append(f"{max(0.0, sub.score - (sub.late_submission_penalty or 0.0)):g}")
                writer.writerow(row)


MATHJAX = Path(__file__).resolve().parent.parent / "_vendor" / "mathjax" / "tex-svg.js"  # `make install`


@functools.cache
def embedded_mathjax() -> str:
    """The course's MathJax (SVG output: no font files to fetch), gzipped and base64-encoded for the feedback
    page to unpack in the browser; "" when ``_vendor/mathjax`` is missing (then nbconvert's CDN copy is used)."""
    try:
        return base64.b64encode(gzip.compress(MATHJAX.read_bytes(), 9, mtime=0)).decode("ascii")
    except OSError:
        return ""


class FeedbackGrades(GetGrades):
    """nbgrader's ``GetGrades`` for the feedback page, plus: a grade neither the judge nor an instructor has
    given is marked ``awaiting`` (the page says "awaiting a hand grade", not "Score: 0"), the notebook's
    awaiting points are in ``resources["nbgrader"]["awaiting"]``, and the course's MathJax is in
    ``resources["attn_mathjax"]``."""

    def preprocess(self, nb: Any, resources: Any) -> Any:
        resources["nbgrader"]["awaiting"] = 0.0
        resources["attn_mathjax"] = embedded_mathjax()
        return super().preprocess(nb, resources)

    def _get_score(self, cell: Any, resources: Any) -> None:
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        awaiting = grade.auto_score is None and grade.manual_score is None
        cell.metadata.nbgrader["awaiting"] = awaiting
        if awaiting:
            resources["nbgrader"]["awaiting"] += float(grade.max_score or 0)


__all__ = ["CanvasExportPlugin", "FeedbackGrades", "LmsFileNameCollector", "PercentPerDayLatePenalty",
           "embedded_mathjax"]
