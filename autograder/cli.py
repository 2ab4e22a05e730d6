"""Command line: ``python -m autograder {release,grade,feedback,extension,remove-student,formgrader,similarity} ...``.

Every command works in the course's one grading folder, the one holding the gradebook that
``nbgrader_config.py`` names (``grading/``), unless ``--workdir`` names another one together
with ``--separate-gradebook``.

Imports: course, batch, gradebook, feedback, sandbox (``Limits``, ``require_isolation``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

from autograder import course
from autograder.isolation.sandbox import Limits
from autograder.records.similarity import add_similarity_parser


DESCRIPTION = """Grade the attention course's exercises with nbgrader's gradebook, formgrader and feedback.

Every command works in the course's grading folder (grading/, where nbgrader_config.py puts
the gradebook) and prints what it changed. See book/instructors.md for a term, step by step."""


def _release(args: argparse.Namespace) -> int:
    names = course.assignments() if args.all else args.assignment
    if not names:
        print("name an assignment or pass --all", file=sys.stderr)
        return 2
    if not all(_known(name) for name in names):
        return 2
    for name in names:
        target = course.generate_release(name, Path(args.out))
        print(f"released {name} -> {target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target}")
    return 0


def limits_from(args: argparse.Namespace) -> Limits:
    """The sandbox limits the options ask for."""
    return Limits(cell_timeout=args.cell_timeout, call_timeout=args.call_timeout,
                  notebook_timeout=args.notebook_timeout, memory_bytes=args.memory_mb << 20,
                  max_processes=args.max_processes, scratch_bytes=args.scratch_mb << 20,
                  require_isolation=args.require_isolation)


def _workdir(args: argparse.Namespace) -> Path | None:
    """The grading folder the command works in (see :func:`course.check_workdir`); None after printing why not."""
    try:
        return course.check_workdir(args.workdir, args.separate_gradebook)
    except ValueError as e:
        print(f"nothing was done: {e}", file=sys.stderr)
        return None


def _known(assignment: str) -> bool:
    """True for an assignment of the course; else prints the known ones."""
    if assignment in course.assignments():
        return True
    print(f"nothing was done: unknown assignment {assignment!r}; known: {', '.join(course.assignments())}",
          file=sys.stderr)
    return False


def _grade(args: argparse.Namespace) -> int:
    from autograder import batch
    from autograder.isolation.sandbox import IsolationUnavailable

    workdir = _workdir(args)
    if workdir is None or not _known(args.assignment):
        return 2
    out = args.out or batch.default_out(workdir, args.assignment)
    counts: dict[str, int] = {}
    try:
        results = batch.run(args.submissions, args.assignment, out, workdir, limits_from(args), args.workers,
                            args.force, log=lambda s: print(s, file=sys.stderr, flush=True),
                            scheduler=args.scheduler, students=args.students, regrade=args.regrade, counts=counts)
    except IsolationUnavailable as e:
        print(f"--require-isolation: nothing was graded. {e}", file=sys.stderr)
        return 3
    if not results:
        return 1  # nothing was submitted: said why, nothing written
    _say_released(workdir, args.assignment)
    graded = counts.get("graded", 0)
    print(f"wrote {out} and {batch.term_file(workdir)} ({len(results)} students; " +
          (f"{graded} graded in this run)" if graded else "none graded in this run: no submission changed)"))
    return 0


def _say_released(workdir: Path, assignment: str) -> None:
    """Say which feedback already handed back is out of date, and the command that hands it back again."""
    from autograder.records.feedback import released_out_of_date
    from autograder.records.gradebook import Records

    for line in released_out_of_date(Records(workdir, assignment).config, workdir, assignment):
        print(line, file=sys.stderr)


def _feedback(args: argparse.Namespace) -> int:
    """After grading by hand: reassign the late penalties on the totals (hand grades included), render the
    feedback again from the gradebook and rewrite the CSVs, so every place shows the same score."""
    from autograder import batch
    from autograder.records.feedback import generate_feedback
    from autograder.records.gradebook import Records

    workdir = _workdir(args)
    if workdir is None or not _known(args.assignment):
        return 2
    records = Records(workdir, args.assignment)
    results = batch.graded_results(records)
    if not results:
        print(f"nothing was done: {args.assignment} has no graded submission in {workdir} (run `grade` first)",
              file=sys.stderr)
        return 2
    for result in results.values():
        records.assign_late_penalties(result)
    graded = [s for s in sorted(results) if (records.workdir / "autograded" / s / args.assignment).is_dir()]
    errors = generate_feedback(records.config, args.assignment, graded)
    scores = records.final_scores()
    for student in graded:
        error = errors[student]
        if not error:
            records.set_feedback_state(student, records.grades_state(student))
        score = scores.get(student)
        shown = f"{score[0]:g} / {score[1]:g}" if score else "not in the gradebook"
        print(f"  {student}: {shown}, " + (f"feedback NOT written: {error}" if error else "feedback written"),
              file=sys.stderr)
    failed = sum(bool(e) for e in errors.values())
    out = args.out or batch.default_out(workdir, args.assignment)
    batch.write_grades(records, out, results, lambda line: print(line, file=sys.stderr))
    _say_released(workdir, args.assignment)
    print(f"wrote {out} and {batch.term_file(workdir)} ({len(results)} students)")
    return 1 if failed else 0


def _lms_feedback(args: argparse.Namespace) -> int:
    """Zip the feedback of the students collected from Canvas or Moodle, named the way the LMS takes it back."""
    from autograder.records.feedback import lms_feedback

    workdir = _workdir(args)
    if workdir is None or not _known(args.assignment):
        return 2
    dest = args.out or workdir / "lms-feedback" / f"{args.assignment}.zip"
    zipped, missing = lms_feedback(workdir, args.assignment, dest)
    if not zipped and not missing:
        print(f"nothing was done: no student of {args.assignment} was collected from an LMS (`nbgrader zip_collect`);"
              " students who submitted through the exchange get theirs with `nbgrader release_feedback`",
              file=sys.stderr)
        return 2
    for student in missing:
        print(f"  {student}: no feedback page yet (run `grade` or `feedback` first): not in the zip", file=sys.stderr)
    print(f"wrote {dest} ({len(zipped)} students): upload it to the LMS (Canvas: the assignment's \"Upload "
          "submission comments\" / re-upload; Moodle: \"Upload multiple feedback files in a zip\")")
    return 1 if missing else 0


def _roster_student(records, student: str) -> bool:
    """True for a student of the gradebook's roster; else prints who is in it."""
    roster = records.roster()
    if student in roster:
        return True
    if not roster:
        print(f"nothing was done: {student!r} is not a student of the roster: the gradebook has no students yet. "
              "Import the roster first (nbgrader db student import roster.csv).", file=sys.stderr)
        return False
    close = difflib.get_close_matches(student, roster, n=3)
    print(f"nothing was done: {student!r} is not a student of the roster ({len(roster)} students"
          + (f"; did you mean {', '.join(close)}?" if close else f": {', '.join(roster[:30])}"
             + (" ..." if len(roster) > 30 else "")) + "). Add a student with `nbgrader db student add ID`.",
          file=sys.stderr)
    return False


def _extension(args: argparse.Namespace) -> int:
    """Grant (or, with ``--remove``, take back) a student's extension in the gradebook; late penalties follow it.
    Negative or zero time is refused: it would move the due date earlier, or grant nothing."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.records.gradebook import Records

    workdir = _workdir(args)
    if workdir is None or not _known(args.assignment):
        return 2
    import math

    if args.remove and (args.days or args.hours):
        print("nothing was done: --remove takes no --days or --hours", file=sys.stderr)
        return 2
    if not args.remove and not (math.isfinite(args.days) and math.isfinite(args.hours) and args.days >= 0
                                and args.hours >= 0 and args.days + args.hours > 0):
        print(f"nothing was done: an extension adds time to the due date: --days and --hours must be zero or more "
              f"and not both zero; got --days {args.days:g} --hours {args.hours:g}. To take an extension back, "
              "pass --remove.", file=sys.stderr)
        return 2
    records = Records(workdir, args.assignment)
    if not _roster_student(records, args.student):
        return 2
    records.prepare_gradebook()
    with Gradebook(f"sqlite:///{records.db}") as gb:
        try:
            gb.find_submission(args.assignment, args.student)
        except MissingEntry:
            gb.add_submission(args.assignment, args.student)
        gb.grant_extension(args.assignment, args.student, days=args.days, hours=args.hours)
    what = "extension removed" if args.remove else f"extension of {args.days:g} days {args.hours:g} hours"
    print(f"{args.student}: {what} on {args.assignment}; run `python -m autograder feedback --assignment "
          f"{args.assignment}` to reassign the late penalty")
    return 0


def _remove_student(args: argparse.Namespace) -> int:
    """Remove a student from grading: the gradebook (their submissions and grades), every assignment's results,
    autograded notebooks, feedback and collection records; then rewrite the grades files without them."""
    import shutil

    from nbgrader.api import Gradebook

    from autograder import batch
    from autograder.records.gradebook import Records

    workdir = _workdir(args)
    if workdir is None:
        return 2
    any_records = Records(workdir, course.assignments()[0])
    if not _roster_student(any_records, args.student):
        return 2
    removed = []
    for folder in ("autograded", "feedback"):
        if (workdir / folder / args.student).is_dir():
            shutil.rmtree(workdir / folder / args.student)
            removed.append(f"{folder}/{args.student}/")
    assignments = {p.name for top in ("results", "collected") if (workdir / top).is_dir()
                   for p in (workdir / top).iterdir() if p.is_dir()}
    for assignment in sorted(assignments):
        base = workdir / "results" / assignment
        for path in (base / f"{args.student}.json", base / "candidates" / f"{args.student}.json",
                     base / "feedback_state" / f"{args.student}.txt",
                     workdir / "collected" / assignment / f"{args.student}.json"):
            if path.exists():
                path.unlink()
                removed.append(str(path.relative_to(workdir)))
    with Gradebook(f"sqlite:///{any_records.db}") as gb:
        graded = [a.name for a in gb.assignments if a.submissions]
        gb.remove_student(args.student)  # with its submissions and grades
    removed.append("the gradebook's student and submissions")
    batch.note_removed(workdir, args.student)
    for assignment in graded:
        if assignment in course.assignments():
            records = Records(workdir, assignment)
            batch.write_grades(records, batch.default_out(workdir, assignment), None,
                               lambda line: print(line, file=sys.stderr))
    folder = workdir / "submitted" / args.student
    later = ("the next `grade` skips them: not in the roster" if any_records.roster_imported() else
             "no roster is imported, so the next `grade` would take that folder again: delete it, or import the "
             "roster")
    print(f"removed {args.student}: " + ", ".join(removed) + "; grades files rewritten without them" +
          (f". Their submissions stay in {folder} ({later}); delete them by hand if they must go"
           if folder.exists() else ""))
    return 0


def formgrader_command(port: int = 8888, root: Path | None = None) -> list[str]:
    """The ``jupyter server`` command line that serves nbgrader's formgrader for the course, on loopback."""
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.root_dir={root or course.ROOT}",
           '--ServerApp.jpserver_extensions={"nbgrader.server_extensions.formgrader": True}']
    if os.geteuid() == 0:  # a container or a server run as root: Jupyter refuses without it
        cmd.append("--allow-root")
    return cmd


def _formgrader(args: argparse.Namespace) -> int:
    """Serve formgrader from the course root (its nbgrader_config.py, its gradebook); runs until stopped."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    cmd = formgrader_command(args.port)
    print("serving formgrader: open the /formgrader page of the address below (Ctrl-C stops it)\n  " +
          " ".join(cmd), file=sys.stderr, flush=True)
    os.chdir(course.ROOT)
    os.execve(sys.executable, cmd, env)
    return 0  # not reached


def add_grade_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="grade every SUBMISSIONS/<student>/<assignment>/*.ipynb")
    p.add_argument("submissions", type=Path, help="folder of student folders (nbgrader's layout)")
    p.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    p.add_argument("--out", type=Path,
                   help="CSV file to write (default: grades-ASSIGNMENT.csv in the grading folder; the term's, "
                        "grades-term.csv, is written beside the gradebook either way)")
    add_workdir_options(p)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="submissions graded at once on this machine (default: the number of cores)")
    p.add_argument("--scheduler", help="Dask distributed scheduler address: grade each submission as a Dask task")
    p.add_argument("--student", action="append", dest="students", metavar="ID",
                   help="grade only this student (repeatable); the CSV still lists every graded student")
    p.add_argument("--force", action="store_true", help="grade again even when a result with the same fingerprint exists")
    p.add_argument("--regrade", action="store_true",
                   help="apply a changed grader to grades already recorded (without it they are kept and the "
                        "students whose grade would change are listed)")
    p.add_argument("--require-isolation", action="store_true",
                   help="refuse to grade where student code cannot be isolated (no network, course hidden)")
    d = Limits()
    p.add_argument("--cell-timeout", type=float, default=d.cell_timeout, help="seconds per notebook cell")
    p.add_argument("--call-timeout", type=float, default=d.call_timeout, help="seconds per call into student code")
    p.add_argument("--notebook-timeout", type=float, default=d.notebook_timeout, help="seconds per notebook in all")
    p.add_argument("--memory-mb", type=int, default=d.memory_bytes >> 20, help="address-space limit of student code")
    p.add_argument("--max-processes", type=int, default=d.max_processes, help="process/thread limit of student code")
    p.add_argument("--scratch-mb", type=int, default=d.scratch_bytes >> 20,
                   help="size of the student's scratch folder (a tmpfs of its own where namespaces are available)")
    p.set_defaults(func=_grade)


def add_workdir_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", type=Path,
                   help="grading folder: gradebook, results, feedback (default: the course's, where "
                        "nbgrader_config.py puts the gradebook: grading/)")
    p.add_argument("--separate-gradebook", action="store_true",
                   help="allow a --workdir whose gradebook is not the course's (formgrader and `nbgrader "
                        "export` will not see those grades)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="generate exercises/ from solutions/assignments/ with nbgrader")
    rel.add_argument("assignment", nargs="*", help="assignment names (NN_topic)")
    rel.add_argument("--all", action="store_true", help="every assignment")
    rel.add_argument("--out", default=str(course.RELEASE), help="release folder (default: exercises/)")
    rel.set_defaults(func=_release)
    add_grade_parser(sub)
    fb = sub.add_parser("feedback", help="render the feedback again from the gradebook (after manual grading)")
    fb.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    fb.add_argument("--out", type=Path, help="CSV file to rewrite (default: grades-ASSIGNMENT.csv in the grading folder)")
    add_workdir_options(fb)
    fb.set_defaults(func=_feedback)
    ext = sub.add_parser("extension", help="grant a student an extension (stored in nbgrader's gradebook)")
    ext.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    ext.add_argument("--student", required=True, help="the student's id")
    ext.add_argument("--days", type=float, default=0.0, help="days added to the due date")
    ext.add_argument("--hours", type=float, default=0.0, help="hours added to the due date")
    ext.add_argument("--remove", action="store_true", help="take the student's extension back")
    add_workdir_options(ext)
    ext.set_defaults(func=_extension)
    lf = sub.add_parser("lms-feedback", help="zip the feedback of LMS-collected students, named as the LMS takes it back")
    lf.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    lf.add_argument("--out", type=Path, help="zip to write (default: lms-feedback/ASSIGNMENT.zip in the grading folder)")
    add_workdir_options(lf)
    lf.set_defaults(func=_lms_feedback)
    rm = sub.add_parser("remove-student", help="remove a student from grading: gradebook, results, feedback, CSVs")
    rm.add_argument("student", help="the student's id")
    add_workdir_options(rm)
    rm.set_defaults(func=_remove_student)
    fg = sub.add_parser("formgrader", help="serve nbgrader's formgrader for the course (loopback, with a token)")
    fg.add_argument("--port", type=int, default=8888, help="port on 127.0.0.1 (default: 8888)")
    fg.set_defaults(func=_formgrader)
    add_similarity_parser(sub)
    return parser


INTERRUPTED = "interrupted: run the same command again to resume"


def main(argv: list[str] | None = None) -> int:
    """Run one command. Ctrl-C prints one line and exits 130: every finished result is on disk, and the same
    command resumes (a result saved is never graded again; the records heal on the next run)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while shutting down prints nothing more
        _end_children()
        print(f"\n{INTERRUPTED}", file=sys.stderr, flush=True)
        return 130


def _end_children() -> None:
    """End this process's own children (the sandbox's zygote, which runs in a session of its own and so never
    sees the terminal's Ctrl-C, and the worker pool's server) before saying anything, so that none of them prints
    a traceback after the one line. Sandboxed processes follow their zygote (parent-death signals)."""
    import glob
    import signal

    def children(pid: int) -> set[int]:
        found: set[int] = set()
        for path in glob.glob(f"/proc/{pid}/task/*/children"):
            try:
                with open(path) as f:
                    found |= {int(p) for p in f.read().split()}
            except (OSError, ValueError):
                continue
        return found

    # The whole tree, listed before anything is ended (an ended parent's children move to another parent): the
    # pool's workers are the children of its server, not of this process, and must say nothing either.
    own = children(os.getpid())
    tree, todo = set(own), list(own)
    while todo:
        for child in children(todo.pop()) - tree:
            tree.add(child)
            todo.append(child)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in own:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
