"""attnkit.attention (chapter 01) against torch's own primitives and the properties the math promises."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import ShapeError, fused_attention, scaled_dot_product_attention, softmax

PATHS = pytest.mark.parametrize("attend", [scaled_dot_product_attention, fused_attention], ids=["explicit", "fast"])

DTYPES = [torch.float32, torch.float64]
SHAPES = [  # (leading dims, n, m, d_k, d_v)
    ((), 3, 5, 4, 6),
    ((2,), 4, 4, 8, 8),
    ((2, 3), 5, 2, 3, 7),
    ((1, 2, 2), 1, 6, 5, 1),
]


def tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-10}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_matches_torch(dtype, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g, dtype=dtype) * 4
    torch.testing.assert_close(softmax(x, dim), torch.softmax(x, dim), **tol(dtype))


def test_softmax_stable_for_large_scores_and_zero_for_all_masked():
    x = torch.tensor([[1e4, 1e4 - 1, -1e4], [-float("inf")] * 3])
    y = softmax(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[0], torch.softmax(x[0], 0))
    assert torch.equal(y[1], torch.zeros(3))


def test_softmax_rejects_integer_input():
    with pytest.raises(TypeError, match="floating-point"):
        softmax(torch.arange(3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead, n, m, dk, dv", SHAPES)
def test_attention_matches_torch(lead, n, m, dk, dv, dtype):
    g = torch.Generator().manual_seed(n * 31 + m)
    q = torch.randn(*lead, n, dk, generator=g, dtype=dtype)
    k = torch.randn(*lead, m, dk, generator=g, dtype=dtype)
    v = torch.randn(*lead, m, dv, generator=g, dtype=dtype)
    mask = torch.rand(n, m, generator=g) < 0.7
    mask[:, 0] = True
    for msk in (None, mask):
        out, w = scaled_dot_product_attention(q, k, v, msk)
        assert out.shape == (*lead, n, dv) and w.shape == (*lead, n, m)
        assert out.dtype == dtype and w.dtype == dtype
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=msk), **tol(dtype))
        expected_w = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(dk)).masked_fill(
            msk.logical_not() if msk is not None else torch.zeros(n, m, dtype=torch.bool), float("-inf")), -1)
        torch.testing.assert_close(w, expected_w, **tol(dtype))


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.equal(out[0, 2], torch.zeros(2)) and torch.equal(w[0, 2], torch.zeros(5))


@pytest.mark.parametrize("args, match", [
    (((2, 3, 4), (2, 5, 3), (2, 5, 6)), r"share their last dimension d_k: query \(2, 3, 4\), key \(2, 5, 3\)"),
    (((2, 3, 4), (2, 5, 4), (2, 6, 6)), r"same number of positions m: key \(2, 5, 4\), value \(2, 6, 6\)"),
    (((2, 3, 4), (3, 5, 4), (3, 5, 6)), r"batch dimensions do not broadcast"),
    (((4,), (5, 4), (5, 6)), r"query must have shape \(..., seq, dim\), got \(4,\)"),
])
@PATHS
def test_shape_errors_name_the_shapes(args, match, attend):
    with pytest.raises(ShapeError, match=match):  # a ValueError, one type for every bad shape
        attend(*(torch.randn(*s) for s in args))


@PATHS
def test_mask_errors_name_what_was_expected(attend):
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="bool tensor"):
        attend(q, q, q, torch.ones(3, 3))
    with pytest.raises(ShapeError, match=r"mask of shape \(4, 3\) does not broadcast"):
        attend(q, q, q, torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ShapeError, match=r"mask of shape \(5, 2, 3, 3\) does not broadcast.* \(2, 3, 3\)"):
        # a mask may not enlarge the batch: (5, 2, 3, 3) would turn 2 outputs into 10
        attend(q, q, q, torch.ones(5, 2, 3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="one dtype"):
        attend(q, q.double(), q)
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        attend([[1.0]], q, q)
    with pytest.raises(TypeError, match="floating point, got dtype torch.int64"):
        attend(q, q, q.long())


@PATHS
def test_no_keys_gives_zero_rows(attend):
    """m = 0: every query has no key to attend to, so its row is zero (the all-masked rule), not an error."""
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5)
    out, w = attend(q, k, v)
    assert torch.equal(out, torch.zeros(2, 3, 5))
    assert (w is None) if attend is fused_attention else w.shape == (2, 3, 0)
    assert softmax(torch.randn(3, 0)).shape == (3, 0)
    with pytest.raises(ValueError, match="d_k"):  # torch skips its checks on empty keys; ours do not
        attend(q, torch.randn(2, 0, 7), v)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 6), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_properties_rows_convex_and_permutations(n, m, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(m, d, generator=g, dtype=torch.float64),
               torch.randn(m, 3, generator=g, dtype=torch.float64))
    out, w = scaled_dot_product_attention(q, k, v)
    # weights: a probability distribution over the keys for every query
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(n, dtype=torch.float64))
    # each output row lies within the range of the value rows (convex combination)
    assert (out <= v.max(0).values + 1e-9).all() and (out >= v.min(0).values - 1e-9).all()
    # permuting the queries permutes the outputs; reordering key-value pairs changes nothing
    pq, pk = torch.randperm(n, generator=g), torch.randperm(m, generator=g)
    out_q, _ = scaled_dot_product_attention(q[pq], k, v)
    out_k, _ = scaled_dot_product_attention(q, k[pk], v[pk])
    torch.testing.assert_close(out_q, out[pq])
    torch.testing.assert_close(out_k, out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_attention_on_gpu_matches_cpu():
    q = torch.randn(2, 3, 8, 16)
    mask = torch.rand(8, 8) < 0.8
    mask[:, 0] = True
    out, w = scaled_dot_product_attention(q.cuda(), q.cuda(), q.cuda(), mask.cuda())
    assert out.device.type == "cuda"
    ref_out, ref_w = scaled_dot_product_attention(q, q, q, mask)
    torch.testing.assert_close(out.cpu(), ref_out, atol=1e-4, rtol=1e-4)


def test_package_exports_and_documents_every_public_name():
    """Every public function and class of the package's modules is in ``attnkit.__all__`` and named in the
    package docstring's map (issue 11: a newcomer finds where a concept lives in one hop)."""
    import importlib

    import attnkit
    modules = ["validation", "device", "attention", "multihead", "self_attention", "masks", "cross_attention",
               "positional", "transformer", "efficient", "text", "gpt", "ngram", "probes", "induction",
               "torch_twins"]
    for name in modules:
        module = importlib.import_module(f"attnkit.{name}")
        assert f"``{name}``" in attnkit.__doc__, f"module {name} missing from the package map"
        public = [n for n, obj in vars(module).items() if not n.startswith("_") and callable(obj)
                  and getattr(obj, "__module__", None) == module.__name__]
        for n in public:
            assert n in attnkit.__all__ and f"``{n}``" in attnkit.__doc__, f"attnkit.{name}.{n} is not exported/mapped"
    assert all(hasattr(attnkit, n) for n in attnkit.__all__)
