"""The trusted judge: everything that decides a verdict, run where no student code runs.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``judge``           grades one notebook: plan, scan, sandbox, then each check through
                    ``Suite.run``
``authorship``      the static authorship scan (delegation to attnkit or torch's attention)
``checks``          the engine of the chapters' checks, re-exported (``checks.__main__`` prints a
                    chapter's checks and stated requirements for a reviewer)
``checks.verdicts`` ``CheckFailed``, ``StudentError``, the student-facing error sentence
``checks.backends`` where the student's code runs (``LocalBackend`` wraps a ``Runner`` here)
``checks.trial``    what a check sees (``Trial``, the student's objects, ``build``)
``checks.suite``    a chapter's ``Suite`` and its one ``run``, ``Requirement``, seeds, ``run_local``
``checks.compare``  the comparisons and ``named_mistake``
``checks.questions`` the question tables (``number``, ``listed``, ``choice``)
``checks.oracle``   the draw-call-compare form of a check, cases as data
``checks.twins``    the copied-weights twin (the student's module and the reference, same weights)
``checks.mistakes`` attention's classic mistakes, computed once
``checks.common``   what several chapters' checks share (the multi-head reference and its
                    mistakes, mistakes in words, the mask and scale as properties of the
                    student's own answer): no chapter imports another's
``checks.trusted_lm`` the judge's own fixtures for exercise 09 (a cache-revealing language model,
                    seeded generators), sent as source into the sandbox and run here for references
``checks.chNN_*``   one chapter's checks, one per test cell, and its stated requirements
==================  ==========================================================================
"""
