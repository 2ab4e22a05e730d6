"""Grading throughput: plain serial ``nbgrader autograde`` against ``python -m autograder grade``, same submissions.

    .venv/bin/python benchmarks/grading_throughput.py [--submissions 40] [--workers N] [--json FILE]
    .venv/bin/python benchmarks/grading_throughput.py --scaling 200 2000 [--workers N] [--dask-workers 2]
    .venv/bin/python benchmarks/grading_throughput.py --records 50 400
    .venv/bin/python benchmarks/grading_throughput.py --against REV [--submissions 40] [--rounds 2]

Builds N submissions to exercise 01 (half the reference answers, half with
classic mistakes), grades them once with nbgrader's own autograde, one after the
other as nbgrader does, and once with the course's grader (sandboxed, in
parallel), and prints submissions per minute for both and their ratio. Both
runs use the same machine in the same process tree; the grades are printed too,
so a faster but different answer would show. It also prints where the course
grader's wall-clock time went (gradebook set-up, grading in the workers and
their sandboxes, rendering the feedback), so a change in the ratio can be
traced to its phase.

With ``--scaling SMALL LARGE`` it grades two generated classes (right, wrong and blank submissions in turn)
with the course grader alone, and prints the time per submission of each and their ratio: a grader whose
cost per submission grows with the class (reading the whole gradebook per student did) shows a ratio
above 1; the goal is at most 1.2. ``--dask-workers N`` grades them through a local Dask cluster of N
worker processes, as ``--scheduler`` does over machines.

With ``--against REV`` it grades the same class with the course grader of git revision REV (checked out in a
temporary folder) and with this checkout's, in turn, and prints the ratio of their best times: what a change to
the grader costs, measured in one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from autograder import course  # noqa: E402
from autograder.batch import run  # noqa: E402
from checking import answered_release, mutate, reference_answers  # noqa: E402

A, NB = "01_single_head", "single_head.ipynb"


def build(subs: Path, n: int, blank: bool = False) -> None:
    """``n`` submissions: half right, half with a classic mistake; with ``blank``, a third each right, wrong and
    the release handed in untouched."""
    ref = reference_answers(course.SOURCE / A / NB)
    wrong = dict(ref, scaled_dot_product_attention=mutate(ref["scaled_dot_product_attention"],
                                                          "/ math.sqrt(d_k)", ""))
    texts = [json.dumps(answered_release(A, NB, ref)), json.dumps(answered_release(A, NB, wrong))]
    if blank:
        texts.append((course.RELEASE / A / NB).read_text())
    for i in range(n):
        folder = subs / f"student{i:05d}" / A
        folder.mkdir(parents=True)
        (folder / NB).write_text(texts[i % len(texts)])


def scaling(sizes: list[int], workers: int, scheduler: str | None) -> dict:
    """Grade classes of each size (right, wrong and blank in turn) with the course grader alone and print the
    time per submission of each and the ratio of the largest to the smallest: 1.0 is linear in the class."""
    from autograder import batch

    rows = {}
    steps = {"plan": "plan", "grade (workers)": "_schedule", "record (coordinator)": "record",
             "publish (feedback)": "publish", "CSVs": "write_grades"}
    for n in sizes:
        tmp = Path(tempfile.mkdtemp(prefix="attn-scaling-"))
        PHASES.clear()
        saved = {name: getattr(batch, name) for name in steps.values()}
        for label, name in steps.items():
            setattr(batch, name, _timed(label, saved[name]))
        try:
            build(tmp / "submitted", n, blank=True)
            start = time.perf_counter()
            run(tmp / "submitted", A, tmp / "grades.csv", tmp / "grading", workers=workers, log=lambda s: None,
                scheduler=scheduler)
            seconds = time.perf_counter() - start
        finally:
            for name, fn in saved.items():
                setattr(batch, name, fn)
            shutil.rmtree(tmp, ignore_errors=True)
        # record runs inside the grading step (as each result arrives): the workers' share is the rest
        PHASES["grade (workers)"] = PHASES.get("grade (workers)", 0.0) - PHASES.get("record (coordinator)", 0.0)
        rows[n] = {"seconds": round(seconds, 2), "per_submission": round(seconds / n, 4),
                   "steps_ms_per_submission": {k: round(1000 * v / n, 1) for k, v in PHASES.items()}}
        print(f"{n:>6} submissions: {seconds:8.1f} s, {seconds / n:.3f} s each; per submission, by step: " +
              ", ".join(f"{k} {1000 * v / n:.0f} ms" for k, v in PHASES.items()), flush=True)
    small, large = min(sizes), max(sizes)
    ratio = rows[large]["per_submission"] / rows[small]["per_submission"]
    print(f"time per submission, {large} against {small}: ratio {ratio:.2f} (goal: at most 1.2)")
    return {"sizes": rows, "ratio": round(ratio, 3), "workers": workers, "scheduler": scheduler or "local processes"}


def plain_nbgrader(subs: Path, work: Path) -> tuple[float, dict[str, float]]:
    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI

    db = work / "gradebook.db"
    course.generate_release(A, work / "release", db_path=db)
    config = course.nbgrader_config(submitted_directory=str(subs), autograded_directory=str(work / "autograded"),
                                    feedback_directory=str(work / "feedback"), db_url=f"sqlite:///{db}")
    # the course's config refuses nbgrader's own autograde (records/doors.py: it runs student code unconfined);
    # this baseline is that unconfined autograde, on the benchmark's own generated submissions
    config.Autograde.exporter_class = "nbconvert.exporters.NotebookExporter"
    api = NbGraderAPI(config=config)
    students = sorted(p.name for p in subs.iterdir())
    start = time.perf_counter()
    for s in students:
        res = api.autograde(A, s, force=True, create=True)
        if not res["success"]:
            raise RuntimeError(res["log"][-2000:])
    seconds = time.perf_counter() - start
    with Gradebook(f"sqlite:///{db}") as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = {sub.student.id: float(sub.score) for sub in gb.find_assignment(A).submissions}
    return seconds, scores


PHASES: dict[str, float] = {}  # where the autograder's wall-clock time went, in the coordinating process


def _timed(name: str, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - start

    return timed


def ours(subs: Path, work: Path, workers: int) -> tuple[float, dict[str, float]]:
    from autograder import batch

    PHASES.clear()
    saved = batch.Records.prepare_gradebook, batch._schedule, batch.publish
    batch.Records.prepare_gradebook = _timed("gradebook set-up", batch.Records.prepare_gradebook)
    batch._schedule = _timed("grading (workers, sandboxes)", batch._schedule)
    batch.publish = _timed("feedback (nbgrader generate_feedback, serial)", batch.publish)
    try:
        start = time.perf_counter()
        results = run(subs, A, work / "grades.csv", work / "grading", workers=workers, log=lambda s: None)
        seconds = time.perf_counter() - start
    finally:
        batch.Records.prepare_gradebook, batch._schedule, batch.publish = saved
    PHASES["other"] = seconds - sum(PHASES.values())
    return seconds, {s: sum(t["points"] for nb in r["notebooks"] for t in nb["tests"]) for s, r in results.items()}


AGAINST = r"""
import sys, time
from pathlib import Path
from autograder.batch import run
subs, work, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
start = time.perf_counter()
results = run(subs, "01_single_head", work / "grades.csv", work / "grading", workers=workers, log=lambda s: None)
seconds = time.perf_counter() - start
print(seconds, sum(t["points"] for r in results.values() for nb in r["notebooks"] for t in nb["tests"]))
"""


def against(rev: str, n: int, workers: int, rounds: int) -> dict:
    """The course grader of ``rev`` (a git revision of this repository, checked out in a temporary folder) and this
    checkout's, on the same generated class, in turn, ``rounds`` times: the seconds of each and their ratio (this one
    against ``rev``'s), so a change's cost is measured on one machine in one run."""
    import subprocess

    tmp = Path(tempfile.mkdtemp(prefix="attn-against-"))
    try:
        old = tmp / "old"
        old.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        build(tmp / "submitted", n)
        times: dict[str, list[float]] = {rev: [], "this checkout": []}
        scores: dict[str, float] = {}
        for i in range(rounds):
            for label, root in ((rev, old), ("this checkout", ROOT)):
                work = tmp / f"work-{i}-{len(times[label])}-{label.replace(' ', '-')}"
                env = dict(os.environ, PYTHONPATH=f"{root / 'solutions'}{os.pathsep}{root}")
                out = subprocess.run([sys.executable, "-c", AGAINST, str(tmp / "submitted"), str(work), str(workers)],
                                     cwd=root, env=env, capture_output=True, text=True, check=True).stdout.split()
                times[label].append(float(out[-2]))
                scores[label] = float(out[-1])
                print(f"{label:<16} round {i + 1}: {float(out[-2]):7.1f} s (total score {float(out[-1]):g})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best = {label: min(t) for label, t in times.items()}
    ratio = best["this checkout"] / best[rev]
    print(f"{n} submissions, {workers} workers, best of {rounds}: {rev} {best[rev]:.1f} s, this checkout "
          f"{best['this checkout']:.1f} s: ratio {ratio:.2f}")
    return {"submissions": n, "workers": workers, "seconds": times, "best": best, "ratio": round(ratio, 3),
            "total_score": scores}


def records_cost(sizes: list[int]) -> dict:
    """The coordinator's per-student cost without grading: record a result in gradebooks of each size and time the
    last 50 records (gradebook rows, late penalty, the student's score), against one read of the whole
    assignment's scores (``Records.final_scores``), which the grader once made per student."""
    import copy

    from autograder.notebook import SourceNotebook
    from autograder.records.gradebook import Records
    from autograder.records.results import NotebookResult, Result, TestResult

    src = SourceNotebook.load(course.SOURCE / A / NB, course.RELEASE / A / NB)
    tests = [TestResult(c.grade_id, c.grade_id, c.points, c.points) for c in src.tests()]
    rows = {}
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix="attn-records-"))
        try:
            records = Records(work, A)
            records.prepare_gradebook()
            times = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i in range(n):
                    result = Result(f"s{i:05d}", A, "fp", "v", "", 0.0, [NotebookResult(NB[:-6], copy.deepcopy(tests))])
                    start = time.perf_counter()
                    records.record(result)
                    records.final_score(result.student)
                    times.append(time.perf_counter() - start)
                start = time.perf_counter()
                records.final_scores()
                whole = time.perf_counter() - start
        finally:
            shutil.rmtree(work, ignore_errors=True)
        last = times[-50:]
        rows[n] = {"record_ms": round(1000 * sum(last) / len(last), 1), "whole_gradebook_read_ms": round(1000 * whole, 1)}
        print(f"{n:>6} students: recording one costs {rows[n]['record_ms']:.0f} ms; one read of every score "
              f"{rows[n]['whole_gradebook_read_ms']:.0f} ms", flush=True)
    small, large = min(sizes), max(sizes)
    ratio = rows[large]["record_ms"] / rows[small]["record_ms"]
    print(f"cost of recording one student, {large} against {small} in the gradebook: ratio {ratio:.2f}")
    return {"sizes": rows, "ratio": round(ratio, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=int, default=40)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--scaling", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                        help="instead: grade SMALL and LARGE generated submissions with the course grader and print "
                             "the time per submission of each and their ratio (e.g. --scaling 200 2000)")
    parser.add_argument("--dask-workers", type=int, default=0,
                        help="with --scaling: grade through a local Dask cluster of this many worker processes "
                             "(what --scheduler spreads over machines)")
    parser.add_argument("--records", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                        help="instead: the coordinator's cost of recording one student in gradebooks of SMALL and "
                             "LARGE students, without grading (e.g. --records 50 400)")
    parser.add_argument("--against", metavar="REV",
                        help="instead: the course grader of git revision REV and this checkout's, in turn, on the same "
                             "--submissions, and the ratio of their times (e.g. --against 13d2ebe)")
    parser.add_argument("--rounds", type=int, default=2, help="with --against: times each grader runs (best kept)")
    args = parser.parse_args()
    if args.against:
        rows = against(args.against, args.submissions, args.workers, args.rounds)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    if args.records:
        rows = records_cost(args.records)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    if args.scaling:
        if args.dask_workers:
            from distributed import LocalCluster

            with LocalCluster(n_workers=args.dask_workers, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster:
                rows = scaling(args.scaling, args.workers, cluster.scheduler_address)
                rows["dask_workers"] = args.dask_workers
        else:
            rows = scaling(args.scaling, args.workers, None)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="attn-throughput-"))
    try:
        subs = tmp / "submitted"
        build(subs, args.submissions)
        t_plain, s_plain = plain_nbgrader(subs, tmp / "plain")
        t_ours, s_ours = ours(subs, tmp / "ours", args.workers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.submissions
    rows = {
        "submissions": n, "cores": os.cpu_count(), "workers": args.workers,
        "plain_nbgrader_serial": {"seconds": round(t_plain, 2), "per_minute": round(60 * n / t_plain, 1),
                                  "total_score": sum(s_plain.values())},
        "autograder": {"seconds": round(t_ours, 2), "per_minute": round(60 * n / t_ours, 1),
                       "total_score": sum(s_ours.values())},
    }
    rows["speedup"] = round(t_plain / t_ours, 2)
    rows["autograder_phases_seconds"] = {k: round(v, 2) for k, v in PHASES.items()}
    print(f"{'grader':<32}{'seconds':>10}{'subs/min':>10}{'total score':>13}")
    for name in ("plain_nbgrader_serial", "autograder"):
        r = rows[name]
        print(f"{name:<32}{r['seconds']:>10.1f}{r['per_minute']:>10.1f}{r['total_score']:>13g}")
    print(f"speed-up (throughput ratio): {rows['speedup']:.2f}x with {args.workers} workers on {os.cpu_count()} cores")
    print("where the autograder's time went: " + ", ".join(f"{k} {v:.1f} s" for k, v in PHASES.items()))
    if s_plain != s_ours:
        print("note: the two graders disagree on some grades:",
              {s: (s_plain.get(s), s_ours.get(s)) for s in s_ours if s_plain.get(s) != s_ours.get(s)})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
