"""The autograded notebooks and the students' feedback, in nbgrader's own layout.

For each student the grader writes ``WORKDIR/autograded/<student>/<assignment>/``
as nbgrader's ``autograde`` would: each notebook (the released one with the
student's answers, written answers and added cells put back, and the judge's
verdict as the output of each test cell), ``timestamp.txt`` and
``submission_secret.txt``. The feedback is then rendered by nbgrader's own
``generate_feedback`` from that folder and the gradebook, so it shows manual
grades, comments and late penalties, and ``nbgrader release_feedback`` finds
every file it expects (files 0644).

Hidden tests never appear: the cells come from the released notebook. Students' markdown
(written answers, cells they added) is made inert with :func:`autograder.records.written.clean_markdown`
before it is written, so formgrader and the feedback page show it as text; the feedback
template (``autograder/records/templates/feedback``) cleans the rendered HTML once more.

Imports: :mod:`autograder.course`, :mod:`autograder.notebook`, :mod:`autograder.records.results`,
:mod:`autograder.records.written`.
"""

from __future__ import annotations

import datetime
import io
import secrets
from pathlib import Path
from typing import Any

from autograder import course
from autograder.notebook import nbgrader_meta
from autograder.records.results import Result, atomic_write, escape_markdown, total
from autograder.records.written import clean_markdown, is_manual

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # nbgrader's timestamp.txt


def autograded_notebook(result: Result, notebook: int) -> str:
    """The released notebook with the student's answers and, under each test cell, the judge's verdict."""
    import nbformat

    nb = result.notebooks[notebook]
    book = nbformat.read(str(course.RELEASE / result.assignment / f"{nb.notebook}.ipynb"), as_version=4)
    tests = {t.grade_id: t for t in nb.tests}
    cells = result.cells.get(nb.notebook)
    written = cells.written if cells else {}
    added: dict[str, list[Any]] = {}
    unanswered = set(cells.unanswered) if cells else set()
    for after, kind, source in (cells.added if cells else []):  # the student's markdown is made inert
        new = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(
            clean_markdown(source))
        added.setdefault(after, []).append(new)
    out = list(added.get("", []))
    for cell in book.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if gid in written and is_manual(cell):
            cell.source = clean_markdown(written[gid]) if cell.cell_type == "markdown" else written[gid]
        if gid in unanswered:
            cell.metadata["attn_unanswered"] = True  # the feedback page says "unanswered"
        elif meta.get("solution") and gid in nb.answers:
            cell.source = nb.answers[gid]
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if gid in tests:
            t = tests[gid]
            # The verdict is the judge's for this whole test cell (its visible tests and the hidden checks):
            # say so, rather than set a hidden check's description under a visible test that reads otherwise.
            head = (f"Grader's verdict for {gid} (this cell's tests and the grader's hidden checks): "
                    f"{min(t.points, t.max_points):g} / {t.max_points:g} points\nChecked: {t.description}")
            if t.message:
                cell.outputs = [nbformat.v4.new_output("error", ename="Failed", evalue=t.message,
                                                       traceback=[head, "Failed: " + t.message])]
            else:
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=head + "\npassed\n")]
        out.append(cell)
        out.extend(added.get(gid, []) if gid else [])
    book.cells = out
    score, max_score = total(nb.tests)
    summary = [f"**Autograded**: {score:g} / {max_score:g} points."]
    if result.reason:
        # The reason quotes student-controlled text (file names): literal in the markdown, so formgrader (which
        # renders this cell) shows it as text, never as a link or HTML.
        summary.append(f"\n\n**Note**: {escape_markdown(result.reason)}")
    book.cells.insert(0, nbformat.v4.new_markdown_cell("".join(summary)))
    buf = io.StringIO()
    nbformat.write(book, buf)
    return buf.getvalue()


def write_autograded(workdir: Path, result: Result, submission: Path, stamp: str = "") -> Path:
    """Write the student's autograded folder (notebooks, ``timestamp.txt``, ``submission_secret.txt``).

    ``timestamp.txt`` is ``stamp``, the time recorded in the gradebook
    (:meth:`autograder.records.gradebook.Records.submission_time`: the collector's), so the two
    records agree; without one, the submission's own, else the time its newest notebook was written. ``submission_secret.txt`` is the submission's own
    (nbgrader's ``collect`` copies it) or a fresh random one.
    """
    folder = workdir / "autograded" / result.student / result.assignment
    for i, nb in enumerate(result.notebooks):
        atomic_write(folder / f"{nb.notebook}.ipynb", autograded_notebook(result, i))
    stamp = stamp or result.timestamp
    if not stamp:
        times = [p.stat().st_mtime for p in _notebooks(submission)]
        moment = datetime.datetime.fromtimestamp(max(times), datetime.timezone.utc) if times else \
            datetime.datetime.now(datetime.timezone.utc)
        stamp = moment.strftime(TIMESTAMP_FORMAT)
    atomic_write(folder / "timestamp.txt", stamp)
    secret = _read_small(submission / "submission_secret.txt") if not submission.is_symlink() else ""
    if not (folder / "submission_secret.txt").exists() or secret:
        atomic_write(folder / "submission_secret.txt", secret or secrets.token_hex(16))
    return folder


def _notebooks(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file() and not p.is_symlink()]
    except OSError:
        return []


def _read_small(path: Path, limit: int = 4096) -> str:
    """The text of a small file the student's folder may hold, or "" (missing, a link, too big, not text)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > limit:
            return ""
        return path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def generate_feedback(config: Any, assignment: str, students: list[str]) -> dict[str, str]:
    """Render the feedback of ``students`` with ``nbgrader generate_feedback``: student -> "" or the error.

    Several students are rendered in one run of nbgrader's converter (its set-up, the template and the
    exporter, costs about as much as rendering a page), the other students of the autograded folder
    excluded; if that run fails, each student is rendered alone, so that an error is told to its owner
    and costs nobody else their page."""
    from nbgrader.apps import NbGraderAPI

    students = sorted(set(students))
    if not students:
        return {}
    feedback_root = Path(config.CourseDirectory.feedback_directory)
    if len(students) > 1:
        autograded = Path(config.CourseDirectory.autograded_directory)
        others = sorted({p.name for p in autograded.iterdir() if p.is_dir()} - set(students)) \
            if autograded.is_dir() else []
        api = NbGraderAPI(config=config)
        with _excluding(api, others):
            result = api.generate_feedback(assignment, None, force=True)
        if result["success"]:
            return {s: _settle(feedback_root / s / assignment) for s in students}
    out = {}
    for student in students:
        result = NbGraderAPI(config=config).generate_feedback(assignment, student, force=True)
        out[student] = "" if result["success"] else \
            (result.get("error") or result.get("log") or "nbgrader generate_feedback failed").strip()[-500:]
        if not out[student]:
            out[student] = _settle(feedback_root / student / assignment)
    return out


class _excluding:
    """nbgrader's ``CourseDirectory.student_id_exclude`` set to ``students`` for the duration."""

    def __init__(self, api: Any, students: list[str]) -> None:
        self.coursedir, self.value = api.coursedir, ",".join(students)

    def __enter__(self) -> None:
        self.saved = self.coursedir.student_id_exclude
        self.coursedir.student_id_exclude = self.value

    def __exit__(self, *exc: object) -> None:
        self.coursedir.student_id_exclude = self.saved


def _settle(feedback: Path) -> str:
    """The rendered page's files made readable (nbgrader sets 0644 on what it converted, not on the copied
    files); "" when the page is there, else why not."""
    pages = list(feedback.glob("*.html")) if feedback.is_dir() else []
    if not pages:
        return "nbgrader generate_feedback wrote no page"
    for path in feedback.rglob("*"):
        if path.is_file():
            path.chmod(0o644)
    return ""


def lms_feedback(workdir: Path, assignment: str, dest: Path) -> tuple[list[str], list[str]]:
    """Zip the feedback pages of the students collected from an LMS (``nbgrader zip_collect``), named the way
    that LMS takes files back; returns ``(students zipped, students whose page is missing)``.

    * Canvas ("Upload submission comments" / re-upload of the bulk download): a file keeps its downloaded
      name's prefix (``smithbob_4343_99210_``), which carries the Canvas user and submission ids, and ends
      in the notebook's name with ``.html``: ``smithbob_4343_99210_single_head.html``.
    * Moodle ("Upload multiple feedback files in a zip"): one folder per participant, named as in the
      download (``Ann Lee_5151_assignsubmission_file_``), holding ``single_head.html``.

    The names come from the collector's record (``GRADING/collected/<assignment>/<student>.json``), never from
    the roster alone. Files in the zip are the rendered pages as they are (0644 when extracted), and at its root
    the pages' MathJax, ``attn-mathjax.js`` (beside Canvas's pages, one folder up from Moodle's), so that the
    unzipped pages render their math offline; the LMS hands each student their page only, which then loads
    MathJax from the CDN, or shows its TeX with a note (``records/templates/attn/attn_mathjax.html.j2``)."""
    import zipfile

    entries, zipped, missing = _lms_entries(workdir, assignment)
    if not entries:  # nothing to hand back: no zip, not an empty one
        return zipped, missing
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, page in entries + _shared_mathjax(entries):
            info = zipfile.ZipInfo(name, date_time=datetime.datetime.now().timetuple()[:6])
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, page.read_bytes())
    tmp.chmod(0o600)
    tmp.replace(dest)
    return zipped, missing


def _lms_entries(workdir: Path, assignment: str) -> tuple[list[tuple[str, Path]], list[str], list[str]]:
    """``(zip entry name -> page, students zipped, students whose page is missing)`` of :func:`lms_feedback`."""
    import json
    import re

    zipped, missing = [], []
    collected = workdir / "collected" / assignment
    entries: list[tuple[str, Path]] = []
    for record_path in sorted(collected.glob("*.json")) if collected.is_dir() else []:
        student = record_path.stem
        if student == "unknown":
            continue
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError):
            continue
        pages = sorted((workdir / "feedback" / student / assignment).glob("*.html"))
        if not pages:
            missing.append(student)
            continue
        first = str((record.get("files") or [""])[0])
        for page in pages:
            if record.get("source") == "Moodle download":
                folder = first.split("/")[0] if "/" in first else \
                    f"{student}_{record.get('lms_user_id', '')}_assignsubmission_file_"
                name = f"{folder}/{page.name}"
            else:
                m = re.match(r"^(.+?_(?:late_)?\d+_\d+)_", first, re.IGNORECASE)
                prefix = m[1] if m else f"{student}_{record.get('lms_user_id', '')}_0"
                name = f"{prefix}_{page.name}"
            entries.append((name, page))
        zipped.append(student)
    return entries, zipped, missing


def _shared_mathjax(entries: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """The zip's copy of the pages' MathJax (the vendored file), if there are pages and it is vendored."""
    from autograder.records.plugins import MATHJAX, SHARED_MATHJAX

    return [(SHARED_MATHJAX, MATHJAX)] if entries and MATHJAX.is_file() else []


def lms_zip(workdir: Path, assignment: str) -> Path:
    """Where ``lms-feedback`` writes the assignment's zip by default."""
    return workdir / "lms-feedback" / f"{assignment}.zip"


def released_out_of_date(config: Any, workdir: Path, assignment: str) -> list[str]:
    """What feedback already handed back no longer shows the current pages (a penalty change, a regrade, an
    extension, a hand grade since), each with the command that hands it back again; [] when none.

    * nbgrader's exchange: ``nbgrader release_feedback`` copied each page to the exchange's ``feedback/`` folder
      under a name made from the submission's secret (nbgrader's ``notebook_hash``); a copy there that differs from
      the page now is out of date.
    * the LMS zip (``lms-feedback``, at its default place): an entry that differs from the page now, or a student
      collected from the LMS with a page the zip lacks."""
    import zipfile

    from nbgrader.utils import notebook_hash

    said = []
    outbound = Path(str(config.Exchange.root)) / str(config.CourseDirectory.course_id) / "feedback"
    stale = []
    if outbound.is_dir():
        for folder in sorted((workdir / "feedback").glob(f"*/{assignment}")):
            secret = _read_small(folder / "submission_secret.txt")
            for page in sorted(folder.glob("*.html")) if secret else []:
                released = outbound / f"{notebook_hash(secret=secret, notebook_id=page.stem)}.html"
                try:
                    if released.is_file() and released.read_bytes() != page.read_bytes():
                        stale.append(folder.parent.name)
                        break
                except OSError:
                    continue
    if stale:
        said.append(f"feedback released through the exchange is out of date for {', '.join(stale[:30])}"
                    f"{' ...' if len(stale) > 30 else ''}: run `nbgrader release_feedback {assignment}` to release "
                    "it again")
    dest = lms_zip(workdir, assignment)
    if dest.is_file():
        entries, _, _ = _lms_entries(workdir, assignment)
        try:
            with zipfile.ZipFile(dest) as z:
                held = {name: z.read(name) for name in z.namelist()}
        except (OSError, zipfile.BadZipFile, KeyError):
            held = {}
        changed = sorted({page.parent.parent.name for name, page in entries
                          if held.get(name) != page.read_bytes()})
        if changed:
            said.append(f"the LMS feedback zip {dest} is out of date for {', '.join(changed[:30])}"
                        f"{' ...' if len(changed) > 30 else ''}: run `python -m autograder lms-feedback --assignment "
                        f"{assignment}` and upload it again")
    return said


__all__ = ["TIMESTAMP_FORMAT", "autograded_notebook", "generate_feedback", "lms_feedback", "lms_zip", "released_out_of_date",
           "write_autograded"]
