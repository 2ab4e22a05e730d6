"""Where the course keeps its assignments, and nbgrader set up for them."""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

from traitlets.config import Config

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "solutions" / "assignments"
RELEASE = ROOT / "exercises"
CONFIG_FILE = Path(__file__).resolve().parent / "nbgrader_config.py"

# nbgrader runs its own tools (alembic) as subprocesses: make the running environment's scripts findable
# even when the virtual environment was not activated.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


def scripts_on_path() -> None:
    """Put this Python's scripts folder first on ``PATH`` (once): nbgrader runs ``alembic`` as a subprocess
    when it creates a gradebook, and must find this environment's, whether or not the virtual environment is
    activated and whatever else ``PATH`` holds (a folder the user may not search makes the lookup fail)."""
    scripts = str(Path(sys.executable).parent)  # not resolved: a venv's bin/ holds its scripts
    if os.environ.get("PATH", "").split(os.pathsep)[:1] != [scripts]:
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def assignments() -> list[str]:
    """Assignment names (``NN_topic``) in order."""
    return sorted(p.name for p in SOURCE.iterdir() if p.is_dir() and p.name[:2].isdigit())


def source_notebooks(assignment: str) -> list[Path]:
    folder = SOURCE / assignment
    if not folder.is_dir():
        raise KeyError(f"unknown assignment {assignment!r}; known: {', '.join(assignments())}")
    return sorted(folder.glob("*.ipynb"))


def nbgrader_config(**overrides: str) -> Config:
    """The course's nbgrader config with some ``CourseDirectory`` fields replaced (paths as strings)."""
    config = Config()
    ns = runpy.run_path(str(CONFIG_FILE), init_globals={"get_config": lambda: config})
    config = ns.get("c", config)
    for key, value in overrides.items():
        config.CourseDirectory[key] = value
    return config


def gradebook_path() -> Path:
    """The course's one gradebook: the SQLite file ``nbgrader_config.py`` names (``grading/gradebook.db``)."""
    url = str(nbgrader_config().CourseDirectory.db_url)
    if not url.startswith("sqlite:///"):
        raise ValueError(f"the course's gradebook must be an SQLite file (sqlite:///PATH); nbgrader_config.py "
                         f"names {url!r}")
    path = Path(url.removeprefix("sqlite:///"))
    return (path if path.is_absolute() else ROOT / path).resolve()


def grading_dir() -> Path:
    """The course's grading folder: the one holding its gradebook (submissions, results, feedback, secret)."""
    return gradebook_path().parent


def check_workdir(workdir: Path | None, separate: bool = False) -> Path:
    """The grading folder a command works in: the course's unless ``workdir`` names another one.

    A folder whose gradebook is not the course's is refused (``ValueError`` naming both) unless
    ``separate``: grades recorded there would not be seen by formgrader, ``nbgrader export`` or
    the Canvas export, which read the course's gradebook.
    """
    course_dir = grading_dir()
    if workdir is None:
        return course_dir
    workdir = workdir.resolve()
    if workdir != course_dir and not separate:
        raise ValueError(f"--workdir {workdir} holds the gradebook {workdir / 'gradebook.db'}, but the course's "
                         f"gradebook (named by nbgrader_config.py) is {gradebook_path()}: grades recorded there "
                         "would not reach formgrader, `nbgrader export` or the Canvas file. Leave out --workdir, "
                         "or pass --separate-gradebook if a second gradebook is what you want.")
    return workdir


def generate_release(assignment: str, out_dir: Path, db_path: Path | None = None) -> Path:
    """Run ``nbgrader generate_assignment`` for ``assignment`` into ``out_dir/assignment``.

    Uses a throw-away gradebook unless ``db_path`` is given.
    """
    from nbgrader.apps import NbGraderAPI

    tmp = Path(tempfile.mkdtemp(prefix="attn-release-"))
    try:
        db = db_path or tmp / "gradebook.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        config = nbgrader_config(source_directory=str(SOURCE), release_directory=str(tmp / "release"), db_url=f"sqlite:///{db}")
        api = NbGraderAPI(config=config)
        res = api.generate_assignment(assignment, force=True, create=True)
        if not res["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{res['log']}\n{res.get('error', '')}")
        target = out_dir / assignment
        if target.exists():
            shutil.rmtree(target)
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp / "release" / assignment, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
