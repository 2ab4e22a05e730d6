"""When was it handed in? The collector's time, checked against the student's ``timestamp.txt``.

A submission's time decides its late penalty, so it must come from what the student
cannot write: the LMS download (``nbgrader zip_collect`` with
:class:`autograder.records.plugins.LmsFileNameCollector` records, for each student, the zip
entry's time and Canvas's ``_LATE_`` marker in ``GRADING/collected/<assignment>/<student>.json``)
or nbgrader's exchange (when the exchange received the student's ``inbound`` folder: its change time, which
no process can set back; the time in the folder's name is the student's and only compared). The
``timestamp.txt`` beside the notebooks is the student's file as far as the grader can tell:
it is read, checked (missing, unparsable, implausible, or disagreeing with the collector's
time), and every doubt becomes a flag shown in the console and the CSV's ``time_review``
column, never a silent "on time".

The instructor's policy (``c.SubmissionTime.policy`` in ``autograder/nbgrader_config.py``):

* ``"collector"`` (default): flag for review and take the collector's time; without one, the
  ``timestamp.txt`` if it is sound (flagged as unconfirmed), else the time the grader first saw
  the submission (flagged): a doubtful time is never "on time" by default;
* ``"latest"``: the later of the collector's time and a sound ``timestamp.txt`` (the strictest);
* ``"timestamp"``: the ``timestamp.txt`` when it is sound (flagged wherever it disagrees).

Imports: nbgrader (``parse_utc``) and the standard library only.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

POLICIES = ("collector", "latest", "timestamp")
MAX_OFFSET = dt.timedelta(hours=14)  # the widest UTC offset in use (UTC+14:00)
TOLERANCE = dt.timedelta(minutes=5)  # timestamp.txt and the collector's time may differ this much
TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"  # what the grader writes (nbgrader's format, in UTC)


@dataclass
class Collected:
    """What the collector saw of one student's submission."""

    time: dt.datetime | None  # naive UTC
    source: str  # "Canvas download", "Moodle download", "nbgrader exchange"
    late_marker: bool = False  # the LMS itself marked it late (Canvas's _LATE_)
    notes: list[str] = field(default_factory=list)  # what disagrees with it (a backdated exchange folder name)


@dataclass
class SubmissionTime:
    """The time recorded in the gradebook, where it came from, and what an instructor should look at."""

    when: dt.datetime | None  # naive UTC, as nbgrader's gradebook stores it
    source: str
    flags: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.when.strftime(TIME_FORMAT) if self.when else ""


def parse_student_time(text: str, now: dt.datetime | None = None) -> tuple[dt.datetime | None, str]:
    """``timestamp.txt`` as naive UTC, or ``(None, why not)``: missing, unparsable or implausible
    (an offset beyond +-14:00, a year before 2000, a time in the future)."""
    from nbgrader.utils import parse_utc

    text = text.strip()
    if not text:
        return None, "no timestamp.txt"
    shown = text[:60]
    offset = re.search(r"(?:UTC|GMT)?\s*([+-])(\d{1,2}):?(\d{2})\s*$", text)
    if offset and dt.timedelta(hours=int(offset[2]), minutes=int(offset[3])) > MAX_OFFSET:
        return None, f"implausible timestamp.txt {shown!r} (offset beyond 14 hours)"
    try:
        when = parse_utc(text)
    except Exception:  # noqa: BLE001 - the student's file: anything may be in it
        return None, f"unparsable timestamp.txt {shown!r}"
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    if when.year < 2000 or when > now + dt.timedelta(days=1):
        return None, f"implausible timestamp.txt {shown!r}"
    return when, ""


def collected_record(grading: Path, assignment: str, student: str) -> Collected | None:
    """The LMS download's record for the student, written by ``nbgrader zip_collect``."""
    path = grading / "collected" / assignment / f"{student}.json"
    try:
        data = json.loads(path.read_text())
        when = dt.datetime.fromisoformat(data["time"]) if data.get("time") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Collected(when, str(data.get("source", "LMS download")), bool(data.get("late_marker")))


def exchange_times(exchange: Path, course_id: str, assignment: str) -> dict[str, Collected]:
    """``student -> Collected`` for every student with a folder in nbgrader's exchange (``inbound``), listing it
    once.

    The time is when the exchange received the submission: the newest *change time* (``st_ctime``) of the
    folder ``nbgrader collect`` takes (the one whose name is newest, as nbgrader picks it) and of every file in
    it. A change time is the file system's: no process can set it back, so a student cannot backdate it. The
    time in the folder's *name* is written by the student's own ``nbgrader submit`` (any process of theirs can
    make a folder with any name): it is only compared, and a name more than :data:`TOLERANCE` away from the
    change time is flagged; the change time wins. (A later change by someone else, an administrator's
    ``chmod -R`` of the exchange, moves change times forward: that shows as a flag on every student, never as
    an earlier time.)"""
    from nbgrader.utils import parse_utc

    inbound = exchange / course_id / "inbound"
    named: dict[str, list[tuple[dt.datetime, Path]]] = {}
    try:
        entries = list(inbound.iterdir())
    except OSError:
        return {}
    for entry in entries:
        parts = entry.name.split("+")
        if len(parts) < 3 or parts[1] != assignment:
            continue
        try:
            when = parse_utc(parts[2])
        except Exception:  # noqa: BLE001 - not one of nbgrader's names
            continue
        named.setdefault(parts[0], []).append((when, entry))
    out = {}
    for student, folders in named.items():
        name_time, folder = max(folders, key=lambda f: f[0])
        changed = _change_time(folder)
        if changed is None:
            out[student] = Collected(None, "nbgrader exchange")
            continue
        collected = Collected(changed, "nbgrader exchange")
        if abs(name_time - changed) > TOLERANCE:
            collected.notes.append(f"the exchange folder's name says {name_time:%Y-%m-%d %H:%M} UTC, the exchange "
                                   f"received it at {changed:%Y-%m-%d %H:%M} UTC (taken)")
        out[student] = collected
    return out


def _change_time(folder: Path) -> dt.datetime | None:
    """The newest change time of ``folder`` and what it holds (links not followed), as naive UTC."""
    try:
        times = [folder.lstat().st_ctime]
        for path in folder.rglob("*"):
            times.append(path.lstat().st_ctime)
    except OSError:
        return None
    return dt.datetime.fromtimestamp(max(times), dt.timezone.utc).replace(tzinfo=None)


def exchange_time(exchange: Path, course_id: str, assignment: str, student: str) -> Collected | None:
    """:func:`exchange_times` of one student."""
    return exchange_times(exchange, course_id, assignment).get(student)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def decide(stamp: str, collected: Collected | None, policy: str = "collector", first_seen: str = "",
           now: dt.datetime | None = None) -> SubmissionTime:
    """The time to record for a submission and the flags an instructor should see (see the module's doc)."""
    if policy not in POLICIES:
        raise ValueError(f"SubmissionTime.policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    student, why = parse_student_time(stamp, now)
    flags = [why] if why else []
    flags += collected.notes if collected else []
    trusted = collected.time if collected else None
    if collected and trusted is None:
        flags.append(f"the {collected.source} gave no time")
    if student and trusted and abs(student - trusted) > TOLERANCE:
        flags.append(f"timestamp.txt says {student:%Y-%m-%d %H:%M} UTC, the {collected.source} "
                     f"{trusted:%Y-%m-%d %H:%M} UTC")
    if policy == "latest" and trusted and student:
        chosen = SubmissionTime(max(trusted, student), "the later of the collector's time and timestamp.txt")
    elif policy == "timestamp" and student:
        chosen = SubmissionTime(student, "timestamp.txt")
    elif trusted:
        chosen = SubmissionTime(trusted, collected.source)
    elif student:
        chosen = SubmissionTime(student, "timestamp.txt")
        flags.append("time not confirmed by a collector (only the student's timestamp.txt)")
    else:
        seen = None
        if first_seen:
            try:
                seen = dt.datetime.fromisoformat(first_seen)
            except ValueError:
                seen = None
        chosen = SubmissionTime(seen, "first seen by the grader")
        flags.append("no trusted time: recorded the time the grader first saw it")
    if collected and collected.late_marker:
        flags.append(f"the {collected.source} marks it late")
    chosen.flags = flags
    return chosen


__all__ = ["Collected", "POLICIES", "SubmissionTime", "collected_record", "decide", "exchange_time", "exchange_times",
           "parse_student_time"]
