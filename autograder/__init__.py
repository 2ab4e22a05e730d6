"""The course's sandboxed autograder: grades a class of nbgrader submissions with a trusted judge.

Map of the package (the same as "Where things live" in ``autograder/README.md``): each file,
its one job, and the modules of this package it may import (the standard library is always
allowed; other libraries are named). ``tests/test_grader_layout.py`` checks the imports.

Grading records (a class goes ``cli`` -> ``batch`` -> ``judge``, then back in the
coordinating process ``gradebook`` -> ``feedback``):

==================  ==========================================================  ===========================
file                its one job                                                 may import
==================  ==========================================================  ===========================
``__main__``        ``python -m autograder``: calls ``cli.main``                ``cli``
``cli``             every command and option (``release``, ``grade``,           ``course``, ``batch``,
                    ``feedback``, ``extension``, ``similarity``)                ``gradebook``, ``feedback``,
                                                                                ``sandbox``, ``similarity``
``batch``           the class: discover and fingerprint submissions and the     ``course``, ``judge``,
                    grader, schedule ``grade_job`` on processes or Dask         ``notebook``, ``results``,
                                                                                ``written``, ``gradebook``,
                                                                                ``feedback``, ``sandbox``
``results``         the typed ``Result`` carried end to end, atomic JSON        ``judge``
``written``         cells graded by hand: which, and what the student wrote     ``notebook``, ``results``
``gradebook``       nbgrader's gradebook (auto scores only), the pinned         ``course``, ``results``,
                    grader version, the CSV                                     ``collector``
``collector``       the submission's time: the collector's (LMS download,       nbgrader only
                    exchange), the student's timestamp.txt checked against it
``feedback``        the autograded folder and ``nbgrader generate_feedback``    ``course``, ``notebook``,
                                                                                ``results``, ``written``
``plugins``         nbgrader plugins: late penalty per day, Canvas export,      nbgrader only
                    LMS file names
``similarity``      the instructor's similarity report (copydetect): ranks      ``course``
                    answers, changes no grade
``course``          where the course keeps its assignments, nbgrader's config,  nbgrader only
                    ``generate_assignment``
``nbgrader_config`` the course's nbgrader configuration                         nothing
==================  ==========================================================  ===========================

Running student code (the harness and the judge):

==================  ==========================================================  ===========================
file                its one job                                                 may import
==================  ==========================================================  ===========================
``harness``         ``Runner`` (the student's namespace and requests) and       numpy, torch, ``wire``,
                    ``Guard`` (per-call bans); the sandbox's request loop       ``torch_names``, ``magics``
``wire``            the message format between judge and sandbox (no pickle)    numpy
``torch_names``     torch's attention names and the aten operators of a ban     nothing
``magics``          IPython syntax turned into plain Python, bounded            nothing (IPython if present)
``authorship``      the static authorship scan                                  ``magics``, ``torch_names``
``notebook``        a notebook read defensively as data; the grading plan       nothing
``judge``           grades one notebook: plan, scan, sandbox, checks            ``authorship``, ``checks``,
                                                                                ``notebook``, ``sandbox``
``checks``          what a check sees (``Trial``), the backends, the shared     torch, numpy, ``wire``,
                    comparison and ``expect_*`` helpers                         ``harness``
``checks.mistakes`` attention's classic mistakes, computed once                 attnkit, ``checks``
``checks.chNN_*``   one chapter's checks, one per test cell                     attnkit, ``checks``,
                                                                                ``checks.mistakes``,
                                                                                earlier ``checks.chNN_*``
==================  ==========================================================  ===========================

The sandbox (one student's isolated process):

==================  ==========================================================  ===========================
file                its one job                                                 may import
==================  ==========================================================  ===========================
``sandbox``         a ``Sandbox`` and its ``Limits``; the choice of isolation   ``wire``, ``cgroups``,
                    (``isolation_mode``, ``require_isolation``, ``HIDDEN``)     ``leftovers``, ``zygote``,
                                                                                ``zygote_client``,
                                                                                ``bubblewrap``
``zygote``          the fork server: imports torch once, forks and isolates     ``harness``
                    each sandbox (namespaces, mounts, user, keyrings)
``zygote_client``   the grader's side of the zygote                             nothing
``bubblewrap``      the ``bwrap`` command line (isolation without root)         nothing
``cgroups``         one sandbox's cgroup (v2 or v1)                             ``leftovers``
``leftovers``       names scratch folders and cgroups; removes dead graders'    nothing
==================  ==========================================================  ===========================
"""
