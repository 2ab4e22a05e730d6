"""nbgrader configuration of the course (also used by ``python -m autograder``).

Run nbgrader's own commands from the repository root with
``nbgrader <command> --config autograder/nbgrader_config.py``. The folders follow
the course layout: sources in ``solutions/assignments``, releases in
``exercises``; grading state (submissions, autograded copies, feedback and the
gradebook) lives under ``grading/``, which git ignores.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "attention-course"
c.CourseDirectory.source_directory = "solutions/assignments"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = f"sqlite:///{ROOT / 'grading' / 'gradebook.db'}"
c.Exchange.root = str(ROOT / "grading" / "exchange")  # unused (no JupyterHub exchange); keeps nbgrader quiet
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".*"]
c.ExecutePreprocessor.timeout = 120
c.Execute.timeout = 120
