"""attnkit.positional (chapter 06) against closed forms and the properties the math promises."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from functools import partial

from attnkit import (
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    alibi_attention,
    alibi_bias,
    alibi_slopes,
    causal_mask,
    scaled_dot_product_attention,
    SinusoidalPositionalEncoding,
    SelfAttention,
    apply_rotary_embedding,
    position_shift_matrix,
    sinusoidal_positional_encoding,
)

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d", [(1, 2), (7, 4), (50, 16), (128, 64)])
def test_sinusoidal_matches_the_formula_entry_by_entry(n, d, dtype):
    P = sinusoidal_positional_encoding(n, d, dtype=dtype)
    assert P.shape == (n, d) and P.dtype == dtype
    expected = torch.empty(n, d, dtype=torch.float64)
    for i in range(n):
        for j in range(d // 2):
            w = 10000.0 ** (-2 * j / d)
            expected[i, 2 * j], expected[i, 2 * j + 1] = math.sin(i * w), math.cos(i * w)
    torch.testing.assert_close(P.double(), expected, atol=TOL[dtype], rtol=0)


def test_sinusoidal_first_rows_and_range():
    P = sinusoidal_positional_encoding(100, 8)
    torch.testing.assert_close(P[0], torch.tensor([0.0, 1.0] * 4))  # sin 0, cos 0
    assert P[:, 0].max() <= 1 and P.min() >= -1
    torch.testing.assert_close(P[:, 0::2] ** 2 + P[:, 1::2] ** 2, torch.ones(100, 4))  # each pair on the unit circle


@pytest.mark.parametrize("bad", [1, 3, 7, 0, -2])
def test_odd_or_empty_dim_raises_a_clear_error(bad):
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positional_encoding(4, bad)
    with pytest.raises(ValueError, match="even"):
        position_shift_matrix(1, bad)


def test_device_and_dtype_follow_the_arguments():
    P = sinusoidal_positional_encoding(3, 4, device="meta", dtype=torch.float64)  # not the default device
    assert P.device.type == "meta" and P.dtype == torch.float64 and P.shape == (3, 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("delta", [0, 1, 5, -3, 40])
def test_shift_matrix_maps_every_position_forward_by_delta(delta, dtype):
    n, d = 64, 32
    P = sinusoidal_positional_encoding(n + 50, d, dtype=dtype)
    M = position_shift_matrix(delta, d, dtype=dtype)
    assert M.shape == (d, d) and M.dtype == dtype
    i = torch.arange(max(0, -delta), n)
    torch.testing.assert_close(P[i] @ M, P[i + delta], atol=10 * TOL[dtype], rtol=0)


def test_shift_matrix_is_a_block_diagonal_rotation():
    d = 12
    M = position_shift_matrix(3, d, dtype=torch.float64)
    torch.testing.assert_close(M @ M.T, torch.eye(d, dtype=torch.float64))  # orthogonal
    block = torch.block_diag(*[torch.ones(2, 2)] * (d // 2)).bool()
    assert (M[~block] == 0).all()  # zero outside the 2x2 blocks
    torch.testing.assert_close(M.T, position_shift_matrix(-3, d, dtype=torch.float64))  # the inverse shifts back
    torch.testing.assert_close(position_shift_matrix(0, d), torch.eye(d))


@settings(max_examples=40, deadline=None)
@given(delta=st.integers(-200, 200), i=st.integers(0, 300), half=st.integers(1, 32))
def test_shift_property_hypothesis(delta, i, half):
    """P[i + delta] = P[i] @ M(delta) for every position, offset and width (a continuous formula: i + delta may be < 0)."""
    d = 2 * half
    P = sinusoidal_positional_encoding(max(i, i + delta) + 1, d, dtype=torch.float64)
    M = position_shift_matrix(delta, d, dtype=torch.float64)
    row = P[i] @ M
    if i + delta >= 0:
        torch.testing.assert_close(row, P[i + delta], atol=1e-9, rtol=0)
    # composition: shifting by delta then by -delta returns to P[i]
    torch.testing.assert_close(row @ position_shift_matrix(-delta, d, dtype=torch.float64), P[i], atol=1e-9, rtol=0)


def test_self_attention_is_blind_to_order_until_positions_are_added():
    torch.manual_seed(0)
    attn = SelfAttention(16, 2)
    x = torch.randn(1, 6, 16)
    perm = torch.randperm(6)
    out, _ = attn(x)
    out_perm, _ = attn(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)  # equivariant: order invisible
    pe = SinusoidalPositionalEncoding(32, 16)
    out, _ = attn(pe(x))
    out_perm, _ = attn(pe(x[:, perm]))
    assert not torch.allclose(out_perm, out[:, perm], atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sinusoidal_module_adds_the_table_and_keeps_no_state(dtype):
    pe = SinusoidalPositionalEncoding(20, 8).to(dtype)
    x = torch.randn(3, 5, 8, dtype=dtype)
    torch.testing.assert_close(pe(x), x + sinusoidal_positional_encoding(5, 8, dtype=dtype))
    assert pe.state_dict() == {} and pe(x).dtype == dtype
    with pytest.raises(ValueError, match="max_len=20"):
        pe(torch.randn(1, 21, 8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 6), (7, 6), (2, 3, 4, 6)])
def test_learned_embedding_adds_one_row_per_position(shape, dtype):
    torch.manual_seed(1)
    emb = LearnedPositionalEmbedding(10, 6).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    n = shape[-2]
    torch.testing.assert_close(emb(x), x + emb.embedding.weight[:n])
    assert emb(x).dtype == dtype


def test_learned_embedding_is_trained_and_refuses_longer_inputs():
    emb = LearnedPositionalEmbedding(4, 3)
    assert [name for name, _ in emb.named_parameters()] == ["embedding.weight"]
    emb(torch.zeros(2, 3, 3)).sum().backward()
    torch.testing.assert_close(emb.embedding.weight.grad, torch.tensor([[2.0] * 3] * 3 + [[0.0] * 3]))
    with pytest.raises(ValueError, match="max_len=4"):
        emb(torch.zeros(1, 5, 3))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, 3\)"):
        emb(torch.zeros(1, 2, 4))


def test_rope_matches_complex_multiplication():
    """Pair (x0, x1) as the complex number x0 + i x1, RoPE multiplies it by exp(i p w_j)."""
    torch.manual_seed(2)
    x = torch.randn(2, 7, 10, dtype=torch.float64)
    pos = torch.arange(7, dtype=torch.float64)
    w = 10000.0 ** (-torch.arange(0, 10, 2, dtype=torch.float64) / 10)
    z = torch.view_as_complex(x.reshape(2, 7, 5, 2).contiguous()) * torch.polar(torch.ones(7, 5, dtype=torch.float64),
                                                                                pos[:, None] * w)
    torch.testing.assert_close(apply_rotary_embedding(x), torch.view_as_real(z).reshape(2, 7, 10))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_keeps_norms_and_position_zero(dtype):
    x = torch.randn(3, 9, 8, dtype=dtype)
    r = apply_rotary_embedding(x)
    assert r.dtype == dtype and r.shape == x.shape
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(r[:, 0], x[:, 0])


@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 500), r=st.integers(0, 500), shift=st.integers(-100, 100), half=st.integers(1, 16),
       seed=st.integers(0, 2**16))
def test_rope_scores_depend_on_relative_position_only(p, r, shift, half, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 2 * half, generator=g, dtype=torch.float64), torch.randn(1, 2 * half, generator=g, dtype=torch.float64)

    def score(pq: int, pk: int) -> torch.Tensor:
        return (apply_rotary_embedding(q, torch.tensor([pq])) * apply_rotary_embedding(k, torch.tensor([pk]))).sum()

    torch.testing.assert_close(score(p, r), score(p + shift, r + shift), atol=1e-9, rtol=1e-9)


def test_rope_rejects_odd_width_and_bad_positions():
    with pytest.raises(ValueError, match="even"):
        apply_rotary_embedding(torch.randn(3, 5))
    with pytest.raises(ValueError, match="positions"):
        apply_rotary_embedding(torch.randn(3, 4), torch.arange(4))


# -- ALiBi (Press et al., 2022) -------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** (-2 * k) for k in range(1, 5)]))
    # not a power of two: the 4-head slopes, then every other one of the 8-head slopes
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8,
                                                              2.0 ** -1, 2.0 ** -3]))
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 6), n=st.integers(1, 7), extra=st.integers(0, 4), shift=st.integers(1, 3))
def test_alibi_bias_depends_only_on_the_distance(H, n, extra, shift):
    m = n + extra
    bias = alibi_bias(alibi_slopes(H, dtype=torch.float64), n, m)  # (H, n, m)
    assert bias.shape == (H, n, m)
    i = torch.arange(m - n, m, dtype=torch.float64)[:, None]  # query positions (the last n)
    j = torch.arange(m, dtype=torch.float64)[None, :]
    torch.testing.assert_close(bias, -alibi_slopes(H, dtype=torch.float64)[:, None, None] * (j - i).abs())
    # shifting queries and keys together changes nothing: a longer sequence holds the same bias, moved
    longer = alibi_bias(alibi_slopes(H, dtype=torch.float64), n, m + shift)  # queries now at the last n of m+shift
    torch.testing.assert_close(longer[..., shift:], bias)
    assert (bias <= 0).all() and (bias[:, torch.arange(n), torch.arange(n) + extra] == 0).all()


def test_alibi_attention_adds_the_bias_and_plugs_into_multihead_attention():
    g = torch.Generator().manual_seed(0)
    B, H, n, d = 2, 4, 5, 3
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    slopes = alibi_slopes(H, dtype=torch.float64)
    mask = causal_mask(n)
    out, w = alibi_attention(q, k, v, mask, slopes=slopes)
    bias = alibi_bias(slopes, n)  # (H, n, n)
    expected = torch.softmax((q @ k.mT / math.sqrt(d) + bias).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, expected @ v)
    # zero slopes: exactly chapter 01's attention
    torch.testing.assert_close(alibi_attention(q, k, v, mask, slopes=torch.zeros(H, dtype=torch.float64))[0],
                               scaled_dot_product_attention(q, k, v, mask)[0])
    # as MultiHeadAttention's attention function: a float bias enters the scores, the return type stays
    mha = MultiHeadAttention(8, 2, attention=partial(alibi_attention, slopes=alibi_slopes(2)))
    x = torch.randn(1, 6, 8)
    out, w = mha(x, x, x, causal_mask(6))
    assert out.shape == (1, 6, 8) and w.shape == (1, 2, 6, 6)
    with pytest.raises(ValueError, match="one slope per head"):
        alibi_attention(q, k, v, slopes=alibi_slopes(3))


def test_alibi_prefers_near_keys_when_the_content_is_equal():
    """With identical keys the scores tie, so ALiBi alone decides: weights fall with distance, faster on steeper heads."""
    H, n = 4, 6
    q, k, v = torch.ones(1, H, n, 2), torch.ones(1, H, n, 2), torch.randn(1, H, n, 2)
    _, w = alibi_attention(q, k, v, causal_mask(n), slopes=alibi_slopes(H))
    last = w[0, :, -1]  # (H, n): the last query's weights over keys 0..n-1
    assert (last[:, 1:] > last[:, :-1]).all()  # nearer keys weigh more
    assert (last[:-1, -1] > last[1:, -1]).all()  # the steepest head keeps most on the nearest key
