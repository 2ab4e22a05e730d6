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
import torch
from torch import Tensor

from autograder.judging.checks.compare import fail_if_named
from autograder.judging.checks.verdicts import CheckFailed


SET = "set"  # how the runner sends a set or frozenset answer (``Runner.op_value``): {"set": [its items]}


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number (or bool) it is; anything else unchanged (the runner sends numbers as
    numbers already, ``harness._numbers``: this is for values that did not travel, a check's own arithmetic)."""
    return value.item() if isinstance(value, np.generic) else value


def _received_set(value: Any) -> list | None:
    """The items of a set the student answered (as the runner sends it), else None."""
    if isinstance(value, dict) and set(value) == {SET} and isinstance(value[SET], list):
        return value[SET]
    return None


def _kind(value: Any) -> str:
    """How a message names what the student answered."""
    if _received_set(value) is not None:
        return "a set"
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _as_number(value: Any, what: str) -> float:
    """One number: an int or a float, or a tensor (or array) holding one number. Bools are refused."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.dtype == torch.bool:
            raise CheckFailed(f"{what} should be one number (an int or a float, like 0.25), got {_kind(value)}"
                              + (" of bools" if value.dtype == torch.bool else ""))
        value = value.item()
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"{what} should be a number (an int or a float, like 0.25), got {_kind(value)}")
    return float(value)


def expect_number(value: Any, expected: float, what: str, mistakes: Mapping[str, float] | None = None,
                  rel: float = 1e-3, abs_tol: float = 1e-6) -> None:
    """``value`` must be a number within ``rel`` (relative) or ``abs_tol`` of ``expected``; a known wrong
    value (``mistakes``: message -> value, NaN included) is named; any other NaN or infinity is refused as no
    number. The expected value is not revealed."""
    v = _as_number(value, what)
    same = lambda a, b: math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol) or (math.isnan(a) and math.isnan(b))  # noqa: E731
    if not math.isfinite(v):
        fail_if_named(v, mistakes, what, same)
        raise CheckFailed(f"{what} should be a finite number (an int or a float, like 0.25), got {v}")
    if math.isclose(v, expected, rel_tol=rel, abs_tol=abs_tol):
        return
    fail_if_named(v, mistakes, what, same)
    raise CheckFailed(f"{what} is not right (you answered {v:.6g})")


def _item(x: Any, what: str, form: str) -> Any:
    """One entry of a listed answer as a plain number: a one-number tensor as its number, a whole float as an int."""
    if isinstance(x, Tensor) and x.numel() == 1 and x.dtype != torch.bool:
        x = x.item()
    x = _plain(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise CheckFailed(f"{what} should be {form} of numbers, got an entry that is {_kind(x)}")
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _listed_items(value: Any, n: int, what: str, order_free: bool) -> tuple:
    """A listed answer as a tuple of plain numbers: a tuple or list, a tensor (or array) of numbers in any shape
    (``(1, 6)`` for six counts, read in order), or, where the order does not matter, a set."""
    form = f"a tuple of {n} numbers" + (" (in any order; a list or a set will do)" if order_free else "")
    items = _received_set(value)
    if items is not None:
        if not order_free:
            raise CheckFailed(f"{what} should be {form}, in order: a set has no order")
    elif isinstance(value, Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise CheckFailed(f"{what} should be {form}, got a tensor of dtype {value.dtype}")
        items = value.flatten().tolist()
    elif isinstance(value, (tuple, list)):
        items = list(value)
    else:
        raise CheckFailed(f"{what} should be {form}, like {tuple('.' * n)!r}, got {_kind(value)}")
    got = tuple(_item(x, what, form) for x in items)
    return tuple(sorted(got)) if order_free else got


def expect_tuple(value: Any, expected: tuple, what: str, mistakes: Mapping[str, tuple] | None = None,
                 order_free: bool = False) -> None:
    """``value`` must hold the numbers of ``expected`` item by item (numbers compared exactly): a tuple, a list
    or a tensor (or array) of as many numbers; ``order_free``: in any order, a set too (``expected`` is then
    given in increasing order)."""
    got = _listed_items(value, len(expected), what, order_free)
    if got == tuple(expected):
        return
    fail_if_named(got, mistakes, what, lambda a, b: a == tuple(b))
    raise CheckFailed(f"{what} is not right (you answered {got!r})")


def expect_choice(value: Any, expected: str, what: str, choices: Iterable[str],
                  mistakes: Mapping[str, str] | None = None) -> None:
    """``value`` must name one of ``choices`` (case and surrounding spaces ignored; an int whose text is an
    option, ``2`` for ``'2'``, names it too) and be ``expected``; ``mistakes`` maps a wrong choice to the message
    that explains it."""
    options = [str(c) for c in choices]
    value = _plain(value)
    if isinstance(value, int) and not isinstance(value, bool) and str(value) in options:
        value = str(value)
    if not isinstance(value, str):
        raise CheckFailed(f"{what} should be one of {', '.join(repr(c) for c in options)} (a string), "
                          f"got {_kind(value)}")
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
    answer: Any = None  # the right value (never shown to a student; the tests read it)
    kind: str = ""  # "number", "listed" or "choice"


def number(answer: float, words: str, mistakes: Mapping[str, float], points: float = 1, rel: float = 1e-3,
           abs_tol: float = 1e-6) -> Question:
    """A number within ``rel`` / ``abs_tol``; ``mistakes``: message -> wrong number (NaN may be one)."""
    return Question(lambda v, name: expect_number(v, answer, name, mistakes, rel, abs_tol), words, mistakes, points,
                    answer, "number")


def listed(answer: tuple, words: str, mistakes: Mapping[str, tuple], points: float = 1,
           prepare: Callable[[Any], Any] | None = None) -> Question:
    """A tuple (a shape, row numbers); ``prepare=row_set``: order-free (a set will do), ``answer`` and the
    mistakes in increasing order; another ``prepare`` normalises the tuple of numbers before it is compared."""
    order_free = prepare is row_set
    then = None if order_free else prepare

    def judge(v: Any, name: str) -> None:
        if then is not None:
            v = then(_listed_items(v, len(answer), name, False))
        expect_tuple(v, answer, name, mistakes, order_free)

    return Question(judge, words, mistakes, points, answer, "listed")


def choice(answer: str, words: str, options: Iterable[str], mistakes: Mapping[str, str], points: float = 1) -> Question:
    """One of ``options``; ``mistakes``: the wrong option -> the message that explains it."""
    options = list(options)
    return Question(lambda v, name: expect_choice(v, answer, name, options, mistakes), words, mistakes, points,
                    answer, "choice")


def row_set(value: Any) -> Any:
    """A listed set of row numbers in increasing order (the order a student lists them in does not matter);
    any other value unchanged. As ``listed``'s ``prepare``: the answer is order-free (see :func:`expect_tuple`)."""
    if isinstance(value, (tuple, list)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return tuple(sorted(value))
    return value
