"""What grading keeps: verdicts, results, nbgrader's gradebook, feedback. Imports nothing of the judging.

==================  ==========================================================================
file                its one job
==================  ==========================================================================
``results``         the verdict types the judge fills in (``TestResult``, ``NotebookResult``),
                    the typed ``Result`` carried end to end, its ``total``, atomic JSON files
``written``         cells graded by hand: which, and what the student wrote
``gradebook``       nbgrader's gradebook (auto scores only), the pinned grader version, the CSV
``feedback``        the autograded folder and ``nbgrader generate_feedback``
``collector``       the submission's time: the collector's (LMS download, exchange), the
                    student's ``timestamp.txt`` checked against it
``plugins``         nbgrader plugins: late penalty per day, Canvas export, LMS file names
``doors``           nbgrader's own doors agreeing with the grader: its autograde refused (unsandboxed),
                    formgrader listing the gradebook's students and the grader's work as graded
``similarity``      the instructor's similarity report (copydetect): ranks answers, changes no
                    grade
==================  ==========================================================================
"""
