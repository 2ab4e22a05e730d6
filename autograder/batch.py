"""Grade a whole class: ``python -m autograder grade SUBMISSIONS --assignment NN_topic --out grades.csv``.

``SUBMISSIONS/<student>/<assignment>/*.ipynb`` is nbgrader's layout. For every
student the batch

1. fingerprints the submission (its notebooks, the source notebooks, the checks
   and the harness); a result with the same fingerprint is reused, so an
   interrupted batch resumes where it stopped and a re-run changes nothing,
   while a re-submission (new fingerprint) is graded again;
2. grades each notebook with :func:`autograder.judge.grade_notebook` (student
   code in a sandbox, verdicts here);
3. writes the result atomically to ``WORKDIR/results/<assignment>/<student>.json``;
4. records the scores in nbgrader's gradebook and writes the feedback notebook
   that nbgrader's ``generate_feedback`` renders to HTML;
5. rewrites the CSV (atomically) from the gradebook, with a ``reason`` column for
   submissions that could not be graded normally.

A failure while grading one student is recorded as that student's reason and
the batch goes on.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import hashlib
import html
import io
import json
import multiprocessing as mp
import os
import re
import secrets
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autograder import course
from autograder.judge import NotebookResult, TestResult, grade_notebook
from autograder.notebook import SourceNotebook, nbgrader_meta
from autograder.sandbox import IsolationUnavailable, Limits, isolation_summary, require_isolation

HERE = Path(__file__).resolve().parent
STUDENT_ID = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")


# -- small utilities ------------------------------------------------------------------------------


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _hash_files(h: "hashlib._Hash", paths: list[Path]) -> None:
    for p in paths:
        h.update(p.name.encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError as e:
            h.update(f"unreadable:{e.errno}".encode())
        h.update(b"\0")


def grader_version(assignment: str, limits: Limits | None = None) -> str:
    """A hash of everything that decides a grade besides the submission itself: the source notebooks,
    the grader and its checks, the reference package the checks compare with, and the limits."""
    import attnkit

    h = hashlib.sha256(repr(limits or Limits()).encode())
    _hash_files(h, course.source_notebooks(assignment))
    _hash_files(h, sorted(HERE.glob("*.py")) + [HERE / "checks" / "__init__.py", HERE / "checks" / f"ch{assignment}.py"])
    _hash_files(h, sorted(Path(attnkit.__file__).parent.glob("*.py")))
    return h.hexdigest()


def clean_text(value: Any) -> Any:
    """``value`` with every string made safe to encode as UTF-8 (lone surrogates from student text escaped)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {clean_text(k): clean_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_text(v) for v in value]
    return value


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


def submission_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file() and not p.is_symlink())


def fingerprint(job: Job, ctx: Context) -> str:
    h = hashlib.sha256(ctx.version.encode() + ctx.secret.encode())
    _hash_files(h, submission_files(job.folder))
    return h.hexdigest()


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


def grade_job(job: Job, ctx: Context) -> dict[str, Any]:
    """Grade one student (runs in a worker process); always returns a result, never raises but for
    :class:`IsolationUnavailable` (isolation required and a Dask worker cannot give it: nothing is recorded)."""
    if ctx.limits.require_isolation:
        require_isolation()
    started = time.monotonic()
    try:
        linked = job.folder.is_symlink() or job.folder.parent.is_symlink()
        if linked or not job.folder.is_dir():
            results = [grade_notebook(None, src, ctx.assignment, secret=ctx.secret) for src in ctx.sources]
            reason = (f"{job.student}/{ctx.assignment} is a symbolic link, not a folder: not graded" if linked
                      else f"no submission folder {job.student}/{ctx.assignment}")
            notes: list[str] = []
        else:
            chosen, notes = pick_notebooks(job, ctx)
            results = [grade_notebook(chosen[src.name], src, ctx.assignment, files=ctx.release, hide=ctx.hide,
                                      limits=ctx.limits, secret=ctx.secret) for src in ctx.sources]
            reason = ""
        reasons = [r.reason for r in results if r.reason]
        reason = "; ".join(([reason] if reason else []) + notes + reasons)
    except Exception:  # noqa: BLE001 - a grader bug must not stop the class
        tb = traceback.format_exc()
        results = [NotebookResult(src.name, [TestResult(c.grade_id, c.grade_id, 0.0, c.points, "internal grader error")
                                             for c in src.tests()]) for src in ctx.sources]
        reason = "internal grader error (see the log): " + tb.strip().splitlines()[-1][:200]
        for r in results:
            r.log.append(tb)
    # Nothing is written here: on Dask this runs on a worker, and the coordinating process writes the
    # result, the gradebook and the feedback (see run's finish).
    return clean_text({"student": job.student, "assignment": ctx.assignment, "fingerprint": fingerprint(job, ctx),
                       "reason": reason[:1000], "seconds": round(time.monotonic() - started, 2),
                       "notebooks": [r.to_json() for r in results]})


# -- gradebook and feedback -------------------------------------------------------------------------


class Records:
    """The grading folder: results, nbgrader gradebook, autograded notebooks and feedback."""

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

    def secret(self) -> str:
        """The seed of the private test inputs: random once per grading folder, then fixed (re-runs agree)."""
        path = self.workdir / "secret"
        if not path.exists():
            atomic_write(path, secrets.token_hex(16))
            os.chmod(path, 0o600)
        return path.read_text().strip()

    def load(self, student: str) -> dict[str, Any] | None:
        path = self.results / f"{student}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return clean_text(data) if isinstance(data, dict) and data.get("student") == student else None

    def save(self, result: dict[str, Any]) -> None:
        atomic_write(self.results / f"{result['student']}.json", json.dumps(result, indent=1))

    def prepare_gradebook(self) -> None:
        """Record the assignment's cells and points in the gradebook (nbgrader generate_assignment does it)."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.db}") as gb:
            try:
                gb.find_assignment(self.assignment)
                known = True
            except Exception:  # noqa: BLE001 - MissingEntry
                known = False
        if not known:
            with tempfile.TemporaryDirectory() as tmp:
                course.generate_release(self.assignment, Path(tmp), db_path=self.db)

    def record(self, result: dict[str, Any]) -> None:
        """Store the scores in the gradebook (idempotent: the same result gives the same rows)."""
        from nbgrader.api import Gradebook

        student = result["student"]
        with Gradebook(f"sqlite:///{self.db}") as gb, warnings.catch_warnings():
            # nbgrader's add_submission trips SQLAlchemy's autoflush warnings; they are harmless here.
            warnings.simplefilter("ignore")
            gb.update_or_create_student(student)
            try:
                gb.find_submission(self.assignment, student)
            except Exception:  # noqa: BLE001 - MissingEntry
                gb.add_submission(self.assignment, student)
            for nb in result["notebooks"]:
                for t in nb["tests"]:
                    grade = gb.find_grade(t["grade_id"], nb["notebook"], self.assignment, student)
                    grade.auto_score = float(min(t["points"], t["max_points"]))
                    grade.manual_score = None
                    grade.needs_manual_grade = False
            gb.db.commit()

    def scores(self) -> dict[str, tuple[float, float]]:
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.db}") as gb:
            out = {}
            for sub in gb.find_assignment(self.assignment).submissions:
                out[sub.student.id] = (float(sub.score), float(sub.max_score))
            return out

def feedback_notebook(assignment: str, nb: dict[str, Any], result: dict[str, Any]) -> str:
    """The released notebook with the student's answers and, under each test cell, the judge's verdict."""
    import nbformat

    release = course.RELEASE / assignment / f"{nb['notebook']}.ipynb"
    book = nbformat.read(str(release), as_version=4)
    tests = {t["grade_id"]: t for t in nb["tests"]}
    answers = nb.get("answers", {})
    for cell in book.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if meta.get("solution") and gid in answers:
            cell.source = answers[gid]
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if gid in tests:
            t = tests[gid]
            head = f"{t['description']}\n{t['points']:g} / {t['max_points']:g} points"
            if t["message"]:
                cell.outputs = [nbformat.v4.new_output("error", ename="Failed", evalue=t["message"],
                                                       traceback=[head, "Failed: " + t["message"]])]
            else:
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=head + "\npassed\n")]
    summary = [f"**Autograded**: {sum(t['points'] for t in nb['tests']):g} / {sum(t['max_points'] for t in nb['tests']):g} points."]
    if result.get("reason"):
        summary.append(f"\n\n**Note**: {html.escape(result['reason'])}")  # student text: never markup
    book.cells.insert(0, nbformat.v4.new_markdown_cell("".join(summary)))
    buf = io.StringIO()
    nbformat.write(book, buf)
    return buf.getvalue()


def render_feedback(workdir: Path, assignment: str, result: dict[str, Any]) -> Path:
    """Write the autograded notebooks and their HTML feedback for one student.

    The HTML is rendered with nbgrader's own feedback template; the scores are
    put into the cells the way nbgrader's GetGrades preprocessor does, but from
    the judge's result rather than a database query, so workers can render in
    parallel. Hidden tests never appear: the cells come from the released notebook.
    """
    import nbformat
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    import nbgrader

    formgrader = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    config = Config()  # the same template settings as nbgrader's GenerateFeedback
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_basedirs = [str(formgrader / "templates")]
    config.HTMLExporter.extra_template_paths = [str(formgrader / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    exporter = HTMLExporter(config=config)
    student = result["student"]
    graded_dir = workdir / "autograded" / student / assignment
    feedback_dir = workdir / "feedback" / student / assignment
    for nb in result["notebooks"]:
        text = feedback_notebook(assignment, nb, result)
        atomic_write(graded_dir / f"{nb['notebook']}.ipynb", text)
        book = nbformat.reads(text, as_version=4)
        tests = {t["grade_id"]: t for t in nb["tests"]}
        for cell in book.cells:
            meta = nbgrader_meta(cell)
            if meta.get("grade_id") in tests:
                t = tests[meta["grade_id"]]
                cell.metadata.nbgrader["score"] = min(t["points"], t["max_points"])
                cell.metadata.nbgrader["points"] = t["max_points"]
            elif meta.get("solution"):
                cell.metadata.nbgrader["comment"] = None
        score = sum(min(t["points"], t["max_points"]) for t in nb["tests"])
        resources = {"nbgrader": {"notebook": nb["notebook"], "assignment": assignment, "student": student,
                                  "score": score, "max_score": sum(t["max_points"] for t in nb["tests"]),
                                  "late_penalty": 0}}
        html, _ = exporter.from_notebook_node(book, resources=resources)
        atomic_write(feedback_dir / f"{nb['notebook']}.html", html)
    return feedback_dir


def total(result: dict[str, Any]) -> tuple[float, float]:
    tests = [t for nb in result["notebooks"] for t in nb["tests"]]
    return sum(min(t["points"], t["max_points"]) for t in tests), sum(t["max_points"] for t in tests)


def write_csv(path: Path, records: Records, results: dict[str, dict[str, Any]], final: bool = True) -> None:
    """One row per student. The final CSV takes its scores from the gradebook, so the two agree;
    the progress CSVs written during a batch take them from the results."""
    scores = records.scores() if final else {s: total(r) for s, r in results.items()}
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["student", "assignment", "score", "max_score", "reason"])
    for student in sorted(results):
        score, max_score = scores.get(student, (0.0, 0.0))
        writer.writerow([student, records.assignment, f"{score:g}", f"{max_score:g}", results[student].get("reason", "")])
    atomic_write(path, buf.getvalue())


# -- the command -----------------------------------------------------------------------------------------


def discover(submissions: Path, assignment: str, own: list[Path] = ()) -> tuple[list[Job], list[str]]:
    """Student folders under ``submissions``; ``own`` are the grader's outputs, never taken for students."""
    jobs, skipped = [], []
    own = [p.resolve() for p in own]
    for entry in sorted(submissions.iterdir()):
        if entry.name.startswith(".") and entry.is_dir():
            skipped.append(entry.name)
            continue
        if not entry.is_dir():
            continue
        if any(entry.resolve() == p or entry.resolve() in p.parents for p in own):
            continue
        if not STUDENT_ID.match(entry.name):
            skipped.append(entry.name)
            continue
        jobs.append(Job(entry.name, entry / assignment))
    return jobs, skipped


def run(submissions: Path, assignment: str, out: Path, workdir: Path | None = None, limits: Limits | None = None,
        workers: int = 1, force: bool = False, log=print, scheduler: str | None = None,
        students: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Grade every student under ``submissions`` (or only ``students``); returns ``student -> result``.

    ``workers`` processes grade at once on this machine; with ``scheduler`` (a Dask
    distributed address) each submission is a Dask task instead. Either way the
    student's code runs in a sandbox process that the worker starts, never in the
    worker itself, and the results, gradebook and CSV are written here.
    """
    if assignment not in course.assignments():
        raise SystemExit(f"unknown assignment {assignment!r}; known: {', '.join(course.assignments())}")
    if not submissions.is_dir():
        raise SystemExit(f"no submissions folder at {submissions}")
    if limits is not None and limits.require_isolation:
        try:
            require_isolation()
        except IsolationUnavailable as e:
            raise SystemExit(str(e)) from None
    workdir = (workdir or out.resolve().parent / "grading").resolve()
    records = Records(workdir, assignment)
    records.prepare_gradebook()
    release = course.RELEASE / assignment
    sources = [SourceNotebook.load(p, release / p.name) for p in course.source_notebooks(assignment)]
    ctx = Context(assignment, sources, release, sorted({course.ROOT, submissions.resolve(), workdir}),
                  limits or Limits(), records.secret(), grader_version(assignment, limits), workdir)
    jobs, skipped = discover(submissions, assignment, own=[workdir, out])
    if students is not None:
        unknown = sorted(set(students) - {j.student for j in jobs})
        if unknown:
            raise SystemExit(f"no submission folder for: {', '.join(unknown)}")
        jobs = [j for j in jobs if j.student in set(students)]
    for name in skipped:
        log(f"skipped folder {clean_text(name)!r}: not a valid student id")
    results: dict[str, dict[str, Any]] = {}
    todo: list[Job] = []
    for job in jobs:
        old = None if force else records.load(job.student)
        if old is not None and old.get("fingerprint") == fingerprint(job, ctx):
            results[job.student] = old
        else:
            todo.append(job)
    log(f"{assignment}: {len(jobs)} students, {len(jobs) - len(todo)} already graded, {len(todo)} to grade")
    log(isolation_summary())  # before any student code runs

    def finish(result: dict[str, Any]) -> None:
        try:
            render_feedback(workdir, assignment, result)
        except Exception as e:  # noqa: BLE001 - feedback failing must not lose the grade
            result["reason"] = (result["reason"] + f"; feedback could not be rendered: {e}").strip("; ")
        records.save(result)  # a result on disk is never lost
        records.record(result)
        results[result["student"]] = result
        if len(results) % 10 == 0:
            write_csv(out, records, results, final=False)
        score, max_score = total(result)
        log(f"  {result['student']}: {score:g}/{max_score:g} in {result['seconds']:.1f} s" +
            (f" ({result['reason'][:120]})" if result["reason"] else ""))

    # Results reused from an earlier run still go through the gradebook and feedback (idempotent),
    # so a batch killed between saving a result and recording it heals itself.
    for student in sorted(results):
        records.record(results[student])
        if not (workdir / "feedback" / student / assignment).is_dir():
            render_feedback(workdir, assignment, results[student])
    if scheduler:
        from distributed import Client, as_completed

        with Client(scheduler) as client:
            futures = [client.submit(grade_job, job, ctx, pure=False, key=f"grade-{assignment}-{job.student}")
                       for job in todo]
            for fut in as_completed(futures):
                finish(fut.result())
    elif workers <= 1:
        for job in todo:
            finish(grade_job(job, ctx))
    else:
        # Workers start from a fresh interpreter ("forkserver"), not a fork of this process: forking a process
        # whose torch or browser threads are running can crash the child.
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("forkserver")) as pool:
            futures = [pool.submit(grade_job, job, ctx) for job in todo]
            for fut in cf.as_completed(futures):
                finish(fut.result())
    everyone = dict(results)
    for path in records.results.glob("*.json"):  # students graded in earlier runs (for example with --student)
        if path.stem not in everyone and (old := records.load(path.stem)) is not None:
            everyone[path.stem] = old
    write_csv(out, records, everyone)
    return results


def add_grade_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="grade every SUBMISSIONS/<student>/<assignment>/*.ipynb")
    p.add_argument("submissions", type=Path, help="folder of student folders (nbgrader's layout)")
    p.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    p.add_argument("--out", type=Path, required=True, help="CSV file to write")
    p.add_argument("--workdir", type=Path, help="grading state: gradebook, results, feedback (default: OUT's folder/grading)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="submissions graded at once on this machine (default: the number of cores)")
    p.add_argument("--scheduler", help="Dask distributed scheduler address: grade each submission as a Dask task")
    p.add_argument("--student", action="append", dest="students", metavar="ID",
                   help="grade only this student (repeatable); the CSV still lists every graded student")
    p.add_argument("--force", action="store_true", help="grade again even when a result with the same fingerprint exists")
    d = Limits()
    p.add_argument("--cell-timeout", type=float, default=d.cell_timeout, help="seconds per notebook cell")
    p.add_argument("--call-timeout", type=float, default=d.call_timeout, help="seconds per call into student code")
    p.add_argument("--notebook-timeout", type=float, default=d.notebook_timeout, help="seconds per notebook in all")
    p.add_argument("--memory-mb", type=int, default=d.memory_bytes >> 20, help="address-space limit of student code")
    p.add_argument("--max-processes", type=int, default=d.max_processes, help="process/thread limit of student code")
    p.add_argument("--scratch-mb", type=int, default=d.scratch_bytes >> 20,
                   help="size of the student's scratch folder (a tmpfs of its own where namespaces are available)")
    p.add_argument("--require-isolation", action="store_true",
                   help="refuse to grade where student code cannot be isolated (no root and no bubblewrap)")
    p.set_defaults(func=_grade)


def _grade(args: argparse.Namespace) -> int:
    limits = Limits(cell_timeout=args.cell_timeout, call_timeout=args.call_timeout,
                    notebook_timeout=args.notebook_timeout, memory_bytes=args.memory_mb << 20,
                    max_processes=args.max_processes, scratch_bytes=args.scratch_mb << 20,
                    require_isolation=args.require_isolation)
    results = run(args.submissions, args.assignment, args.out, args.workdir, limits, args.workers, args.force,
                  log=lambda s: print(s, file=sys.stderr, flush=True), scheduler=args.scheduler,
                  students=args.students)
    print(f"wrote {args.out} ({len(results)} students)")
    return 0
