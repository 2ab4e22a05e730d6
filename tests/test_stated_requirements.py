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


def test_every_chapter_has_checks():
    assert [c[:2] for c in CHAPTERS] == [f"{i:02d}" for i in range(1, 11)], CHAPTERS


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


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_answer_cell(cell: dict) -> bool:
    """A cell where the student writes an answer to a question: a solution cell that defines no function or
    class (a value to assign, or a written answer in markdown)."""
    source = "".join(cell["source"])
    return bool(_nbgrader(cell).get("solution")) and not re.search(r"^\s*(def|class) ", source, re.MULTILINE)


def instruction_cells(assignment: str, checks: tuple[str, ...] = ()) -> list[str]:
    """What tells the student how to write the answers, in the released notebook: the markdown cells and the
    stubs (signatures and docstrings) of the solution cells. Not the read-only setup code, not the test cells
    (their docstrings and messages come after the answer is written), nor an answer cell's stub, nor a
    question (the markdown cell just before an answer cell) unless ``checks`` grade that question's answer
    (``test_<answer id>``)."""
    kept = []
    for path in sorted((RELEASE / assignment).glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            following = cells[i + 1] if i + 1 < len(cells) else None
            if _is_answer_cell(cell):
                continue
            if cell["cell_type"] == "markdown" and following and _is_answer_cell(following):
                if f"test_{_nbgrader(following).get('grade_id')}" not in checks:
                    continue
            if cell["cell_type"] == "markdown" or _nbgrader(cell).get("solution"):
                kept.append("".join(cell["source"]))
    return kept


def student_text(assignment: str, checks: tuple[str, ...] = ()) -> str:
    """The instruction text of the released notebook (``instruction_cells``), lower case, without markdown's
    backticks, stars and dollars, whitespace collapsed."""
    return _norm("\n".join(instruction_cells(assignment, checks)))


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
    """Issue 23: a correct answer written from the text alone can know every requirement a check enforces: its
    key phrase is in the instructions (markdown and solution stubs), not only in a test, a question or a message."""
    table = _table(chapter)
    missing = {name: req.phrase for name, req in table.items()
               if _norm(req.phrase) not in student_text(chapter, req.checks + req.also)}
    assert not missing, f"requirements whose key phrase is not in exercises/{chapter}: {missing}"


MIN_WORDS, MIN_CHARS = 3, 12


def _words(phrase: str) -> list[str]:
    """The phrase's words: runs of letters, digits and underscores (a formula counts by its symbols:
    ``mask.unsqueeze(1)`` is three words, ``sqrt(d_k)`` two)."""
    return re.findall(r"[a-z0-9_]+", _norm(phrase))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_key_phrase_is_distinctive(chapter):
    """A key phrase names its requirement, so a word that occurs anywhere in the notebook cannot stand for it:
    every phrase has at least ``MIN_WORDS`` words (runs of letters, digits and underscores, so a formula or a
    code expression counts by its symbols) and at least ``MIN_CHARS`` characters. ``'device'``, ``'bool'``,
    ``'sqrt(d_k)'`` or ``'(output, weights)'`` alone fail; ``'mask.unsqueeze(1)'``,
    ``'softmax(q k^t / sqrt(d_k)) v'`` or ``'(b, 1, max_len)'`` pass."""
    weak = {name: req.phrase for name, req in _table(chapter).items()
            if len(_words(req.phrase)) < MIN_WORDS or len(_norm(req.phrase).strip()) < MIN_CHARS}
    assert not weak, f"ch{chapter}: key phrases too short to show where the text states the requirement: {weak}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_reviewers_list_is_printed_from_the_data(chapter):
    """``python -m autograder.judging.checks --requirements NN`` lists every check with its property and every
    stated requirement under the check that enforces it: the requirements are written once, as data."""
    from autograder.judging.checks.__main__ import requirements_list

    listing, table = requirements_list(chapter[:2]), _table(chapter)
    assert all(f"{gid} (" in listing for gid in load_suite(chapter).checks), listing
    assert all(f"- {name}: \"{req.phrase}\"" in listing for name, req in table.items()), listing
    assert "do not exist" not in listing
    doc = importlib.import_module(f"autograder.judging.checks.ch{chapter}").__doc__ or ""
    assert sum(req.phrase in doc for req in table.values()) < 2, "the requirements are data: keep prose out of the docstring"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_question_tables_give_the_points_of_their_test_cells(chapter):
    """A question's row in its chapter's table states its points; the notebook's test cell holds the same."""
    cells = {_nbgrader(c).get("grade_id"): _nbgrader(c) for path in sorted((RELEASE / chapter).glob("*.ipynb"))
             for c in json.loads(path.read_text())["cells"]}
    rows = {gid: c.points for gid, c in load_suite(chapter).checks.items() if c.points is not None}
    assert all(cells[gid].get("points") == points for gid, points in rows.items()), rows


def test_the_readmes_chapter_skeleton_uses_the_engine_as_it_is():
    """"Adding a chapter" (autograder/README.md) shows a chapter's checks module: it parses, and every name it
    imports from the engine exists, so a newcomer who copies it starts from working code."""
    import autograder.judging.checks as engine

    readme = (CHECKS.parents[1] / "README.md").read_text()
    section = readme[readme.index("## Adding a chapter"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 9)]
    tree = ast.parse(code)
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == "autograder.judging.checks" for a in node.names}
    assert names and all(hasattr(engine, n) for n in names), sorted(n for n in names if not hasattr(engine, n))
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert {"SUITE.oracle", "SUITE.questions", "twin", "requirements"} <= calls, calls
