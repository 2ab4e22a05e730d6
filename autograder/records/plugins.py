"""nbgrader plugins of the course: late penalties, LMS bulk downloads, the exports and the feedback.

All are configured in ``autograder/nbgrader_config.py`` and used by
nbgrader's own machinery:

* :class:`PercentPerDayLatePenalty` through ``AssignLatePenalties.plugin_class``
  (nbgrader's ``LateSubmissionPlugin`` offers only "none" or "zero");
* :class:`LmsFileNameCollector` through ``ZipCollectApp.collector_plugin``
  (``nbgrader zip_collect``), for Canvas's and Moodle's bulk-download names;
* :class:`CanvasExportPlugin` through ``nbgrader export --exporter
  autograder.records.plugins.CanvasExportPlugin --to canvas.csv``, and
  :class:`CheckedCsvExportPlugin` through ``ExportApp.plugin_class`` (plain ``nbgrader export``): both hold the
  course's graded assignments and the submissions only, refuse any stale total (a late penalty, a hand grade, an
  extension changed since the feedback and the CSVs were written) and neutralise formula-shaped cells;
* :class:`FeedbackGrades` through ``GenerateFeedback.preprocessors`` (``nbgrader
  generate_feedback`` and ``python -m autograder feedback``): the grades as nbgrader's
  ``GetGrades`` reads them, plus which ones still await a hand grade, and where the page finds the course's
  MathJax: one shared copy, ``attn-mathjax.js`` in the feedback folder (:func:`share_mathjax`), not one
  embedded in every page (:func:`mathjax_data` embeds it in formgrader's page).

Imports: nbgrader, :mod:`autograder.records.results` (``csv_cell``, ``is_number``),
:mod:`autograder.records.gradebook` (``submitted``; when an export runs, the staleness tests), and, when an export
runs, :mod:`autograder.course` (the course's assignments).
"""

from __future__ import annotations

import base64
import csv
import functools
import gzip
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import CsvExportPlugin, ExportPlugin, FileNameCollectorPlugin, LateSubmissionPlugin
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbgrader.preprocessors import GetGrades
from traitlets import Bool, Dict, Float, List, Unicode

from autograder.records.gradebook import submitted
from autograder.records.results import csv_cell, is_number

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
# (user id, then submission id; "-N" when the student uploaded the file again; "LATE" when Canvas found it late).
CANVAS = re.compile(r"^[^_/]+_(?P<late>late_)?(?P<student_id>\d+)_\d+_(?P<file_id>.+?)(?:-\d+)?(?P<ext>\.[A-Za-z0-9]+)$",
                    re.IGNORECASE)
# Moodle: "Jane Doe_4321_assignsubmission_file_/single_head.ipynb" (a folder per student) or the same
# without the slash (flat download); the number is the participant id.
MOODLE = re.compile(r"^[^/]+?_(?P<student_id>\d+)_assignsubmission_file_/?(?P<file_id>[^/]+?)(?P<ext>\.[A-Za-z0-9]+)$")
SOURCES = {"canvas": "Canvas download", "moodle": "Moodle download"}


class LmsFileNameCollector(FileNameCollectorPlugin):
    """Read the student and the notebook from the file names of a Canvas or Moodle bulk download.

    The number in the file name is the LMS's user (Canvas) or participant (Moodle) id: it is
    looked up in the roster's ``lms_user_id`` (``nbgrader db student import roster.csv``) and the
    file is filed under that student's roster id. An id that is not in the roster is listed
    (console and ``GRADING/collected/<assignment>/unknown.json``) and its files are skipped, never
    filed under an invented student; with ``require_roster = False`` and an empty roster the LMS
    id is used as the student id.

    The submission's time is the zip entry's (read in ``zip_timezone``), the collector's time,
    which ``zip_collect`` writes to ``timestamp.txt``; it, Canvas's ``_LATE_`` marker and the LMS
    id go to ``GRADING/collected/<assignment>/<student>.json`` (``GRADING`` is the gradebook's
    folder), where the grader reads them (:mod:`autograder.records.collector`).
    """

    lms = List(["canvas", "moodle"], help="download formats tried, in order").tag(config=True)
    zip_timezone = Unicode("UTC", help="time zone of the zip entries' times (the LMS server's)").tag(config=True)
    require_roster = Bool(True, help="skip files whose LMS id is not a roster's lms_user_id").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._roster: dict[str, str] | None = None
        self._times: dict[str, Any] | None = None
        self._seen: dict[str, dict[str, Any]] = {}
        self._unknown: dict[str, list[str]] = {}

    # -- where things are --------------------------------------------------------------------------

    def _coursedir(self) -> Any:
        return getattr(self.parent, "coursedir", None)

    def _collected(self) -> Path | None:
        coursedir = self._coursedir()
        if coursedir is None or not str(coursedir.db_url).startswith("sqlite:///"):
            return None
        return Path(str(coursedir.db_url)[len("sqlite:///"):]).parent / "collected" / coursedir.assignment_id

    def roster(self) -> dict[str, str]:
        """``lms_user_id -> roster id`` from the course's gradebook."""
        if self._roster is None:
            self._roster = {}
            coursedir = self._coursedir()
            if coursedir is not None:
                with Gradebook(coursedir.db_url) as gb:
                    self._roster = {str(s.lms_user_id): s.id for s in gb.students if s.lms_user_id}
        return self._roster

    def entry_times(self) -> dict[str, Any]:
        """Zip entry name (and its base name) -> the entry's time as naive UTC, for every archive downloaded."""
        if self._times is None:
            import datetime as dt
            import zipfile

            import dateutil.tz

            self._times = {}
            tz = dateutil.tz.gettz(self.zip_timezone)
            coursedir = self._coursedir()
            archive = Path(self.parent._format_collect_path(self.parent.archive_directory)) if coursedir else None
            for path in sorted(archive.rglob("*.zip")) if archive and archive.is_dir() else []:
                try:
                    with zipfile.ZipFile(path) as z:
                        for info in z.infolist():
                            local = dt.datetime(*info.date_time, tzinfo=tz)
                            utc = local.astimezone(dt.timezone.utc).replace(tzinfo=None)
                            self._times[info.filename] = utc
                            self._times.setdefault(os.path.basename(info.filename), utc)
                except (OSError, zipfile.BadZipFile) as e:
                    self.log.warning("could not read the entry times of %s: %s", path, e)
        return self._times

    # -- the plugin --------------------------------------------------------------------------------

    def collect(self, submitted_file: str) -> dict[str, Any] | None:
        parent, name = os.path.split(submitted_file)
        if os.path.splitext(name)[1] not in self.valid_ext:
            return None
        candidates = {"canvas": (CANVAS, name), "moodle": (MOODLE, f"{os.path.basename(parent)}/{name}")}
        for lms in self.lms:
            pattern, text = candidates[lms]
            m = pattern.match(text) or (pattern.match(name) if lms == "moodle" else None)
            if m:
                break
        else:
            self.log.warning("not a Canvas or Moodle submission file name: %s", name)
            return None
        lms_id = m["student_id"]
        roster = self.roster()
        student = roster.get(lms_id) or (lms_id if not roster and not self.require_roster else None)
        if student is None:
            self._unknown.setdefault(lms_id, []).append(name)
            self.log.warning("LMS id %s (%s) is not the lms_user_id of any student in the roster: skipped. "
                             "Import the roster first: nbgrader db student import roster.csv", lms_id, name)
            self._write("unknown", {"lms_user_ids": self._unknown})
            return None
        when = self.entry_times().get(f"{os.path.basename(parent)}/{name}") or self.entry_times().get(name)
        late = bool(m.groupdict().get("late"))
        record = self._seen.setdefault(student, {"source": SOURCES[lms], "lms_user_id": lms_id, "time": None,
                                                 "late_marker": False, "files": []})
        record["files"].append(text if lms == "moodle" and "/" in text and pattern.match(text) else name)
        record["late_marker"] = record["late_marker"] or late
        if when is not None and (record["time"] is None or when.isoformat() > record["time"]):
            record["time"] = when.isoformat()
        self._write(student, record)
        info = {"student_id": student, "file_id": m["file_id"] + m["ext"]}
        if when is not None:
            info["timestamp"] = when.isoformat(" ") + "+00:00"
        return info

    def _write(self, name: str, data: dict[str, Any]) -> None:
        folder = self._collected()
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(data, indent=1))


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
        refuse_stale(self, gradebook, self.assignment or None)
        dest = self.to or "canvas_grades.csv"
        assignments = exported_assignments(self, gradebook)
        students = [s for s in gradebook.students if not self.student or s.id in self.student]
        self.log.info("Exporting grades for Canvas to %s", dest)
        with open(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", newline="") as f:
            os.chmod(dest, 0o600)  # grades: the instructor's alone
            writer = csv.writer(f)
            writer.writerow(self.HEADER + [csv_cell(self.assignment_columns.get(a.name, a.name))
                                           for a in assignments])
            writer.writerow(["Points Possible", "", "", "", ""] + [f"{a.max_score:g}" for a in assignments])
            for student in students:
                name = ", ".join(p for p in (student.last_name, student.first_name) if p) or student.id
                row = [csv_cell(v) for v in (name, student.lms_user_id or student.id, "", student.id, self.section)]
                for a in assignments:
                    try:
                        sub = gradebook.find_submission(a.name, student.id)
                    except MissingEntry:
                        sub = None
                    if sub is None or not submitted(sub):  # nothing submitted: an empty cell, never a 0
                        row.append("")
                        continue
                    row.append(f"{max(0.0, sub.score - (sub.late_submission_penalty or 0.0)):g}")
                writer.writerow(row)


class CheckedCsvExportPlugin(CsvExportPlugin):
    """nbgrader's plain CSV export (``nbgrader export --to FILE``, the course's default exporter), refusing late
    penalties that are out of date (:func:`refuse_stale`), with every text cell a spreadsheet would run as a
    formula neutralised (:func:`autograder.records.results.csv_cell`) and the file readable by its owner only."""

    def export(self, gradebook: Gradebook) -> None:
        refuse_stale(self, gradebook, self.assignment or None)
        chosen = exported_assignments(self, gradebook)
        names = [a.name for a in chosen]
        if not names:
            self.log.error("no graded assignment of the course to export: nothing was exported")
            raise SystemExit(1)
        wanted = self.assignment
        self.assignment = names  # the course's graded assignments only
        try:
            super().export(gradebook)
        finally:
            self.assignment = wanted
        pairs = {(a.name, sub.student.id) for a in chosen for sub in a.submissions if submitted(sub)}
        dest = self.to or "grades.csv"
        with open(dest, newline="") as f:
            rows = list(csv.reader(f))
        # nbgrader writes a 0 for every student without a submission: only submissions are exported
        rows = rows[:1] + [r for r in rows[1:] if len(r) > 3 and (r[0], r[3]) in pairs]
        with open(os.open(dest, os.O_WRONLY | os.O_TRUNC, 0o600), "w", newline="") as f:
            os.chmod(dest, 0o600)
            csv.writer(f).writerows([[cell if is_number(cell) else csv_cell(cell) for cell in row] for row in rows])


def exported_assignments(plugin: ExportPlugin, gradebook: Gradebook) -> list[Any]:
    """The assignments an export holds: the course's graded ones (``--assignment``: only those), saying which
    of the gradebook's are left out (a typo'd ``nbgrader db assignment add`` is no column)."""
    from autograder import course
    from autograder.records.gradebook import course_assignments

    chosen = course_assignments(gradebook, list(plugin.assignment) or None)
    names = {a.name for a in chosen}
    others = sorted(a.name for a in gradebook.assignments if a.name not in course.assignments())
    if others:
        plugin.log.warning("not exported: %s (not an assignment of the course; remove it with `nbgrader db "
                           "assignment remove NAME`)", ", ".join(others))
    asked = sorted(set(plugin.assignment) - names)
    if asked:
        plugin.log.warning("not exported: %s (no graded submission of an assignment of the course)", ", ".join(asked))
    return chosen


def refuse_stale(plugin: ExportPlugin, gradebook: Gradebook, assignments: list[str] | None) -> None:
    """Stop an export (exit 1, nothing written) when a recorded late penalty no longer fits its total
    (:func:`autograder.records.gradebook.stale_penalties`) or a submission's grades changed since its feedback
    and the grades files were written (:func:`autograder.records.gradebook.stale_totals`: a hand grade, an
    extension, a penalty), naming the students and the command that fixes them."""
    from autograder.records.gradebook import stale_message, stale_penalties, stale_totals

    stale = stale_penalties(gradebook, plugin.config, assignments)
    database = gradebook.engine.url.database
    totals = stale_totals(gradebook, Path(database).resolve().parent, assignments) if database else []
    if stale or totals:
        plugin.log.error(stale_message(stale, totals))
        raise SystemExit(1)


MATHJAX = Path(__file__).resolve().parents[2] / "_vendor" / "mathjax" / "tex-svg.js"  # `make install`


@functools.cache
def embedded_mathjax() -> str:
    """The course's MathJax (SVG output: no font files to fetch), gzipped and base64-encoded for the feedback
    page to unpack in the browser; "" when ``_vendor/mathjax`` is missing (then nbconvert's CDN copy is used)."""
    try:
        return base64.b64encode(gzip.compress(MATHJAX.read_bytes(), 9, mtime=0)).decode("ascii")
    except OSError:
        return ""


SHARED_MATHJAX = "attn-mathjax.js"  # the feedback pages' MathJax, one copy per feedback tree and per LMS zip


@functools.cache
def shared_mathjax() -> dict[str, str]:
    """What a feedback page needs to load the course's MathJax from a shared copy (``attn/attn_mathjax.html.j2``,
    ``attn_mathjax_shared``): the copy's file name, and the same file on the npm CDN with its Subresource
    Integrity hash (the browser runs it only if its bytes are the course's); {} without ``_vendor/mathjax``."""
    try:
        data = MATHJAX.read_bytes()
    except OSError:
        return {}
    m = re.search(rb'VERSION="(\d+\.\d+\.\d+)"', data)
    return {"file": SHARED_MATHJAX,
            "cdn": f"https://cdn.jsdelivr.net/npm/mathjax@{m[1].decode()}/es5/{MATHJAX.name}" if m else "",
            "integrity": "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode("ascii")}


def share_mathjax(folder: Path) -> Path | None:
    """Write the course's MathJax to ``folder/attn-mathjax.js`` (0644), unless the same bytes are there: the copy
    the feedback pages below it load (``../../attn-mathjax.js`` from ``<student>/<assignment>/``). ``None``
    without ``_vendor/mathjax`` or when it cannot be written (the pages then fall back to the CDN, else show
    their TeX with a note)."""
    try:
        data = MATHJAX.read_bytes()
        dest = folder / SHARED_MATHJAX
        if dest.is_symlink() or dest.is_dir():
            return None
        if not (dest.is_file() and dest.stat().st_size == len(data) and dest.read_bytes() == data):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{SHARED_MATHJAX}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, dest)
        elif dest.stat().st_mode & 0o777 != 0o644:
            dest.chmod(0o644)
        return dest
    except OSError:
        return None


def mathjax_data(_: object = "") -> str:
    """The template filter ``attn_mathjax_data``: :func:`embedded_mathjax`, for pages rendered without the
    feedback's preprocessor (formgrader's submission page)."""
    return embedded_mathjax()


class FeedbackGrades(GetGrades):
    """nbgrader's ``GetGrades`` for the feedback page, plus: a grade neither the judge nor an instructor has
    given is marked ``awaiting`` (the page says "awaiting a hand grade", not "Score: 0"), the notebook's
    awaiting points are in ``resources["nbgrader"]["awaiting"]``, and where the page loads the course's MathJax
    from is in ``resources["attn_mathjax_shared"]`` (:func:`shared_mathjax`), the shared copy written at the
    top of the feedback folder (:func:`share_mathjax`; whichever door renders the page: ``grade``,
    ``feedback``, ``nbgrader generate_feedback``)."""

    def preprocess(self, nb: Any, resources: Any) -> Any:
        from nbgrader.coursedir import CourseDirectory

        resources["nbgrader"]["awaiting"] = 0.0
        resources["attn_mathjax_shared"] = shared_mathjax()
        if resources["attn_mathjax_shared"]:
            coursedir = CourseDirectory(config=self.config)
            _share_once(str(Path(coursedir.root) / coursedir.feedback_directory))
        return super().preprocess(nb, resources)

    def _get_score(self, cell: Any, resources: Any) -> None:
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        awaiting = grade.auto_score is None and grade.manual_score is None
        cell.metadata.nbgrader["awaiting"] = awaiting
        if awaiting:
            resources["nbgrader"]["awaiting"] += float(grade.max_score or 0)


_shared: set[str] = set()


def _share_once(folder: str) -> None:
    """:func:`share_mathjax` once per feedback folder and process (a run renders many pages), again if the copy
    has gone since."""
    if folder in _shared and (Path(folder) / SHARED_MATHJAX).is_file():
        return
    if share_mathjax(Path(folder)):
        _shared.add(folder)


class FeedbackHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter for the feedback pages, without its BeautifulSoup pass over the finished page.

    That pass (``HTMLExporter.from_notebook_node``) parses the whole page again to give images without alt
    text a placeholder and to make JupyterLab-styled cells focusable; it was more than half of what a
    feedback page cost (``benchmarks/grading_throughput.py``). The feedback template is the classic one (no
    JupyterLab cells to make focusable), and the placeholder alt text is added here with one pattern.
    Everything else, sanitising included, is the parent's."""

    def from_notebook_node(self, nb: Any, resources: dict | None = None, **kw: Any) -> tuple[str, dict]:
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        self.register_filter("highlight_code",
                             self.filters.get("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type",
                             WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata, parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return _IMG_WITHOUT_ALT.sub('<img alt="No description has been provided for this image"', html), resources


_IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")


__all__ = ["CanvasExportPlugin", "CheckedCsvExportPlugin", "FeedbackGrades", "FeedbackHTMLExporter", "LmsFileNameCollector", "PercentPerDayLatePenalty",
           "SHARED_MATHJAX", "embedded_mathjax", "mathjax_data", "share_mathjax", "shared_mathjax"]
