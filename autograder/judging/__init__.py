"""The trusted judge: everything that decides a verdict, run where no student code runs.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``judge``           grades one notebook: plan, scan, sandbox, then each check through
                    ``Suite.run``
``authorship``      the static authorship scan (delegation to attnkit or torch's attention)
``checks``          what a check sees (``Trial``), ``Suite`` and its one ``run``, the backends,
                    the shared comparison and ``expect_*`` helpers
``checks.mistakes`` attention's classic mistakes, computed once
``checks.common``   what several chapters' checks share (the multi-head reference and its
                    mistakes, mistakes in words, ``row_set``): no chapter imports another's
``checks.trusted_lm`` the judge's own fixtures for exercise 09 (a cache-revealing language model,
                    seeded generators), sent as source into the sandbox and run here for references
``checks.chNN_*``   one chapter's checks, one per test cell, and its stated requirements
==================  ==========================================================================
"""
