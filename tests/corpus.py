"""Faulty, hostile and unusual submissions to exercise 01, each with the grade and reason it must get.

Every case writes one student's folder. ``score`` is the exact auto-graded score,
in points read from the source notebook (each test's points, credited to the answer
parts its check exercises): ``FULL`` is every auto-graded point (code and
conceptual questions), ``TOTAL`` adds the hand-graded written answer (the CSV's
``max_score``; it earns nothing here, as no one has graded it). ``notebook()``
answers the questions with the reference, so a case that breaks only the code keeps
``QUESTION_POINTS``. ``reason`` and ``message`` are substrings the CSV reason and
some test's feedback message must contain.
Cases that attack the machine also name a ``probe``: a path that must not exist
after the batch (something the submission tried to plant outside its sandbox).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autograder.judging.checks import load_suite
from autograder.course import RELEASE, ROOT, SOURCE
from autograder.notebook import nbgrader_meta
from checking import reference_answers

A = "01_single_head"
NB = "single_head.ipynb"


def _graded_cells() -> list[dict]:
    """nbgrader metadata of the source notebook's graded cells (auto-graded tests and hand-graded answers)."""
    cells = json.loads((SOURCE / A / NB).read_text())["cells"]
    return [dict(nbgrader_meta(c), cell_type=c.get("cell_type")) for c in cells if nbgrader_meta(c).get("grade")]


CHECKS = load_suite(A).checks
TEST_POINTS = {m["grade_id"]: float(m.get("points", 0)) for m in _graded_cells() if m["cell_type"] == "code"}
assert set(TEST_POINTS) == set(CHECKS), f"tests without a check, or checks without a test: {set(TEST_POINTS) ^ set(CHECKS)}"


def points(*parts: str) -> float:
    """The auto-graded points a submission earns when exactly these answer parts are right: every test whose
    check exercises only these parts."""
    return sum(p for gid, p in TEST_POINTS.items() if set(CHECKS[gid].parts) <= set(parts))


REF = reference_answers(SOURCE / A / NB)
QUESTIONS = tuple(gid for gid in REF if gid.startswith("q_"))
FULL = points(*REF)  # every auto-graded point
TOTAL = sum(float(m.get("points", 0)) for m in _graded_cells())  # with the written answer's: the CSV's max_score
SOFTMAX_POINTS, SDPA_POINTS = points("softmax"), points("scaled_dot_product_attention")
QUESTION_POINTS = points(*QUESTIONS)
assert QUESTIONS and SOFTMAX_POINTS and SDPA_POINTS and TOTAL > FULL, "exercise 01 changed shape: revisit the corpus"
assert FULL == SOFTMAX_POINTS + SDPA_POINTS + QUESTION_POINTS, "a check spans several parts: revisit the corpus"
SOFTMAX, SDPA = REF["softmax"], REF["scaled_dot_product_attention"]
ESCAPES = "<img src=x onerror=alert(1)><script>alert(2)</script>\ud800"  # markup and a lone surrogate
MARKER = Path("/tmp/attn-corpus-marker")  # written by one submission, must be invisible to the next


def release() -> dict:
    return json.loads((RELEASE / A / NB).read_text())


def notebook(softmax: str = SOFTMAX, sdpa: str = SDPA, extra: list[str] | None = None, before: list[str] | None = None,
             edit: Callable[[dict], None] | None = None, questions: dict[str, str] | None = None) -> dict:
    """The released notebook with answer cells filled in (the questions with the reference answers; the written
    answer left as released), extra cells added after (or before) the answers."""
    nb = release()
    answers = dict(REF, **(questions or {}), softmax=softmax, scaled_dot_product_attention=sdpa)
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell["source"] = answers[gid]
    code = lambda s: {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}  # noqa: E731
    setup_at = next(i for i, c in enumerate(nb["cells"]) if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "setup")
    for i, s in enumerate(before or []):
        nb["cells"].insert(setup_at + 1 + i, code(s))
    nb["cells"] += [code(s) for s in extra or []]
    if edit:
        edit(nb)
    return nb


def write_nb(nb: dict | str | bytes, name: str = NB) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        data = nb if isinstance(nb, (str, bytes)) else json.dumps(nb)
        (folder / name).write_bytes(data.encode() if isinstance(data, str) else data)

    return build


def cells_where(pred: Callable[[dict], bool]) -> Callable[[dict], None]:
    def edit(nb: dict) -> None:
        nb["cells"] = [c for c in nb["cells"] if not pred(c)]

    return edit


def is_test(c: dict) -> bool:
    return c.get("metadata", {}).get("nbgrader", {}).get("grade", False)


def each_test(fn: Callable[[dict], None]) -> Callable[[dict], None]:
    def edit(nb: dict) -> None:
        for c in nb["cells"]:
            if is_test(c):
                fn(c)

    return edit


@dataclass
class Case:
    name: str
    build: Callable[[Path], None]
    score: float
    reason: str = ""
    message: str = ""
    probe: Path | None = None


WRONG_SOFTMAX = "def softmax(x, dim=-1):\n    return x\n"
# The wrong answers below return the right shapes: test_sdpa_shapes is honestly earned, and the questions.
SHAPES_POINTS = TEST_POINTS["test_sdpa_shapes"]
WRONG_SCORE = SHAPES_POINTS + QUESTION_POINTS
WRONG_SDPA = "def scaled_dot_product_attention(query, key, value, mask=None):\n    w = torch.zeros(query.shape[:-1] + key.shape[-2:-1])\n    return w @ value, w\n"
LEAK_GUARD = f"""
import os
_LEAK = any(os.path.exists(p) for p in [{str(SOURCE)!r}, {str(ROOT / 'autograder')!r}, {str(MARKER)!r}, '/root/.bashrc'])
"""
CORRUPTED_IF_LEAK = LEAK_GUARD + SOFTMAX.replace("    x_max = x.amax", "    if _LEAK:\n        return x * 0\n    x_max = x.amax", 1)

# Issue 20's helper process: started by a cell before any judged call; it computes what the part sends it.
HELPER = """
import os, pickle, struct, torch
import torch.nn.functional as F
_to_helper = os.pipe()
_from_helper = os.pipe()
_pid = os.fork()
if _pid == 0:
    while True:
        _n = struct.unpack("<Q", os.read(_to_helper[0], 8))[0]
        _x = [torch.from_numpy(_a) for _a in pickle.loads(os.read(_to_helper[0], _n))]
        _y = pickle.dumps({compute}.nan_to_num(0.0).numpy())
        os.write(_from_helper[1], struct.pack("<Q", len(_y)) + _y)
"""
ASK_HELPER = """
import os, pickle, select, struct
def _ask(*tensors):
    data = pickle.dumps([t.detach().numpy() for t in tensors])
    os.write(_to_helper[1], struct.pack("<Q", len(data)) + data)
    if not select.select([_from_helper[0]], [], [], 0.5)[0]:
        raise RuntimeError("no helper process")
    n = struct.unpack("<Q", os.read(_from_helper[0], 8))[0]
    return torch.from_numpy(pickle.loads(os.read(_from_helper[0], n)))
"""


def _cases() -> list[Case]:
    cases = [
        # -- correct answers, written unusually or noisily: full marks ---------------------------------
        Case("reference", write_nb(notebook()), FULL),
        Case("noisy_stderr_warnings", write_nb(notebook(sdpa=SDPA.replace(
            "    d_k = query.shape[-1]",
            "    import sys, warnings\n    print('debug', file=sys.stderr)\n    warnings.warn('careful')\n    d_k = query.shape[-1]"))), FULL),
        Case("einsum_float64", write_nb(notebook(sdpa='''
def scaled_dot_product_attention(query, key, value, mask=None):
    scores = torch.einsum("...nd,...md->...nm", query.double(), key.double()) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = softmax(scores, dim=-1)
    return torch.einsum("...nm,...mv->...nv", w, value.double()).to(value.dtype), w.to(query.dtype)
''')), FULL),
        Case("helper_cell_added", write_nb(notebook(
            softmax="def softmax(x, dim=-1):\n    return _stable(x, dim)\n",
            before=["def _stable(x, dim):\n    m = x.amax(dim, keepdim=True).nan_to_num(0.0, neginf=0.0)\n"
                    "    e = (x - m).exp()\n    s = e.sum(dim, keepdim=True)\n    return e / torch.where(s > 0, s, torch.ones_like(s))\n"])),
                FULL),
        Case("ipython_magics_and_get_ipython", write_nb(notebook(
            softmax="%%time\n" + SOFTMAX, sdpa="%matplotlib inline\n!echo hi\n" + SDPA,
            before=["get_ipython().run_line_magic('load_ext', 'autoreload')\n"])), FULL),
        Case("duplicate_answers_do_not_exceed_max", write_nb(notebook(extra=[SOFTMAX, SDPA, SOFTMAX])), FULL),
        # -- tampering with tests and metadata: tests restored, points from the source ----------------------
        Case("tests_deleted", write_nb(notebook(edit=cells_where(is_test))), FULL),
        Case("tests_replaced_by_print_passed", write_nb(notebook(
            softmax=WRONG_SOFTMAX, sdpa=WRONG_SDPA,
            edit=each_test(lambda c: c.update(source="print('test passed')")))), WRONG_SCORE, message="does not match"),
        Case("test_points_inflated_and_ungraded", write_nb(notebook(edit=each_test(
            lambda c: c["metadata"]["nbgrader"].update(points=1000, grade=False, grade_id="x" + c["metadata"]["nbgrader"]["grade_id"])))),
             FULL),
        Case("cells_reordered_ids_changed", write_nb(notebook(edit=lambda nb: (
            nb["cells"].reverse(), [c.update(id=f"x{i}") for i, c in enumerate(nb["cells"])],
            [c["metadata"].pop("nbgrader", None) for c in nb["cells"] if c.get("cell_type") == "code" and not is_test(c)],
            nb["cells"].sort(key=lambda c: ("import math" not in "".join(c.get("source", ""))))))), FULL),
        Case("blank_exercise", write_nb(release()), 0.0, message="not implemented"),
        # -- fooling the judge: verdicts are computed elsewhere ------------------------------------------
        Case("patched_comparisons", write_nb(notebook(
            softmax=WRONG_SOFTMAX, sdpa=WRONG_SDPA,
            before=["import torch, numpy\ntorch.allclose = lambda *a, **k: True\ntorch.testing.assert_close = lambda *a, **k: None\n"
                    "torch.equal = lambda *a, **k: True\nnumpy.allclose = lambda *a, **k: True\ntorch.Tensor.__eq__ = lambda *a: True\n"])),
             WRONG_SCORE),
        Case("torch_function_mode", write_nb(notebook(
            softmax=WRONG_SOFTMAX, sdpa=WRONG_SDPA,
            before=["from torch.overrides import TorchFunctionMode\nclass Liar(TorchFunctionMode):\n"
                    "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
                    "        if 'close' in getattr(func, '__name__', ''):\n            return True\n"
                    "        return func(*args, **(kwargs or {}))\nLiar().__enter__()\n"])), WRONG_SCORE),
        Case("lying_tensor_subclass", write_nb(notebook(softmax='''
class Agreeable(torch.Tensor):
    def __eq__(self, other):
        return True
def softmax(x, dim=-1):
    return x.as_subclass(Agreeable)
''')), QUESTION_POINTS, message="subclass"),  # the attention built on it returns the subclass too
        Case("questions_answered_with_objects_equal_to_anything", write_nb(notebook(questions={
            QUESTIONS[0]: "class Anything(float):\n    def __eq__(self, other):\n        return True\n"
                          "    __ne__ = __lt__ = __gt__ = lambda self, other: False\n    __le__ = __ge__ = __eq__\n"
                          "    __hash__ = float.__hash__\n"
                          "class AnyTuple(tuple):\n    def __eq__(self, other):\n        return True\n"
                          "    __hash__ = tuple.__hash__\n"
                          f"{QUESTIONS[0]} = Anything(-1)\n",
            **{q: f"{q} = {'AnyTuple((-1,))' if q == 'q_output_shape' else 'Anything(-1)'}\n" for q in QUESTIONS[1:]}})),
             SOFTMAX_POINTS + SDPA_POINTS, message="to hold a plain number"),
        Case("displayhook_and_printed_passed", write_nb(notebook(
            softmax=WRONG_SOFTMAX, sdpa=WRONG_SDPA,
            before=["import sys\nsys.displayhook = lambda v: print('All tests passed')\nprint('All tests passed! 11/11')\n"])), WRONG_SCORE),
        Case("input_transformer", write_nb(notebook(
            softmax=WRONG_SOFTMAX, sdpa=WRONG_SDPA,
            before=["try:\n    get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])\nexcept NameError:\n    pass\n"])),
             WRONG_SCORE),
        Case("reseed_and_memorise", write_nb(notebook(sdpa='''
torch.manual_seed(0)
_seen = {}
def scaled_dot_product_attention(query, key, value, mask=None):
    torch.manual_seed(1234)
    w = torch.full(query.shape[:-1] + key.shape[-2:-1], 1.0 / key.shape[-2])
    return w @ value, w
''')), SOFTMAX_POINTS + SHAPES_POINTS + QUESTION_POINTS, message="does not match"),  # of sdpa's tests, shapes only
        # The request loop bound its channel before any student code (issue 20): rebinding wire.send changes nothing.
        Case("tampers_with_harness", write_nb(notebook(extra=[
            "import sys\nfor m in list(sys.modules.values()):\n    if hasattr(m, 'send') and hasattr(m, 'recv'):\n"
            "        m.send = lambda fd, msg: None\n"])), FULL),
        # -- honest authorship ---------------------------------------------------------------------------------
        Case("delegates_to_attnkit", write_nb(notebook(sdpa="from attnkit import scaled_dot_product_attention\n")),
             SOFTMAX_POINTS + QUESTION_POINTS, message="attnkit"),
        Case("delegates_to_torch_sdpa", write_nb(notebook(sdpa='''
import torch.nn.functional as F
def scaled_dot_product_attention(query, key, value, mask=None):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask), None
''')), SOFTMAX_POINTS + QUESTION_POINTS, message="scaled_dot_product_attention"),
        Case("self_check_against_torch", write_nb(notebook(extra=[  # binds x, the answer's own parameter name
            "import torch\nimport torch.nn.functional as F\nx = torch.randn(2, 3, 4)\n"
            "out = F.scaled_dot_product_attention(x, x, x)\n"])), FULL),
        Case("delegates_obfuscated", write_nb(notebook(sdpa='''
import torch.nn.functional as F
_name = "".join(["scaled", "_dot", "_product", "_attention"])
def scaled_dot_product_attention(query, key, value, mask=None):
    out = vars(F)[_name](query, key, value, attn_mask=mask)
    w = softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]))
    return out, w
''')), SOFTMAX_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        # -- faults: the batch goes on, honest points kept ------------------------------------------------------
        Case("infinite_loop_ignoring_sigint", write_nb(notebook(extra=[
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n"])),
             FULL, reason="stopped"),
        Case("hangs_when_called", write_nb(notebook(sdpa="def scaled_dot_product_attention(q, k, v, mask=None):\n    while True:\n        pass\n")),
             SOFTMAX_POINTS + QUESTION_POINTS, reason="still running", message="did not finish in time"),
        Case("sys_exit", write_nb(notebook(extra=["import sys\nsys.exit(1)\n"])), FULL),
        Case("os_exit_at_top_level", write_nb(notebook(extra=["import os\nos._exit(3)\n"])), FULL, reason="skipped"),
        Case("os_exit_when_called", write_nb(notebook(softmax=SOFTMAX.replace("    x_max = x.amax", "    import os\n    os._exit(0)\n    x_max = x.amax", 1))),
             QUESTION_POINTS, reason="exited", message="stopped the process"),  # its 9 crashes leave the questions a process
        # a real fault (a signal sent to itself would be ignored: the worker is PID 1 of its namespace)
        Case("segfault", write_nb(notebook(extra=["import faulthandler\nfaulthandler._read_null()\n"])), FULL, reason="skipped"),
        Case("memory_exhaustion", write_nb(notebook(extra=["hog = []\nwhile True:\n    hog.append(bytearray(1 << 28))\n"])), FULL),
        Case("huge_output", write_nb(notebook(extra=["import sys, os\nfor _ in range(2000):\n    print('x' * 100000)\n"
                                                    "os.write(1, b'y' * (1 << 20))\n"])), FULL),
        Case("fork_bomb", write_nb(notebook(extra=["import os, time\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n"
                                                  "            time.sleep(600)\n            os._exit(0)\n"
                                                  "    except OSError:\n        break\n"])), FULL),
        # -- isolation: nothing of the course visible, nothing planted survives ----------------------------------
        Case("reads_course_files", write_nb(notebook(softmax=CORRUPTED_IF_LEAK)), FULL),
        Case("plants_marker_for_next_student", write_nb(notebook(extra=[
            f"import pathlib\nfor p in [{str(MARKER)!r}, {str(ROOT / 'planted.txt')!r}, '/root/planted.txt']:\n"
            "    try:\n        pathlib.Path(p).write_text('x')\n    except OSError:\n        pass\n"])), FULL, probe=ROOT / "planted.txt"),
        Case("sees_no_marker", write_nb(notebook(softmax=CORRUPTED_IF_LEAK)), FULL, probe=MARKER),
        Case("ipython_startup_file", write_nb(notebook(extra=[
            "import os, pathlib\np = pathlib.Path(os.path.expanduser('~/.ipython/profile_default/startup'))\n"
            "p.mkdir(parents=True, exist_ok=True)\n(p / '00-evil.py').write_text('import torch; torch.allclose = lambda *a, **k: True')\n"])),
             FULL, probe=Path("/root/.ipython/profile_default/startup/00-evil.py")),
        Case("network_blocked", write_nb(notebook(softmax='''
import socket
def _online():
    for host in [("127.0.0.1", 22), ("10.0.0.1", 80), ("1.1.1.1", 80)]:
        try:
            socket.create_connection(host, timeout=1).close()
            return True
        except OSError:
            pass
    return False
_NET = _online()
''' + SOFTMAX.replace("    x_max = x.amax", "    if _NET:\n        return x\n    x_max = x.amax", 1))), FULL),
        Case("files_beside_notebook", lambda folder: (
            write_nb(notebook())(folder),
            (folder / "numpy.py").write_text("raise ImportError('planted numpy')\n"),
            (folder / "torch.py").write_text("raise ImportError('planted torch')\n"),
            (folder / "gradebook.db").write_bytes(b"SQLite format 3\0garbage"),
        ), FULL),
        # -- broken files ------------------------------------------------------------------------------------
        Case("bom_before_json", write_nb(b"\xef\xbb\xbf" + json.dumps(notebook()).encode()), FULL),
        Case("markup_and_surrogate_in_cell_id", write_nb(notebook(edit=lambda nb: nb["cells"].append({
            "cell_type": "code", "metadata": {"nbgrader": {"grade_id": ESCAPES, "solution": False}},
            "source": "import os\nos._exit(1)\n", "outputs": [], "execution_count": None}))), FULL, reason="skipped"),
        Case("answers_in_a_second_notebook", lambda folder: (
            write_nb(release())(folder), write_nb(notebook(), name="single_head-Copy1.ipynb")(folder)),
             0.0, reason="not graded: single_head-Copy1.ipynb"),
        Case("assignment_folder_is_a_symlink", lambda folder: (
            folder.parent.mkdir(parents=True, exist_ok=True), folder.symlink_to(SOURCE / A)),
             0.0, reason="symbolic link"),
        Case("bool_weights", write_nb(notebook(sdpa=SDPA + "\n_sdpa = scaled_dot_product_attention\n"
                                               "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                                               "    out, w = _sdpa(q, k, v, mask)\n    return out, w > 0\n")),
             SOFTMAX_POINTS + QUESTION_POINTS, message="expected a floating-point tensor"),
        Case("invalid_json", write_nb("{\"cells\": [ oops"), 0.0, reason="not valid JSON"),
        Case("empty_file", write_nb(""), 0.0, reason="empty"),
        Case("json_not_a_notebook", write_nb(json.dumps({"hello": "world"})), 0.0, reason="not a notebook"),
        Case("not_utf8", write_nb(b"\xff\xfe\x00garbage"), 0.0, reason="not valid JSON"),
        Case("deeply_nested_json", write_nb("[" * 100000 + "]" * 100000), 0.0, reason="not"),
        Case("malformed_cells", write_nb(json.dumps({"cells": [None, 3, {"cell_type": "code", "source": 7},
                                                              {"cell_type": "code", "source": ["x = 1\n", None]}]})),
             0.0, reason="no answer cells"),
        Case("syntax_error_in_answer", write_nb(notebook(softmax="def softmax(x, dim=-1)\n    return x\n")), QUESTION_POINTS,
             message="softmax"),
        Case("missing_notebook", lambda folder: folder.mkdir(parents=True), 0.0, reason="no notebook named"),
        Case("renamed_notebook", write_nb(notebook(), name="my_attention.ipynb"), FULL, reason="in place of"),
        # -- the scratch folder is a bounded tmpfs (the cell fails with ENOSPC; the answers still count) -------
        Case("fills_scratch_disk", write_nb(notebook(extra=[
            "import os\nos.makedirs('fill', exist_ok=True)\nfor i in range(8):\n    with open(f'fill/f{i}', 'wb') as f:\n"
            "        for _ in range(40):\n            f.write(b'\\0' * (1 << 20))\n"])), FULL),
        # -- authorship, whatever else the notebook holds -------------------------------------------------------
        Case("magic_and_broken_cell_do_not_hide_delegation", write_nb(notebook(
            softmax="def softmax(x, dim=-1):\n    return torch.softmax(x, dim).nan_to_num(0.0)\n",
            extra=["%matplotlib inline\n", "def oops(:\n    pass\n"])), SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        Case("delegates_to_aten_by_computed_name", write_nb(notebook(sdpa='''
def scaled_dot_product_attention(query, key, value, mask=None):
    op = getattr(torch.ops.aten, bytes.fromhex("5f7363616c65645f646f745f70726f647563745f617474656e74696f6e5f6d617468").decode())
    m = None if mask is None else torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, float("-inf"))
    out, w = op(query, key, value, attn_mask=m)
    return out.nan_to_num(0.0), w.nan_to_num(0.0)
''')), SOFTMAX_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        Case("percent_continuation_beside_a_magic", write_nb(notebook(softmax="%matplotlib inline\n" + SOFTMAX.replace(
            "    x_max = x.amax", "    dim = (dim\n           % x.dim())\n    x_max = x.amax", 1))), FULL),
        # -- routes by names built at run time: outside the vocabulary (issue 34), and refused at run time behind it
        # (the run-time refusal alone: forged_softmax_through_the_part_allowed_it, the hooks, tests/test_vocabulary.py)
        Case("forged_softmax_name_built_at_run_time", write_nb(notebook(softmax=
            "def softmax(x, dim=-1):\n    return getattr(torch, ''.join(map(chr, [115, 111, 102, 116, 109, 97, 120])))(x, dim)"
            ".nan_to_num(0.0)\n")), SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        Case("forged_softmax_unpickled", write_nb(notebook(softmax=
            "import pickle\n_f = pickle.loads(bytes.fromhex('63746f7263680a736f66746d61780a2e'))\n"
            "def softmax(x, dim=-1):\n    return _f(x, dim).nan_to_num(0.0)\n")), SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        Case("forged_softmax_torchscript_from_a_string", write_nb(notebook(softmax=
            "import base64\n_cu = torch.jit.CompilationUnit(base64.b64decode("
            "'ZGVmIGYoeDogVGVuc29yLCBkOiBpbnQpOgogICAgcmV0dXJuIHRvcmNoLnNvZnRtYXgoeCwgZCkK').decode())\n"
            "def softmax(x, dim=-1):\n    return _cu.f(x, dim).nan_to_num(0.0)\n")), SDPA_POINTS + QUESTION_POINTS,
             message="torch's own implementation"),
        Case("forged_softmax_distribution_from_logits", write_nb(notebook(softmax=
            "_D = vars(torch.distributions)[bytes.fromhex('43617465676f726963616c').decode()]\n"
            "def softmax(x, dim=-1):\n    return _D(logits=x.movedim(dim, -1), validate_args=False).probs.movedim(-1, dim).nan_to_num(0.0)\n")),
             SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        Case("forged_softmax_through_the_part_allowed_it", write_nb(notebook(
            softmax="def softmax(x, dim=-1):\n    x = x.movedim(dim, -1)\n    eye = torch.eye(x.shape[-1], dtype=x.dtype)\n"
                    "    w = scaled_dot_product_attention(x.unsqueeze(-2) * math.sqrt(x.shape[-1]), eye, eye)[1]\n"
                    "    return w.squeeze(-2).movedim(-1, dim).nan_to_num(0.0)\n",
            sdpa=SDPA.replace("weights = softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)"))),
             SDPA_POINTS + QUESTION_POINTS, message="torch's own implementation"),
        Case("guard_switched_off_through_gc", write_nb(notebook(sdpa='''
import gc
import torch.nn.functional as F
def scaled_dot_product_attention(query, key, value, mask=None):
    for o in gc.get_objects():
        if isinstance(o, torch.library.Library):
            o._destroy()
    op = getattr(F, bytes.fromhex("7363616c65645f646f745f70726f647563745f617474656e74696f6e").decode())
    out = op(query, key, value, attn_mask=mask).nan_to_num(0.0)
    return out, softmax(query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1]))
''')), SOFTMAX_POINTS + QUESTION_POINTS, message="guard"),
        # -- issue 20: the guard runs in the student's process; these reach it by names the scan cannot read ----
        # The stack above a judged call is the grader's: the Runner found there, Guard.judged and the Runner's
        # own guard replaced by do-nothing contexts. The request loop bound its guard before any student code.
        Case("guard_replaced_through_the_stack", write_nb(notebook(softmax=f'''
import contextlib, sys
_h = lambda s: bytes.fromhex(s).decode()
def softmax(x, dim=-1):
    frame = getattr(sys, _h("{b"_getframe".hex()}"))(0)
    while frame is not None:
        runner = getattr(frame, _h("{b"f_locals".hex()}")).get("self")
        if type(runner).__name__ == "Runner":
            try:  # (issue 29: in the sandbox the Runner has no guard at all; the process is banned for life)
                type(runner.guard).judged = lambda self, fragments: contextlib.nullcontext()
            except TypeError:
                pass
            type(runner)._judged = lambda self, req: contextlib.nullcontext()
            runner.guard = type("Off", (), {{"judged": lambda self, f: contextlib.nullcontext(), "refusals": []}})()
        frame = getattr(frame, _h("{b"f_back".hex()}"))
    return getattr(torch, _h("{b"softmax".hex()}"))(x, dim).nan_to_num(0.0)
''')), SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        # A helper process started before any judged call, to which the part sends its tensor: fork is refused in
        # the sandbox (seccomp), so no helper exists when the part needs it. torch.softmax written plainly in
        # module-level code the part never calls, and F.scaled_dot_product_attention for the attention part.
        Case("helper_process_runs_torch_softmax", write_nb(notebook(
            before=[HELPER.format(compute="torch.softmax(_x[0], -1)")],
            softmax=ASK_HELPER + "def softmax(x, dim=-1):\n    return _ask(x.movedim(dim, -1)).movedim(-1, dim)\n")),
             QUESTION_POINTS),  # (the attention part calls the student's softmax, and fails with it)
        Case("helper_process_runs_torch_attention", write_nb(notebook(
            before=[HELPER.format(compute="F.scaled_dot_product_attention(*_x[:3], attn_mask=_x[3] if _x[3:] else None)")],
            sdpa=ASK_HELPER + SDPA.replace("return weights @ value, weights",
                                           "return _ask(query, key, value, *([] if mask is None else [mask])), weights"))),
             SOFTMAX_POINTS + QUESTION_POINTS),
        # torch's own Python softmax (torch._refs) taken from the closure of its decorator: guarded in place, the
        # function the closure holds refuses like the operator.
        Case("refs_softmax_taken_from_its_closure", write_nb(notebook(softmax=f'''
import torch._refs
_h = lambda s: bytes.fromhex(s).decode()
def softmax(x, dim=-1):
    outer = getattr(torch._refs, _h("{b"softmax".hex()}"))
    cells = getattr(outer, _h("{b"__closure__".hex()}"))
    fns = [getattr(c, _h("{b"cell_contents".hex()}")) for c in cells]
    inner = [f for f in fns if callable(f) and getattr(f, "__name__", "") == _h("{b"softmax".hex()}")][0]
    return inner(x, dim).nan_to_num(0.0)
try:  # torch's Python softmax imports torch._dynamo on its first call (seconds): paid here, not in a timed call
    softmax(torch.zeros(1))
except Exception:
    pass
''')), SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        # -- grader-side analysis is bounded: minutes unbounded, graded normally now ----------------------------
        Case("pathological_magics_and_helper_chain", write_nb(notebook(extra=[
            "\n".join(f"x{i} = {i}\n%time y = 1" for i in range(600)),
            "".join(f"def h{i}(x):\n    return h{i + 1}(x)\n" for i in range(3000)) + "def h3000(x):\n    return x\n"])), FULL),
        Case("too_large_to_scan", write_nb(notebook(extra=["x = 1\n" * 180_000])), 0.0,
             reason="more than the grader reads"),
        # -- honest code that works in Jupyter works here ----------------------------------------------------
        Case("namedtuple_and_jit_script", write_nb(notebook(
            softmax="@torch.jit.script\n" + SOFTMAX,
            sdpa="import collections\nAttention = collections.namedtuple('Attention', 'output weights')\n" +
                 SDPA.replace("return weights @ value, weights", "return Attention(weights @ value, weights)"))), FULL),
        Case("writefile_helper_named_softmax", write_nb(notebook(
            before=["%%writefile attention_helpers.py\nimport torch\n\n" + SOFTMAX.replace("def softmax(", "def stable_softmax(")],
            softmax="import attention_helpers\nfrom attention_helpers import stable_softmax\n\n"
                    "def softmax(x, dim=-1):\n    return attention_helpers.stable_softmax(x, dim)\n")), FULL),
        *_cases_29(),
        *_cases_34(),
    ]
    return cases


# -- issue 29: a fourth round, by an attacker who read the grader; and honest code it marked down ------------------
# Each process that answers a part is banned for its whole life (autograder/in_sandbox/ban.py): these cells run their
# work where the grader's own code runs (decoding the request, encoding the reply), switch the ban off through the
# grader's objects, or use torch's own Python attention; names are built at run time, so only the run-time design
# stands in the way (the static scan cannot read them).

_h = lambda s: f"bytes.fromhex({s.encode().hex()!r}).decode()"  # noqa: E731 - a name the scan cannot fold

DECODE_HOOK = f"""
import json, numpy, torch
_SEEN = {{}}
_recent = []
_loads, _frombuffer = json.loads, numpy.frombuffer
def _remember(a):
    try:
        t = torch.from_numpy(numpy.array(a))
        if t.is_floating_point() and t.dim() >= 1:
            _SEEN[t.numpy().tobytes()] = getattr(torch, {_h("softmax")})(t, -1)
            _recent.append(t)
            if len(_recent) >= 3:
                q, k, v = _recent[-3:]
                if q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2]:
                    out, w = getattr(torch.ops.aten, {_h("_scaled_dot_product_attention_math")})(q, k, v)
                    _SEEN[("att", q.numpy().tobytes())] = (out, w)
    except Exception:
        pass
_shapes = []
def _walk(v):
    if isinstance(v, dict):
        if "$a" in v:
            _shapes.append(v["shape"])
        for x in v.values():
            _walk(x)
    elif isinstance(v, list):
        for x in v:
            _walk(x)
def _hooked_frombuffer(*args, **kwargs):
    a = _frombuffer(*args, **kwargs)
    for shape in list(_shapes):
        if int(numpy.prod(shape)) == a.size:
            _shapes.remove(shape)
            _remember(a.reshape(shape))
            break
    return a
def _hooked_loads(*args, **kwargs):
    header = _loads(*args, **kwargs)
    _shapes.clear()
    _walk(header)
    return header
numpy.frombuffer, json.loads = _hooked_frombuffer, _hooked_loads
"""
LOOKUP_SOFTMAX = "def softmax(x, dim=-1):\n    return _SEEN[x.numpy().tobytes()] if dim in (-1, x.dim() - 1) else x\n"
LOOKUP_SDPA = ("def scaled_dot_product_attention(query, key, value, mask=None):\n"
               "    return _SEEN[('att', query.numpy().tobytes())]\n")

ENCODE_HOOK = f"""
import numpy, torch
_asked = []
_contiguous = numpy.ascontiguousarray
def _hooked(a, *args, **kwargs):
    for x in _asked[-1:]:
        if a.shape == tuple(x.shape):
            try:
                a = getattr(torch, {_h("softmax")})(torch.from_numpy(x.numpy()), -1).numpy()
            except Exception:
                pass
    return _contiguous(a, *args, **kwargs)
numpy.ascontiguousarray = _hooked
def softmax(x, dim=-1):
    _asked.append(x.detach().clone())
    return x
"""

GUARD_GRAPH = f"""
import contextlib, sys, torch
for _m in list(sys.modules.values()):
    _guard = getattr(_m, 'Guard', None)
    if isinstance(_guard, type) and hasattr(_guard, '_probe'):
        _guard._plan = lambda self, fragments: []
        _guard._probe = lambda self, fragments: None
        _guard._table = lambda self, fragments: []
        _guard.judged = lambda self, fragments: contextlib.nullcontext()
_grader = sys.modules.get({_h("harness")})
def softmax(x, dim=-1):
    return getattr(torch, {_h("softmax")})(x, dim).nan_to_num(0.0)
"""

AO_STAR_IMPORT = '''
from torch.ao.nn.quantizable import *

def scaled_dot_product_attention(query, key, value, mask=None):
    *lead, n, d = query.shape
    m = key.shape[-2]
    q = query.reshape(-1, n, d).double()
    k = key.expand(*lead, m, d).reshape(-1, m, d).double()
    att = MultiheadAttention(d, 1, batch_first=True, bias=False).double()
    with torch.no_grad():
        att.in_proj_weight.copy_(torch.eye(d, dtype=torch.float64).repeat(3, 1)) if hasattr(att, "in_proj_weight") else None
        for lin in (att.linear_Q, att.linear_K, att.linear_V):
            lin.weight.copy_(torch.eye(d, dtype=torch.float64))
    bad = None
    if mask is not None:
        bad = ~torch.broadcast_to(mask, (*lead, n, m)).reshape(-1, n, m)
        bad = torch.zeros(bad.shape, dtype=torch.float64).masked_fill(bad, float("-inf"))
    w = att(q, k, k, need_weights=True, attn_mask=bad)[1].nan_to_num(0.0)
    w = w.reshape(*lead, n, m).to(query.dtype)
    return w @ value, w
'''
AO_BY_RUN_TIME_NAME = AO_STAR_IMPORT.replace(
    "from torch.ao.nn.quantizable import *\n",
    f"import importlib\nMultiheadAttention = vars(importlib.import_module('torch.ao.nn.quantizable'))[{_h('MultiheadAttention')}]\n")

AUTOGRAD_CTX = '''
class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        x_max = x.amax(dim=dim, keepdim=True)
        x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
        e = torch.exp(x - x_max)
        total = e.sum(dim=dim, keepdim=True)
        out = e / torch.where(total > 0, total, torch.ones_like(total))
        ctx.softmax_out = out
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        y = ctx.softmax_out
        return y * (g - (g * y).sum(ctx.dim, keepdim=True)), None

def softmax(x, dim=-1):
    return _Softmax.apply(x, dim)
'''


def _cases_29() -> list[Case]:
    return [
        # Work done while the request is read: rebound json.loads and numpy.frombuffer compute torch's softmax and
        # attention of the inputs; the answers only look them up. The hooks run banned, like every line.
        Case("forged_in_the_request_decode_hooks", write_nb(notebook(before=[DECODE_HOOK], softmax=LOOKUP_SOFTMAX,
                                                                     sdpa=LOOKUP_SDPA)), QUESTION_POINTS),
        # Work done while the reply is written: a rebound numpy.ascontiguousarray swaps torch's softmax into the reply.
        Case("forged_in_the_reply_encode_hook", write_nb(notebook(
            softmax=ENCODE_HOOK, sdpa=SDPA.replace("weights = softmax(scores, dim=-1)",
                                                   "weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)"))),
             SDPA_POINTS + QUESTION_POINTS),
        # The guard's object graph through sys.modules (Guard._plan, _probe, judged replaced): nothing of it enforces
        # the ban in the sandbox (the registration has no Python handle).
        Case("guard_object_graph_through_sys_modules", write_nb(notebook(softmax=GUARD_GRAPH)),
             SDPA_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        # torch.ao's quantizable MultiheadAttention, by a star import: the scan reads the bare name ...
        Case("torch_ao_star_import", write_nb(notebook(sdpa=AO_STAR_IMPORT)), SOFTMAX_POINTS + QUESTION_POINTS,
             message="star import"),
        # ... and by a name built at run time: its forward, which names attention and calls a softmax, refuses.
        Case("torch_ao_by_a_run_time_name", write_nb(notebook(sdpa=AO_BY_RUN_TIME_NAME)),
             SOFTMAX_POINTS + QUESTION_POINTS, message="outside its vocabulary"),
        # -- honest code stays honest --
        Case("autograd_function_keeps_its_output_on_ctx", write_nb(notebook(softmax=AUTOGRAD_CTX)), FULL),
        Case("writefile_module_imported_whole", write_nb(notebook(
            before=["%%writefile my_softmax.py\nimport torch\n\n" + SOFTMAX],
            softmax="import my_softmax\n\n_mine = my_softmax.softmax\n\ndef softmax(x, dim=-1):\n    return _mine(x, dim)\n")),
             FULL),
        Case("torch_compile_eager_backend", write_nb(notebook(softmax=SOFTMAX + "\nsoftmax = torch.compile(softmax, backend='eager')\n")),
             FULL),
        # A process-starting call fails, saying why and what to use instead.
        Case("torch_compile_default_backend", write_nb(notebook(softmax="@torch.compile\n" + SOFTMAX)),
             QUESTION_POINTS, message="the grader runs your notebook in one process"),
        Case("subprocess_in_an_answer", write_nb(notebook(softmax=SOFTMAX.replace(
            "    x_max = x.amax", "    import subprocess\n    subprocess.run(['true'], check=True)\n    x_max = x.amax", 1))),
             QUESTION_POINTS, message="the grader runs your notebook in one process"),
    ]


def with_files(nb: dict, files: dict[str, str], outside: dict[str, str] | None = None,
               links: dict[str, str] | None = None) -> Callable[[Path], None]:
    """The notebook and ``files`` (name -> text) in the student's folder; ``outside``: files beside the folder (a
    path escape's target); ``links``: name -> target, symbolic links in the folder."""
    def build(folder: Path) -> None:
        write_nb(nb)(folder)
        for name, text in files.items():
            (folder / name).write_text(text)
        for name, text in (outside or {}).items():
            (folder.parent / name).write_text(text)
        for name, target in (links or {}).items():
            (folder / name).symlink_to(target)

    return build


SELF_CHECK_FIRST = "x = torch.randn(2, 5)\ntorch.testing.assert_close(softmax(x), torch.softmax(x, -1))\n\n" + SOFTMAX
HELPERS = "import torch\n\n" + SOFTMAX.replace("def softmax(", "def helper_softmax(")
USES_HELPER = "def softmax(x, dim=-1):\n    return helper_softmax(x, dim)\n"


def _cases_34() -> list[Case]:
    """Issue 34: honest code written unusually keeps its points (the execution half)."""
    return [
        # A self-check before the def, refused (torch's softmax in the softmax part's banned process; softmax not
        # yet defined elsewhere): the cell's later statements still run, the function is defined.
        Case("self_check_before_the_def", write_nb(notebook(softmax=SELF_CHECK_FIRST)), FULL),
        # A cell disabled as Jupyter disables it is neither run nor scanned.
        Case("script_false_cell_not_run", write_nb(notebook(extra=[
            "%%script false\nfrom attnkit import softmax\ndef scaled_dot_product_attention(q, k, v, mask=None):\n"
            "    return torch.nn.functional.scaled_dot_product_attention(q, k, v), None\n",
            "%%bash\necho $HOME\n", "%%html\n<b>attention</b>\n"])), FULL),
        # %run FILE runs the student's file in the namespace (scanned as theirs), options and quotes as IPython reads them.
        Case("run_helpers_file", with_files(notebook(softmax="%run helpers.py\n\n" + USES_HELPER),
                                                              {"helpers.py": HELPERS}), FULL),
        Case("run_helpers_quoted_no_suffix", with_files(notebook(softmax="%run -i 'helpers'\n" + USES_HELPER),
                                                        {"helpers.py": HELPERS}), FULL),
        # A missing file fails that line, as in Jupyter; the cell's def after it still runs.
        Case("run_missing_file", write_nb(notebook(softmax="%run not_submitted.py\n" + SOFTMAX)), FULL),
        # Files outside the folder, or through a link, are not read: the helper is missing, so is softmax.
        Case("run_path_escape", with_files(notebook(softmax="%run ../outside_helpers.py\n" + USES_HELPER), {},
                                           outside={"outside_helpers.py": HELPERS}), QUESTION_POINTS),
        Case("run_symlink", with_files(notebook(softmax="%run helpers.py\n" + USES_HELPER), {},
                                       links={"helpers.py": "/etc/hostname"}), QUESTION_POINTS),
        # A one-process torch.compile backend that decomposes the student's own softmax (dynamic shapes and a first
        # call in the cell: one compilation, not one per shape inside the corpus's 4 s per call).
        Case("torch_compile_decomp_partition", write_nb(notebook(
            softmax=SOFTMAX + "\nsoftmax = torch.compile(softmax, backend='aot_eager_decomp_partition', dynamic=True)\n"
                              "softmax(torch.zeros(2, 3))\n")), FULL),
        # Question answers in the form a reader calls the same.
        Case("questions_as_tensors", write_nb(notebook(questions={
            "q_output_shape": "q_output_shape = torch.tensor([[8, 3, 5, 32]])\n",
            "q_weight": "q_weight = torch.tensor(math.e / (math.e + 1))\n",
            "q_score_variance": "q_score_variance = torch.ones(64).sum()\n"})), FULL),
    ]


CASES = _cases()


# -- exercise 09: forged fixtures and samplers without randomness (issue 20), graded through the sandbox ----------
# The attacks lived in the student's process: the call log of the model handed to generate, and the name TinyLM
# in the student's namespace, from which the grader built its "reference" too; samplers right on identical rows
# that ignore the generator; int32 ids. Each keeps exactly the points of the checks it does not touch.

A09, NB09 = "09_tiny_gpt", "tiny_gpt.ipynb"
CHECKS09 = load_suite(A09).checks
TEST_POINTS09 = {m["grade_id"]: float(m.get("points", 0)) for c in json.loads((SOURCE / A09 / NB09).read_text())["cells"]
                 if (m := nbgrader_meta(c)).get("grade") and c.get("cell_type") == "code"}
assert set(TEST_POINTS09) == set(CHECKS09), "exercise 09 changed shape: revisit the corpus"
REF09 = reference_answers(SOURCE / A09 / NB09)
FULL09 = sum(TEST_POINTS09.values())
SAMPLE_POINTS09 = TEST_POINTS09["test_sample_next_greedy_topk"] + TEST_POINTS09["test_sample_next_distribution"]
GENERATE_POINTS09 = TEST_POINTS09["test_generate_greedy"] + TEST_POINTS09["test_generate_sampling"]


def notebook09(**answers: str) -> Callable[[Path], None]:
    """Exercise 09's released notebook answered with the reference, but for ``answers`` (part -> code)."""
    from checking import answered_release

    return write_nb(answered_release(A09, NB09, dict(REF09, **answers)), NB09)


_MULTINOMIAL = "    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)\n"


def _sampler09(draw: str) -> str:
    assert _MULTINOMIAL in REF09["sample_next"]
    return REF09["sample_next"].replace(_MULTINOMIAL, draw)


# A generate that never uses the cache, then rewrites the model's call log as a cached loop would have left
# it (tests/test_ch09_grading.py grades the same answer in-process).
FORGED_LOG_GENERATE = '''
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    tokens = prompt
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits, _ = model(tokens)
            tokens = torch.cat([tokens, sample_next(logits[:, -1], temperature, top_k, generator)[:, None]], 1)
    n = prompt.shape[1]
    model.calls[:] = [(n, 0)] + [(1, n + i) for i in range(max_new_tokens - 1)]
    return tokens
'''
# The fixtures' names redefined in an answer cell: when the grader built "TinyLM" by name, even its greedy
# "reference" was this class (tests/test_ch09_grading.py grades the same answer in-process).
FIXTURES_REDEFINED = '''
class TinyLM(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
    def forward(self, tokens, cache=None):
        logits = torch.zeros(tokens.shape + (12,))
        logits[..., 0] = 1.0
        return logits, None
    def call_log(self):
        return [(1, 0)]

def seeded_generator(seed):
    return torch.Generator().manual_seed(0)

def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    return torch.cat([prompt, torch.zeros(prompt.shape[0], max_new_tokens, dtype=torch.long)], 1)
'''

CASES09 = [
    Case("09_reference", notebook09(), FULL09),
    Case("09_generate_rewrites_the_call_log", notebook09(generate=FORGED_LOG_GENERATE), FULL09 - GENERATE_POINTS09,
         message="the cache is never used"),
    Case("09_tinylm_redefined_in_an_answer_cell", notebook09(generate=FIXTURES_REDEFINED), FULL09 - GENERATE_POINTS09, message="differ from greedy decoding"),
    # generate passes the generator on, but the draws ignore it: generate_sampling sees other seeds repeat too
    Case("09_sampler_without_randomness", notebook09(sample_next=_sampler09(
        "    u = (torch.arange(logits.shape[0], dtype=probs.dtype) + 0.5)[:, None] / logits.shape[0]\n"
        "    return (probs.cumsum(-1) < u).sum(-1).clamp(max=logits.shape[-1] - 1)\n")),
         FULL09 - SAMPLE_POINTS09 - TEST_POINTS09["test_generate_sampling"], message="two different seeds"),
    Case("09_sampler_reseeds_the_global_generator", notebook09(sample_next=_sampler09(
        "    torch.manual_seed(0)\n    return torch.multinomial(probs, 1).squeeze(-1)\n")),
         FULL09 - SAMPLE_POINTS09 - TEST_POINTS09["test_generate_sampling"], message="global generator reseeded"),
    Case("09_sampler_int32_ids", notebook09(sample_next=_sampler09(
        "    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).int()\n")),
         FULL09 - SAMPLE_POINTS09, message="int64"),
]
