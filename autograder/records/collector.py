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

Imports: nbgrader (``parse_utc``), :mod:`autograder.notebook` (the size cap) and the standard library.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass
class ExchangeFolder:
    """One folder of nbgrader's exchange (``inbound``) named for a student."""

    path: Path
    name_time: dt.datetime  # the time in the folder's name (the student's own `nbgrader submit` wrote it)
    changed: dt.datetime | None  # when the exchange received it: the newest change time of the folder and its files
    problem: str = ""  # why its time cannot be the student's ("" when it can): not theirs, or holds a link
    uid: int = -1  # its owner


def parse_exchange_name(name: str) -> tuple[str, str, dt.datetime] | None:
    """``(student, assignment, time)`` of an exchange folder's name, split as nbgrader's ``collect`` splits it
    (``rsplit("+", 3)``: a student id may hold a ``+``), or None for a name that is not one of nbgrader's."""
    from nbgrader.utils import parse_utc

    parts = name.rsplit("+", 3)
    if len(parts) < 3:
        return None
    try:
        return parts[0], parts[1], parse_utc(parts[2])
    except Exception:  # noqa: BLE001 - not one of nbgrader's names
        return None


def exchange_folders(exchange: Path, course_id: str, assignment: str) -> dict[str, list[ExchangeFolder]]:
    """``student -> [ExchangeFolder]`` for every folder of nbgrader's exchange (``inbound``) named for the
    assignment, listing it once, each with its problem if its time cannot be taken as the student's:

    * a folder, or anything in it, that is a **symbolic link**: nbgrader's ``collect`` copies what a link points
      to, so the graded content may have been written long after the link was made (and timed);
    * a folder **not owned by the student**: the exchange's ``inbound`` is writable by every student, and a
      classmate can make a folder named for anyone. With an account named for the student on this machine (as on
      a JupyterHub), its owner must be that account (nbgrader's ``collect`` warns on the same test); without one,
      a folder owned by another account of this machine, or by a user id that also made folders named for another
      student, is refused (the instructor's and root's own copies are accepted)."""
    import pwd

    inbound = exchange / course_id / "inbound"
    try:
        entries = list(inbound.iterdir())
    except OSError:
        return {}
    named: dict[str, list[ExchangeFolder]] = {}
    owners: dict[int, set[str]] = {}
    for entry in entries:
        parsed = parse_exchange_name(entry.name)
        if parsed is None or parsed[1] != assignment:
            continue
        student, _, name_time = parsed
        try:
            uid = entry.lstat().st_uid
        except OSError:
            continue
        owners.setdefault(uid, set()).add(student)
        named.setdefault(student, []).append(ExchangeFolder(entry, name_time, _change_time(entry), _link_in(entry),
                                                            uid))
    for student, folders in named.items():  # once every owner is known
        for folder in folders:
            folder.problem = folder.problem or _not_owned(folder.uid, student, owners, pwd)
    return named


def _account(uid: int, pwd: Any) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _not_owned(uid: int, student: str, owners: dict[int, set[str]], pwd: Any) -> str:
    """Why a folder named for ``student`` and owned by ``uid`` is not the student's ("" when it is)."""
    try:
        own = pwd.getpwnam(student).pw_uid
    except KeyError:
        own = None
    if own is not None:
        return "" if uid == own else f"owned by {_account(uid, pwd)}, not by {student}"
    if uid in (0, os.geteuid()):
        return ""
    try:
        return f"owned by {pwd.getpwuid(uid).pw_name}, not by {student}"  # another account of this machine
    except KeyError:
        pass
    others = sorted(owners.get(uid, set()) - {student})
    return (f"made by {_account(uid, pwd)}, who also made folders named for {', '.join(others[:5])}" if others
            else "")


def _link_in(folder: Path) -> str:
    """"holds a symbolic link (NAME)" when ``folder`` is a link or holds one, else ""."""
    if folder.is_symlink():
        return "is a symbolic link"
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            if os.path.islink(os.path.join(dirpath, name)):
                shown = os.path.relpath(os.path.join(dirpath, name), folder)
                return f"holds a symbolic link ({shown[:80]}): what it points to may have been written later"
    return ""


def exchange_collected(folders: list[ExchangeFolder], assignment: str, fingerprint: str | None = None,
                       fingerprint_of: Callable[[Path], str] | None = None) -> Collected:
    """The exchange's record of the submission that was graded, among a student's ``folders``.

    With ``fingerprint`` (the graded content's, :func:`folder_fingerprint`) the time is that of the folder whose
    content was graded, matched by content: never a newer folder's (a re-submission that was not collected) nor
    a refused one's. A newer submission that was not collected is reported with the command that collects it; a
    graded content that matches no usable folder gets no time (flagged). Without a fingerprint, the newest usable
    folder by name (the one ``nbgrader collect`` takes first)."""
    notes = [f"exchange folder {f.path.name[:120]!r} ignored: {f.problem}" for f in folders if f.problem]
    usable = [f for f in folders if not f.problem]
    prints: dict[Path, str] = {}

    def fp(folder: ExchangeFolder) -> str:
        if folder.path not in prints:
            try:
                prints[folder.path] = fingerprint_of(folder.path) if fingerprint_of else ""
            except OSError:
                prints[folder.path] = ""
        return prints[folder.path]

    if fingerprint is None or fingerprint_of is None:
        chosen = max(usable, key=lambda f: f.name_time, default=None)
    else:
        matched = [f for f in usable if fp(f) == fingerprint]
        chosen = min(matched, key=lambda f: f.name_time, default=None)
        if chosen is None:
            refused = [f for f in folders if f.problem and fp(f) == fingerprint]
            notes.append(f"the graded notebooks are those of a refused exchange folder ({refused[0].path.name[:120]!r})"
                         ": its time is not used" if refused else
                         "the graded notebooks match no usable folder of the exchange (copied by hand, or changed "
                         "since they were collected): the exchange cannot confirm their time")
        else:
            newer = [f for f in usable if f.name_time > chosen.name_time and fp(f) != fingerprint]
            if newer:
                latest = max(newer, key=lambda f: f.name_time)
                notes.append(f"a newer submission ({latest.name_time:%Y-%m-%d %H:%M} UTC) is in the exchange but was "
                             f"not collected: the older one was graded. To grade the newest, run `nbgrader collect "
                             f"--update {assignment}`, then grade again")
    if chosen is None or chosen.changed is None:
        return Collected(None, "nbgrader exchange", notes=notes)
    if abs(chosen.name_time - chosen.changed) > TOLERANCE:
        notes.append(f"the exchange folder's name says {chosen.name_time:%Y-%m-%d %H:%M} UTC, the exchange "
                     f"received it at {chosen.changed:%Y-%m-%d %H:%M} UTC (taken)")
    return Collected(chosen.changed, "nbgrader exchange", notes=notes)


def exchange_times(exchange: Path, course_id: str, assignment: str) -> dict[str, Collected]:
    """``student -> Collected`` for every student with a folder in nbgrader's exchange (``inbound``), listing it
    once: the newest usable folder's (:func:`exchange_collected` without a fingerprint).

    The time is when the exchange received the submission: the newest *change time* (``st_ctime``) of the
    folder and of every file in it. A change time is the file system's: no process can set it back, so a student
    cannot backdate it. The time in the folder's *name* is written by the student's own ``nbgrader submit`` (any
    process of theirs can make a folder with any name): it is only compared, and a name more than
    :data:`TOLERANCE` away from the change time is flagged; the change time wins. (A later change by someone
    else, an administrator's ``chmod -R`` of the exchange, moves change times forward: that shows as a flag on
    every student, never as an earlier time.)"""
    return {student: exchange_collected(folders, assignment)
            for student, folders in exchange_folders(exchange, course_id, assignment).items()}


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


# -- what was graded, as content --------------------------------------------------------------------------


def hash_files(h: "hashlib._Hash", paths: list[Path]) -> None:
    """Feed names and contents to ``h``; a file over the notebook size cap is hashed by size and time only."""
    from autograder.notebook import MAX_NOTEBOOK_BYTES

    for p in paths:
        h.update(os.fsencode(p.name) + b"\0")  # a name need not be UTF-8
        try:
            st = p.stat()
            if st.st_size > MAX_NOTEBOOK_BYTES:
                h.update(f"large:{st.st_size}:{st.st_mtime_ns}".encode())
            else:
                with open(p, "rb") as f:
                    h.update(f.read(MAX_NOTEBOOK_BYTES + 1))
        except OSError as e:
            h.update(f"unreadable:{e.errno}".encode())
        h.update(b"\0")


def submission_files(folder: Path) -> list[Path]:
    """The notebooks of a submission folder (no links, no folders)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file() and not p.is_symlink())


def folder_fingerprint(secret: str, folder: Path) -> str:
    """A hash of a submission folder's notebooks and ``timestamp.txt`` with the grading secret: the result's
    fingerprint (a new one means re-submitted), and how an exchange folder is matched to what was graded
    (``nbgrader collect`` copies the folder as it is)."""
    h = hashlib.sha256(secret.encode())
    stamp = folder / "timestamp.txt"
    hash_files(h, submission_files(folder) + ([stamp] if stamp.is_file() and not stamp.is_symlink() else []))
    return h.hexdigest()


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


__all__ = ["Collected", "ExchangeFolder", "POLICIES", "SubmissionTime", "collected_record", "decide", "exchange_collected",
           "exchange_folders", "exchange_time", "exchange_times", "folder_fingerprint", "hash_files",
           "parse_exchange_name", "parse_student_time", "submission_files"]
