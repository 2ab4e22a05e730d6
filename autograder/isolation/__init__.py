"""Starting and confining one student's process.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``sandbox``         a ``Sandbox`` and its ``Limits``; the choice of isolation (``isolation_mode``,
                    ``require_isolation``, ``HIDDEN``); copies ``autograder/in_sandbox`` in
``zygote``          the fork server: imports torch once, forks and isolates each sandbox
                    (namespaces, mounts, user, keyrings)
``zygote_client``   the grader's side of the zygote
``bubblewrap``      the ``bwrap`` command line (isolation without root)
``cgroups``         one sandbox's cgroup (v2 or v1)
``leftovers``       names scratch folders and cgroups; removes dead graders' left-overs
==================  ==========================================================================
"""
