"""A chapter's checks: the :class:`Suite` of one assignment (its checks keyed by the test cell they grade, its
bans), the requirements its text states as data (:class:`Requirement`), how a check's seed is derived
(:func:`seed_for`) and how a notebook's hidden tests run one (:func:`run_local`)."""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autograder.judging.checks.backends import Backend, LocalBackend
from autograder.judging.checks.oracle import oracle
from autograder.judging.checks.questions import Question
from autograder.judging.checks.trial import Trial


@dataclass
class Check:
    grade_id: str
    fn: Callable[[Trial], None]
    parts: tuple[str, ...]  # the solution cells (function or class names) this check exercises
    doc: str  # the one property it tests, in a line: what the feedback shows beside the score
    points: float | None = None  # a question's points, from its table (other checks: the notebook's)


@dataclass
class Suite:
    """The checks of one assignment, keyed by the test cell ``grade_id`` they grade."""

    assignment: str
    checks: dict[str, Check] = field(default_factory=dict)
    # part -> {attribute or imported name: what it is}: names that part's answer must not use
    forbidden: dict[str, dict[str, str]] = field(default_factory=dict)
    asked: dict[str, Question] = field(default_factory=dict)  # the conceptual questions' table (see questions)

    def add(self, grade_id: str, parts: Iterable[str], fn: Callable[[Trial], None], doc: str,
            points: float | None = None) -> None:
        if grade_id in self.checks:
            raise ValueError(f"check {grade_id!r} registered twice")
        self.checks[grade_id] = Check(grade_id, fn, tuple(parts), doc, points)

    def check(self, grade_id: str, parts: Iterable[str]) -> Callable[[Callable[[Trial], None]], Callable[[Trial], None]]:
        """Decorator: the function is the check of ``grade_id``; its docstring's first paragraph says what it tests."""
        def register(fn: Callable[[Trial], None]) -> Callable[[Trial], None]:
            self.add(grade_id, parts, fn, " ".join((fn.__doc__ or grade_id).strip().split("\n\n")[0].split()))
            return fn

        return register

    def oracle(self, grade_id: str, part: str, words: str, **kw: Any) -> None:
        """A check in the oracle form (:func:`autograder.judging.checks.oracle.oracle`: cases as data)."""
        self.add(grade_id, [part], oracle(part, **kw), words)

    def questions(self, table: Mapping[str, Question]) -> None:
        """The chapter's conceptual questions, one check ``test_<name>`` per row, graded on the value of ``name``."""
        self.asked.update(table)
        for name, q in table.items():
            self.add(f"test_{name}", [name], lambda t, name=name, q=q: q.judge(t.value(name), name), q.words, q.points)

    def bans(self, parts: Iterable[str]) -> tuple[str, ...]:
        """What is refused at run time while a check of ``parts`` runs: for every part it exercises, its vocabulary's
        run-time words (:meth:`attnkit.vocabulary.Vocabulary.runtime_words`: the operators that do its topic, the
        libraries outside) and the names of ``forbidden``."""
        from attnkit.vocabulary import vocabulary

        parts = list(parts)
        return tuple(sorted({name for p in parts for name in self.forbidden.get(p, {})} | {
            word for p in parts for word in vocabulary(self.assignment, p).runtime_words()}))

    def run(self, grade_id: str, backend: Backend, seed: int) -> None:
        """Run the check of test cell ``grade_id`` on the student's code behind ``backend``.

        The one way a check is run, by the judge, by the source notebooks' hidden tests
        (:func:`run_local`) and by the tests: every call the check makes carries the bans of the
        parts it exercises. Returns when the check passes; raises ``CheckFailed`` (or
        ``StudentError``) with the student-facing message when it does not."""
        check = self.checks[grade_id]
        check.fn(Trial(backend, seed, self.bans(check.parts)))


@dataclass(frozen=True)
class Requirement:
    """One requirement the exercise's text states, as data beside the checks (``STATED_REQUIREMENTS``): the one
    place a chapter lists them (``python -m autograder.judging.checks --requirements NN`` prints them for a
    reviewer).

    ``checks``: the check(s) that enforce it (an answer breaking only this requirement fails these and no
    other); ``message``: words of the message such an answer gets; ``phrase``: words of the student's
    notebook (markdown or docstrings) that state it; ``also``: checks that the same answer fails too, with
    their own words (a pair missing breaks every check that reads the pair). ``tests/test_stated_requirements.py``
    reads the phrases against the notebook, ``tests/chapter_checking.py`` breaks each requirement alone."""

    checks: tuple[str, ...]
    message: str
    phrase: str
    also: tuple[str, ...] = ()


def requirements(rows: Mapping[str, tuple]) -> dict[str, Requirement]:
    """A chapter's ``STATED_REQUIREMENTS`` from its rows: name -> (check(s), words of the message, words of the
    text that state it[, the checks the same answer also fails]); a row's check(s): one grade id or several."""
    def one(checks: str | Iterable[str], message: str, phrase: str, also: Iterable[str] = ()) -> Requirement:
        return Requirement((checks,) if isinstance(checks, str) else tuple(checks), message, phrase, tuple(also))

    return {name: one(*row) for name, row in rows.items()}


def load_suite(assignment: str) -> Suite:
    """The suite of ``assignment`` (``01_single_head`` -> ``autograder.judging.checks.ch01_single_head``)."""
    try:
        module = importlib.import_module(f"autograder.judging.checks.ch{assignment}")
    except ModuleNotFoundError as e:
        raise KeyError(f"no checks for assignment {assignment!r}") from e
    return module.SUITE


def seed_for(secret: str, assignment: str, grade_id: str) -> int:
    digest = hashlib.sha256(f"{secret}\0{assignment}\0{grade_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


_SAID_UNCONFINED = False  # run_local's note, once per process


def run_local(assignment: str, grade_id: str, namespace: Mapping[str, Any], secret: str = "local") -> None:
    """Run one check against the functions in ``namespace`` (a notebook's ``globals()``).

    This is what the source notebooks' hidden tests call, so that the instructor sees them pass on the
    reference. Under plain ``nbgrader autograde`` it runs in the student's own kernel, with the
    grader's rights and no sandbox: a note says so, once per kernel, on stdout (nbgrader counts any
    output on stderr as a failed test)."""
    global _SAID_UNCONFINED
    if not _SAID_UNCONFINED:
        _SAID_UNCONFINED = True
        print("note: this check runs in this notebook's own kernel, not in the grader's sandbox; grade "
              "submissions with `python -m autograder grade` (autograder/README.md): plain `nbgrader "
              "autograde` runs student code unconfined, with your rights")
    backend = LocalBackend(dict(namespace) if not isinstance(namespace, dict) else namespace)
    load_suite(assignment).run(grade_id, backend, seed_for(secret, assignment, grade_id))
