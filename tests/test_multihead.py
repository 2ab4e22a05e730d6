"""attnkit.multihead against torch's own multi-head attention and the algebra of heads (chapter 02)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads, to_torch_multihead

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def torch_twin(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention with ``mha``'s weights, in eval mode."""
    return to_torch_multihead(mha).eval()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, n, m, E, H", [(2, 3, 5, 8, 2), (1, 4, 4, 12, 3), (3, 1, 6, 6, 6), (2, 5, 2, 4, 1)])
def test_matches_torch_multihead_attention(B, n, m, E, H, dtype):
    torch.manual_seed(0)
    mha = MultiHeadAttention(E, H).to(dtype)
    q, k, v = (torch.randn(B, n, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype))
    out, w = mha(q, k, v)
    exp_out, exp_w = torch_twin(mha)(q, k, v, need_weights=True, average_attn_weights=False)
    assert out.shape == (B, n, E) and w.shape == (B, H, n, m)
    assert out.dtype == dtype and w.dtype == dtype
    torch.testing.assert_close(out, exp_out, **TOL[dtype])
    torch.testing.assert_close(w, exp_w, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_matches_torch_with_inverted_polarity(dtype):
    torch.manual_seed(1)
    B, n, m, E, H = 2, 4, 5, 8, 2
    mha = MultiHeadAttention(E, H).to(dtype)
    q, k = torch.randn(B, n, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype)
    mask = torch.rand(n, m) < 0.6
    mask[:, 0] = True
    out, w = mha(q, k, k, mask)
    # nn.MultiheadAttention's bool attn_mask means "may NOT attend": invert ours.
    exp_out, exp_w = torch_twin(mha)(q, k, k, attn_mask=~mask, average_attn_weights=False)
    torch.testing.assert_close(out, exp_out, **TOL[dtype])
    torch.testing.assert_close(w, exp_w, **TOL[dtype])
    assert (w[..., ~mask] == 0).all()


def test_mask_shapes_broadcast_over_heads():
    torch.manual_seed(2)
    B, n, m, E, H = 2, 3, 4, 8, 2
    mha = MultiHeadAttention(E, H)
    q, k = torch.randn(B, n, E), torch.randn(B, m, E)
    per_example = torch.rand(B, n, m) < 0.7
    per_example[..., 0] = True
    _, w3 = mha(q, k, k, per_example)
    _, w4 = mha(q, k, k, per_example[:, None].expand(B, H, n, m))
    torch.testing.assert_close(w3, w4)
    assert (w3.masked_select(~per_example[:, None].expand(B, H, n, m)) == 0).all()
    key_padding = torch.tensor([[True] * 4, [True, True, False, False]])[:, None, :]  # (B, 1, m)
    _, w = mha(q, k, k, key_padding)
    assert (w[1, :, :, 2:] == 0).all() and torch.allclose(w.sum(-1), torch.ones(B, H, n))
    per_head = torch.zeros(B, H, n, m, dtype=torch.bool)
    per_head[:, 0, :, 0] = True
    per_head[:, 1, :, -1] = True
    _, w = mha(q, k, k, per_head)
    assert (w[:, 0, :, 0] == 1).all() and (w[:, 1, :, -1] == 1).all()


def test_equals_explicit_per_head_computation():
    """h separate per-head projections (slices of the wide weights), attended and concatenated, give the same output."""
    torch.manual_seed(3)
    B, n, m, E, H = 2, 3, 4, 12, 3
    Dh = E // H
    mha = MultiHeadAttention(E, H).double()
    q, k, v = (torch.randn(B, n, E, dtype=torch.float64), torch.randn(B, m, E, dtype=torch.float64),
               torch.randn(B, m, E, dtype=torch.float64))
    heads = []
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        qh = F.linear(q, mha.q_proj.weight[rows], mha.q_proj.bias[rows])
        kh = F.linear(k, mha.k_proj.weight[rows], mha.k_proj.bias[rows])
        vh = F.linear(v, mha.v_proj.weight[rows], mha.v_proj.bias[rows])
        w = torch.softmax(qh @ kh.mT / math.sqrt(Dh), dim=-1)
        heads.append(w @ vh)
    expected = mha.out_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(mha(q, k, v)[0], expected)


def test_no_bias_and_parameter_count():
    E, H = 16, 4
    assert sum(p.numel() for p in MultiHeadAttention(E, H).parameters()) == 4 * E * E + 4 * E
    mha = MultiHeadAttention(E, H, bias=False)
    assert sum(p.numel() for p in mha.parameters()) == 4 * E * E
    x = torch.randn(1, 3, E)
    torch.testing.assert_close(mha(x, x, x)[0], torch_twin(mha)(x, x, x)[0], atol=1e-5, rtol=1e-4)


def test_fully_masked_row_is_zero_not_nan():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    out, w = mha(x, x, x, mask)
    assert torch.isfinite(out).all() and (w[:, :, 1] == 0).all()
    torch.testing.assert_close(out[0, 1], mha.out_proj.bias)  # zero heads, then the output projection's bias


@pytest.mark.parametrize("E, H", [(10, 3), (7, 2), (4, 0)])
def test_indivisible_embed_dim_raises_clearly(E, H):
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(E, H)


def test_clear_errors_for_wrong_inputs():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"embed_dim=8"):
        mha(torch.randn(2, 3, 6), torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    with pytest.raises(TypeError, match="float64"):
        x = torch.randn(1, 2, 8, dtype=torch.float64)
        mha(x, x, x)
    with pytest.raises(ValueError, match="key and value"):
        mha(torch.randn(1, 2, 8), torch.randn(1, 3, 8), torch.randn(1, 4, 8))
    with pytest.raises(ValueError, match="divisible"):
        split_heads(torch.randn(2, 3, 7), 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_heads_layout(dtype):
    x = torch.arange(2 * 3 * 6, dtype=dtype).reshape(2, 3, 6)
    s = split_heads(x, 2)
    assert s.shape == (2, 2, 3, 3) and s.dtype == dtype
    torch.testing.assert_close(s[:, 0], x[..., :3])  # head 0 = the first Dh features
    torch.testing.assert_close(s[:, 1], x[..., 3:])
    torch.testing.assert_close(s, x.view(2, 3, 2, 3).permute(0, 2, 1, 3))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(B=st.integers(1, 3), n=st.integers(1, 5), H=st.integers(1, 4), Dh=st.integers(1, 4),
       lead=st.booleans())
def test_merge_inverts_split(B, n, H, Dh, lead):
    g = torch.Generator().manual_seed(B * 1000 + n * 100 + H * 10 + Dh)
    shape = (2, B, n, H * Dh) if lead else (B, n, H * Dh)
    x = torch.randn(*shape, generator=g)
    assert split_heads(x, H).shape == shape[:-2] + (H, n, Dh)
    assert torch.equal(merge_heads(split_heads(x, H)), x)
    y = torch.randn(B, H, n, Dh, generator=g)
    assert torch.equal(split_heads(merge_heads(y), H), y)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n=st.integers(1, 5), m=st.integers(1, 5), H=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_weights_are_distributions_and_heads_are_independent(n, m, H, seed):
    torch.manual_seed(seed)
    E = 8
    mha = MultiHeadAttention(E, H).double()
    q, k = torch.randn(2, n, E, dtype=torch.float64), torch.randn(2, m, E, dtype=torch.float64)
    out, w = mha(q, k, k)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, n, dtype=torch.float64))
    # each head's weights equal single-head attention with that head's slice of the projections
    Dh = E // H
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        qh = F.linear(q, mha.q_proj.weight[rows], mha.q_proj.bias[rows])
        kh = F.linear(k, mha.k_proj.weight[rows], mha.k_proj.bias[rows])
        torch.testing.assert_close(w[:, h], scaled_dot_product_attention(qh, kh, kh)[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_gpu():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    expected = mha(x, x, x)[0]
    out, w = mha.cuda()(x.cuda(), x.cuda(), x.cuda())
    assert out.device.type == "cuda" and w.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)


# -- grouped-query and multi-query attention (chapter 08) --------------------------------------------


def test_num_kv_heads_equal_to_num_heads_is_plain_multi_head_attention():
    torch.manual_seed(5)
    B, n, m, E, H = 2, 3, 5, 12, 3
    mha = MultiHeadAttention(E, H).double()
    gqa = MultiHeadAttention(E, H, num_kv_heads=H).double()
    gqa.load_state_dict(mha.state_dict())  # the same parameters, the same names and shapes
    q, k = torch.randn(B, n, E, dtype=torch.float64), torch.randn(B, m, E, dtype=torch.float64)
    for a, b in zip(mha(q, k, k), gqa(q, k, k)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("H, G", [(4, 2), (4, 1), (6, 3), (6, 2)])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_query_attention_matches_torch_enable_gqa(H, G, masked):
    """K/V heads shared by groups of H // G consecutive query heads, as torch's ``enable_gqa=True``."""
    if "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""):
        pytest.skip("this torch has no enable_gqa")
    torch.manual_seed(H * 10 + G)
    B, n, m, E = 2, 4, 6, 24
    Dh = E // H
    gqa = MultiHeadAttention(E, H, num_kv_heads=G).double()
    assert gqa.k_proj.weight.shape == gqa.v_proj.weight.shape == (G * Dh, E)
    x, ctx = torch.randn(B, n, E, dtype=torch.float64), torch.randn(B, m, E, dtype=torch.float64)
    mask = torch.rand(B, n, m) < 0.7 if masked else None
    if mask is not None:
        mask[..., 0] = True
    out, w = gqa(x, ctx, ctx, mask)
    assert out.shape == (B, n, E) and w.shape == (B, H, n, m)
    q = split_heads(gqa.q_proj(x), H)  # (B, H, n, Dh)
    k, v = split_heads(gqa.k_proj(ctx), G), split_heads(gqa.v_proj(ctx), G)  # (B, G, m, Dh)
    attn_mask = None if mask is None else mask[:, None]  # (B, 1, n, m)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)  # (B, H, n, Dh)
    torch.testing.assert_close(out, gqa.out_proj(merge_heads(expected)))


def test_multi_query_heads_share_keys_and_values():
    """With one K/V head, every query head scores the same keys: heads differ only through their queries."""
    torch.manual_seed(6)
    E, H = 8, 4
    mqa = MultiHeadAttention(E, H, num_kv_heads=1)
    assert sum(p.numel() for p in mqa.parameters()) == 2 * E * E + 2 * E * (E // H) + 2 * E + 2 * (E // H)
    with torch.no_grad():
        mqa.q_proj.weight.copy_(mqa.q_proj.weight[:E // H].repeat(H, 1))  # every query head the same
        mqa.q_proj.bias.copy_(mqa.q_proj.bias[:E // H].repeat(H))
    x = torch.randn(2, 5, E)
    _, w = mqa(x, x, x)
    for h in range(1, H):
        torch.testing.assert_close(w[:, h], w[:, 0])


@pytest.mark.parametrize("H, G", [(4, 3), (4, 0), (4, 8)])
def test_num_kv_heads_must_divide_num_heads(H, G):
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(8, H, num_kv_heads=G)


def test_grouped_query_attention_has_no_torch_multihead_twin():
    with pytest.raises(ValueError, match="grouped-query"):
        to_torch_multihead(MultiHeadAttention(8, 4, num_kv_heads=2))


# -- attention dropout (issue 15) ----------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_dropout_matches_torch_with_the_same_seed(p, masked):
    """In train mode the same RNG seed drops the same weights as nn.MultiheadAttention; eval drops nothing."""
    torch.manual_seed(7)
    B, n, m, E, H = 2, 4, 6, 8, 2
    mha = MultiHeadAttention(E, H, dropout=p).double()
    twin = to_torch_multihead(mha)
    assert twin.dropout == p
    x, ctx = torch.randn(B, n, E, dtype=torch.float64), torch.randn(B, m, E, dtype=torch.float64)
    mask = torch.rand(n, m) < 0.7 if masked else None
    if mask is not None:
        mask[:, 0] = True
    torch_mask = None if mask is None else ~mask  # torch: True = may NOT attend
    for training in (True, False):
        mha.train(training), twin.train(training)
        torch.manual_seed(123)
        out, w = mha(x, ctx, ctx, mask)
        torch.manual_seed(123)
        exp_out, exp_w = twin(x, ctx, ctx, attn_mask=torch_mask, need_weights=True, average_attn_weights=False)
        torch.testing.assert_close(out, exp_out)
        torch.testing.assert_close(w, exp_w)
        if training:  # something was dropped, and the kept weights were scaled by 1 / (1 - p)
            dropped = (w == 0) & (mha.eval()(x, ctx, ctx, mask)[1] > 0)
            assert dropped.any()
            mha.train()
        else:  # eval: the plain weights, rows summing to 1
            torch.testing.assert_close(w.sum(-1), torch.ones(B, H, n, dtype=torch.float64))


def test_dropout_is_checked_and_needs_the_weights():
    with pytest.raises(ValueError, match="probability"):
        MultiHeadAttention(8, 2, dropout=1.5)
    from attnkit import fused_attention
    mha = MultiHeadAttention(8, 2, dropout=0.1, attention=fused_attention)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="fused_attention returns none"):
        mha(x, x, x)
    assert mha.eval()(x, x, x)[1] is None  # eval: no dropout, the fast path runs
