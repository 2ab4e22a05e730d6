"""Answers graded by hand: which cells need a manual grade, and what the student wrote in them.

nbgrader marks a cell for manual grading when it is an answer cell with points
(``solution`` and ``grade``, markdown or code) or a task (``task``). The judge
never grades these; the batch carries the student's text for them, and the
cells the student added (helpers, notes), into the autograded notebook, where
formgrader shows them with a manual score and comment box.

Imports: :mod:`autograder.notebook` (reading a submission), :mod:`autograder.records.results`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autograder.notebook import canonical_text, cell_text, defined_names, nbgrader_meta, read_notebook
from autograder.records.results import StudentCells

MAX_ADDED_CELLS = 50  # added cells carried into the autograded notebook, per notebook
MAX_CELL_CHARS = 20000  # characters kept of each carried cell


def is_manual(cell: dict[str, Any]) -> bool:
    """True for a cell nbgrader grades by hand: an answer with points, or a task."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("task") or (meta.get("solution") and meta.get("grade")))


def student_cells(path: Path | None, release: dict[str, Any]) -> StudentCells:
    """The student's answers to the manual cells of ``release`` and the cells they added.

    A student cell answers a manual cell when it carries that cell's ``grade_id``.
    A cell is the student's own when its ``grade_id`` (if any) is not one of the
    release's, its text is not a release cell's, and (for code) it does not define
    an auto-graded part (those are answers, carried by the judge's result).
    """
    out = StudentCells()
    if path is None:
        return out
    nb = read_notebook(path)  # size-capped; raises BadNotebook
    cells = [c for c in release.get("cells", []) if isinstance(c, dict)]
    ids = {nbgrader_meta(c).get("grade_id") for c in cells} - {None, ""}
    manual = {nbgrader_meta(c)["grade_id"] for c in cells if is_manual(c) and nbgrader_meta(c).get("grade_id")}
    parts = {nbgrader_meta(c).get("grade_id") for c in cells if nbgrader_meta(c).get("solution")} - manual
    texts = {canonical_text(cell_text(c.get("source"))) for c in cells}
    after = ""
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown"):
            continue
        gid = nbgrader_meta(cell).get("grade_id")
        gid = gid if isinstance(gid, str) else ""
        source = cell_text(cell.get("source"))[:MAX_CELL_CHARS]
        if gid in manual:
            out.written.setdefault(gid, source)
        if gid in ids:
            after = gid
            continue
        if not source.strip() or canonical_text(source) in texts:
            continue
        if cell["cell_type"] == "code" and defined_names(source) & parts:
            continue
        if len(out.added) < MAX_ADDED_CELLS:
            out.added.append((after, cell["cell_type"], source))
    released = {nbgrader_meta(c)["grade_id"]: canonical_text(cell_text(c.get("source"))) for c in cells
                if nbgrader_meta(c).get("grade_id") in manual}
    answers = {g for g in manual if not any(nbgrader_meta(c).get("grade_id") == g and nbgrader_meta(c).get("task")
                                            for c in cells)}  # a task is answered elsewhere
    out.unanswered = sorted(g for g in answers if g not in out.written or canonical_text(out.written[g]) == released[g])
    return out
