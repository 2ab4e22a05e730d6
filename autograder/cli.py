"""Command line: ``python -m autograder {release,grade,feedback,extension,similarity} ...``.

Every command works in the course's one grading folder, the one holding the gradebook that
``nbgrader_config.py`` names (``grading/``), unless ``--workdir`` names another one together
with ``--separate-gradebook``.

Imports: course, batch, gradebook, feedback, sandbox (``Limits``, ``require_isolation``).
"""

from __future__ import annotations

import argparse
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


def _grade(args: argparse.Namespace) -> int:
    from autograder import batch
    from autograder.isolation.sandbox import IsolationUnavailable, require_isolation

    workdir = _workdir(args)
    if workdir is None:
        return 2
    out = args.out or workdir / "grades.csv"

    if args.require_isolation:
        try:
            require_isolation()
        except IsolationUnavailable as e:
            print(f"--require-isolation: nothing was graded. {e}", file=sys.stderr)
            return 3
    results = batch.run(args.submissions, args.assignment, out, workdir, limits_from(args), args.workers,
                        args.force, log=lambda s: print(s, file=sys.stderr, flush=True), scheduler=args.scheduler,
                        students=args.students, regrade=args.regrade)
    print(f"wrote {out} ({len(results)} students)")
    return 0


def _feedback(args: argparse.Namespace) -> int:
    """After grading by hand: reassign the late penalties on the totals (hand grades included), render the
    feedback again from the gradebook and rewrite the CSV, so every place shows the same score."""
    from autograder.records.feedback import generate_feedback
    from autograder.records.gradebook import Records, write_csv

    workdir = _workdir(args)
    if workdir is None:
        return 2
    records = Records(workdir, args.assignment)
    results = {p.stem: r for p in sorted(records.results.glob("*.json")) if (r := records.load(p.stem)) is not None}
    before = records.final_scores()
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
    for line in records.changes(before):
        print(line, file=sys.stderr)
    out = args.out or records.workdir / "grades.csv"
    write_csv(out, records, results)
    print(f"wrote {out} ({len(results)} students)")
    return 1 if failed else 0


def _extension(args: argparse.Namespace) -> int:
    """Grant (or, with zero, remove) a student's extension in the gradebook; late penalties follow it."""
    from nbgrader.api import Gradebook, MissingEntry

    from autograder.records.gradebook import Records

    workdir = _workdir(args)
    if workdir is None:
        return 2
    records = Records(workdir, args.assignment)
    records.prepare_gradebook()
    with Gradebook(f"sqlite:///{records.db}") as gb:
        try:
            gb.find_student(args.student)
        except MissingEntry:
            gb.add_student(args.student)
        try:
            gb.find_submission(args.assignment, args.student)
        except MissingEntry:
            gb.add_submission(args.assignment, args.student)
        gb.grant_extension(args.assignment, args.student, days=args.days, hours=args.hours)
    print(f"{args.student}: extension of {args.days:g} days {args.hours:g} hours on {args.assignment}; "
          "run `grade` again to reassign the late penalty")
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
    p.add_argument("--out", type=Path, help="CSV file to write (default: grades.csv in the grading folder)")
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
    fb.add_argument("--out", type=Path, help="CSV file to rewrite (default: grades.csv in the grading folder)")
    add_workdir_options(fb)
    fb.set_defaults(func=_feedback)
    ext = sub.add_parser("extension", help="grant a student an extension (stored in nbgrader's gradebook)")
    ext.add_argument("--assignment", required=True, help="assignment name, e.g. 01_single_head")
    ext.add_argument("--student", required=True, help="the student's id")
    ext.add_argument("--days", type=float, default=0.0, help="days added to the due date")
    ext.add_argument("--hours", type=float, default=0.0, help="hours added to the due date")
    add_workdir_options(ext)
    ext.set_defaults(func=_extension)
    fg = sub.add_parser("formgrader", help="serve nbgrader's formgrader for the course (loopback, with a token)")
    fg.add_argument("--port", type=int, default=8888, help="port on 127.0.0.1 (default: 8888)")
    fg.set_defaults(func=_formgrader)
    add_similarity_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
