"""Scale-out: grading through a Dask distributed cluster (a LocalCluster here) gives the same grades as the
local run, the student's code runs in a sandbox the worker starts, not in the worker's process, and the
workers write nothing into the grading folder (results, gradebook and feedback are the coordinator's).
Grading students separately (one Kubernetes Job each) and merging their results regrades nothing when
the Jobs share the secret."""

from __future__ import annotations

import csv
import json

import pytest

from autograder import course
from autograder.batch import run
from autograder.notebook import SourceNotebook
from autograder.isolation.sandbox import Limits
from checking import answered_release, mutate, reference_answers

pytestmark = pytest.mark.slow
A, NB = "01_single_head", "single_head.ipynb"
# Every auto-graded point: what a right answer to every code part and question earns before anyone grades the
# written answers by hand (the CSV's max_score counts those too).
AUTO_POINTS = sum(c.points for c in SourceNotebook.load(course.SOURCE / A / NB).tests())


def rows(path):
    with open(path, newline="") as f:
        return {r["student"]: (r["score"], r["max_score"], r["reason"]) for r in csv.DictReader(f)}


def write_audit(folder: str):
    """A Dask worker plugin that records every write a worker process makes under ``folder`` (Python's audit
    hooks), and a function for ``client.run`` that returns them. Defined here so that both travel by value."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WriteAudit(WorkerPlugin):
        name = "write-audit"

        def setup(self, worker) -> None:
            import os
            import sys

            seen: list[str] = []
            worker.write_audit = seen
            writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

            def hook(event: str, args: tuple) -> None:
                if event == "open":
                    path, mode, flags = args
                    writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & writes)
                elif event in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.chmod"):
                    path, writing = args[0], True
                else:
                    return
                if writing and isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path).startswith(folder):
                    seen.append(f"{event} {os.fsdecode(path)}")

            sys.addaudithook(hook)

    def written(dask_worker) -> list[str]:
        return list(getattr(dask_worker, "write_audit", ["the audit plugin is not installed"]))

    return WriteAudit(), written


def test_dask_cluster_grades_like_the_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    ref = reference_answers(course.SOURCE / A / NB)
    # This answer is wrong whenever it runs inside a process that has Dask loaded (a worker's own process).
    # (the flag is set by a statement the part does not reach, so its own vocabulary stays clean)
    spy = dict(ref, softmax="import sys\nFLAGS = {}\nFLAGS['dask'] = 'distributed' in sys.modules\n" + ref["softmax"].replace(
        "    x_max = x.amax", "    if FLAGS['dask']:\n        return x\n    x_max = x.amax", 1))
    variants = {
        "reference": ref,
        "unscaled": dict(ref, scaled_dot_product_attention=mutate(ref["scaled_dot_product_attention"], "/ math.sqrt(d_k)", "")),
        "spy": spy,
    }
    subs = tmp_path / "submitted"
    for student, answers in variants.items():
        (subs / student / A).mkdir(parents=True)
        (subs / student / A / NB).write_text(json.dumps(answered_release(A, NB, answers)))
    (subs / "broken" / A).mkdir(parents=True)
    (subs / "broken" / A / NB).write_text("{")
    limits = Limits(cell_timeout=30, call_timeout=20)
    run(subs, A, tmp_path / "local.csv", tmp_path / "w-local", limits, workers=1, log=print)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            plugin, written_by_workers = write_audit(str(tmp_path))
            client.register_plugin(plugin)
            run(subs, A, tmp_path / "dask.csv", tmp_path / "w-dask", limits, log=print,
                scheduler=cluster.scheduler_address)
            written = client.run(written_by_workers)
            probe = str(tmp_path / "probe")
            client.run(lambda: open(probe, "w").close())  # the audit sees a write when there is one
            control = client.run(written_by_workers)
    assert len(written) == 2 and all(w == [] for w in written.values()), f"workers wrote: {written}"
    assert all(any(probe in line for line in w) for w in control.values()), control
    assert (tmp_path / "w-dask" / "feedback").is_dir(), "the coordinator wrote no feedback"
    assert rows(tmp_path / "dask.csv") == rows(tmp_path / "local.csv")
    got = rows(tmp_path / "dask.csv")
    assert float(got["reference"][0]) == float(got["spy"][0]) == AUTO_POINTS, got
    assert float(got["unscaled"][0]) < AUTO_POINTS, got
    assert "not valid JSON" in got["broken"][2]


def test_jobs_that_share_the_secret_merge_without_regrading(tmp_path):
    """The Kubernetes recipe (autograder/README.md): one Job per student, each with its own grading folder and
    the term's secret copied in; the merge host copies the secret and the results and grades nothing again."""
    import shutil

    ref = reference_answers(course.SOURCE / A / NB)
    answers = {"alice": ref, "bob": dict(ref, scaled_dot_product_attention=mutate(
        ref["scaled_dot_product_attention"], "/ math.sqrt(d_k)", ""))}
    subs = tmp_path / "submissions"
    for student, given in answers.items():
        (subs / student / A).mkdir(parents=True)
        (subs / student / A / NB).write_text(json.dumps(answered_release(A, NB, given)))
    limits = Limits(cell_timeout=30, call_timeout=20)
    secret = tmp_path / "secret"
    secret.write_text("the term's secret, made once\n")
    for student in answers:  # each Job: its own folder, the shared secret copied in before it starts
        job = tmp_path / "jobs" / student / "grading"
        job.mkdir(parents=True)
        shutil.copy(secret, job / "secret")
        run(subs, A, job.parent / "grades.csv", job, limits, workers=1, log=print, students=[student])
    merged = tmp_path / "merged"
    (merged / "results" / A).mkdir(parents=True)
    shutil.copy(secret, merged / "secret")
    for student in answers:
        shutil.copy(tmp_path / "jobs" / student / "grading" / "results" / A / f"{student}.json", merged / "results" / A)
    logs: list[str] = []
    run(subs, A, tmp_path / "merged.csv", merged, limits, workers=1, log=logs.append)
    assert any("2 already graded, 0 to grade" in line for line in logs), logs
    got = rows(tmp_path / "merged.csv")
    assert float(got["alice"][0]) == AUTO_POINTS and float(got["bob"][0]) < AUTO_POINTS, got
    assert (merged / "feedback" / "alice" / A).is_dir(), "the merge wrote no feedback"
