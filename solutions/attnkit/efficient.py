"""Efficient attention: the fused kernel, tiling with the online softmax, a key-value cache, linear attention (chapter 08).

Shape legend: ``...`` any leading batch dimensions (usually ``(B, H)``), ``n`` queries, ``m``
keys and values, ``t`` positions already in a cache, ``s`` new positions, ``d_k`` the
query/key width, ``d_v`` the value width, ``b`` a block of keys.

:func:`fused_attention` hands attention to torch's fused kernel, with the course's contract
(bool masks, zero rows for queries with no allowed key, our error messages); it never forms the
weights, so it returns ``(output, None)``. Standard attention (chapter 01) stores the ``(n, m)`` scores and weights, so its memory grows
with the square of the sequence length. :func:`tiled_attention` computes the same output one
block of keys at a time, keeping per query only a running maximum, a running sum and a running
weighted sum of values (the online softmax; Milakov and Gimelshein, 2018; Dao et al., 2022).
:func:`cached_attention` decodes one position at a time from a cache of the earlier keys and
values. :func:`linear_attention` replaces the softmax kernel by a feature map so the cost is
linear in the length (Katharopoulos et al., 2020). :func:`peak_memory` measures the bytes of
tensors a call keeps alive at once, on any device (``meta`` too, which computes nothing).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit.attention import scaled_dot_product_attention
from attnkit.validation import ShapeError, check_inputs, check_tensors

__all__ = ["fused_attention", "online_softmax_update", "tiled_attention", "append_to_cache", "cached_attention",
           "kv_cache_bytes_per_token", "elu_feature_map", "linear_attention", "causal_linear_attention",
           "peak_memory"]

State = tuple[Tensor, Tensor, Tensor]  # running max (..., n, 1), running sum (..., n, 1), accumulator (..., n, d_v)
KVCache = tuple[Tensor, Tensor]  # keys (..., t, d_k), values (..., t, d_v)


def _check_positive(**sizes: int) -> None:
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")


# -- torch's fused kernel, with the course's contract --------------------------------


def fused_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, None]:
    """The output of :func:`attnkit.scaled_dot_product_attention` from torch's fused kernel (chapter 08).

    Same arguments and the same output; the second item is always ``None`` because the fused
    kernel never forms the ``(n, m)`` weights (that is what makes it fast). The pair keeps the
    shape of every attention function, so ``MultiHeadAttention(..., attention=fused_attention)``
    runs the fast path; with attention ``dropout > 0`` that module raises ``ValueError`` in
    training mode, since there are no weights to drop (use ``dropout=0.0``, or ``eval()``).

    Small calls are where Python's own cost shows (on a GPU most calls are small next to the
    launch cost). Without a mask, torch's own input checks refuse what the contract refuses
    (fewer than two dimensions, integer or mixed dtypes, mixed devices, shapes that do not fit
    or broadcast) but for keys and values of different lengths, so once those agree the call
    goes straight to the kernel, and ours run only when it has refused. With a mask, the checks here are the cheap ones; broadcasting, the costly check, is
    left to torch's kernel, which refuses what it cannot broadcast. Only then does
    :func:`attnkit.validation.check_inputs` run: it replaces torch's message by ours, and where the
    inputs do fit the contract (a broadcast that the explicit path handles and the kernel does
    not) the explicit path answers. Two inputs torch would take but read differently are checked
    first: a mask that is not bool (an additive bias for torch), and no keys at all (torch then
    skips its own checks).

    ``F.scaled_dot_product_attention`` reads a bool mask the same way (True = may attend) but,
    depending on the version and the kernel it picks, may give NaN for a query row with no
    allowed key. Such rows are let see every key, which keeps the kernel and its gradients
    finite, and their output is then set to zero, as the contract asks.
    """
    if mask is None:  # the common call: torch's own checks refuse what the contract refuses
        try:
            m = key.shape[-2]  # no keys: torch skips its checks; a value of other length it may take
            if m and value.shape[-2] == m:
                return F.scaled_dot_product_attention(query, key, value), None  # (..., n, d_v)
        except torch.OutOfMemoryError:
            raise
        except Exception:  # refused (or not tensors at all): our checks below name what is wrong
            pass
    check_tensors(query, key, value)
    if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool):
        check_inputs(query, key, value, mask)  # raises: the mask must be bool
    if key.shape[-2] == 0:  # no keys: every row is empty, and torch's kernel skips its checks
        return scaled_dot_product_attention(query, key, value, mask)[0], None
    try:
        if mask is None:
            return F.scaled_dot_product_attention(query, key, value), None  # (..., n, d_v)
        if mask.device != query.device:
            mask = mask.to(query.device)
        has_key = mask.any(dim=-1, keepdim=True)  # (..., n, 1): does the row allow any key?
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask | ~has_key)  # (..., n, d_v)
    except torch.OutOfMemoryError:
        raise
    except Exception:  # torch raises RuntimeError, IndexError, ... for inputs its kernel refuses
        # raises, naming what was expected and what came; else legal inputs the kernel refused
        return scaled_dot_product_attention(query, key, value, mask)[0], None
    if out.shape[:-2] != query.shape[:-2]:  # a broadcast batch: make sure the mask did not enlarge it
        check_inputs(query, key, value, mask)
    return out.masked_fill(~has_key, 0.0), None


# -- the online softmax and tiled attention ------------------------------------------


def online_softmax_update(running_max: Tensor, running_sum: Tensor, acc: Tensor,
                          scores: Tensor, values: Tensor) -> State:
    """Fold one block of keys into every query's running softmax state (chapter 08).

    After the blocks seen so far, with ``M`` the largest score of a query row:
    ``running_max = M``, ``running_sum = sum exp(s - M)`` and
    ``acc = sum exp(s - M) v`` over those keys. A new block with a larger maximum
    ``M'`` multiplies the old sum and accumulator by ``exp(M - M')`` so every term is
    relative to ``M'``. A row whose scores are all ``-inf`` so far keeps
    ``running_max = -inf``, ``running_sum = 0`` and ``acc = 0``.

    Args:
        running_max: ``(..., n, 1)``, ``-inf`` before the first block.
        running_sum: ``(..., n, 1)``, zeros before the first block.
        acc: ``(..., n, d_v)``, zeros before the first block.
        scores: ``(..., n, b)`` scaled scores of the block; masked keys are ``-inf``.
        values: ``(..., b, d_v)`` the block's values.

    Returns:
        The new ``(running_max, running_sum, acc)``; the output is
        ``acc / running_sum``.
    """
    block_max = scores.amax(dim=-1, keepdim=True)  # (..., n, 1)
    new_max = torch.maximum(running_max, block_max)  # (..., n, 1)
    shift = torch.where(torch.isfinite(new_max), new_max,
                        torch.zeros_like(new_max))  # all--inf rows: shift by 0
    rescale = torch.exp(running_max - shift)  # (..., n, 1): exp(M - M'), 0 at first
    p = torch.exp(scores - shift)  # (..., n, b)
    new_sum = rescale * running_sum + p.sum(dim=-1, keepdim=True)  # (..., n, 1)
    return new_max, new_sum, rescale * acc + p @ values  # acc: (..., n, d_v)


def tiled_attention(query: Tensor, key: Tensor, value: Tensor,
                    mask: Tensor | None = None, causal: bool = False,
                    block_q: int = 512, block_k: int = 512) -> Tensor:
    """Attention one ``(block_q, block_k)`` tile at a time: FlashAttention's algorithm.

    Chapter 08. Equals :func:`attnkit.scaled_dot_product_attention`'s output, but
    never holds more than one tile of scores per query block, so its memory grows
    linearly with ``n`` and ``m`` (Dao et al., 2022).

    Args:
        query: ``(..., n, d_k)``; key: ``(..., m, d_k)``; value: ``(..., m, d_v)``.
        mask: optional bool tensor broadcastable to ``(..., n, m)``, True = may attend.
        causal: query ``i`` sees keys ``j <= i + m - n``, made tile by tile; tiles
            entirely in the future are skipped. When ``n == m`` this is the usual
            causal mask. When ``n != m`` the queries are the *last* ``n`` positions
            (bottom-right alignment: the last query sees every key, as when decoding
            after a cache), i.e. ``mask = ones(n, m).tril(m - n)``. torch's
            ``F.scaled_dot_product_attention(..., is_causal=True)`` aligns top-left
            instead (``tril(0)``: query ``i`` sees keys ``0..i``); the two differ
            when ``n != m``.
        block_q, block_k: tile sizes.

    Returns:
        ``(..., n, d_v)``; a query with no allowed key gets a zero row.
    """
    batch = check_inputs(query, key, value, mask)  # the broadcast batch shape
    _check_positive(block_q=block_q, block_k=block_k)
    n, m, d_k, d_v = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    if mask is not None:  # a view: slicing tiles works on size-1 axes too
        mask = mask.to(query.device).expand(*mask.shape[:-2], n, m)
    scale = 1.0 / math.sqrt(d_k)
    out = query.new_empty(*batch, n, d_v)  # (..., n, d_v)
    for i in range(0, n, block_q):
        q = query[..., i:i + block_q, :] * scale  # (..., bq, d_k)
        bq = q.shape[-2]
        state = (q.new_full((*batch, bq, 1), float("-inf")), q.new_zeros(*batch, bq, 1),
                 q.new_zeros(*batch, bq, d_v))
        last_key = i + bq - 1 + m - n  # the last key this block's last query may see
        key_end = m if not causal else max(0, min(m, last_key + 1))
        for j in range(0, key_end, block_k):
            scores = q @ key[..., j:j + block_k, :].transpose(-2, -1)  # (..., bq, bk)
            if mask is not None:
                tile = mask[..., i:i + block_q, j:j + block_k]  # (..., bq, bk)
                scores = scores.masked_fill(~tile, float("-inf"))
            if causal and j + scores.shape[-1] - 1 > i + m - n:  # crosses the diagonal
                rows = torch.arange(i, i + bq, device=q.device)[:, None]  # (bq, 1)
                rows = rows + (m - n)  # the last key each query may see
                cols = torch.arange(j, j + scores.shape[-1], device=q.device)  # (bk,)
                scores = scores.masked_fill(cols > rows, float("-inf"))
            state = online_softmax_update(*state, scores, value[..., j:j + block_k, :])
        _, total, acc = state
        safe = torch.where(total > 0, total, torch.ones_like(total))  # empty rows: 0
        out[..., i:i + block_q, :] = acc / safe  # (..., bq, d_v)
    return out


# -- decoding with a key-value cache -------------------------------------------------


def append_to_cache(cache: KVCache | None, key: Tensor, value: Tensor) -> KVCache:
    """The cache with ``s`` new positions appended on the time axis (chapter 08).

    ``(..., t, d) -> (..., t + s, d)``. ``cache`` is ``None`` before the first step.
    Returns new tensors; the old cache is not modified.
    """
    if cache is None:
        return key, value
    for name, old, new in (("key", cache[0], key), ("value", cache[1], value)):
        if old.shape[:-2] != new.shape[:-2] or old.shape[-1] != new.shape[-1] \
                or old.dtype != new.dtype or old.device != new.device:
            raise ValueError(f"the new {name} {tuple(new.shape)} ({new.dtype}, "
                             f"{new.device}) does not extend the cached {name}s "
                             f"{tuple(old.shape)} ({old.dtype}, {old.device}): only "
                             f"the time axis (-2) may differ")
    keys = torch.cat([cache[0], key], dim=-2)  # (..., t + s, d_k)
    values = torch.cat([cache[1], value], dim=-2)  # (..., t + s, d_v)
    return keys, values


def cached_attention(query: Tensor, key: Tensor, value: Tensor,
                     cache: KVCache | None) -> tuple[Tensor, KVCache]:
    """Causal attention for ``s`` new positions after ``t`` cached ones (chapter 08).

    Args:
        query, key, value: ``(..., s, d)`` for positions ``t .. t + s - 1``.
        cache: keys ``(..., t, d_k)`` and values ``(..., t, d_v)`` of the earlier
            positions, or ``None``.

    Returns:
        ``(output, cache)``: output ``(..., s, d_v)``, where new position ``t + i``
        attends to positions ``0 .. t + i``, and the cache extended to ``t + s``
        positions. Decoding one position at a time this way equals causal attention
        over the whole sequence, at a cost of ``O(t)`` per step instead of
        recomputing all ``O(t^2)`` scores.
    """
    check_inputs(query, key, value)
    keys, values = append_to_cache(cache, key, value)  # (..., t + s, d_k | d_v)
    s, total = query.shape[-2], keys.shape[-2]
    mask = None
    if s > 1:  # a prompt: each new position sees the cache and the new ones up to it
        mask = torch.ones(s, total, dtype=torch.bool, device=query.device)
        mask = mask.tril(total - s)  # (s, t + s)
    out, _ = fused_attention(query, keys, values, mask)  # (..., s, d_v)
    return out, (keys, values)


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                             dtype: torch.dtype = torch.float16) -> int:
    """Bytes a key-value cache holds per token, for a configuration (chapter 08).

    ``2 * num_layers * num_kv_heads * head_dim * itemsize``: every layer caches one
    key and one value vector of ``head_dim`` numbers per key-value head. Multi-head
    attention has ``num_kv_heads == num_heads``; grouped-query attention (Ainslie et
    al., 2023) fewer; multi-query attention (Shazeer, 2019) one. Query heads do not
    count: queries are never cached.
    """
    _check_positive(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_dim * itemsize


# -- linear attention ----------------------------------------------------------------

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    """``elu(x) + 1``: positive, so ``phi(q) . phi(k)`` is a valid similarity.

    The feature map of Katharopoulos et al. (2020), chapter 08.
    """
    return F.elu(x) + 1


def linear_attention(query: Tensor, key: Tensor, value: Tensor,
                     feature_map: FeatureMap = elu_feature_map,
                     eps: float = 1e-6) -> Tensor:
    """Kernelized attention ``phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(k_j))`` (ch. 08).

    The softmax similarity ``exp(q . k / sqrt(d_k))`` is replaced by
    ``phi(q) . phi(k)``. Matrix products associate, so ``phi(K)^T V``
    (``d_k x d_v``) is formed once, no ``(n, m)`` matrix exists, and the cost is
    ``O(n d_k d_v)``.

    Args:
        query: ``(..., n, d_k)``; key: ``(..., m, d_k)``; value: ``(..., m, d_v)``.

    Returns:
        ``(..., n, d_v)``.
    """
    check_inputs(query, key, value)
    phi_q, phi_k = feature_map(query), feature_map(key)  # (..., n | m, d_k)
    kv = phi_k.transpose(-2, -1) @ value  # (..., d_k, d_v)
    normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (..., n, 1)
    return (phi_q @ kv) / (normaliser + eps)  # (..., n, d_v)


def causal_linear_attention(query: Tensor, key: Tensor, value: Tensor,
                            feature_map: FeatureMap = elu_feature_map,
                            eps: float = 1e-6, chunk: int = 64) -> Tensor:
    """Causal linear attention with running sums, one chunk at a time (chapter 08).

    Position ``i`` needs ``S_i = sum_{j<=i} phi(k_j) v_j^T`` and
    ``z_i = sum_{j<=i} phi(k_j)``. Within a chunk the few pairs are computed directly
    (a small ``(chunk, chunk)`` lower triangle); the running ``S`` (``d_k x d_v``) and
    ``z`` carry everything before the chunk. Memory and time are linear in ``n``.

    Args:
        query, key: ``(..., n, d_k)``; value: ``(..., n, d_v)`` (``n == m``).

    Returns:
        ``(..., n, d_v)``.
    """
    batch = check_inputs(query, key, value)  # the broadcast batch shape
    if query.shape[-2] != key.shape[-2]:
        raise ShapeError(f"causal attention pairs query i with keys j <= i, so it "
                         f"needs as many queries as keys: query {tuple(query.shape)}, "
                         f"key {tuple(key.shape)}")
    _check_positive(chunk=chunk)
    phi_q, phi_k = feature_map(query), feature_map(key)  # (..., n, d_k)
    n, d_k, d_v = query.shape[-2], query.shape[-1], value.shape[-1]
    S = value.new_zeros(*batch, d_k, d_v)  # running sum of phi(k_j) v_j^T
    z = value.new_zeros(*batch, 1, d_k)  # running sum of phi(k_j)
    out = value.new_empty(*batch, n, d_v)
    for i in range(0, n, chunk):
        q, k = phi_q[..., i:i + chunk, :], phi_k[..., i:i + chunk, :]  # (..., c, d_k)
        v = value[..., i:i + chunk, :]  # (..., c, d_v)
        c = q.shape[-2]
        within = (q @ k.transpose(-2, -1)).tril()  # (..., c, c): pairs j <= i in chunk
        numerator = q @ S + within @ v  # (..., c, d_v)
        denominator = (q * z).sum(-1, keepdim=True) + within.sum(-1, keepdim=True)
        out[..., i:i + c, :] = numerator / (denominator + eps)  # (..., c, d_v)
        S = S + k.transpose(-2, -1) @ v  # (..., d_k, d_v)
        z = z + k.sum(dim=-2, keepdim=True)  # (..., 1, d_k)
    return out


# -- measuring memory ---------------------------------------------------------------


class _TensorBytes(TorchDispatchMode):
    """Counts the bytes of tensor storages created inside the mode and still alive; remembers the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        returns = func._schema.returns
        fresh = [r.alias_info is None for r in returns]  # views and in-place results allocate nothing new
        fresh = fresh * len(outs) if len(fresh) == 1 else fresh
        for t, new in zip(outs, fresh):
            if new and isinstance(t, Tensor):
                storage = t.untyped_storage()
                key = id(storage)
                if key not in self.seen:
                    self.seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._free, key, storage.nbytes())
                    self.peak = max(self.peak, self.live)
        return out


def peak_memory(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Peak bytes of the tensors ``fn(*args, **kwargs)`` allocates and holds at once (chapter 08).

    On CUDA inputs this is ``torch.cuda.max_memory_allocated`` above what was allocated before
    the call. Elsewhere every tensor storage created during the call is counted while it is alive
    (like ``tracemalloc``, for tensors); on ``meta`` tensors this gives the same count with no
    arithmetic done, which is how large sizes are measured in seconds. Runs under ``no_grad``.
    """
    tensors = [a for a in args if isinstance(a, Tensor)]
    if tensors and tensors[0].is_cuda:
        device = tensors[0].device
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            result = fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        del result
        return torch.cuda.max_memory_allocated(device) - base
    counter = _TensorBytes()
    with torch.no_grad(), counter:
        result = fn(*args, **kwargs)
    del result
    return counter.peak
