"""The fast path (``attnkit.efficient.fused_attention``) equals the explicit textbook path: outputs, gradients, masks.

The explicit path is what the chapters teach; the fast path hands the same computation to
``torch.nn.functional.scaled_dot_product_attention`` (chapter 08, ``attnkit.bench``). Modules take
the attention function as their ``attention=`` argument.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import (MultiHeadAttention, TransformerDecoderBlock, TransformerEncoderBlock, causal_mask,
                     fused_attention, padding_mask, scaled_dot_product_attention)

PATHS = (scaled_dot_product_attention, fused_attention)  # explicit, fast

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _masks(n: int, m: int, gen: torch.Generator) -> dict[str, torch.Tensor | None]:
    random = torch.rand(2, n, m, generator=gen) > 0.5  # (B, n, m)
    random[0, 1] = False  # a fully masked query row
    padded = padding_mask(torch.tensor([m, 1]), m)  # (B, 1, m)
    return {"none": None, "random with an empty row": random, "padding (B, 1, m)": padded,
            "all False": torch.zeros(n, m, dtype=torch.bool)}


def _both(fn, *inputs):
    """Outputs and input gradients of ``fn`` on explicit and fast paths, with the same upstream gradient."""
    results = []
    for attention in PATHS:
        xs = [x.detach().clone().requires_grad_(True) for x in inputs]
        out = fn(*xs, attention=attention)
        probe = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
        grads = torch.autograd.grad((out * probe).sum(), xs, allow_unused=True)
        results.append((out.detach(), [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, xs)]))
    return results


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_name", ["none", "random with an empty row", "padding (B, 1, m)", "all False"])
def test_sdpa_fast_equals_explicit(dtype, mask_name, device):
    gen = torch.Generator().manual_seed(0)
    B, H, n, m, d_k, d_v = 2, 3, 5, 7, 4, 6
    q = torch.randn(B, H, n, d_k, generator=gen, dtype=dtype).to(device)
    k = torch.randn(B, H, m, d_k, generator=gen, dtype=dtype).to(device)
    v = torch.randn(B, H, m, d_v, generator=gen, dtype=dtype).to(device)
    mask = _masks(n, m, gen)[mask_name]
    if mask is not None:
        mask = (mask.unsqueeze(1) if mask.dim() == 3 else mask).to(device)  # a head axis for (B, n, m) masks

    def attend(q, k, v, attention):
        out, w = attention(q, k, v, mask)
        assert (w is None) == (attention is fused_attention)
        return out

    (slow, slow_g), (fast, fast_g) = _both(attend, q, k, v)
    assert fast.dtype == dtype and fast.device == q.device
    assert torch.isfinite(fast).all() and all(torch.isfinite(g).all() for g in fast_g)
    torch.testing.assert_close(fast, slow, **TOL[dtype])
    for name, a, b in zip("qkv", fast_g, slow_g):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda s, name=name: f"gradient wrt {name}: {s}")
    if mask is not None:  # rows with no allowed key are zero on the fast path too
        empty = ~mask.any(-1)  # (..., n)
        assert torch.all(fast.masked_select(empty.unsqueeze(-1).expand_as(fast)) == 0)


def test_sdpa_fast_default_and_broadcasting():
    """The explicit path returns the weights; unbatched and broadcast batch shapes work on the fast path."""
    q, k, v = torch.randn(3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    out, w = scaled_dot_product_attention(q, k, v)
    assert w is not None and w.shape == (2, 3, 5)
    fast, none = fused_attention(q, k, v)
    assert none is None
    torch.testing.assert_close(fast, out)
    with pytest.raises(TypeError, match="bool"):
        fused_attention(q, k, v, torch.ones(3, 5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("self_attention", [True, False], ids=["self", "cross"])
def test_multihead_fast_equals_explicit(dtype, self_attention):
    torch.manual_seed(1)
    B, n, m, E, H = 2, 5, 3, 12, 3
    mha = MultiHeadAttention(E, H).to(dtype)
    fast_mha = MultiHeadAttention(E, H, attention=fused_attention).to(dtype)
    fast_mha.load_state_dict(mha.state_dict())
    modules = {scaled_dot_product_attention: mha, fused_attention: fast_mha}
    x = torch.randn(B, n, E, dtype=dtype)
    y = x if self_attention else torch.randn(B, m, E, dtype=dtype)
    mask = torch.rand(B, n, y.shape[1]) > 0.4
    mask[1, 2] = False  # a fully masked query row

    def run(x, y, attention):
        kv = x if self_attention else y
        return modules[attention](x, kv, kv, mask)[0]

    (slow, slow_g), (fast, fast_g) = _both(run, x, y)
    torch.testing.assert_close(fast, slow, **TOL[dtype])
    for a, b in zip(fast_g, slow_g):
        torch.testing.assert_close(a, b, **TOL[dtype])
    assert fast_mha(x, y, y)[1] is None
    # parameter gradients too
    grads = []
    for module in (mha, fast_mha):
        module.zero_grad()
        module(x, y, y, mask)[0].square().sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("norm_first", [False, True])
def test_blocks_fast_equal_explicit(norm_first):
    torch.manual_seed(2)
    B, n, m, E, H, F = 2, 6, 4, 16, 4, 32
    enc = TransformerEncoderBlock(E, H, F, norm_first=norm_first).double()
    dec = TransformerDecoderBlock(E, H, F, norm_first=norm_first).double()
    fast_enc = TransformerEncoderBlock(E, H, F, norm_first=norm_first, attention=fused_attention).double()
    fast_dec = TransformerDecoderBlock(E, H, F, norm_first=norm_first, attention=fused_attention).double()
    fast_enc.load_state_dict(enc.state_dict())
    fast_dec.load_state_dict(dec.state_dict())
    x, mem = torch.randn(B, n, E, dtype=torch.float64), torch.randn(B, m, E, dtype=torch.float64)
    pad = padding_mask(torch.tensor([m, 2]), m)  # (B, 1, m)
    slow, w = enc(x, padding_mask(torch.tensor([n, 3]), n))
    fast, none = fast_enc(x, padding_mask(torch.tensor([n, 3]), n))
    assert w is not None and none is None
    torch.testing.assert_close(fast, slow)
    slow, ws, wc = dec(x, mem, causal_mask(n), pad)
    fast, ns, nc = fast_dec(x, mem, causal_mask(n), pad)
    assert ns is None and nc is None
    torch.testing.assert_close(fast, slow)


def _outcome(q, k, v, mask, attention):
    try:
        return "ok", attention(q, k, v, mask)[0]
    except Exception as err:  # noqa: BLE001 - the outcome compared is the error itself
        return type(err).__name__, str(err)


LEAD = st.sampled_from([(), (1,), (2,), (3,), (2, 1), (1, 2), (2, 2)])
MASK_SHAPES = ["n m", "1 m", "m", "n 1", "2 n m", "1 n m", "2 2 n m", "3 n m", "m n", "1 1 1 n m"]


@settings(max_examples=150, deadline=None)
@given(lead=st.tuples(LEAD, LEAD, LEAD), n=st.integers(1, 3), m=st.integers(0, 3), d=st.integers(1, 3),
       d_v=st.integers(1, 3), off=st.tuples(st.sampled_from([0, 0, 0, 1]), st.sampled_from([0, 0, 0, 1])),
       mask_shape=st.none() | st.sampled_from(MASK_SHAPES), float_mask=st.booleans(), seed=st.integers(0, 99))
def test_fast_and_explicit_agree_on_any_input(lead, n, m, d, d_v, off, mask_shape, float_mask, seed):
    """Valid or not, both paths give one answer: the same output, or the same error with the same message.

    The fast path leaves broadcasting checks to torch's kernel; this is what keeps that honest:
    shapes that do not broadcast, masks that would enlarge the batch, d_k or m that differ,
    no keys at all, a float mask (an additive bias to torch, an error here).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead[0], n, d, generator=gen)
    k = torch.randn(*lead[1], m, d + off[0], generator=gen)
    v = torch.randn(*lead[2], m + off[1], d_v, generator=gen)
    mask = None
    if mask_shape is not None:
        sizes = {"n": n, "m": m}
        mask = torch.rand(*(sizes[s] if s in sizes else int(s) for s in mask_shape.split()), generator=gen) > 0.3
        mask = mask.float() if float_mask else mask
    (kind_a, a), (kind_b, b) = _outcome(q, k, v, mask, scaled_dot_product_attention), _outcome(q, k, v, mask, fused_attention)
    assert kind_a == kind_b, (a, b)
    if kind_a == "ok":
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    else:
        assert a == b
