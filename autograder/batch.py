"""Grade a whole class: discover the submissions, fingerprint them, schedule the grading.

``SUBMISSIONS/<student>/<assignment>/*.ipynb`` is nbgrader's layout. :func:`run` is five named steps (as
nbgrader's ``Autograde`` lists its preprocessors), each reading its inputs once per run:

1. :func:`plan`: the roster students' folders (any other folder listed and skipped; a roster student with no
   folder for the assignment gets no record; none submitted: stop, nothing recorded), the release notebooks, the grader's version, and each submission's fingerprint
   (its notebooks and ``timestamp.txt``): a result with the same fingerprint is reused, so an interrupted
   batch resumes where it stopped and a re-run changes nothing, while a re-submission is graded again;
2. grading: :func:`grade_job` per submission (student code in a sandbox, verdicts here, the notebook parsed
   once for the judge and the written answers), in worker processes or as Dask tasks (:func:`_schedule`);
3. :func:`record`, in this process only: saves the :class:`~autograder.records.results.Result`, records it
   in the gradebook (one student's rows: the cost per student does not grow with the class) and writes the
   autograded notebooks;
4. :func:`publish`: the feedback of every student whose gradebook entries changed, in one nbgrader run;
5. :func:`write_grades`: the assignment's CSV and the term's, from the gradebook, with every changed score.

Isolation is demanded in one place, :func:`demand_isolation` (before step 1, and on the machine that grades).

Grades are stable: the grader's version (:func:`grader_version`) is pinned per
assignment when it is first graded. After a change to the grader, its checks or
``attnkit``, recorded grades are kept; the batch grades those students again on
the side (kept under ``results/<assignment>/candidates/``) and reports whose grade
would change, and ``regrade=True`` grades everyone again with the new grader.

Nothing one submission contains may stop the batch: every per-submission step
runs inside that submission's error handling, and each result is saved as soon
as it is computed.

Imports: course, judge, notebook, sandbox (``Limits``), results, written, gradebook, feedback.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import hashlib
import json
import multiprocessing as mp
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autograder import course
from autograder.isolation.sandbox import IsolationUnavailable, Limits, isolation_summary, require_isolation
from autograder.judging.judge import grade_notebook
from autograder.notebook import BadNotebook, SourceNotebook
from autograder.records.collector import folder_fingerprint, hash_files, submission_files
from autograder.records.feedback import generate_feedback, write_autograded
from autograder.records.gradebook import Records, write_csv, write_term
from autograder.records.results import (NotebookResult, Result, StudentCells, TestResult, clean_text, load_result,
                                        save_result)
from autograder.records.written import student_cells

HERE = Path(__file__).resolve().parent
STUDENT_ID = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")
# What grading runs, by folder: the judge with its shared checks, the sandbox and what runs in it, the notebook reader.
# A chapter's checks import no other chapter's (tests/test_stated_requirements.py), so the assignment's own
# module is the only chapter module that decides its grades.
GRADING_CODE = ("judging", "isolation", "in_sandbox", "notebook.py")


# -- fingerprints ---------------------------------------------------------------------------------------


def grading_code(assignment: str) -> list[Path]:
    """The modules of this package that decide ``assignment``'s grades (other chapters' checks excluded)."""
    own = f"ch{assignment}.py"
    found = []
    for entry in GRADING_CODE:
        path = HERE / entry
        for p in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            chapter = p.parent.name == "checks" and p.name.startswith("ch") and p.name[2:4].isdigit()
            if not chapter or p.name == own:
                found.append(p)
    return found


def grader_version(assignment: str, limits: Limits | None = None) -> str:
    """A hash of everything that decides a grade besides the submission itself: the source notebooks,
    the grading code (every module of ``GRADING_CODE`` but the other chapters' checks), the reference
    package the checks compare with, and the limits."""
    import attnkit

    h = hashlib.sha256(repr(limits or Limits()).encode())
    hash_files(h, course.source_notebooks(assignment))
    for path in grading_code(assignment):
        h.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    hash_files(h, sorted(Path(attnkit.__file__).parent.glob("*.py")))
    return h.hexdigest()


# -- one submission -------------------------------------------------------------------------------------


@dataclass
class Job:
    student: str
    folder: Path  # SUBMISSIONS/<student>/<assignment> (may not exist)


@dataclass
class Context:
    assignment: str
    sources: list[SourceNotebook]
    release: Path
    hide: list[Path]
    limits: Limits
    secret: str
    version: str
    workdir: Path
    released: dict[str, dict] = field(default_factory=dict)  # notebook name -> the release notebook, read once


def fingerprint(job: Job, ctx: Context) -> str:
    """A hash of the submission (notebooks and ``timestamp.txt``) and the secret: new means re-submitted."""
    return folder_fingerprint(ctx.secret, job.folder)


def read_timestamp(folder: Path) -> str:
    """The submission's ``timestamp.txt`` (nbgrader's format), or "" when missing or unreadable."""
    path = folder / "timestamp.txt"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 200:
            return ""
        return path.read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def pick_notebooks(job: Job, ctx: Context) -> tuple[dict[str, Path | None], list[str]]:
    """Map each source notebook to the student's file; a lone renamed notebook is used with a note."""
    files = submission_files(job.folder)
    by_name = {p.stem: p for p in files}
    chosen: dict[str, Path | None] = {}
    notes: list[str] = []
    for src in ctx.sources:
        chosen[src.name] = by_name.get(src.name)
    missing = [n for n, p in chosen.items() if p is None]
    extra = [p for p in files if p.stem not in chosen]
    if len(missing) == 1 and len(extra) == 1:
        chosen[missing[0]] = extra[0]
        notes.append(f"graded {extra[0].name} in place of the expected {missing[0]}.ipynb")
    elif extra:
        expected = ", ".join(f"{src.name}.ipynb" for src in ctx.sources)
        notes.append(f"not graded: {', '.join(p.name for p in extra)} (only {expected} is graded; "
                     "put your answers in that file)")
    return chosen, notes


def grade_job(job: Job, ctx: Context) -> Result:
    """Grade one student (runs in a worker process or a Dask task); always returns a result, never raises but for
    :class:`IsolationUnavailable` (isolation required and a Dask worker cannot give it: nothing is recorded)."""
    demand_isolation(ctx.limits)  # again here: a Dask worker may be another machine
    started = time.monotonic()
    cells: dict[str, StudentCells] = {}
    stamp = ""
    try:
        stamp = read_timestamp(job.folder)
        linked = job.folder.is_symlink() or job.folder.parent.is_symlink()
        if linked or not job.folder.is_dir():
            results = [grade_notebook(None, src, ctx.assignment, secret=ctx.secret) for src in ctx.sources]
            reason = (f"{job.student}/{ctx.assignment} is a symbolic link, not a folder: not graded" if linked
                      else f"no submission folder {job.student}/{ctx.assignment}")
            notes: list[str] = []
        else:
            chosen, notes = pick_notebooks(job, ctx)
            results, reason = [], ""
            for src in ctx.sources:  # the judge, then the written answers, from one parse of each notebook
                results.append(grade_notebook(chosen[src.name], src, ctx.assignment, files=ctx.release,
                                              hide=ctx.hide, limits=ctx.limits, secret=ctx.secret))
                try:
                    cells[src.name] = student_cells(chosen[src.name], ctx.released[src.name])
                except BadNotebook:
                    pass  # the judge's result already says why
        reasons = [r.reason for r in results if r.reason]
        blank = sorted({gid for c in cells.values() for gid in c.unanswered})
        if blank and len(blank) < sum(len(c.answer_ids) for c in cells.values()):
            notes.append("unanswered (left as released): " + ", ".join(blank))
        elif blank:
            notes.append("nothing answered: every answer cell is as released")
        reason = "; ".join(([reason] if reason else []) + notes + reasons)
    except Exception:  # noqa: BLE001 - a grader bug must not stop the class
        tb = traceback.format_exc()
        results = [NotebookResult(src.name, [TestResult(c.grade_id, c.grade_id, 0.0, c.points, "internal grader error")
                                             for c in src.tests()]) for src in ctx.sources]
        reason = "internal grader error (see the log): " + tb.strip().splitlines()[-1][:200]
        for r in results:
            r.log.append(tb)
    try:
        fp = fingerprint(job, ctx)
    except Exception as e:  # noqa: BLE001 - an unreadable submission still gets its result
        fp = f"unreadable:{type(e).__name__}"
    seen = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None).isoformat()
    return Result(job.student, ctx.assignment, fp, ctx.version, clean_text(reason[:1000]),
                  round(time.monotonic() - started, 2), results, cells, clean_text(stamp), seen)


# -- the class ------------------------------------------------------------------------------------------


def demand_isolation(limits: Limits | None) -> None:
    """The one place isolation is demanded: raises :class:`IsolationUnavailable` when ``limits`` require it and
    this machine cannot give it. :func:`run` calls it before anything is recorded, :func:`grade_job` on the
    machine that grades (a Dask worker may be another one)."""
    if limits is not None and limits.require_isolation:
        require_isolation()


GRADING_FOLDERS = ("autograded", "feedback", "submitted", "exchange", "downloaded", "collected", "results",
                   "release", "source")  # nbgrader's and the grader's own folders: never students


def removed_file(workdir: Path) -> Path:
    """The students ``remove-student`` took out of the course (one id a line)."""
    return workdir / "results" / "removed-students.txt"


def note_removed(workdir: Path, student: str) -> None:
    path = removed_file(workdir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(student + "\n")
    path.chmod(0o600)


def removed_students(workdir: Path) -> set[str]:
    try:
        return set(removed_file(workdir).read_text().split())
    except OSError:
        return set()


def discover(submissions: Path, assignment: str, own: list[Path] = (),
             roster: list[str] | None = None, removed: set[str] = frozenset()) -> tuple[list[Job], list[str]]:
    """Student folders under ``submissions`` and the names skipped, each with why.

    ``own`` are the grader's outputs, never taken for students. With a ``roster`` (the gradebook's students)
    only its students are graded: any other folder is listed and skipped, never added as a student. ``removed``
    are the students ``remove-student`` took out: their folders are skipped with no advice to add them back."""
    jobs, skipped = [], []
    own = [p.resolve() for p in own]
    known = set(roster or [])
    assignments = set(course.assignments())
    for entry in sorted(submissions.iterdir()):
        name = clean_text(os.fsdecode(entry.name))
        try:
            if entry.name.startswith(".") and entry.is_dir():
                skipped.append(f"{name!r}: a hidden folder")
                continue
            if not entry.is_dir():
                continue
            if any(entry.resolve() == p or entry.resolve() in p.parents for p in own):
                continue
        except OSError:  # a folder that vanished or cannot be read: not a student
            skipped.append(f"{name!r}: cannot be read")
            continue
        if not STUDENT_ID.match(entry.name):
            skipped.append(f"{name!r}: not a valid student id")
        elif entry.name in assignments:
            skipped.append(f"{name!r}: an assignment's folder, not a student's: give the folder holding one folder "
                           f"per student (SUBMISSIONS/<student>/{assignment}/), such as grading/submitted")
        elif known and entry.name not in known and entry.name in removed:
            skipped.append(f"{name!r}: removed from the course (remove-student): its folder is left as it was; "
                           "delete it if it must go")
        elif known and entry.name not in known:
            skipped.append(f"{name!r}: not a student of the roster" + (
                " (one of the grading folder's own folders)" if entry.name in GRADING_FOLDERS else
                f"; add a student with `nbgrader db student add {entry.name}` (or import the roster) and grade again"))
        elif not known and entry.name in GRADING_FOLDERS:
            skipped.append(f"{name!r}: one of the grading folder's own folders, not a student")
        else:
            jobs.append(Job(entry.name, entry / assignment))
    return jobs, skipped


def _changed(old: Result, new: Result) -> bool:
    points = lambda r: {(nb.notebook, t.grade_id): t.points for nb in r.notebooks for t in nb.tests}  # noqa: E731
    return points(old) != points(new)


@dataclass
class Plan:
    """What a run will do, decided before any student code runs (:func:`plan`)."""

    records: Records
    ctx: Context
    jobs: list[Job]
    reused: dict[str, Result]  # recorded with the same fingerprint: kept
    previous: dict[str, Result]  # the recorded result a re-submission replaces
    todo: list[Job]  # to grade
    trial: list[Job]  # recorded by another grader version: graded on the side, to report differences
    skipped: list[str]


def check_names(assignment: str, submissions: Path, workdir: Path) -> None:
    """Refuse (``SystemExit`` naming what exists) an unknown assignment, a missing folder, or the grading
    folder or any folder of it but ``submitted/`` (``feedback/``, ``autograded/``, ...) given where its submissions
    were meant."""
    if assignment not in course.assignments():
        raise SystemExit(f"unknown assignment {assignment!r}; known: {', '.join(course.assignments())}")
    if not submissions.is_dir():
        raise SystemExit(f"no submissions folder at {submissions}")
    if (submissions / "gradebook.db").exists() or submissions.resolve() == workdir:
        raise SystemExit(f"{submissions} is the grading folder (it holds the gradebook), not a folder of "
                         f"submissions: did you mean {submissions / 'submitted'}? Nothing was graded.")
    inside = submissions.resolve()
    if inside.is_relative_to(workdir) and inside.relative_to(workdir).parts[0] != "submitted":
        raise SystemExit(f"{submissions} is one of the grading folder's own folders "
                         f"({inside.relative_to(workdir).parts[0]}/: the grader's or nbgrader's output), not a folder of "
                         f"submissions: did you mean {workdir / 'submitted'}? Nothing was graded.")


def plan(submissions: Path, assignment: str, out: Path, workdir: Path, limits: Limits | None, force: bool,
         regrade: bool, students: list[str] | None, log: Callable[[str], object]) -> Plan | None:
    """Step 1: decide who is graded, who is kept, who is graded on the side; None when nothing was submitted
    (then nothing is recorded)."""
    records = Records(workdir, assignment)
    roster = records.roster() if records.roster_imported() else []
    jobs, skipped = discover(submissions, assignment, own=[workdir, out], roster=roster,
                             removed=removed_students(workdir))
    for why in skipped:
        log(f"skipped folder {why}")
    # A roster student with a folder (for another assignment) but none for this one submitted nothing: no record
    # (an empty cell in the term's grades, nothing exported), never a 0 timed at the grading moment. A grade
    # recorded earlier is kept as it was.
    absent = [j for j in jobs if not j.folder.exists() and not j.folder.is_symlink()]
    if absent:
        kept = [j.student for j in absent if records.load(j.student) is not None]
        log(f"{assignment}: no {assignment}/ folder for {', '.join(j.student for j in absent[:20])}"
            f"{' ...' if len(absent) > 20 else ''}: nothing recorded for them" +
            (f" (the grade recorded earlier is kept for {', '.join(kept[:20])})" if kept else ""))
        jobs = [j for j in jobs if j not in absent]
    if students is not None:
        unknown = sorted(set(students) - {j.student for j in jobs})
        if unknown:
            raise SystemExit(f"no submission folder of a roster student for: {', '.join(unknown)}; students with a "
                             f"folder: {', '.join(j.student for j in jobs) or 'none'}")
        jobs = [j for j in jobs if j.student in set(students)]
    no_roster = "" if roster else ("no roster in the gradebook: every student folder is graded and added as a "
                                   "student. Import the roster first (nbgrader db student import roster.csv) so "
                                   "that only its students are.")
    if not any(j.folder.is_dir() and not j.folder.is_symlink() for j in jobs):
        log(f"{assignment}: 0 submissions found under {submissions} (no <student>/{assignment}/ folder of "
            f"{'a roster student' if roster else 'a student'}): nothing was graded or recorded")
        if no_roster:
            log(no_roster)
        return None
    records.prepare_gradebook()
    release = course.RELEASE / assignment
    sources = [SourceNotebook.load(p, release / p.name) for p in course.source_notebooks(assignment)]
    released = {src.name: json.loads((release / f"{src.name}.ipynb").read_text()) for src in sources}
    version = grader_version(assignment, limits)
    ctx = Context(assignment, sources, release, sorted({course.ROOT, submissions.resolve(), workdir}),
                  limits or Limits(), records.secret(), version, workdir, released)
    pinned = records.pinned_version(version, replace=regrade or force)
    reused: dict[str, Result] = {}
    previous: dict[str, Result] = {}
    todo: list[Job] = []
    trial: list[Job] = []
    candidates = records.results / "candidates"
    for job in jobs:
        try:
            fp = fingerprint(job, ctx)
        except Exception:  # noqa: BLE001 - grade_job reports it
            fp = None
        old = records.load(job.student)
        if old is not None and fp is not None and old.fingerprint == fp and not (force or regrade):
            reused[job.student] = old  # recorded: kept, whichever grader produced it
            if old.version != version and records_candidate(candidates, job.student, fp, version) is None:
                trial.append(job)
            continue
        if old is not None and old.fingerprint != fp:
            previous[job.student] = old
        todo.append(job)
    log(f"{assignment}: {len(jobs)} students, {len(jobs) - len(todo)} already graded, {len(todo)} to grade")
    if no_roster:
        log(no_roster)
    if pinned != version and not (regrade or force):
        log(f"{assignment}: the grader changed since this assignment was first graded; recorded grades are kept "
            "(pass --regrade to apply the new grader)")
    return Plan(records, ctx, jobs, reused, previous, todo, trial, skipped)


def record(p: Plan, result: Result, submissions: Path, log: Callable[[str], object]) -> None:
    """Step 3, for each graded student, in this process only: save the result (first: a result on disk is never
    lost), record it in the gradebook, write the autograded notebooks, say the score as every place shows it."""
    records = p.records
    old = records.load(result.student)  # a --force or --regrade of the same submission keeps when it came
    if old is not None and old.first_seen and old.fingerprint == result.fingerprint:
        result.first_seen = old.first_seen
    records.save(result)
    when = records.submission_time(result)
    try:
        records.record(result, resubmitted=result.student in p.previous)
        write_autograded(records.workdir, result, submissions / result.student / p.ctx.assignment, when.text)
    except Exception:  # noqa: BLE001 - the result is saved; the next run records it again
        log(f"  {result.student}: could not be recorded: {traceback.format_exc()}")
    score, max_score, penalty = records.final_score(result.student) or (*result.total, 0.0)
    late = f", late penalty {penalty:g} subtracted" if penalty else ""
    log(f"  {result.student}: {score:g} / {max_score:g}{late} in {result.seconds:.1f} s" +
        (f" ({result.reason[:200]})" if result.reason else ""))
    for flag in when.flags:
        log(f"  {result.student}: time to review: {flag}")


def run(submissions: Path, assignment: str, out: Path, workdir: Path | None = None, limits: Limits | None = None,
        workers: int = 1, force: bool = False, log: Callable[[str], object] = print, scheduler: str | None = None,
        students: list[str] | None = None, regrade: bool = False,
        counts: dict[str, int] | None = None) -> dict[str, Result]:
    """Grade every roster student under ``submissions`` (or only ``students``); returns ``student -> result``.

    The steps, each a function: :func:`plan` (who is graded, kept, graded on the side), grading
    (:func:`grade_job` through :func:`_schedule`), :func:`record` (each result, here), :func:`publish` (the
    feedback) and :func:`write_grades` (the assignment's CSV and the term's, from the gradebook).

    ``workers`` processes grade at once on this machine; with ``scheduler`` (a Dask
    distributed address) each submission is a Dask task instead. Either way the
    student's code runs in a sandbox process that the worker starts, never in the
    worker itself, and the results, gradebook, feedback and CSV are written here.
    ``force`` or ``regrade`` grade everyone again with the current grader and pin its
    version; without them, grades recorded by an earlier grader are kept and the
    students whose grade the current one would change are reported. Either way
    manual grades and comments stay (see :mod:`autograder.records.gradebook`).
    """
    workdir = (workdir or course.grading_dir()).resolve()  # the course's one gradebook by default
    check_names(assignment, submissions, workdir)
    demand_isolation(limits)  # raises IsolationUnavailable (the command exits 3) before anything is recorded
    p = plan(submissions, assignment, out, workdir, limits, force, regrade, students, log)
    if p is None:
        return {}
    records, ctx = p.records, p.ctx
    if counts is not None:
        counts["graded"] = len(p.todo)  # what this run grades (the others' recorded results are kept)
    log(isolation_summary())  # before any student code runs
    from autograder.records.plugins import MATHJAX

    if not MATHJAX.is_file():
        log(f"WARNING: the course's MathJax ({MATHJAX}) is missing (run `make install`): feedback pages fetch it "
            "from a CDN, and where a student is offline their math shows as raw $...$")
    results: dict[str, Result] = dict(p.reused)

    def finish(result: Result) -> None:
        record(p, result, submissions, log)
        results[result.student] = result

    def keep_candidate(result: Result) -> None:
        save_result(records.results / "candidates" / f"{result.student}.json", result)

    # Results reused from an earlier run still go through the gradebook (idempotent: it also reassigns late
    # penalties after a new due date or extension), so a batch killed between saving and recording heals itself.
    for student in sorted(p.reused):
        try:
            records.record(p.reused[student])
        except Exception:  # noqa: BLE001 - one student's records must not stop the class
            log(f"  {student}: could not be recorded again: {traceback.format_exc()}")
    _schedule(p.todo, ctx, finish, workers, scheduler)
    if p.trial:
        _schedule(p.trial, ctx, keep_candidate, workers, scheduler)
    report_stale(records, results, ctx.version, log)
    publish(records, results, submissions, log)  # feedback where the gradebook changed since it was rendered
    review = {s: t.flags for s in sorted(results) if (t := records.submission_time(results[s])).flags}
    if review:
        log(f"{assignment}: {len(review)} submission time(s) to review (policy {records.time_policy!r}; "
            "the CSV's time_review column): " + "; ".join(f"{s}: {', '.join(f)}" for s, f in review.items()))
    write_grades(records, out, results, log)
    return results


def graded_results(records: Records, results: dict[str, Result] | None = None) -> dict[str, Result]:
    """``results`` and every other roster student's recorded result (graded in earlier runs, for example with
    ``--student``): the students of the assignment's CSV. A result of a student no longer in the roster
    (removed) is left out."""
    roster = set(records.roster()) if records.roster_imported() else set()
    everyone = dict(results or {})
    for path in records.results.glob("*.json"):
        if path.stem not in everyone and (not roster or path.stem in roster) and \
                (old := records.load(path.stem)) is not None:
            everyone[path.stem] = old
    return {s: r for s, r in everyone.items() if not roster or s in roster}


def write_grades(records: Records, out: Path, results: dict[str, Result] | None,
                 log: Callable[[str], object]) -> dict[str, Result]:
    """Last step: the assignment's CSV (every recorded student, scores from the gradebook) and the term's
    (:func:`autograder.records.gradebook.write_term`, beside the gradebook), saying every score that changed
    and any file kept because it had rows the new one lacks."""
    everyone = graded_results(records, results)
    for line in write_csv(out, records, everyone):
        log(line)
    for line in write_term(records.db, term_file(records.workdir)):
        log(line)
    return everyone


def term_file(workdir: Path) -> Path:
    """The term's grades: one row per roster student, a column per assignment."""
    return workdir / "grades-term.csv"


def default_out(workdir: Path, assignment: str) -> Path:
    """The assignment's grades file when ``--out`` is not given."""
    return workdir / f"grades-{assignment}.csv"


def records_candidate(folder: Path, student: str, fp: str, version: str) -> Result | None:
    """A result graded on the side with grader ``version`` for this very submission, if there is one."""
    cand = load_result(folder / f"{student}.json", student)
    return cand if cand is not None and cand.fingerprint == fp and cand.version == version else None


def report_stale(records: Records, results: dict[str, Result], version: str, log: Callable[[str], object]) -> None:
    """Say which recorded grades come from an earlier grader, and which of them the current one would change."""
    stale = sorted(s for s, r in results.items() if r.version != version)
    if not stale:
        return
    would = []
    for student in stale:
        old = results[student]
        cand = records_candidate(records.results / "candidates", student, old.fingerprint, version)
        if cand is not None and _changed(old, cand):
            would.append(f"{student} ({old.total[0]:g} -> {cand.total[0]:g})")
    log(f"{records.assignment}: {len(stale)} recorded grades come from an earlier grader and are kept; "
        f"{len(would)} would change with --regrade" + (": " + ", ".join(would) if would else ""))


def publish(records: Records, results: dict[str, Result], submissions: Path,
            log: Callable[[str], object] = print) -> None:
    """Render the feedback of every student whose gradebook entries changed since it was last rendered (a
    new grade, a manual grade or comment, a late penalty) or whose page is missing, in one nbgrader run.

    A failure is added to that student's reason and logged; it never stops the batch.
    """
    due: dict[str, str] = {}  # student -> the gradebook state the page will show
    for student in sorted(results):
        result = results[student]
        try:
            state = records.grades_state(student)
            page = records.workdir / "feedback" / student / records.assignment
            if page.is_dir() and records.feedback_state(student) == state:
                continue
            if not (records.workdir / "autograded" / student / records.assignment).is_dir():
                write_autograded(records.workdir, result, submissions / student / records.assignment,
                                 records.submission_time(result).text)
            due[student] = state
        except Exception:  # noqa: BLE001 - the grade is recorded; the next run renders it again
            _feedback_failed(records, result, traceback.format_exc(), log)
    try:
        errors = generate_feedback(records.config, records.assignment, list(due))
    except Exception:  # noqa: BLE001
        errors = dict.fromkeys(due, traceback.format_exc())
    for student, state in due.items():
        if errors.get(student):
            _feedback_failed(records, results[student], errors[student], log)
        else:
            records.set_feedback_state(student, state)


def _feedback_failed(records: Records, result: Result, error: str, log: Callable[[str], object]) -> None:
    note = "feedback could not be rendered: " + error.strip().splitlines()[-1][:200]
    log(f"  {result.student}: {note}")
    if note not in result.reason:
        result.reason = (result.reason + "; " + note).strip("; ")
        records.save(result)


def _schedule(jobs: list[Job], ctx: Context, done: Callable[[Result], None], workers: int,
              scheduler: str | None) -> None:
    """Grade ``jobs`` here, in worker processes, or as Dask tasks; ``done`` gets each result in this process."""
    if not jobs:
        return
    if scheduler:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futures = [client.submit(grade_job, job, ctx, pure=False, key=f"grade-{ctx.assignment}-{job.student}")
                       for job in jobs]
            for fut in as_completed(futures):
                done(fut.result())
    elif workers <= 1:
        for job in jobs:
            done(grade_job(job, ctx))
    else:
        # Workers start from a fresh interpreter ("forkserver"), not a fork of this process: forking a process
        # whose torch or browser threads are running can crash the child.
        # Ctrl-C reaches every process of the terminal's group: a worker still starting (before its initializer)
        # would print a KeyboardInterrupt traceback after the coordinator's one line. SIGINT is blocked while the
        # pool starts its server and workers (both inherit the mask) and unblocked in each worker once its quiet
        # handler is in place; here, a Ctrl-C meanwhile is delivered when the workers are started.
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("forkserver"),
                                    initializer=_quiet_on_interrupt) as pool:
            import signal

            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                futures = [pool.submit(grade_job, job, ctx) for job in jobs]
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            for fut in cf.as_completed(futures):
                done(fut.result())


def _quiet_on_interrupt() -> None:
    """In a worker: Ctrl-C (sent to the whole process group) ends it at once and silently. The coordinating
    process says the one thing to say (:data:`autograder.cli.INTERRUPTED`); a worker's result is only ever
    saved by the coordinator, so nothing half-written is left."""
    import signal

    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while the pool started (_schedule)
