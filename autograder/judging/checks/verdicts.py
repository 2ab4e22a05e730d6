"""A check's verdicts: :class:`CheckFailed` (the answer is wrong; the message says how), :class:`StudentError` (the
student's code raised, timed out or returned something unusable), the student-facing sentence for an error their
code raised, and :func:`explained`, which makes such an error a check's message."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

PLACEHOLDER = "not implemented yet: the cell still raises NotImplementedError"


class CheckFailed(AssertionError):
    """The student's answer is wrong; the message says how."""


class StudentError(CheckFailed):
    """The student's code raised, timed out or returned something unusable."""

    @property
    def placeholder(self) -> bool:
        """The exercise's own ``raise NotImplementedError`` (an unanswered cell): passed on, never explained."""
        return str(self).startswith(PLACEHOLDER)


@contextmanager
def explained(message: Callable[[StudentError], str]) -> Iterator[None]:
    """An error the student's code raises in the block fails the check with ``message(error)`` (not the placeholder)."""
    try:
        yield
    except StudentError as err:
        if err.placeholder:
            raise
        raise CheckFailed(message(err)) from None


def describe_error(error: str) -> str:
    """A student-facing sentence for an exception raised by their code."""
    name, _, detail = error.partition(":")
    if name.strip() == "NotImplementedError" and not detail.strip():  # the exercise's own placeholder
        return PLACEHOLDER
    if error.startswith(("Delegated", "Tampered")):
        return "earns no points: " + error.split(":", 1)[1].strip()
    return f"your code raised {error}"


def reply_value(reply: Mapping[str, Any]) -> Any:
    """The value of a runner's reply, or :class:`StudentError` with the student-facing sentence."""
    if not reply.get("ok"):
        raise StudentError(describe_error(str(reply.get("error", "an error"))))
    return reply.get("value")
