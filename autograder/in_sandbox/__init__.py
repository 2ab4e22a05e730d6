"""What runs inside the sandbox, beside the student's code; the whole folder is copied there.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``harness``         the sandbox's request loop: ``main`` confines the process, bans it for life,
                    then ``serve`` answers the judge's requests until the channel closes
``ban``             the ban, read whole by a reviewer: torch's attention and a part's own bans
                    refused for the process's life (kernels, torch's Python re-implementations,
                    the audit hook); ``Guard``, the per-call ban of the local runner
``runner``          ``Runner``: the student's namespace and the judge's requests (a cell, a call,
                    a gradient, a value, a fixture), the same in the sandbox and locally
``confine``         no second process: the seccomp filter installed before the first student line
``wire``            the message format between the judge and the sandbox (JSON and raw bytes,
                    no pickle)
``torch_names``     the names of torch's attention and the aten operators a ban covers, declared
                    once for the static scan and the run-time ban
``magics``          IPython syntax turned into plain Python, bounded
==================  ==========================================================================

In the sandbox these run as flat modules (``import wire``); they import only each other, the
standard library, numpy and torch. Everything here is within the student's reach once student code
runs, so nothing here decides a verdict: the judge (``autograder.judging``) does.
"""
