"""Authoring helper: write a notebook with nbgrader cell metadata from Python.

Used while writing source notebooks; the committed ``.ipynb`` files are the
source of truth afterwards (``exercises/`` is generated from them by nbgrader).

    from tools.nbbuild import md, code, readonly, solution, test, write
    write("solutions/assignments/01_single_head/single_head.ipynb", [md("# Title"), ...])
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat

_KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _meta(grade_id: str, *, solution: bool = False, grade: bool = False, locked: bool = False,
          points: float | None = None) -> dict:
    m = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution,
         "task": False}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def _clean(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def md(text: str, grade_id: str | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell(_clean(text))
    if grade_id:
        cell.metadata.update(_meta(grade_id, locked=True))
    return cell


def code(text: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(_clean(text))
    if tags:
        cell.metadata["tags"] = tags
    return cell


def readonly(grade_id: str, text: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(_clean(text))
    cell.metadata.update(_meta(grade_id, locked=True))
    return cell


def solution(grade_id: str, text: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(_clean(text))
    cell.metadata.update(_meta(grade_id, solution=True))
    return cell


def test(grade_id: str, points: float, visible: str, assignment: str) -> nbformat.NotebookNode:
    """A test cell: ``visible`` runs in the student's kernel; the hidden part runs the judge's check."""
    hidden = (f"### BEGIN HIDDEN TESTS\nfrom autograder.checks import run_local\n"
              f"run_local({assignment!r}, {grade_id!r}, globals())\n### END HIDDEN TESTS")
    cell = nbformat.v4.new_code_cell(_clean(visible) + "\n" + hidden)
    cell.metadata.update(_meta(grade_id, grade=True, locked=True, points=points))
    return cell


def write(path: str | Path, cells: list) -> None:
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": _KERNEL,
                                                         "language_info": {"name": "python"}})
    for i, c in enumerate(nb.cells):
        c["id"] = f"cell-{i:02d}"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
