"""What runs inside the sandbox, beside the student's code; the whole folder is copied there.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``harness``         ``Runner`` (the student's namespace and the judge's requests) and ``Guard``
                    (per-call bans at torch's dispatcher); ``main`` is the sandbox's request loop
``wire``            the message format between the judge and the sandbox (JSON and raw bytes,
                    no pickle)
``torch_names``     the names of torch's attention and the aten operators a ban covers, declared
                    once for the static scan and the run-time guard
``magics``          IPython syntax turned into plain Python, bounded
==================  ==========================================================================

In the sandbox these run as flat modules (``import wire``); they import only each other, the
standard library, numpy and torch. Everything here is within the student's reach once student code
runs, so nothing here decides a verdict: the judge (``autograder.judging``) does.
"""
