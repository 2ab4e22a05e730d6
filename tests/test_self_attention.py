"""attnkit.SelfAttention against torch's self-attention, and the symmetry the math promises (chapter 03)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit import MultiHeadAttention, SelfAttention, to_torch_multihead

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def torch_twin(layer: SelfAttention) -> nn.MultiheadAttention:
    return to_torch_multihead(layer.attn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("B, n, E, H", [(2, 5, 8, 2), (1, 1, 4, 4), (3, 7, 12, 3)])
def test_is_multihead_attention_of_x_with_itself(B, n, E, H, masked, dtype):
    """SelfAttention(x) is its MultiHeadAttention on (x, x, x), mask passed through, and torch's self-attention."""
    torch.manual_seed(0)
    layer = SelfAttention(E, H).to(dtype)
    assert isinstance(layer.attn, MultiHeadAttention)
    x = torch.randn(B, n, E, dtype=dtype)
    mask = torch.rand(B, n, n) < 0.5 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query keeps a key
    out, w = layer(x, mask)
    assert out.shape == (B, n, E) and w.shape == (B, H, n, n) and out.dtype == dtype
    for got, want in zip((out, w), layer.attn(x, x, x, mask)):
        torch.testing.assert_close(got, want, **TOL[dtype])
    # torch: a 3-D attn_mask is (B * H, n, n) and True = may NOT attend
    attn_mask = None if mask is None else ~mask.repeat_interleave(H, dim=0)
    ref = torch_twin(layer)(x, x, x, attn_mask=attn_mask, average_attn_weights=False)
    for got, want in zip((out, w), ref):
        torch.testing.assert_close(got, want, **TOL[dtype])
    if mask is not None:
        assert (w.masked_select(~mask[:, None].expand_as(w)) == 0).all()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(1, 8), H=st.sampled_from([1, 2, 4]), seed=st.integers(0, 2**16))
def test_permutation_equivariance(n, H, seed):
    """Reordering the positions reorders the outputs and the weights' rows and columns the same way."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = SelfAttention(8, H).double()
    x = torch.randn(2, n, 8, generator=g, dtype=torch.float64)
    perm = torch.randperm(n, generator=g)
    out, w = layer(x)
    out_p, w_p = layer(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm])


def test_parameters_are_those_of_the_wrapped_attention():
    layer = SelfAttention(16, 4)
    assert [k for k, _ in layer.named_parameters()] == [
        f"attn.{p}.{t}" for p in ("q_proj", "k_proj", "v_proj", "out_proj") for t in ("weight", "bias")]
    with pytest.raises(ValueError, match="divisible"):
        SelfAttention(10, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_runs_on_gpu():
    layer = SelfAttention(8, 2)
    x = torch.randn(2, 3, 8)
    expected = layer(x)[0]
    out, _ = layer.cuda()(x.cuda())
    torch.testing.assert_close(out.cpu(), expected, atol=1e-4, rtol=1e-4)
