"""nbgrader finds this file from the course root (formgrader, `nbgrader ...`): the configuration lives in
autograder/nbgrader_config.py, which `python -m autograder` reads too."""

from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file
load_subconfig(str(Path(__file__).resolve().parent / "autograder" / "nbgrader_config.py"))  # noqa: F821
