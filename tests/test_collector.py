"""The submission's time is the collector's: the student's timestamp.txt is checked against it and every doubt is
flagged, never read as "on time" (autograder/collector.py). Pure functions: no grading, no sandbox."""

from __future__ import annotations

import datetime as dt

import pytest

from autograder.records.collector import Collected, decide, exchange_time, parse_student_time

NOW = dt.datetime(2026, 11, 1)
CANVAS = Collected(dt.datetime(2026, 10, 4, 12, 0), "Canvas download")


@pytest.mark.parametrize("text, why", [
    ("", "no timestamp.txt"),
    ("yesterday-ish", "unparsable"),
    ("2026-10-01 10:00:00 UTC+24:00", "implausible"),
    ("2026-10-01 10:00:00 +2400", "implausible"),
    ("1970-01-01 00:00:00 UTC", "implausible"),
    ("2099-01-01 00:00:00 UTC", "implausible"),
])
def test_a_doubtful_timestamp_is_flagged(text, why):
    when, reason = parse_student_time(text, NOW)
    assert when is None and why in reason
    decided = decide(text, CANVAS, now=NOW)
    assert decided.when == CANVAS.time and decided.source == "Canvas download"  # the penalty follows the collector
    assert any(why in f for f in decided.flags)


def test_a_backdated_timestamp_disagrees_with_the_collector_and_loses():
    decided = decide("2026-10-01 10:00:00.000000 UTC", CANVAS, now=NOW)
    assert decided.when == CANVAS.time
    assert any("disagree" in f or "timestamp.txt says 2026-10-01 10:00" in f for f in decided.flags)
    latest = decide("2026-10-05 10:00:00 UTC", CANVAS, policy="latest", now=NOW)
    assert latest.when == dt.datetime(2026, 10, 5, 10, 0)  # the strictest of the two
    assert decide("2026-10-04 12:02:00 UTC", CANVAS, now=NOW).flags == []  # within the tolerance: nothing to say


def test_without_a_collector_a_time_is_flagged_and_never_missing():
    unconfirmed = decide("2026-10-01 10:00:00 UTC", None, now=NOW)
    assert unconfirmed.when == dt.datetime(2026, 10, 1, 10) and "not confirmed" in unconfirmed.flags[0]
    nothing = decide("", None, first_seen="2026-10-20T08:00:00", now=NOW)
    assert nothing.when == dt.datetime(2026, 10, 20, 8) and nothing.source == "first seen by the grader"
    assert any("no trusted time" in f for f in nothing.flags)
    marked = decide("", Collected(dt.datetime(2026, 10, 1), "Canvas download", late_marker=True), now=NOW)
    assert any("marks it late" in f for f in marked.flags)
    with pytest.raises(ValueError, match="policy"):
        decide("", None, policy="whatever")


def test_the_exchange_time_is_when_the_exchange_received_it_not_the_folders_name(tmp_path):
    """The folder's name is written by the student's own `nbgrader submit`: a backdated one is flagged and the
    change time of the folder and its files (which no process can set back) is taken."""
    import os

    inbound = tmp_path / "course" / "inbound"
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    honest = now.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    (inbound / f"alice+01_single_head+{honest}+abc").mkdir(parents=True)
    backdated = inbound / "mallory+01_single_head+2026-10-01 09:00:00.000000 UTC+abc"
    backdated.mkdir()
    (backdated / "single_head.ipynb").write_text("{}")
    os.utime(backdated / "single_head.ipynb", (0, 0))  # mtimes can be set back; change times cannot
    (inbound / "bob+01_single_head+garbage+x").mkdir()
    alice = exchange_time(tmp_path, "course", "01_single_head", "alice")
    assert alice is not None and abs(alice.time - now) < dt.timedelta(minutes=1) and alice.notes == []
    assert alice.source == "nbgrader exchange"
    mallory = exchange_time(tmp_path, "course", "01_single_head", "mallory")
    assert abs(mallory.time - now) < dt.timedelta(minutes=1)  # not 2026-10-01
    assert "name says 2026-10-01 09:00" in mallory.notes[0]
    decided = decide("2026-10-01 09:00:00 UTC", mallory, now=now + dt.timedelta(minutes=1))
    assert decided.when == mallory.time and any("name says" in f for f in decided.flags)
    assert exchange_time(tmp_path, "course", "01_single_head", "bob") is None
