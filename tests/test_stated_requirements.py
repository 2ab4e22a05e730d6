"""The graded checks as one generation (issue 20) whose contracts a student can read (issue 23).

- Every chapter's checks module declares ``STATED_REQUIREMENTS`` as data: requirement -> the check(s) that
  enforce it, the words of the message a violating answer gets, and the key phrase that states it in the
  exercise text. ``tests/test_chNN_grading.py`` breaks each requirement alone (``chapter_checking.
  assert_requirement_broken_alone``); here the table is read against the suite and the student's notebook.
- No chapter's checks import another chapter's: what they share lives in ``autograder/judging/checks/common.py``.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from autograder.judging.checks import Requirement, load_suite
from autograder.course import RELEASE

CHECKS = Path(__file__).resolve().parents[1] / "autograder" / "judging" / "checks"
CHAPTERS = sorted(p.stem.removeprefix("ch") for p in CHECKS.glob("ch[0-9][0-9]_*.py"))


def test_nine_chapters_have_checks():
    assert [c[:2] for c in CHAPTERS] == [f"{i:02d}" for i in range(1, 10)], CHAPTERS


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth of its code), relative imports resolved."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative to autograder.judging.checks
                module = "autograder.judging.checks" + ("." + module if module else "")
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}  # ``from autograder.judging.checks import ch01_x``
    return names


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_chapter_imports_another_chapters_checks(chapter):
    imported = _imported_modules(CHECKS / f"ch{chapter}.py")
    others = {m for m in imported if re.fullmatch(r"autograder\.checks\.ch\d\d_\w+", m)}
    assert not others, f"ch{chapter} imports {sorted(others)}: move what they share to autograder/judging/checks/common.py"


def student_text(assignment: str) -> str:
    """The released notebook's cells (markdown, docstrings, comments, the visible tests), lower case, without
    markdown's backticks, stars and dollars, whitespace collapsed: what the student reads."""
    cells = [("".join(c["source"])) for path in sorted((RELEASE / assignment).glob("*.ipynb"))
             for c in json.loads(path.read_text())["cells"]]
    return _norm("\n".join(cells))


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[`*$]", "", text.lower()))


def _table(chapter: str) -> dict:
    return importlib.import_module(f"autograder.judging.checks.ch{chapter}").STATED_REQUIREMENTS


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_requirement_maps_to_checks_of_its_suite(chapter):
    suite, table = load_suite(chapter), _table(chapter)
    assert len(table) >= 8, table
    for name, req in table.items():
        assert isinstance(req, Requirement) and req.checks and req.message and req.phrase, name
        assert set(req.checks + req.also) <= set(suite.checks), (name, req)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_requirement_is_stated_in_the_exercise_text(chapter):
    """Issue 23: a correct answer written from the text alone can know every requirement a check enforces."""
    text, table = student_text(chapter), _table(chapter)
    missing = {name: req.phrase for name, req in table.items() if _norm(req.phrase) not in text}
    assert not missing, f"requirements whose key phrase is not in exercises/{chapter}: {missing}"
