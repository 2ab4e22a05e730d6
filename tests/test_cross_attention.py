"""attnkit.cross_attention (chapter 05) against torch.nn.MultiheadAttention and the properties of cross-attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import CrossAttention, MultiHeadAttention, SelfAttention, padding_mask, to_torch_multihead
from attnkit.cross_attention import context_padding_mask

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def torch_twin(cross: CrossAttention) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention with the weights of ``cross`` copied in."""
    return to_torch_multihead(cross.attn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, n, m, E, H", [(2, 3, 7, 8, 2), (1, 9, 2, 12, 3), (3, 5, 5, 4, 1), (2, 1, 6, 16, 4)])
def test_matches_torch_multihead_attention(B, n, m, E, H, dtype):
    torch.manual_seed(0)
    cross = CrossAttention(E, H).to(dtype)
    x, ctx = torch.randn(B, n, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype)
    out, w = cross(x, ctx)
    assert out.shape == (B, n, E) and w.shape == (B, H, n, m) and out.dtype == dtype
    ref, ref_w = torch_twin(cross)(x, ctx, ctx, average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(w, ref_w, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_context_mask_matches_torch_key_padding_mask(dtype):
    torch.manual_seed(1)
    B, n, m, E = 3, 4, 6, 8
    cross = CrossAttention(E, 2).to(dtype)
    x, ctx = torch.randn(B, n, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype)
    lengths = torch.tensor([6, 2, 4])
    keep = torch.arange(m) < lengths[:, None]  # (B, m) True = real token
    out, w = cross(x, ctx, keep)
    # torch's key_padding_mask is True = NOT allowed: invert ours
    ref, ref_w = torch_twin(cross)(x, ctx, ctx, key_padding_mask=~keep, average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(w, ref_w, **TOL[dtype])
    assert (w.masked_select(~keep[:, None, None, :].expand_as(w)) == 0).all()
    # the chapter 04 helper's (B, 1, m) mask gives the same result
    out2, _ = cross(x, ctx, padding_mask(lengths, m))
    torch.testing.assert_close(out2, out)


def test_context_equal_to_x_is_self_attention():
    torch.manual_seed(2)
    cross, self_attn = CrossAttention(8, 2), SelfAttention(8, 2)
    self_attn.load_state_dict(cross.state_dict())
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(cross(x, x)[0], self_attn(x)[0])


def test_mask_helper_shapes_and_errors():
    keep = torch.tensor([[True, False, True]])
    assert context_padding_mask(keep, 5).shape == (1, 1, 3)
    assert context_padding_mask(torch.ones(1, 5, 3, dtype=torch.bool), 5).shape == (1, 5, 3)
    with pytest.raises(ValueError, match="context_mask"):
        context_padding_mask(torch.ones(1, 4, 3, dtype=torch.bool), 5)
    with pytest.raises(ValueError, match="same B"):
        CrossAttention(4, 1)(torch.randn(2, 3, 4), torch.randn(3, 3, 4))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_properties_hypothesis(n, m, seed):
    """Reordering the context changes nothing; output row i depends on x row i only; masked tokens are ignored."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    cross = CrossAttention(8, 2).double()
    x, ctx = torch.randn(2, n, 8, generator=g, dtype=torch.float64), torch.randn(2, m, 8, generator=g, dtype=torch.float64)
    keep = torch.rand(2, m, generator=g) < 0.7
    keep[:, 0] = True
    out, w = cross(x, ctx, keep)
    perm = torch.randperm(m, generator=g)
    out_p, w_p = cross(x, ctx[:, perm], keep[:, perm])
    torch.testing.assert_close(out_p, out)  # the context is a set
    torch.testing.assert_close(w_p, w[..., perm])
    x2 = x.clone()
    x2[:, 0] += 1.0
    out2, _ = cross(x2, ctx, keep)
    torch.testing.assert_close(out2[:, 1:], out[:, 1:])  # each query on its own
    ctx2 = torch.where(keep[..., None], ctx, torch.randn_like(ctx))
    torch.testing.assert_close(cross(x, ctx2, keep)[0], out)  # padded tokens have no influence


def test_gradients_reach_both_sequences():
    cross = CrossAttention(4, 2)
    x, ctx = torch.randn(1, 2, 4, requires_grad=True), torch.randn(1, 3, 4, requires_grad=True)
    out, _ = cross(x, ctx)
    out.sum().backward()
    assert x.grad is not None and ctx.grad is not None and ctx.grad.abs().sum() > 0


def test_device_follows_the_inputs():
    """On a device other than the default CPU (``meta``: shapes only, no GPU needed), outputs stay there."""
    cross = CrossAttention(4, 2).to("meta")
    x, ctx = torch.randn(1, 2, 4, device="meta"), torch.randn(1, 3, 4, device="meta")
    out, w = cross(x, ctx, torch.ones(1, 3, dtype=torch.bool, device="meta"))
    assert out.device.type == w.device.type == "meta" and out.shape == (1, 2, 4) and w.shape == (1, 2, 2, 3)


def test_module_layout_is_the_contract():
    cross = CrossAttention(8, 4)
    assert isinstance(cross.attn, MultiHeadAttention)
    assert set(cross.state_dict()) == {f"attn.{name}.{t}" for name in ("q_proj", "k_proj", "v_proj", "out_proj")
                                       for t in ("weight", "bias")}
