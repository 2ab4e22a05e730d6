"""One student's result for one assignment, as a typed object, and how it is written to disk.

A :class:`Result` is made by :func:`autograder.batch.grade_job`, saved as JSON
under ``WORKDIR/results/<assignment>/<student>.json``, recorded in the
gradebook (:mod:`autograder.records.gradebook`) and rendered as feedback
(:mod:`autograder.records.feedback`). The verdict types the judge fills in,
:class:`TestResult` and :class:`NotebookResult`, live here too, so the records
never import the judging.

Where a score comes from: each check is all or nothing (the judge,
:func:`autograder.judging.judge.grade_notebook`, gives a test cell its points
when its check passes); :func:`total` adds a result's points up; the late
penalty and hand grades are applied in nbgrader's gradebook
(:mod:`autograder.records.gradebook`), which the CSV reads.

Imports: the standard library only.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any



# -- the judge's verdicts on one notebook (made by autograder.judging.judge) --------------------------


@dataclass
class TestResult:
    grade_id: str
    description: str
    points: float
    max_points: float
    message: str = ""  # empty when passed


@dataclass
class NotebookResult:
    notebook: str
    tests: list[TestResult] = field(default_factory=list)
    reason: str = ""  # why the submission could not be graded normally ("" when it could)
    log: list[str] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)  # part -> the student's code, for the feedback

    def to_json(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "reason": self.reason, "log": self.log, "answers": self.answers,
                "tests": [asdict(t) for t in self.tests]}



def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half of one.

    The file gets ``mode`` (0644 by default: feedback must be readable by the student's server).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def clean_text(value: Any) -> Any:
    """``value`` with every string made safe to encode as UTF-8 (lone surrogates from student text escaped)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {clean_text(k): clean_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_text(v) for v in value]
    return value


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def csv_cell(value: Any) -> str:
    """A text cell for a CSV the grader writes: one that a spreadsheet would run as a formula (``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return first: a student id ``-2+3`` shows as ``1``) gets a leading ``'``,
    which spreadsheets show as text and do not display."""
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def is_number(text: str) -> bool:
    """Whether a CSV cell holds a number (``-1.5`` included): a spreadsheet shows it as that number, so it is
    written as it is, where :func:`csv_cell` would quote a text cell starting with ``-``."""
    try:
        float(text)
        return True
    except ValueError:
        return False


def escape_markdown(text: str) -> str:
    """Student-controlled text (a file name, a reason quoting one) made literal in a markdown cell: every ASCII
    punctuation character backslash-escaped (CommonMark allows it for all of them), so no link, image, emphasis
    or HTML can form, and newlines made spaces, so no block (heading, list, code) can start."""
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", " ".join(str(text).splitlines()))


def total(tests: list[TestResult]) -> tuple[float, float]:
    """``(score, max_score)`` of some verdicts: the one place scores are summed."""
    return sum(min(t.points, t.max_points) for t in tests), sum(t.max_points for t in tests)


@dataclass
class StudentCells:
    """What the student wrote that the judge does not grade, for the autograded notebook and formgrader.

    ``written``: the student's text of each manually graded answer cell (``grade_id -> source``);
    ``added``: cells the student added, as ``(grade_id of the cell they follow, cell_type, source)``;
    ``unanswered``: answer cells (by hand or by the judge) missing or left as released; a manual one gets 0
    without a hand grade, as nbgrader's autograde gives it, and every one is listed in the result's reason;
    ``answer_ids``: every answer cell of the notebook.
    """

    written: dict[str, str] = field(default_factory=dict)
    added: list[tuple[str, str, str]] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)  # answer cells left as released (or missing)
    answer_ids: list[str] = field(default_factory=list)  # every answer cell of the notebook, graded either way


@dataclass
class Result:
    """One student's graded submission of one assignment."""

    student: str
    assignment: str
    fingerprint: str  # of the submission (and the secret): a new one means a re-submission
    version: str  # of the grader that produced these verdicts (see batch.grader_version)
    reason: str
    seconds: float
    notebooks: list[NotebookResult]
    cells: dict[str, StudentCells] = field(default_factory=dict)  # notebook name -> the student's other cells
    timestamp: str = ""  # the submission's timestamp.txt (nbgrader's format), "" when it had none
    first_seen: str = ""  # when the grader first graded this submission (ISO, naive UTC)

    @property
    def total(self) -> tuple[float, float]:
        return total([t for nb in self.notebooks for t in nb.tests])

    def to_json(self) -> dict[str, Any]:
        return clean_text({
            "student": self.student, "assignment": self.assignment, "fingerprint": self.fingerprint,
            "version": self.version, "reason": self.reason, "seconds": self.seconds, "timestamp": self.timestamp,
            "first_seen": self.first_seen,
            "notebooks": [nb.to_json() for nb in self.notebooks],
            "cells": {name: {"written": c.written, "added": [list(a) for a in c.added], "unanswered": c.unanswered,
                             "answer_ids": c.answer_ids} for name, c in self.cells.items()},
        })

    def __getitem__(self, key: str) -> Any:
        """Read a field as it is stored in the JSON file (``result["notebooks"][0]["tests"]``)."""
        return self.to_json()[key]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Result":
        """The result stored in ``data``; raises ``KeyError``, ``TypeError`` or ``ValueError`` when malformed."""
        notebooks = [NotebookResult(nb["notebook"], [TestResult(**t) for t in nb["tests"]], nb.get("reason", ""),
                                    list(nb.get("log", [])), dict(nb.get("answers", {}))) for nb in data["notebooks"]]
        cells = {name: StudentCells(dict(c.get("written", {})), [tuple(a) for a in c.get("added", [])],
                                    list(c.get("unanswered", [])), list(c.get("answer_ids", [])))
                 for name, c in dict(data.get("cells", {})).items()}
        return cls(str(data["student"]), str(data["assignment"]), str(data["fingerprint"]), str(data.get("version", "")),
                   str(data.get("reason", "")), float(data.get("seconds", 0.0)), notebooks, cells,
                   str(data.get("timestamp", "")), str(data.get("first_seen", "")))


def load_result(path: Path, student: str) -> Result | None:
    """The result saved at ``path`` for ``student``, or ``None`` when there is none or it cannot be read."""
    try:
        data = clean_text(json.loads(path.read_text()))
        result = Result.from_json(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return result if result.student == student else None


def save_result(path: Path, result: Result) -> None:
    atomic_write(path, json.dumps(result.to_json(), indent=1), mode=0o600)


__all__ = ["Result", "StudentCells", "atomic_write", "clean_text", "csv_cell", "escape_markdown", "is_number", "load_result", "save_result", "total"]
