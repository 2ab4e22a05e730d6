"""Conceptual questions: the answer is a value the student assigned (read with ``Trial.value``).

A chapter writes its questions as a table, ``SUITE.questions({name: number(...) | listed(...) | choice(...)})``:
for each, the right value (computed from the question's inputs, so a reader can check it), the words of what it
asks (the check's description), the named mistakes (message -> the wrong value; for a choice, the wrong choice ->
message) and the points of its test cell (``tests/test_stated_requirements.py`` compares them with the notebook).
The right value is never revealed in a message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from autograder.judging.checks.compare import fail_if_named
from autograder.judging.checks.verdicts import CheckFailed


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number (or bool) it is; anything else unchanged (the runner sends numbers as
    numbers already, ``harness._numbers``: this is for values that did not travel, a check's own arithmetic)."""
    return value.item() if isinstance(value, np.generic) else value


def _as_number(value: Any, what: str) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"{what} should be a number, got {type(value).__name__}")
    return float(value)


def expect_number(value: Any, expected: float, what: str, mistakes: Mapping[str, float] | None = None,
                  rel: float = 1e-3, abs_tol: float = 1e-6) -> None:
    """``value`` must be a number within ``rel`` (relative) or ``abs_tol`` of ``expected``; a known wrong
    value (``mistakes``: message -> value, NaN included) is named. The expected value is not revealed."""
    v = _as_number(value, what)
    if math.isclose(v, expected, rel_tol=rel, abs_tol=abs_tol):
        return
    fail_if_named(v, mistakes, what, lambda a, b: math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)
                  or (math.isnan(a) and math.isnan(b)))
    raise CheckFailed(f"{what} is not right (you answered {v:.6g})")


def expect_tuple(value: Any, expected: tuple, what: str, mistakes: Mapping[str, tuple] | None = None) -> None:
    """``value`` must be a tuple (or list) equal to ``expected`` item by item (numbers compared exactly)."""
    if isinstance(value, Tensor) and value.dim() == 1:
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise CheckFailed(f"{what} should be a tuple like {tuple('.' * len(expected))!r}, got {type(value).__name__}")
    got = tuple(_plain(x) for x in value)
    if got == tuple(expected):
        return
    fail_if_named(got, mistakes, what, lambda a, b: a == tuple(b))
    raise CheckFailed(f"{what} is not right (you answered {got!r})")


def expect_choice(value: Any, expected: str, what: str, choices: Iterable[str],
                  mistakes: Mapping[str, str] | None = None) -> None:
    """``value`` must name one of ``choices`` (case and surrounding spaces ignored) and be ``expected``;
    ``mistakes`` maps a wrong choice to the message that explains it."""
    options = [str(c) for c in choices]
    if not isinstance(value, str):
        raise CheckFailed(f"{what} should be one of {', '.join(repr(c) for c in options)} (a string), "
                          f"got {type(value).__name__}")
    got = value.strip().lower()
    if got not in [c.lower() for c in options]:
        raise CheckFailed(f"{what} should be one of {', '.join(repr(c) for c in options)}, got {value[:40]!r}")
    if got == expected.lower():
        return
    fail_if_named(got, {message: wrong for wrong, message in (mistakes or {}).items()}, what,
                  lambda a, b: a == b.lower())
    raise CheckFailed(f"{what} is not right (you chose {value.strip()[:40]!r})")


@dataclass(frozen=True)
class Question:
    """One row of a chapter's question table: see :func:`number`, :func:`listed`, :func:`choice`."""

    judge: Callable[[Any, str], None]  # (the student's value, the variable's name) -> None or CheckFailed
    words: str  # what the question asks: the check's description
    mistakes: Mapping[str, Any] = field(default_factory=dict)
    points: float = 1


def number(answer: float, words: str, mistakes: Mapping[str, float], points: float = 1, rel: float = 1e-3,
           abs_tol: float = 1e-6) -> Question:
    """A number within ``rel`` / ``abs_tol``; ``mistakes``: message -> wrong number (NaN may be one)."""
    return Question(lambda v, name: expect_number(v, answer, name, mistakes, rel, abs_tol), words, mistakes, points)


def listed(answer: tuple, words: str, mistakes: Mapping[str, tuple], points: float = 1,
           prepare: Callable[[Any], Any] | None = None) -> Question:
    """A tuple (a shape, row numbers); ``prepare`` normalises the value first (``row_set``: order-free)."""
    return Question(lambda v, name: expect_tuple(prepare(v) if prepare else v, answer, name, mistakes), words,
                    mistakes, points)


def choice(answer: str, words: str, options: Iterable[str], mistakes: Mapping[str, str], points: float = 1) -> Question:
    """One of ``options``; ``mistakes``: the wrong option -> the message that explains it."""
    options = list(options)
    return Question(lambda v, name: expect_choice(v, answer, name, options, mistakes), words, mistakes, points)


def row_set(value: Any) -> Any:
    """A listed set of row numbers in increasing order (the order a student lists them in does not matter);
    any other value unchanged, for ``expect_tuple`` to judge."""
    if isinstance(value, (tuple, list)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return tuple(sorted(value))
    return value
