"""The course's sandboxed autograder: grades a class of nbgrader submissions with a trusted judge.

The folders follow the trust boundary. Anything that runs beside the student's code is the
student's; a verdict is decided only on the judge's side of the line.

==================  ==============================================================================
folder or module    its job
==================  ==============================================================================
``in_sandbox/``     copied whole into every sandbox and run there, beside the student's code: the
                    request loop, the ban for the process's life, the ``Runner``, the seccomp
                    filter, the wire format, the names of torch's banned operators, IPython
                    magics. Nothing here decides a verdict.
``isolation/``      starting and confining the student's process: the sandbox and its limits, the
                    zygote, bubblewrap, cgroups, left-overs of killed graders.
``judging/``        the trusted judge: one notebook graded (``judge``), the static authorship scan,
                    the checks of every chapter (``checks/``, run through ``Suite.run``).
``records/``        what is kept: the verdict and result types, nbgrader's gradebook and the CSV,
                    written answers, feedback, nbgrader's plugins, the similarity report. Imports
                    nothing of ``judging``, ``isolation`` or ``in_sandbox``.
``notebook``        a notebook read defensively as data; the grading plan (shared foundation)
``course``          where the course keeps its assignments; nbgrader's config (shared foundation)
``batch``           the class: discover and fingerprint submissions, schedule the judge, record
``cli``             every command (``release``, ``grade``, ``feedback``, ``extension``, ``formgrader``,
                    ``similarity``)
``__main__``        ``python -m autograder``
``nbgrader_config`` the course's nbgrader configuration
==================  ==============================================================================

Each folder's ``__init__`` lists its files and their jobs. ``IMPORTS`` is the rule the folders
keep, checked by ``tests/test_grader_layout.py``: what each may import of this package.
"""

_FOUNDATIONS = frozenset({"notebook", "course"})
_EVERYTHING = frozenset({"in_sandbox", "isolation", "judging", "records", "notebook", "course", "batch", "cli"})

IMPORTS: dict[str, frozenset[str]] = {
    "in_sandbox": frozenset({"in_sandbox"}),
    "isolation": frozenset({"isolation", "in_sandbox"}),
    "judging": frozenset({"judging", "in_sandbox", "isolation", "records"}) | _FOUNDATIONS,
    "records": frozenset({"records"}) | _FOUNDATIONS,
    "notebook": frozenset({"in_sandbox"}),  # the magics, read as the harness reads them (%run)
    "course": frozenset(),
    "nbgrader_config": frozenset({"course", "records"}),  # records.doors: nbgrader's own doors
    "batch": _EVERYTHING - {"cli"},
    "cli": _EVERYTHING,
    "__main__": frozenset({"cli"}),
}
