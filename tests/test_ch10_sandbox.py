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
    # the wrapper's launch runs the object's torch.mm, a matrix product the chapter's process refuses
    expect(results, **{g: "not a Triton kernel" for g in KERNEL_CHECKS}, **{g: "matrix product" for g in WRAPPER_CHECKS})
    assert points == 5  # the questions


def test_a_jit_function_calling_a_python_helper_does_not_compile(tmp_path):
    results, _, _ = grade(tmp_path, flash_forward_kernel=PYTHON_HELPER)
    expect(results, **{g: "does not compile for a gpu" for g in KERNEL_CHECKS})
    assert "_end" in results["test_kernel_tiles"], results["test_kernel_tiles"]  # the compiler's own message


@pytest.mark.parametrize("wrapper, words", [(MM_PER_HEAD, "outside its vocabulary"),
                                            (ELEMENTWISE_PER_HEAD, "never launched")], ids=["torch.mm", "elementwise"])
def test_a_wrapper_that_never_launches_earns_nothing(tmp_path, wrapper, words):
    """torch.mm is outside the wrapper's vocabulary (it earns nothing before it runs); elementwise products are
    inside, and a wrapper that never launches its kernel earns no launch point."""
    results, _, _ = grade(tmp_path, flash_attention_forward=wrapper)
    expect(results, **{g: words for g in NEVER_LAUNCHES})


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


# -- matrix products, refused as a class in the chapter's process ------------------------------------------------------

# Every public route to a matrix product in torch (the class is what the operators compute, not these names): each
# is tried in a cell; the cell prints which ran, which the grader refused, which failed otherwise.
PRODUCTS = r'''
import torch, torch.nn as nn, torch.nn.functional as F
a, b, v, w = torch.randn(3, 4), torch.randn(4, 5), torch.randn(4), torch.randn(4)
sq, x = torch.randn(4, 4), torch.randn(1, 2, 8)
def in_place():
    c = a.clone()
    c @= sq
routes = {
    "torch.mm": lambda: torch.mm(a, b), "Tensor.mm": lambda: a.mm(b), "torch.matmul": lambda: torch.matmul(a, b),
    "Tensor.matmul": lambda: a.matmul(b), "a @ b": lambda: a @ b, "Tensor.__rmatmul__": lambda: b.__rmatmul__(a),
    "a @= b": in_place, "torch.bmm": lambda: torch.bmm(a[None], b[None]),
    "torch.baddbmm": lambda: torch.baddbmm(torch.zeros(1, 3, 5), a[None], b[None]),
    "torch.addbmm": lambda: torch.addbmm(torch.zeros(3, 5), a[None], b[None]),
    "torch.addmm": lambda: torch.addmm(torch.zeros(3, 5), a, b),
    "torch.addmv": lambda: torch.addmv(torch.zeros(3), a, v), "torch.mv": lambda: torch.mv(a, v),
    "torch.dot": lambda: torch.dot(v, w), "Tensor.dot": lambda: v.dot(w), "torch.vdot": lambda: torch.vdot(v, w),
    "torch.inner": lambda: torch.inner(a, a), "torch.outer": lambda: torch.outer(v, w),
    "torch.ger": lambda: torch.ger(v, w), "torch.addr": lambda: torch.addr(sq, v, w),
    "torch.einsum": lambda: torch.einsum("ij,jk->ik", a, b), "torch.einsum (vectors)": lambda: torch.einsum("i,i->", v, w),
    "torch.tensordot": lambda: torch.tensordot(a, b, dims=1), "torch.kron": lambda: torch.kron(v, w),
    "torch.chain_matmul": lambda: torch.chain_matmul(a, b),
    "torch.linalg.multi_dot": lambda: torch.linalg.multi_dot([a, b]), "torch.linalg.matmul": lambda: torch.linalg.matmul(a, b),
    "torch.linalg.vecdot": lambda: torch.linalg.vecdot(v, w), "torch.linalg.matrix_power": lambda: torch.linalg.matrix_power(sq, 2),
    "torch.matrix_exp": lambda: torch.matrix_exp(sq), "torch.cov": lambda: torch.cov(a), "torch.corrcoef": lambda: torch.corrcoef(a),
    "F.linear": lambda: F.linear(a, b.T), "nn.Linear": lambda: nn.Linear(4, 5)(a),
    "F.bilinear": lambda: F.bilinear(a, a, torch.randn(2, 4, 4)), "nn.Bilinear": lambda: nn.Bilinear(4, 4, 2)(a, a),
    "F.conv1d": lambda: F.conv1d(x, torch.randn(1, 2, 3)), "F.conv2d": lambda: F.conv2d(x[None], torch.randn(1, 1, 2, 3)),
    "F.conv3d": lambda: F.conv3d(x[None, None], torch.randn(1, 1, 1, 2, 3)),
    "F.conv_transpose1d": lambda: F.conv_transpose1d(x, torch.randn(2, 1, 3)), "nn.Conv1d": lambda: nn.Conv1d(2, 1, 3)(x),
    "torch.cdist": lambda: torch.cdist(a, a),
    "torch.cdist (no mm)": lambda: torch.cdist(a, a, compute_mode="donot_use_mm_for_euclid_dist"),
    "F.pdist": lambda: F.pdist(a), "F.cosine_similarity": lambda: F.cosine_similarity(a[:, None], a[None], dim=-1),
    "F.embedding_bag (weighted)": lambda: F.embedding_bag(torch.tensor([[0, 1, 2]]), sq, mode="sum",
                                                          per_sample_weights=torch.rand(1, 3)),
    "nn.EmbeddingBag": lambda: nn.EmbeddingBag(4, 4, mode="sum")(torch.tensor([[0, 1]]), per_sample_weights=torch.rand(1, 2)),
}
refused, failed, ran = [], [], []
for name, f in routes.items():
    try:
        f()
        ran.append(name)
    except Exception as e:
        (refused if "matrix product" in str(e) and "refused by the grader" in str(e) else failed).append(
            f"{name}: {type(e).__name__}: {str(e)[:200]}")
print(repr((len(routes), ran, refused, failed)))
'''


def test_every_public_matrix_product_is_refused_in_the_chapters_process():
    """Issue 35: the kernel's and the wrapper's process (one process: the same bans) refuses matrix products as a
    class at run time, however reached (the static rule names only some); a process without the class runs every
    route (so each route is a real product, not an error)."""
    import ast

    from autograder.isolation.sandbox import Sandbox
    from autograder.judging.checks import load_suite

    suite = load_suite(A)
    bans = suite.bans(["flash_forward_kernel"])
    assert bans == suite.bans(["flash_attention_forward"]) and "class:contraction" in bans, bans
    for banned in (bans, ()):
        with Sandbox(bans=banned) as box:
            reply = box.request({"op": "exec", "code": PRODUCTS, "label": "<products>"}, timeout=60)
        assert reply["ok"], reply
        count, ran, refused, failed = ast.literal_eval(reply["output"].strip().splitlines()[-1])
        assert not failed, failed
        if banned:
            assert not ran and len(refused) == count, ran
        else:
            assert len(ran) == count, (ran, refused)


# A wrapper that launches its kernel as stated, and also reaches a matrix product the static rule does not name
# (F.conv1d, nn.Linear, torch.linalg.vecdot): the exercise says the wrapper computes no product.
PRODUCT_ON_THE_SIDE = {
    "F.conv1d": "torch.nn.functional.conv1d(q.reshape(1, -1, d), torch.ones(1, q.reshape(1, -1, d).shape[1], 1))",
    "nn.Linear": "torch.nn.Linear(d, 1)(q)",
    "torch.linalg.vecdot": "torch.linalg.vecdot(q, q)",
}


@pytest.mark.parametrize("route", list(PRODUCT_ON_THE_SIDE))
def test_a_wrapper_that_reaches_a_matrix_product_loses_its_points(tmp_path, route):
    wrapper = mutate(WRAPPER, "    grid = (triton.cdiv(n, block_m), B * H)\n",
                     f"    check = {PRODUCT_ON_THE_SIDE[route]}  # a product on the side\n"
                     "    grid = (triton.cdiv(n, block_m), B * H)\n")
    results, _, _ = grade(tmp_path, flash_attention_forward=wrapper)
    expect(results, **{g: "matrix product" for g in WRAPPER_CHECKS})
