"""Exercise 10 graded through the real sandbox (issue 35): each cheat and each misgraded case of the issue, graded
as a submitted notebook is (``judge.grade_notebook``: the cells run in a banned, confined process; the checks judge
from outside). Each case states, per check, the words of its message ('' for a pass)."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (requirements.txt pins it)", allow_module_level=True)

from autograder.course import RELEASE, SOURCE  # noqa: E402
from autograder.isolation.sandbox import Limits  # noqa: E402
from autograder.judging.judge import grade_notebook  # noqa: E402
from autograder.notebook import SourceNotebook  # noqa: E402
from checking import answered_release, mutate, reference_answers  # noqa: E402

pytestmark = pytest.mark.slow
A, NB = "10_flash_triton", "flash_triton.ipynb"
REF = reference_answers(SOURCE / A / NB)
KERNEL, WRAPPER = REF["flash_forward_kernel"], REF["flash_attention_forward"]
KERNEL_CHECKS = ("test_kernel_tiles", "test_kernel_ragged", "test_kernel_causal", "test_kernel_lse")
WRAPPER_CHECKS = ("test_wrapper_shapes", "test_wrapper_launch", "test_wrapper_strides", "test_wrapper_blocks")
LIMITS = Limits(cell_timeout=20, call_timeout=20, notebook_timeout=240)


def grade(tmp_path, **answers: str) -> tuple[dict[str, str], float, float]:
    """(grade_id -> message, '' when it passed; the auto-graded points; seconds) of the reference notebook with
    ``answers`` in place of its answer cells, graded through the sandbox."""
    path = tmp_path / NB
    path.write_text(json.dumps(answered_release(A, NB, dict(REF, **answers))))
    start = time.monotonic()
    result = grade_notebook(path, SourceNotebook.load(SOURCE / A / NB, RELEASE / A / NB), A, files=RELEASE / A,
                            limits=LIMITS, secret="t")
    seconds = time.monotonic() - start
    return {t.grade_id: t.message for t in result.tests}, sum(t.points for t in result.tests), seconds


def expect(results: dict[str, str], **words: str) -> None:
    """Each check named in ``words`` fails with a message holding them; every other check passes."""
    for gid, message in results.items():
        want = words.get(gid, "")
        if want:
            assert message and want.lower() in message.lower(), (gid, message, results)
        else:
            assert message == "", (gid, message, results)


def test_the_reference_gets_every_automatic_point_in_time(tmp_path):
    results, points, seconds = grade(tmp_path)
    expect(results)
    assert points == 14
    assert seconds < 10 * 2.5, seconds  # under 10 s on an idle machine; this one is shared (see the report)
