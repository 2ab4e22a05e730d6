"""A grade does not depend on the instructor's shell (issue 36): under the guide's ``umask 077`` the root sandbox
made the mount points of its exposed folders 0700, so student code could import no module the zygote had not
loaded in advance (a perfect chapter 10 notebook scored 6/16, 14/16 under umask 022; a chapter 01 notebook that
imports ``sysconfig`` lost its softmax points). Each notebook is graded through the real sandbox in a fresh
process (a zygote of its own) under each umask, and the points must agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import course
from autograder.isolation.sandbox import NAMESPACES, isolation_mode
from checking import answered_release

pytestmark = pytest.mark.slow

GRADE = """
import json, os, sys
from pathlib import Path
os.umask(int(sys.argv[1], 8))
from autograder import course
from autograder.isolation.sandbox import Limits
from autograder.judging.judge import grade_notebook
from autograder.notebook import SourceNotebook
assignment, path, hide = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
release = course.RELEASE / assignment
src = [SourceNotebook.load(p, release / p.name) for p in course.source_notebooks(assignment)][0]
result = grade_notebook(path, src, assignment, files=release, hide=[course.ROOT, hide],
                        limits=Limits(cell_timeout=120, call_timeout=60, notebook_timeout=600), secret="umask")
print(json.dumps({t.grade_id: [t.points, t.message] for t in result.tests}))
"""


def grade_under(umask: int, assignment: str, notebook: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(course.ROOT / "solutions"), str(course.ROOT)])}
    proc = subprocess.run([sys.executable, "-c", GRADE, f"{umask:o}", assignment, str(notebook), str(notebook.parent)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(isolation_mode() != NAMESPACES, reason="the root sandbox (namespaces, a user of its own) only")
@pytest.mark.parametrize("assignment, name, prefix", [
    ("01_single_head", "single_head.ipynb", {"softmax": "import sysconfig\nsysconfig.get_paths()\n"}),
    ("10_flash_triton", "flash_triton.ipynb", {}),
])
def test_umask_077_grades_as_umask_022(tmp_path, assignment, name, prefix):
    nb = answered_release(assignment, name)
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in prefix:
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            cell["source"] = prefix[gid] + src
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    open_shell, guide_shell = grade_under(0o022, assignment, path), grade_under(0o077, assignment, path)
    assert guide_shell == open_shell
    lost = {gid: msg for gid, (points, msg) in open_shell.items() if msg}
    if assignment == "01_single_head":
        assert not lost, lost  # the reference with an import of sysconfig: every point
    else:
        assert sum(p for p, _ in open_shell.values()) > 0
