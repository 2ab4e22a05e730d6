"""The committed exercises/ are exactly what nbgrader generates from solutions/assignments/ (never edited by hand)."""

from __future__ import annotations

import json

import pytest

from autograder import course

pytestmark = pytest.mark.slow


def _cells(path):
    nb = json.loads(path.read_text())
    return nb["cells"], nb["metadata"]


@pytest.mark.parametrize("assignment", course.assignments())
def test_release_is_generated_and_current(assignment, tmp_path):
    fresh = course.generate_release(assignment, tmp_path)
    committed = course.RELEASE / assignment
    assert committed.is_dir(), f"exercises/{assignment} missing: run `make exercises`"
    names = sorted(p.name for p in fresh.rglob("*") if p.is_file())
    assert sorted(p.name for p in committed.rglob("*") if p.is_file()) == names
    for name in names:
        if name.endswith(".ipynb"):
            assert _cells(committed / name) == _cells(fresh / name), (
                f"exercises/{assignment}/{name} differs from what nbgrader generates from "
                f"solutions/assignments/{assignment}: run `make exercises` (never edit exercises/ by hand)")
        else:
            assert (committed / name).read_bytes() == (fresh / name).read_bytes()


@pytest.mark.parametrize("assignment", course.assignments())
def test_release_hides_solutions_and_hidden_tests(assignment):
    for path in (course.RELEASE / assignment).glob("*.ipynb"):
        text = path.read_text()
        for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "run_local"):
            assert secret not in text, f"{path} contains {secret!r}"
        assert "NotImplementedError" in text
        first = json.loads(text)["cells"][0]
        assert first["cell_type"] == "markdown" and "generated" in "".join(first["source"]).lower()
