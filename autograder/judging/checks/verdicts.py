"""A check's verdicts: :class:`CheckFailed` (the answer is wrong; the message says how) and
:class:`StudentError` (the student's code raised, timed out or returned something unusable), and the
student-facing sentence for an error their code raised."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CheckFailed(AssertionError):
    """The student's answer is wrong; the message says how."""


class StudentError(CheckFailed):
    """The student's code raised, timed out or returned something unusable."""


def describe_error(error: str) -> str:
    """A student-facing sentence for an exception raised by their code."""
    name, _, detail = error.partition(":")
    if name.strip() == "NotImplementedError" and not detail.strip():  # the exercise's own placeholder
        return "not implemented yet: the cell still raises NotImplementedError"
    if error.startswith(("Delegated", "Tampered")):
        return "earns no points: " + error.split(":", 1)[1].strip()
    return f"your code raised {error}"


def reply_value(reply: Mapping[str, Any]) -> Any:
    """The value of a runner's reply, or :class:`StudentError` with the student-facing sentence."""
    if not reply.get("ok"):
        raise StudentError(describe_error(str(reply.get("error", "an error"))))
    return reply.get("value")
