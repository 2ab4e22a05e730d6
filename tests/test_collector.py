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


# -- the exchange's time belongs to the content graded (issue 36) -------------------------------------------------


def _submit(inbound, name, content, stamp):
    folder = inbound / name
    folder.mkdir(parents=True)
    (folder / "single_head.ipynb").write_text(content)
    (folder / "timestamp.txt").write_text(stamp)
    return folder


def test_names_are_split_as_nbgrader_splits_them():
    from autograder.records.collector import parse_exchange_name

    student, assignment, when = parse_exchange_name("ann+lee+01_single_head+2026-10-01 09:00:00.000000 UTC+abc")
    assert (student, assignment, when) == ("ann+lee", "01_single_head", dt.datetime(2026, 10, 1, 9))
    assert parse_exchange_name("alice") is None


def test_a_resubmission_not_collected_leaves_the_graded_content_its_own_time(tmp_path):
    """`nbgrader collect` without --update keeps the first submission: the time is that submission's, never the
    newer folder's, and the newer one is reported with the command that collects it."""
    import os
    import shutil
    import time

    from autograder.records.collector import exchange_collected, exchange_folders, folder_fingerprint

    inbound = tmp_path / "course" / "inbound"
    first = _submit(inbound, "alice+01_single_head+2026-10-01 09:00:00.000000 UTC+a", '{"v": 1}',
                    "2026-10-01 09:00:00.000000 UTC")
    old = time.time() - 3 * 86400
    for p in (first / "single_head.ipynb", first / "timestamp.txt", first):
        os.utime(p, (old, old))
    time.sleep(0.05)
    _submit(inbound, "alice+01_single_head+2026-10-03 09:00:00.000000 UTC+b", '{"v": 2}',
            "2026-10-03 09:00:00.000000 UTC")
    collected = tmp_path / "submitted" / "alice" / "01_single_head"
    shutil.copytree(first, collected)  # what `nbgrader collect` (no --update) copied
    folders = exchange_folders(tmp_path, "course", "01_single_head")["alice"]
    graded = folder_fingerprint("s", collected)
    got = exchange_collected(folders, "01_single_head", graded, lambda f: folder_fingerprint("s", f))
    first_folder = next(f for f in folders if f.path == first)
    assert got.time == first_folder.changed
    assert any("newer submission (2026-10-03 09:00 UTC)" in n and "nbgrader collect --update 01_single_head" in n
               for n in got.notes), got.notes
    content = exchange_collected(folders, "01_single_head", "not what was graded", lambda f: folder_fingerprint("s", f))
    assert content.time is None and any("match no usable folder" in n for n in content.notes)
    assert decide("2026-10-01 09:00:00 UTC", content).flags  # never a silent "on time"


def test_a_linked_notebook_is_never_timed_by_its_link(tmp_path):
    import shutil

    from autograder.records.collector import exchange_collected, exchange_folders, folder_fingerprint

    inbound = tmp_path / "course" / "inbound"
    late = tmp_path / "home" / "late.ipynb"
    late.parent.mkdir()
    late.write_text('{"late": true}')
    folder = inbound / f"alice+01_single_head+{dt.datetime.now():%Y-%m-%d %H:%M:%S}.000000 UTC+a"
    folder.mkdir(parents=True)
    (folder / "single_head.ipynb").symlink_to(late)
    collected = tmp_path / "submitted" / "alice" / "01_single_head"
    shutil.copytree(folder, collected)  # nbgrader copies what the link points to
    folders = exchange_folders(tmp_path, "course", "01_single_head")["alice"]
    assert "symbolic link" in folders[0].problem
    got = exchange_collected(folders, "01_single_head", folder_fingerprint("s", collected),
                             lambda f: folder_fingerprint("s", f))
    assert got.time is None and any("symbolic link" in n for n in got.notes)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="making a folder owned by another user needs root")
def test_a_folder_named_for_a_classmate_is_refused(tmp_path):
    """The exchange's inbound is writable by every student: a folder named `alice+...` made by bob's account moves
    nothing. With an account named for the student, the owner must be that account; without one, an account that
    made folders for two students is refused."""
    import os
    import pwd

    from autograder.records.collector import exchange_folders, exchange_times

    inbound = tmp_path / "course" / "inbound"
    stamp = f"{dt.datetime.now():%Y-%m-%d %H:%M:%S}.000000 UTC"
    unnamed = next(uid for uid in range(54321, 60000) if not _named(pwd, uid))  # a hub's user, unknown here
    os.chown(_submit(inbound, f"bob+01_single_head+{stamp}+a", "{}", stamp), unnamed, unnamed)
    os.chown(_submit(inbound, f"alice+01_single_head+{stamp}+b", "{}", stamp), unnamed, unnamed)
    os.chown(_submit(inbound, f"carol+01_single_head+{stamp}+b", "{}", stamp), 65534, 65534)  # nobody's
    os.chown(_submit(inbound, f"dave+01_single_head+{stamp}+b", "{}", stamp), unnamed + 1, unnamed + 1)
    account = pwd.getpwuid(1).pw_name  # an account of this machine (daemon): its folder must be its own
    _submit(inbound, f"{account}+01_single_head+{stamp}+c", "{}", stamp)  # made by root
    folders = exchange_folders(tmp_path, "course", "01_single_head")
    assert "also made folders named for bob" in folders["alice"][0].problem
    assert f"not by {account}" in folders[account][0].problem
    assert "not by carol" in folders["carol"][0].problem  # another account of this machine made it
    assert folders["dave"][0].problem == ""  # an unknown user id, whose only folder is dave's: his
    times = exchange_times(tmp_path, "course", "01_single_head")
    assert times["alice"].time is None and any("ignored" in n for n in times["alice"].notes)


def _named(pwd, uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
