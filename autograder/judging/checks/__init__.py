"""The graded tests, run by the trusted judge.

Each assignment has a module ``chNN_topic.py`` with a :class:`Suite` whose checks are named after the
notebook's test cells (``test_<name>...``); a check is worth that cell's points and tests one property, which
its description names. A check is ordinary Python that runs in the judge: it draws inputs from a private
generator, asks the student's process to run the student's code on them (:class:`Trial`), gets back plain
tensors, and compares them here, where the student's code never ran. A failure raises :class:`CheckFailed`
with a message for the student, naming the misconception where the answer matches a known mistake.

The engine, by what each module holds: ``verdicts`` (the failures), ``backends`` (where the student's code
runs), ``trial`` (what a check sees), ``suite`` (a chapter's checks, requirements, seeds, ``run_local``),
``compare`` (comparisons and :func:`named_mistake`), ``questions`` (the question tables), ``oracle`` (the
draw-call-compare form), ``twins`` (the copied-weights twin); ``mistakes`` and ``common`` hold what several
chapters' checks share. ``autograder/README.md`` ("Adding a chapter") shows a chapter's skeleton.
"""

from autograder.judging.checks.backends import Backend, LocalBackend
from autograder.judging.checks.compare import (close, expect_close, expect_pair, expect_tensor, expect_value_error,
                                               fail_if_named, named_mistake)
from autograder.judging.checks.oracle import Args, args
from autograder.judging.checks.questions import (Question, choice, expect_choice, expect_number, expect_tuple, listed,
                                                 number, row_set)
from autograder.judging.checks.suite import Check, Requirement, Suite, load_suite, requirements, run_local, seed_for
from autograder.judging.checks.trial import Obj, Trial, build, label
from autograder.judging.checks.twins import Params, draw_weights, twin
from autograder.judging.checks.verdicts import (PLACEHOLDER, CheckFailed, StudentError, describe_error, explained,
                                                reply_value)

__all__ = ["PLACEHOLDER", "Args", "Backend", "Check", "CheckFailed", "LocalBackend", "Obj", "Params", "Question",
           "Requirement", "StudentError", "Suite", "Trial", "args", "build", "choice", "close", "describe_error",
           "draw_weights", "expect_choice", "expect_close", "expect_number", "expect_pair", "expect_tensor",
           "expect_tuple", "expect_value_error", "explained", "fail_if_named", "label", "listed", "load_suite",
           "named_mistake", "number", "reply_value", "requirements", "row_set", "run_local", "seed_for", "twin"]
