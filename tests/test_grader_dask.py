"""Grading through a Dask distributed cluster (a LocalCluster here) gives the same grades as the local run,
and the student's code runs in a sandbox the worker starts, not in the worker's process."""

from __future__ import annotations

import csv
import json

import pytest

from autograder import course
from autograder.batch import run
from autograder.sandbox import Limits
from checking import answered_release, mutate, reference_answers

pytestmark = pytest.mark.slow
A, NB = "01_single_head", "single_head.ipynb"


def rows(path):
    with open(path, newline="") as f:
        return {r["student"]: (r["score"], r["max_score"], r["reason"]) for r in csv.DictReader(f)}


def test_dask_cluster_grades_like_the_local_run(tmp_path):
    distributed = pytest.importorskip("distributed")
    ref = reference_answers(course.SOURCE / A / NB)
    # This answer is wrong whenever it runs inside a process that has Dask loaded (a worker's own process).
    spy = dict(ref, softmax="import sys\nIN_DASK = 'distributed' in sys.modules\n" + ref["softmax"].replace(
        "    x_max = x.amax", "    if IN_DASK:\n        return x\n    x_max = x.amax", 1))
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
        run(subs, A, tmp_path / "dask.csv", tmp_path / "w-dask", limits, log=print,
            scheduler=cluster.scheduler_address)
    assert rows(tmp_path / "dask.csv") == rows(tmp_path / "local.csv")
    got = rows(tmp_path / "dask.csv")
    assert got["reference"][0] == got["reference"][1] and got["spy"][0] == got["spy"][1]
    assert float(got["unscaled"][0]) < float(got["unscaled"][1])
    assert "not valid JSON" in got["broken"][2]
