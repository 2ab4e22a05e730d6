"""Exercise 10's graded checks: full marks for correct kernels however written, named failures for the classic
mistakes and for what a GPU would refuse but Triton's interpreter runs (masks, tile sizes, bfloat16 in tl.dot).

Every kernel launch here runs in Triton's interpreter (~0.1-0.3 s each); the suite launches about 20 times.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

if importlib.util.find_spec("triton") is None:  # the course without Triton: only this chapter's tests skip
    pytest.skip("Triton is not installed (requirements.txt pins it)", allow_module_level=True)

from autograder.judging.checks.ch10_flash_triton import KERNEL_CHECKS, STATED_REQUIREMENTS  # noqa: E402
from chapter_checking import (assert_answer_named, assert_questions_pass, assert_requirement_broken_alone,  # noqa: E402
                              question_answers)
from checking import assert_delegation_named, mutate, run_checks, run_suite, source_code  # noqa: E402

A = "10_flash_triton"
REF = source_code(A)
QUESTIONS = "import math\n" + question_answers(A, "flash_triton.ipynb")
SETUP = REF.split("@triton.jit")[0]  # the read-only setup cell (imports, TRITON_INTERPRET, LOG2_E)

# Written another way: K loaded as (BLOCK_N, HEAD_DIM) and transposed with tl.trans, the causal loop in two stages
# (tiles wholly below the diagonal without a mask, then the diagonal ones), the division by l_i as a product with
# its reciprocal, a wrapper that checks sizes with math.log2 and builds the grid with a lambda.
TWO_STAGE = SETUP + '''
@triton.jit
def _tile(q, K, V, bh, m, rows, start_n, m_i, l_i, acc, qk_scale, MASK: tl.constexpr,
          BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    keys = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    offs = (bh * m + keys[:, None]) * HEAD_DIM + dims[None, :]
    k = tl.load(K + offs, mask=keys[:, None] < m, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    ok = keys[None, :] < m
    if MASK:
        ok = ok & (keys[None, :] <= rows[:, None])
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    v = tl.load(V + offs, mask=keys[:, None] < m, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc


@triton.jit
def flash_forward_kernel(Q, K, V, O, LSE, n, m, qk_scale, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + (bh * n + rows[:, None]) * HEAD_DIM + dims[None, :], mask=rows[:, None] < n, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        below = tl.minimum(tile * BLOCK_M // BLOCK_N * BLOCK_N, m)  # key tiles wholly before the first query
        for start_n in range(0, below, BLOCK_N):
            m_i, l_i, acc = _tile(q, K, V, bh, m, rows, start_n, m_i, l_i, acc, qk_scale, False, BLOCK_N, HEAD_DIM)
        for start_n in range(below, tl.minimum((tile + 1) * BLOCK_M, m), BLOCK_N):
            m_i, l_i, acc = _tile(q, K, V, bh, m, rows, start_n, m_i, l_i, acc, qk_scale, True, BLOCK_N, HEAD_DIM)
    else:
        for start_n in range(0, m, BLOCK_N):
            m_i, l_i, acc = _tile(q, K, V, bh, m, rows, start_n, m_i, l_i, acc, qk_scale, False, BLOCK_N, HEAD_DIM)
    inv = 1.0 / l_i
    tl.store(O + (bh * n + rows[:, None]) * HEAD_DIM + dims[None, :], acc * inv[:, None], mask=rows[:, None] < n)
    tl.store(LSE + bh * n + rows, m_i * 0.6931471805599453 + tl.log(l_i), mask=rows < n)


def flash_attention_forward(q, k, v, causal=False, block_m=64, block_n=64):
    B, H, n, d = q.shape
    for size in (block_m, block_n, d):
        if size < 16 or not math.log2(size).is_integer():
            raise ValueError(f"{size} is not a power of two of at least 16")
    q, k, v = (x.contiguous() for x in (q, k, v))
    out, lse = torch.empty_like(q), q.new_empty((B, H, n), dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), B * H)  # noqa: E731
    flash_forward_kernel[grid](q, k, v, out, lse, n, k.shape[2], math.log2(math.e) / d ** 0.5,
                               CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d)
    return out, lse
''' + QUESTIONS


# Without tl.dot: the scores and the weighted values as broadcast products summed over an axis (slower on a GPU,
# exact everywhere), the state kept in natural-log units after converting once, a wrapper that builds its
# outputs with new_empty and checks the sizes with bit_count.
BROADCAST = SETUP + '''
@triton.jit
def flash_forward_kernel(Q, K, V, O, LSE, n, m, qk_scale, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + pid_h * n * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < n, other=0.0)
    running_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
    running_sum = tl.full([BLOCK_M], 0.0, tl.float32)
    out = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    hi = m
    if CAUSAL:
        hi = tl.minimum(m, (pid_m + 1) * BLOCK_M)
    for lo in range(0, hi, BLOCK_N):
        offs_n = lo + tl.arange(0, BLOCK_N)
        base = pid_h * m * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(K + base, mask=offs_n[:, None] < m, other=0.0)  # (BLOCK_N, HEAD_DIM)
        v = tl.load(V + base, mask=offs_n[:, None] < m, other=0.0)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * qk_scale
        allowed = offs_n[None, :] < m
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(allowed, s, -float("inf"))
        new_max = tl.maximum(running_max, tl.max(s, 1))
        p = tl.exp2(s - new_max[:, None])
        scale_old = tl.exp2(running_max - new_max)
        running_sum = running_sum * scale_old + tl.sum(p, 1)
        out = out * scale_old[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        running_max = new_max
    tl.store(O + pid_h * n * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             out / running_sum[:, None], mask=offs_m[:, None] < n)
    natural = running_max * 0.6931471805599453 + tl.log(running_sum)
    tl.store(LSE + pid_h * n + offs_m, natural, mask=offs_m < n)


def flash_attention_forward(q, k, v, causal=False, block_m=64, block_n=64):
    d = q.shape[-1]
    if any(x < 16 or x.bit_count() != 1 for x in (block_m, block_n, d)):
        raise ValueError("block_m, block_n and d must be powers of two, at least 16")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    flash_forward_kernel[(triton.cdiv(q.shape[2], block_m), q.shape[0] * q.shape[1])](
        q, k, v, o, lse, q.shape[2], k.shape[2], LOG2_E * d ** -0.5, causal, block_m, block_n, d)
    return o, lse
''' + QUESTIONS

def test_reference_gets_full_marks():
    results = run_suite(A, REF)
    assert results == {gid: "" for gid in results}, results


@pytest.mark.parametrize("code", [TWO_STAGE, BROADCAST], ids=["two-stage-causal-loop", "broadcast-products"])
def test_kernels_written_another_way_get_full_marks(code):
    results = run_suite(A, code)
    assert results == {gid: "" for gid in results}, results


# -- each stated requirement broken alone loses the points of its checks, named -----------------------------------

V_LOAD = "v = tl.load(v_ptrs, mask=keys[:, None] < m, other=0.0)  # (BLOCK_N, HEAD_DIM)"
REQUIREMENTS = {
    "the running max rescales the sum and the accumulator": mutate(REF, "acc = acc * alpha[:, None] + pv",
                                                                   "acc = acc + pv"),
    "exp2 with log2(e) folded into the scale": mutate(REF, "p = tl.exp2(s - m_new[:, None])",
                                                      "p = tl.exp(s - m_new[:, None])").replace(
        "alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp(m_i - m_new)"),
    "masked loads": mutate(REF, V_LOAD, "v = tl.load(v_ptrs)"),
    "masked stores": mutate(REF, "tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=rows[:, None] < n)",
                            "tl.store(o_ptrs, acc.to(O.dtype.element_ty))"),
    "keys past m are not attended": mutate(REF, "visible = keys[None, :] < m\n",
                                           "visible = keys[None, :] < m + BLOCK_N\n"),
    "causal: query i sees keys j <= i": mutate(REF, "keys[None, :] <= rows[:, None]", "keys[None, :] < rows[:, None]"),
    "the log-sum-exp is a natural log": mutate(REF, "lse = (m_i + tl.log2(l_i)) * 0.6931471805599453",
                                               "lse = m_i + tl.log2(l_i)"),
    "no bfloat16 in tl.dot": mutate(REF, 's = tl.dot(q, kT, input_precision="ieee")',
                                    's = tl.dot(q.to(tl.bfloat16), kT.to(tl.bfloat16))'),
    "program ids: query tile, then head": mutate(REF, "start_m = tl.program_id(0)\n    bh = tl.program_id(1)",
                                                 "start_m = tl.program_id(1)\n    bh = tl.program_id(0)"),
    "the wrapper returns (output, lse)": mutate(REF, "    return out, lse\n", "    return out\n"),
    "tile sizes are powers of two of at least 16": mutate(REF, 'raise ValueError(f"{name} must be', 'print(f"{name} must be'),
    "qk_scale = log2(e) / sqrt(d)": mutate(REF, "qk_scale = LOG2_E / math.sqrt(d)", "qk_scale = 1 / math.sqrt(d)"),
    "the grid covers the last partial tile": mutate(REF, "grid = (triton.cdiv(n, block_m), B * H)",
                                                    "grid = (n // block_m, B * H)"),
    "causal is passed to the kernel": mutate(REF, "qk_scale,\n                               causal,",
                                             "qk_scale,\n                               False,"),
    "q, k, v made contiguous": mutate(REF, "q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n", ""),
}


@pytest.mark.parametrize("name", list(STATED_REQUIREMENTS))
def test_each_stated_requirement_broken_alone_is_named(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


# -- mistakes that are not requirements of their own, named all the same ---------------------------------------------

@pytest.mark.parametrize("old, new, gid, words", [
    ("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)", "test_kernel_tiles", "running sum"),
    ("        if CAUSAL:\n            visible = visible & (keys[None, :] <= rows[:, None])\n", "",
     "test_kernel_causal", "diagonal tile"),
    ("lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = m_i * 0.6931471805599453", "test_kernel_lse",
     "running max alone"),
    ("tl.store(LSE + bh * n + rows, lse, mask=rows < n)", "tl.store(LSE + bh * n + rows, lse)", "test_kernel_ragged",
     "tl.store without a mask"),
], ids=["sum-not-rescaled", "causal-by-tiles-only", "lse-is-the-max", "lse-store-unmasked"])
def test_kernel_mistake_named(old, new, gid, words):
    message = run_checks(A, mutate(REF, old, new), [gid])[gid]
    assert words in message.lower(), message


def test_a_wrong_kernel_costs_no_wrapper_check():
    """The wrapper is judged against the student's own kernel: a kernel mistake costs kernel checks only."""
    wrong_kernel = REQUIREMENTS["the running max rescales the sum and the accumulator"]
    results = run_checks(A, wrong_kernel, ["test_wrapper_launch", "test_wrapper_strides", "test_wrapper_shapes"])
    assert results == {gid: "" for gid in results}, results


def test_delegating_the_wrapper_earns_nothing_for_it():
    code = REF + ("\nimport torch.nn.functional as F\ndef flash_attention_forward(q, k, v, causal=False, block_m=64, "
                  "block_n=64):\n    return F.scaled_dot_product_attention(q, k, v, is_causal=causal), None\n")
    results = assert_delegation_named(A, code, "flash_attention_forward")
    assert all(results[gid] == "" for gid in KERNEL_CHECKS), results


def test_torch_matmul_in_the_wrapper_earns_nothing():
    """Attention computed with torch's products instead of the kernel: the wrapper's part earns nothing."""
    code = REF + ('\ndef flash_attention_forward(q, k, v, causal=False, block_m=64, block_n=64):\n'
                  '    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])\n'
                  '    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)\n')
    assert_delegation_named(A, code, "flash_attention_forward")


# -- questions --------------------------------------------------------------------------------------------------------

def test_question_answers_pass():
    assert_questions_pass(A, QUESTIONS)


@pytest.mark.parametrize("gid, value, words", [
    ("test_q_programs", 224, "partial tile"),
    ("test_q_state_floats", 128 + 128 + 128 * 128, "state alone"),
    ("test_q_state_floats", 2 * 128 + 2 * 128 * 128, "tile of scores"),
    ("test_q_state_floats", 2 * 128 + 128 * 128 + 128 * 64, "query tile"),
    ("test_q_qk_scale", 0.125, "log2(e)"),
    ("test_q_alpha", 0.1353352832366127, "base-2"),
    ("test_q_tile_bytes", 16384, "one tile"),
])
def test_wrong_answer_named(gid, value, words):
    assert_answer_named(A, gid, value, words)


def test_the_released_stubs_are_named_not_implemented():
    """A blank notebook: every code check says 'not implemented yet', the kernel's too (the interpreter wraps
    what a kernel raises in its own error)."""
    import json

    from autograder.course import RELEASE
    from checking import namespace

    cells = json.loads((RELEASE / A / "flash_triton.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"
                     and not c["metadata"]["nbgrader"].get("grade") and not c["metadata"]["nbgrader"]["grade_id"]
                     .startswith("q_") and c["metadata"]["nbgrader"]["grade_id"] != "install")  # (the grader's plan too)
    assert "raise NotImplementedError" in code and callable(namespace(code)["flash_attention_forward"])
    gids = [*KERNEL_CHECKS, "test_wrapper_shapes", "test_wrapper_blocks"]
    results = run_checks(A, code, gids)
    assert all(msg.startswith("not implemented yet") for msg in results.values()), results


# -- matrix products as a class of operators (the run-time rule of both parts' process) -------------------------------

# Operators whose names look like a product's and are not one: a reduction of one tensor, elementwise arithmetic, a
# resampling, a conversion or packing of indices, a loss. Any other operator whose name looks like a product must be
# in the class: a product torch adds later is refused, or this test says which one to sort.
LOOKS_LIKE_A_PRODUCT = re.compile(r"mm|mv|dot|matmul|linear|einsum|tensordot|kron|outer|inner|ger|conv|dist|bag|"
                                  r"similar|addr|gemm|product")
NOT_A_PRODUCT = re.compile(r"^(_foreach_)?(cummax|cummin|_cummax_helper|_cummin_helper|cummaxmin_backward|lgamma|"
                           r"mvlgamma|digamma|polygamma|special_\w*gamma\w*|igammac?|_standard_gamma(_grad)?|"
                           r"_convert_\w+|upsample_\w+|_upsample_\w+|dist|pairwise_distance|is_distributed|"
                           r"_nested_get_jagged_dummy|hamming_window|multinomial|multi_margin_loss\w*|"
                           r"multilabel_margin_loss\w*|_test_\w+|linalg_householder_product|addcmul_?|"
                           r"_unsafe_masked_index_put_accumulate|fbgemm_pack_quantized_matrix)_?$")


def test_every_operator_that_looks_like_a_product_is_sorted():
    import torch

    from autograder.in_sandbox import torch_names

    bases = sorted({op[len("aten::"):].split(".")[0] for op in torch._C._dispatch_get_all_op_names()
                    if op.startswith("aten::")})
    unsorted = [b for b in bases if LOOKS_LIKE_A_PRODUCT.search(b) and not torch_names.op_class(b)
                and not torch_names.is_torch_attention(b) and not NOT_A_PRODUCT.match(b)]
    assert not unsorted, f"sort these into torch_names.CONTRACTION_TOKENS or NOT_A_PRODUCT: {unsorted}"
    wrongly = [b for b in bases if torch_names.op_class(b) and NOT_A_PRODUCT.match(b)]
    assert not wrongly, wrongly
    for product in ("mm", "_int_mm", "_scaled_mm", "_grouped_mm", "addmm", "baddbmm", "mv", "dot", "vdot", "inner",
                    "outer", "matmul", "linear", "bilinear", "_trilinear", "einsum", "tensordot", "kron",
                    "linalg_multi_dot", "linalg_vecdot", "conv1d", "convolution", "cdist", "embedding_bag"):
        assert torch_names.op_class(product) == "contraction", product


def test_an_unknown_class_of_operators_is_an_error():
    from autograder.in_sandbox.torch_names import runtime_fragments

    assert "class:contraction" in runtime_fragments(["class:contraction", "softmax"])
    with pytest.raises(ValueError, match="unknown class of operators 'class:products'.*class:contraction"):
        runtime_fragments(["class:products"])


# -- the visible tests teach what the grade checks (issue 35) ----------------------------------------------------------

def _visible(code: str, gids: list[str]) -> dict[str, str]:
    """grade_id -> '' when the released notebook's visible test passes on ``code`` (run as a notebook would: setup
    and answers, then the test cell), else the message it raised."""
    import json

    from autograder.course import RELEASE
    from checking import namespace

    cells = {c["metadata"]["nbgrader"].get("grade_id"): "".join(c["source"])
             for c in json.loads((RELEASE / A / "flash_triton.ipynb").read_text())["cells"]}
    ns = namespace(code)
    out = {}
    for gid in gids:
        try:
            exec(compile(cells[gid], f"<{gid}>", "exec"), ns)
            out[gid] = ""
        except AssertionError as e:
            out[gid] = str(e)
    return out


VISIBLE = ["test_kernel_tiles", "test_kernel_ragged", "test_kernel_causal", "test_kernel_lse", "test_wrapper_shapes",
           "test_wrapper_launch", "test_wrapper_strides", "test_wrapper_blocks"]


@pytest.mark.parametrize("code", [REF, TWO_STAGE, BROADCAST], ids=["reference", "two-stage", "broadcast"])
def test_the_visible_tests_pass_correct_answers(code):
    assert _visible(code, VISIBLE) == {gid: "" for gid in VISIBLE}


@pytest.mark.parametrize("old, new, gid, words", [
    ("keys[None, :] <= rows[:, None]", "keys[None, :] < rows[:, None]", "test_kernel_causal", "causal mask is strict"),
    ("acc = acc * alpha[:, None] + pv", "acc = acc + pv", "test_kernel_tiles", "does not rescale the accumulator"),
    ("lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = m_i + tl.log2(l_i)", "test_kernel_lse",
     "base-2 log-sum-exp"),
    ("alpha = tl.exp2(m_i - m_new)\n        p = tl.exp2(s - m_new[:, None])",
     "alpha = tl.exp(m_i - m_new)\n        p = tl.exp(s - m_new[:, None])", "test_kernel_tiles", "use tl.exp2"),
    ("grid = (triton.cdiv(n, block_m), B * H)", "grid = (n // block_m, B * H)", "test_wrapper_launch",
     "not n // block_m"),
    ("q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n", "", "test_wrapper_strides", "call .contiguous()"),
    ("tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=rows[:, None] < n)", "tl.store(o_ptrs, acc.to(O.dtype.element_ty))",
     "test_kernel_ragged", "tl.store without a mask"),
    ("tl.store(LSE + bh * n + rows, lse, mask=rows < n)", "tl.store(LSE + bh * n + rows, lse)", "test_kernel_ragged",
     "tl.store without a mask"),
    (V_LOAD, "v = tl.load(v_ptrs)", "test_kernel_ragged", "tl.load without a mask"),
    ("qk_scale = LOG2_E / math.sqrt(d)", "qk_scale = 1 / math.sqrt(d)", "test_wrapper_launch", "lacks log2(e)"),
], ids=["strict-mask", "no-rescale", "base-2-lse", "exp-with-base-2-scale", "n//block_m", "no-contiguous",
        "unmasked-o-store", "unmasked-lse-store", "unmasked-v-load", "scale-without-log2e"])
def test_the_visible_tests_name_the_graders_mistakes(old, new, gid, words):
    """Each classic mistake fails its visible test with the grader's own message (not assert_close's "Tensor-likes
    are not close! ... nan at index"), and the grader's check says the same."""
    code = mutate(REF, old, new)
    message = _visible(code, [gid])[gid]
    assert words in message and "Tensor-likes" not in message, message
    assert words in run_checks(A, code, [gid])[gid], run_checks(A, code, [gid])
