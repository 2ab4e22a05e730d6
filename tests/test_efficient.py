"""attnkit.efficient: tiled attention, the online softmax, the KV cache, linear attention, memory accounting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnkit import MultiHeadAttention, causal_mask, merge_heads, scaled_dot_product_attention, split_heads
from attnkit.efficient import (append_to_cache, cached_attention, causal_linear_attention, elu_feature_map,
                               kv_cache_bytes_per_token, linear_attention, online_softmax_update, peak_memory,
                               tiled_attention)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _qkv(n=37, m=29, d_k=8, d_v=5, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return make(2, 3, n, d_k), make(2, 3, m, d_k), make(2, 3, m, d_v)


def test_online_softmax_update_equals_softmax_block_by_block():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(4, 10, generator=g) * 5  # (n, m)
    scores[0, :4] = float("-inf")  # the first blocks of row 0 are masked: state must stay finite
    scores[1] = float("-inf")  # row 1 fully masked
    values = torch.randn(10, 3, generator=g)
    state = (torch.full((4, 1), float("-inf")), torch.zeros(4, 1), torch.zeros(4, 3))
    for j in range(0, 10, 3):
        state = online_softmax_update(*state, scores[:, j:j + 3], values[j:j + 3])
        assert torch.isfinite(state[1]).all() and torch.isfinite(state[2]).all()
    m, l, acc = state
    torch.testing.assert_close(m, scores.amax(-1, keepdim=True))
    expected = torch.exp(scores - torch.where(m.isfinite(), m, 0))
    torch.testing.assert_close(l, expected.sum(-1, keepdim=True))
    torch.testing.assert_close(acc, expected @ values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("blocks", [(8, 8), (5, 7), (64, 64), (1, 3)])
def test_tiled_equals_reference(dtype, blocks, device):
    q, k, v = _qkv(dtype=dtype, device=device)
    ref, _ = scaled_dot_product_attention(q, k, v)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(tiled_attention(q, k, v, block_q=blocks[0], block_k=blocks[1]), ref, **tol)
    mask = torch.rand(2, 1, 37, 29, generator=torch.Generator().manual_seed(3)) > 0.6
    mask[1, 0, 4] = False  # a fully masked row gives zeros
    ref, _ = scaled_dot_product_attention(q, k, v, mask.to(device))
    out = tiled_attention(q, k, v, mask.to(device), block_q=blocks[0], block_k=blocks[1])
    torch.testing.assert_close(out, ref, **tol)
    assert torch.all(out[1, :, 4] == 0)


@pytest.mark.parametrize("n", [1, 16, 33])
def test_tiled_causal_equals_causal_mask_and_aligns_to_the_end(n):
    q, k, v = _qkv(n=n, m=n)
    ref, _ = scaled_dot_product_attention(q, k, v, causal_mask(n))
    torch.testing.assert_close(tiled_attention(q, k, v, causal=True, block_q=8, block_k=4), ref)
    # the last s queries against all n keys: query i sees keys up to i + n - s, like decoding with a cache
    s = max(1, n // 3)
    torch.testing.assert_close(tiled_attention(q[..., -s:, :], k, v, causal=True, block_q=3, block_k=5),
                               ref[..., -s:, :])


def test_tiled_gradients_match():
    q, k, v = (x.double().requires_grad_() for x in _qkv(n=12, m=12))
    g1 = torch.autograd.grad(tiled_attention(q, k, v, causal=True, block_q=5, block_k=4).sin().sum(), (q, k, v))
    g2 = torch.autograd.grad(scaled_dot_product_attention(q, k, v, causal_mask(12))[0].sin().sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_append_to_cache_grows_the_time_axis():
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 6)
    cache = append_to_cache(None, k, v)
    assert cache[0] is k and cache[1] is v
    cache2 = append_to_cache(cache, k[..., :1, :], v[..., :1, :])
    assert cache2[0].shape == (2, 3, 5, 5) and cache2[1].shape == (2, 3, 5, 6)
    assert cache[0].shape == (2, 3, 4, 5), "the old cache must not change"
    torch.testing.assert_close(cache2[0][..., 4, :], k[..., 0, :])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunks", [[1] * 9, [4, 1, 1, 3], [9]])
def test_incremental_decoding_equals_full_causal_attention(chunks, device):
    """Token by token (or a prompt then tokens) through MultiHeadAttention's projections equals one causal pass."""
    torch.manual_seed(0)
    E, H, n = 16, 4, sum(chunks)
    mha = MultiHeadAttention(E, H).to(device).double()
    x = torch.randn(2, n, E, dtype=torch.float64, device=device)
    full, _ = mha(x, x, x, causal_mask(n, device=device))
    outs, cache, t = [], None, 0
    for s in chunks:
        xt = x[:, t:t + s]  # (B, s, E)
        q, k, v = (split_heads(p(xt), H) for p in (mha.q_proj, mha.k_proj, mha.v_proj))  # (B, H, s, Dh)
        out, cache = cached_attention(q, k, v, cache)
        outs.append(mha.out_proj(merge_heads(out)))  # (B, s, E)
        t += s
        assert cache[0].shape == (2, H, t, E // H)
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


def _kernel_reference(q, k, v, causal):
    a = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)  # (..., n, m)
    if causal:
        a = a.tril()
    return a @ v / (a.sum(-1, keepdim=True) + 1e-6)


def test_linear_attention_equals_the_kernel_formula():
    q, k, v = (x.double() for x in _qkv())
    torch.testing.assert_close(linear_attention(q, k, v), _kernel_reference(q, k, v, False))
    # a constant feature map weighs every key alike: softmax attention with all scores equal (zero queries)
    uniform = linear_attention(q, k, v, feature_map=torch.ones_like, eps=0.0)
    torch.testing.assert_close(uniform, scaled_dot_product_attention(torch.zeros_like(q), k, v)[0])


@pytest.mark.parametrize("chunk", [1, 8, 64])
def test_causal_linear_attention_equals_the_masked_kernel_formula(chunk):
    q, k, v = (x.double() for x in _qkv(n=33, m=33))
    out = causal_linear_attention(q, k, v, chunk=chunk)
    torch.testing.assert_close(out, _kernel_reference(q, k, v, True))
    # causality: changing the future does not change the past
    k2 = k.clone()
    k2[..., 20:, :] += 1.0
    torch.testing.assert_close(causal_linear_attention(q, k2, v, chunk=chunk)[..., :20, :], out[..., :20, :])


def test_peak_memory_counts_live_tensors_and_views_once():
    assert peak_memory(lambda: torch.empty(1000)) == 4000
    x = torch.randn(100, 100)
    assert peak_memory(lambda x: x.t(), x) == 0  # a view allocates nothing
    assert peak_memory(lambda x: x.t().contiguous(), x) == 40000

    def two_then_one(x):
        a = x * 2  # 40 kB
        b = a + 1  # 40 kB, both alive
        del a
        return b * 3  # a freed first: peak stays 80 kB

    assert peak_memory(two_then_one, x) == 80000


def test_memory_standard_quadratic_tiled_linear_and_meta_agrees():
    def standard(q):
        return scaled_dot_product_attention(q, q, q)[0]

    def tiled(q):
        return tiled_attention(q, q, q, block_q=64, block_k=64)

    peaks = {}
    for n in (256, 512):
        q = torch.randn(1, 1, n, 16)
        peaks[n] = (peak_memory(standard, q), peak_memory(tiled, q))
        assert peaks[n] == (peak_memory(standard, q.to("meta")), peak_memory(tiled, q.to("meta")))
        assert peaks[n][0] >= 2 * n * n * 4  # at least scores and weights, (n, n) float32 each
    assert peaks[512][0] / peaks[256][0] > 3.5  # quadratic
    assert peaks[512][1] / peaks[256][1] < 2.5  # linear
    # the chapter's claim: at n = 16384 the tiled path needs at most a tenth of the standard path's memory
    q = torch.empty(1, 1, 16384, 64, device="meta")
    assert peak_memory(tiled_attention, q, q, q, block_q=2048, block_k=2048) * 10 <= peak_memory(standard, q)


@pytest.mark.parametrize("call, error, match", [
    (lambda q: tiled_attention(q, torch.randn(2, 5, 3), q), ValueError, r"d_k: query \(2, 5, 4\), key \(2, 5, 3\)"),
    (lambda q: tiled_attention(q, q, q, torch.ones(5, 5)), TypeError, "mask must be a bool tensor"),
    (lambda q: tiled_attention(q, q, q, block_k=0), ValueError, "block_k must be a positive int, got 0"),
    (lambda q: linear_attention(q, q, q.long()), TypeError, "value must be floating point, got dtype torch.int64"),
    (lambda q: causal_linear_attention(q, torch.randn(2, 6, 4), torch.randn(2, 6, 4)), ValueError,
     r"as many queries as keys: query \(2, 5, 4\), key \(2, 6, 4\)"),
    (lambda q: causal_linear_attention(q, q, q, chunk=-1), ValueError, "chunk must be a positive int"),
    (lambda q: cached_attention(q[:, :1], q[:, :1], q[:, :1], (torch.randn(2, 3, 5), torch.randn(2, 3, 4))),
     ValueError, r"new key \(2, 1, 4\) .* does not extend the cached keys \(2, 3, 5\)"),
    (lambda q: append_to_cache((q, q), q, q.double()), ValueError, "new value .*float64.* cached values"),
])
def test_bad_input_names_what_was_expected(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(2, 5, 4))


@pytest.mark.parametrize("n, m", [(5, 8), (8, 5), (6, 6)])
def test_tiled_causal_is_bottom_right_aligned_and_torch_is_causal_is_top_left(n, m):
    """``causal=True`` lets query i see keys j <= i + m - n (the queries are the last n positions);
    torch's ``is_causal=True`` lets it see j <= i. The two agree exactly when n == m."""
    g = torch.Generator().manual_seed(n * 10 + m)
    q, k, v = (torch.randn(2, s, 4, generator=g, dtype=torch.float64) for s in (n, m, m))
    ours = tiled_attention(q, k, v, causal=True, block_q=2, block_k=3)
    bottom_right = torch.ones(n, m, dtype=torch.bool).tril(m - n)  # (n, m)
    torch.testing.assert_close(ours, scaled_dot_product_attention(q, k, v, bottom_right)[0])
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if n <= m:  # with n > m the top-left mask leaves rows empty, which torch fills with NaN
        top_left_mask = torch.ones(n, m, dtype=torch.bool).tril()  # (n, m)
        torch.testing.assert_close(top_left, scaled_dot_product_attention(q, k, v, top_left_mask)[0])
    if n == m:
        torch.testing.assert_close(ours, top_left)
    else:
        assert not torch.allclose(ours, top_left, equal_nan=True)


@pytest.mark.parametrize("H, G", [(8, 8), (8, 2), (8, 1)])
def test_kv_cache_bytes_per_token_is_what_the_cache_holds(H, G):
    """The formula equals the bytes of real cached tensors of a grouped-query layer, per cached position."""
    E, t, layers = 32, 5, 3
    mha = MultiHeadAttention(E, H, num_kv_heads=G).to(torch.float16)
    x = torch.randn(1, t, E, dtype=torch.float16)
    cache = None
    k, v = split_heads(mha.k_proj(x), G), split_heads(mha.v_proj(x), G)  # (1, G, t, Dh): what is cached
    cache = append_to_cache(cache, k, v)
    per_layer = sum(c.numel() * c.element_size() for c in cache) / t
    assert kv_cache_bytes_per_token(layers, G, E // H, torch.float16) == layers * per_layer
    assert kv_cache_bytes_per_token(1, 1, 64, torch.float32) == 2 * 64 * 4
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_cache_bytes_per_token(1, 0, 64)
