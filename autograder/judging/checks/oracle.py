"""The oracle form of a check: draw inputs, call the student's function, compare with the reference, name the
classic mistakes, for each case of a table. ``SUITE.oracle(grade_id, part, words, cases=..., reference=...)``
registers one; a check that needs more than this is written as a function (``SUITE.check``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import Tensor

from autograder.judging.checks.compare import expect_close
from autograder.judging.checks.trial import Trial, label


@dataclass(frozen=True)
class Args:
    """The arguments of one call: what ``draw`` returns when the call takes keywords."""

    args: tuple
    kwargs: dict = field(default_factory=dict)


def args(*a: Any, **kw: Any) -> Args:
    return Args(a, kw)


def _shown(v: Any) -> Any:
    return f"<{tuple(v.shape)} tensor>" if isinstance(v, Tensor) else v


def oracle(part: str, cases: Iterable[Any], reference: Callable[..., Tensor],
           draw: Callable[..., Any] | None = None, mistakes: Callable[..., Mapping[str, Tensor]] | None = None,
           what: Callable[..., str] | None = None, atol: float = 1e-4, rtol: float = 1e-4,
           compare: Callable[..., None] = expect_close) -> Callable[[Trial], None]:
    """A check of ``part`` on each case: the arguments are ``draw(t, *case)`` (an :class:`Args`, or a tuple of
    positional arguments; without ``draw`` the case itself), the expected value ``reference(*args, **kwargs)``, the
    named mistakes ``mistakes(*args, **kwargs)`` (message -> wrong value), the message's name for the value
    ``what(*args, **kwargs)`` (by default the call with its tensors' shapes), compared by ``compare`` (by default
    :func:`expect_close` with ``atol`` / ``rtol``; any function of (actual, expected, what, mistakes))."""
    cases = list(cases)
    judge = partial(expect_close, atol=atol, rtol=rtol) if compare is expect_close else compare

    def check(t: Trial) -> None:
        for case in cases:
            case = case if isinstance(case, tuple) else (case,)
            drawn = draw(t, *case) if draw else case
            a = drawn if isinstance(drawn, Args) else Args(tuple(drawn))
            got = t.call(part, *a.args, **a.kwargs)
            name = what(*a.args, **a.kwargs) if what else label(part, *map(_shown, a.args), **a.kwargs)
            wrong = mistakes(*a.args, **a.kwargs) if mistakes else None
            judge(got, reference(*a.args, **a.kwargs), name, wrong)

    return check
