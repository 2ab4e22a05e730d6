"""attnkit.masks against torch's own causal attention and the promises of masking (chapter 04)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import SelfAttention, causal_mask, padding_mask, scaled_dot_product_attention, sliding_window_mask

DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 9])
def test_causal_mask_is_lower_triangle_with_diagonal(n):
    mask = causal_mask(n)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    assert torch.equal(mask, torch.ones(n, n).tril().bool())
    assert bool(mask.diagonal().all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d", [(1, 4), (5, 3), (8, 8)])
def test_causal_mask_matches_torch_is_causal(n, d, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, d, dtype=dtype) for _ in range(3))
    out, w = scaled_dot_product_attention(q, k, v, causal_mask(n))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert bool((w.triu(1) == 0).all())


@pytest.mark.parametrize("lengths, max_len", [([3, 1, 4], 4), ([0, 2], 3), ([5], 5), ([], 2)])
def test_padding_mask_marks_real_tokens(lengths, max_len):
    mask = padding_mask(torch.tensor(lengths, dtype=torch.long), max_len)
    assert mask.dtype == torch.bool and mask.shape == (len(lengths), 1, max_len)
    for b, length in enumerate(lengths):
        assert mask[b, 0].tolist() == [True] * length + [False] * (max_len - length)
    assert torch.equal(mask, padding_mask(lengths, max_len))  # a plain list works too


def test_padding_mask_errors_are_clear():
    with pytest.raises(ValueError, match="max_len=3"):
        padding_mask(torch.tensor([4]), 3)
    with pytest.raises(ValueError, match="1-D integer"):
        padding_mask(torch.tensor([1.5]), 3)
    with pytest.raises(ValueError, match="n >= 0"):
        causal_mask(-1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_combined_mask_matches_torch_and_keeps_rows_finite(dtype):
    torch.manual_seed(1)
    lengths, n, d = torch.tensor([4, 2, 0]), 4, 6
    mask = causal_mask(n) & padding_mask(lengths, n)  # (B, n, n)
    assert mask.shape == (3, n, n)
    for b, length in enumerate(lengths.tolist()):
        expected = torch.ones(n, n).tril().bool() & (torch.arange(n) < length)
        assert torch.equal(mask[b], expected)
    q, k, v = (torch.randn(3, n, d, dtype=dtype) for _ in range(3))
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert bool((w[2] == 0).all()) and bool((out[2] == 0).all())  # length 0: every row fully masked -> zeros
    ref = F.scaled_dot_product_attention(q[:2], k[:2], v[:2], attn_mask=mask[:2])
    torch.testing.assert_close(out[:2], ref)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(n=st.integers(2, 7), i=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_causal_self_attention_ignores_the_future(n, i, seed):
    """Changing inputs after position i leaves outputs 0..i unchanged, and their gradient there is zero."""
    i = i % (n - 1)
    torch.manual_seed(seed)
    layer = SelfAttention(8, 2).double()
    x = torch.randn(1, n, 8, dtype=torch.float64, requires_grad=True)
    mask = causal_mask(n)
    out, _ = layer(x, mask)
    x2 = x.detach().clone()
    x2[:, i + 1:] += torch.randn_like(x2[:, i + 1:])
    out2, _ = layer(x2, mask)
    torch.testing.assert_close(out2[:, : i + 1], out[:, : i + 1].detach())
    assert not torch.allclose(out2[:, i + 1:], out[:, i + 1:].detach())
    (grad,) = torch.autograd.grad(out[0, i].sum(), x)
    assert bool((grad[0, i + 1:] == 0).all()) and bool(grad[0, : i + 1].abs().sum() > 0)


def test_causal_mask_on_device_argument():
    assert causal_mask(3, device="meta").device.type == "meta"  # a device other than the default, no GPU needed
    if torch.cuda.is_available():
        assert causal_mask(3, device="cuda").device.type == "cuda"
        assert padding_mask(torch.tensor([1, 2], device="cuda"), 3).device.type == "cuda"


@pytest.mark.parametrize("n, window", [(1, 1), (6, 1), (6, 2), (7, 3), (5, 5), (4, 9)])
def test_sliding_window_mask_is_the_band_and_combines_with_causal(n, window):
    mask = sliding_window_mask(n, window)
    assert mask.shape == (n, n) and mask.dtype == torch.bool
    for i in range(n):
        for j in range(n):
            assert bool(mask[i, j]) == (abs(i - j) < window)
    local = causal_mask(n) & sliding_window_mask(n, window)
    for i in range(n):  # query i sees keys i - window + 1 .. i
        assert local[i].nonzero().flatten().tolist() == list(range(max(0, i - window + 1), i + 1))
    if window >= n:
        assert bool(mask.all())


def test_sliding_window_attention_ignores_keys_outside_the_window():
    """Changing a key farther than the window leaves the query's output unchanged; a key inside changes it."""
    g = torch.Generator().manual_seed(0)
    n, w = 8, 3
    q, k, v = (torch.randn(1, n, 4, generator=g) for _ in range(3))
    mask = causal_mask(n) & sliding_window_mask(n, w)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, 2], v2[:, 2] = torch.randn(4, generator=g), torch.randn(4, generator=g)  # key 2: outside query 7's window
    out2, _ = scaled_dot_product_attention(q, k2, v2, mask)
    torch.testing.assert_close(out2[:, 5:], out[:, 5:])  # queries 5.. see keys 3.. only
    assert not torch.allclose(out2[:, 2:5], out[:, 2:5])
    assert int((weights[0] > 0).sum(-1).max()) == w


@pytest.mark.parametrize("n, window", [(-1, 2), (3, 0), (3, 1.5), (True, 2)])
def test_sliding_window_mask_refuses_bad_arguments(n, window):
    with pytest.raises(ValueError, match="sliding_window_mask"):
        sliding_window_mask(n, window)
