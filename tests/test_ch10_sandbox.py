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


# -- the cheats --------------------------------------------------------------------------------------------------------

NOT_A_KERNEL = '''class _Attention:
    """Not a kernel: kernel[grid](...) computes attention in Python with torch.mm."""

    def __getitem__(self, grid):
        def run(Q, K, V, O, LSE, n, m, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM):
            q, k, v = Q.reshape(-1, n, HEAD_DIM), K.reshape(-1, m, HEAD_DIM), V.reshape(-1, m, HEAD_DIM)
            for h in range(q.shape[0]):
                s = torch.mm(q[h], k[h].t()) / math.sqrt(HEAD_DIM)
                if CAUSAL:
                    s = s.masked_fill(torch.ones(n, m).triu(1).bool(), float("-inf"))
                w = (s - s.amax(-1, keepdim=True)).exp()
                O.view(-1, n, HEAD_DIM)[h] = torch.mm(w / w.sum(-1, keepdim=True), v[h])
                LSE.view(-1, n)[h] = s.amax(-1) + w.sum(-1).log()
        return run


flash_forward_kernel = _Attention()
'''

# A @triton.jit function that Triton's interpreter runs but no GPU compiler takes: a plain Python helper (numpy
# inside) reads the runtime length m as an int.
PYTHON_HELPER = '''import numpy as np


def _end(m, start_m, block_m, causal):
    return int(np.minimum(int(m), (int(start_m) + 1) * block_m)) if causal else int(m)


''' + mutate(KERNEL, "end = tl.minimum((start_m + 1) * BLOCK_M, m) if CAUSAL else m",
             "end = _end(m, start_m, BLOCK_M, CAUSAL)")

MM_PER_HEAD = '''def flash_attention_forward(q, k, v, causal=False, block_m=64, block_n=64):
    B, H, n, d = q.shape
    for size in (block_m, block_n, d):
        if size < 16 or size & (size - 1):
            raise ValueError("a power of two of at least 16")
    out, lse = torch.empty_like(q), torch.empty(B, H, n)
    for b in range(B):
        for h in range(H):
            s = torch.mm(q[b, h], k[b, h].t()) / math.sqrt(d)
            if causal:
                s = s.masked_fill(torch.ones(n, k.shape[2]).triu(1).bool(), float("-inf"))
            w = (s - s.amax(-1, keepdim=True)).exp()
            out[b, h] = torch.mm(w / w.sum(-1, keepdim=True), v[b, h])
            lse[b, h] = s.amax(-1) + w.sum(-1).log()
    return out, lse
'''
ELEMENTWISE_PER_HEAD = MM_PER_HEAD.replace("torch.mm(q[b, h], k[b, h].t())",
                                           "(q[b, h][:, None, :] * k[b, h][None, :, :]).sum(-1)").replace(
    "torch.mm(w / w.sum(-1, keepdim=True), v[b, h])", "((w / w.sum(-1, keepdim=True))[:, :, None] * v[b, h]).sum(1)")

NEVER_LAUNCHES = {"test_wrapper_shapes": "never launched", "test_wrapper_launch": "never launched",
                  "test_wrapper_strides": "never launched", "test_wrapper_blocks": "never launched"}


def test_an_object_with_getitem_is_not_a_kernel(tmp_path):
    results, points, _ = grade(tmp_path, flash_forward_kernel=NOT_A_KERNEL)
    expect(results, **{g: "not a Triton kernel" for g in KERNEL_CHECKS}, **NEVER_LAUNCHES)
    assert points == 5  # the questions


def test_a_jit_function_calling_a_python_helper_does_not_compile(tmp_path):
    results, _, _ = grade(tmp_path, flash_forward_kernel=PYTHON_HELPER)
    expect(results, **{g: "does not compile for a gpu" for g in KERNEL_CHECKS})
    assert "_end" in results["test_kernel_tiles"], results["test_kernel_tiles"]  # the compiler's own message


@pytest.mark.parametrize("wrapper", [MM_PER_HEAD, ELEMENTWISE_PER_HEAD], ids=["torch.mm", "elementwise"])
def test_a_wrapper_that_never_launches_earns_nothing(tmp_path, wrapper):
    results, _, _ = grade(tmp_path, flash_attention_forward=wrapper)
    expect(results, **NEVER_LAUNCHES)


def test_a_wrong_scale_loses_the_launch_point_whatever_the_kernel_does(tmp_path):
    kernel = mutate(KERNEL, "s = tl.dot(q, kT, input_precision=\"ieee\") * qk_scale",
                    "s = tl.dot(q, kT, input_precision=\"ieee\") * (1.4426950408889634 / tl.sqrt(HEAD_DIM * 1.0))")
    wrapper = mutate(WRAPPER, "qk_scale = LOG2_E / math.sqrt(d)", "qk_scale = 1.0")
    results, _, _ = grade(tmp_path, flash_forward_kernel=kernel, flash_attention_forward=wrapper)
    expect(results, test_wrapper_launch="qk_scale = 1.0")


def test_an_unmasked_query_load_is_named_with_its_line(tmp_path):
    kernel = mutate(KERNEL, "q = tl.load(q_ptrs, mask=rows[:, None] < n, other=0.0)", "q = tl.load(q_ptrs)")
    results, _, _ = grade(tmp_path, flash_forward_kernel=kernel)
    expect(results, test_kernel_ragged="tl.load without a mask")
    line = 1 + kernel.splitlines().index("    q = tl.load(q_ptrs)  # (BLOCK_M, HEAD_DIM)")
    assert f"line {line} of" in results["test_kernel_ragged"], results["test_kernel_ragged"]


# -- correct or wrong, graded the other way ----------------------------------------------------------------------------

# The forward loop of Triton's fused-attention tutorial: key tiles before the query tile unmasked, then the query
# tile's own keys masked. With BLOCK_N > BLOCK_M a tile of the first stage straddles the diagonal.
TUTORIAL = mutate(KERNEL, '''    end = tl.minimum((start_m + 1) * BLOCK_M, m) if CAUSAL else m
    for start_n in range(0, end, BLOCK_N):''', '''    lo = start_m * BLOCK_M if CAUSAL else m  # stage 1: the tiles before the query tile, no causal mask
    end = tl.minimum((start_m + 1) * BLOCK_M, m) if CAUSAL else m
    for start_n in range(0, end, BLOCK_N):''').replace('''        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])''', '''        if CAUSAL:
            if start_n >= lo:  # stage 2: the query tile's own keys
                visible = visible & (keys[None, :] <= rows[:, None])''')


def test_the_tutorials_forward_with_wide_key_tiles_is_wrong(tmp_path):
    results, _, _ = grade(tmp_path, flash_forward_kernel=TUTORIAL)
    expect(results, test_kernel_causal="BLOCK_N=64")


def test_a_causal_mask_that_replaces_the_length_mask_is_wrong(tmp_path):
    kernel = mutate(KERNEL, '''        visible = keys[None, :] < m
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])''', '''        if CAUSAL:
            visible = keys[None, :] <= rows[:, None]
        else:
            visible = keys[None, :] < m''')
    results, _, _ = grade(tmp_path, flash_forward_kernel=kernel)
    expect(results, test_kernel_causal="causal mask replaces the length mask")


def test_a_swapped_grid_is_named(tmp_path):
    wrapper = mutate(WRAPPER, "grid = (triton.cdiv(n, block_m), B * H)", "grid = (B * H, triton.cdiv(n, block_m))")
    results, _, _ = grade(tmp_path, flash_attention_forward=wrapper)
    expect(results, test_wrapper_launch="swapped")


@pytest.mark.parametrize("kernel, words", [
    (mutate(KERNEL, "tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=rows[:, None] < n)",
            "tl.store(o_ptrs, acc.to(O.dtype.element_ty))"),
     {"test_kernel_ragged": "tl.store without a mask", "test_kernel_causal": "past the end of o"}),
    (mutate(KERNEL, "keys[None, :] <= rows[:, None]", "keys[None, :] < rows[:, None]"),
     {"test_kernel_causal": "strict"}),
    (mutate(KERNEL, "o_ptrs = O + (bh * n + rows[:, None])", "o_ptrs = O + (bh * m + rows[:, None])"),
     {"test_kernel_ragged": "the row offsets are wrong"}),
], ids=["unmasked-store", "strict-causal-nan", "masked-stores-at-the-wrong-head"])
def test_a_kernel_bug_costs_only_kernel_checks(tmp_path, kernel, words):
    results, _, _ = grade(tmp_path, flash_forward_kernel=kernel)
    expect(results, **words)
