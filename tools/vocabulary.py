"""Write each exercise's vocabulary (what its parts may call) into its source notebook, from the one table.

    .venv/bin/python -m tools.vocabulary          # rewrite solutions/assignments/*/*.ipynb
    .venv/bin/python -m tools.vocabulary --check  # exit 1 if a notebook is stale

The table is :data:`attnkit.vocabulary.VOCABULARIES`. Each source notebook gets, after its introduction, a
read-only markdown cell ``vocabulary`` whose text is :func:`attnkit.vocabulary.describe`, and the first test
cell of each part starts with the visible check, :func:`attnkit.vocabulary.check_vocabulary`. Then
``python -m autograder release --all`` regenerates the exercises. ``tests/test_vocabulary.py`` checks both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELL_ID = "vocabulary"
IMPORT = "from attnkit.vocabulary import check_vocabulary  # the rule in 'What your code may call'\n"  # (older form)


def check_block(assignment: str, part: str) -> list[str]:
    """The visible check's lines: the rule checked where the course package is installed, a note where it is not
    (the grader checks it all the same)."""
    return ["try:  # the rule in 'What your code may call' (checked with the course package, attnkit)\n",
            "    from attnkit.vocabulary import check_vocabulary\n",
            *((f"    check_vocabulary({assignment!r}, {part!r}, globals())\n",)
              if len(f"    check_vocabulary({assignment!r}, {part!r}, globals())") <= 88 else
              (f"    check_vocabulary({assignment!r}, {part!r},\n", "                     globals())\n")),
            "except ImportError:\n",
            "    print(\"attnkit is not installed here: the grader checks 'What your code may call'\")\n"]


def _without_check(lines: list[str]) -> list[str]:
    """A test cell's lines without the visible check (either form)."""
    text = "".join(lines)
    for start in ("try:  # the rule in 'What your code may call'",):
        at = text.find(start)
        if at >= 0:
            end = text.index("'What your code may call'\")\n", at + len(start)) + len("'What your code may call'\")\n")
            text = text[:at] + text[end:]
    return [line for line in text.splitlines(keepends=True)
            if line != IMPORT and not line.startswith("check_vocabulary(")]


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def first_tests(assignment: str, cells: list[dict]) -> dict[str, str]:
    """part -> the grade_id of the first test cell whose check exercises it (questions left out)."""
    sys.path.insert(0, str(ROOT))
    from autograder.judging.checks import load_suite

    suite = load_suite(assignment)
    first: dict[str, str] = {}
    for cell in cells:
        gid = _meta(cell).get("grade_id", "")
        check = suite.checks.get(gid)
        for part in check.parts if check else ():
            if not part.startswith("q_"):
                first.setdefault(part, gid)
    return first


def updated(path: Path) -> tuple[str, str]:
    """The notebook's text now, and with the vocabulary written in."""
    from attnkit.vocabulary import describe

    assignment = path.parent.name
    text = path.read_text()
    nb = json.loads(text)
    cells = nb["cells"]
    parts = [_meta(c)["grade_id"] for c in cells if _meta(c).get("solution") and c["cell_type"] == "code"
             and not _meta(c)["grade_id"].startswith("q_")]
    body = "## What your code may call\n\n" + describe(assignment, parts)
    source = body.splitlines(keepends=True)
    at = next((i for i, c in enumerate(cells) if c.get("id") == CELL_ID), None)
    cell = {"cell_type": "markdown", "id": CELL_ID,
            "metadata": {"nbgrader": {"grade": False, "grade_id": CELL_ID, "locked": True, "schema_version": 3,
                                      "solution": False, "task": False}}, "source": source}
    if at is None:
        cells.insert(1, cell)
    else:
        cells[at] = cell
    for part, gid in first_tests(assignment, cells).items():
        test = next(c for c in cells if _meta(c).get("grade_id") == gid)
        lines = _without_check("".join(test["source"]).splitlines(keepends=True))
        doc_end = 0
        if lines and lines[0].startswith('"""'):  # after the test's one-line docstring
            doc_end = next((i + 1 for i, line in enumerate(lines) if i and line.rstrip().endswith('"""')), 1) \
                if not (lines[0].rstrip().endswith('"""') and len(lines[0].strip()) > 3) else 1
        test["source"] = lines[:doc_end] + check_block(assignment, part) + lines[doc_end:]
    for c in cells:  # a test cell that is no longer a part's first loses its check
        if c["cell_type"] == "code" and _meta(c).get("grade") and _meta(c).get("grade_id") not in \
                first_tests(assignment, cells).values():
            c["source"] = _without_check("".join(c["source"]).splitlines(keepends=True))
    return text, json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a source notebook is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted((ROOT / "solutions" / "assignments").glob("*/*.ipynb")):
        old, new = updated(path)
        if old != new:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new)
    for path in stale:
        print(("stale: " if args.check else "wrote ") + str(path))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
