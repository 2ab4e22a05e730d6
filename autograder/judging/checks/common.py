"""What the checks of several chapters share (no chapter's checks import another chapter's, issue 20): attention's
classic mistakes (:mod:`mistakes`) in the words of chapters 01 and 04, ``ATTENTION_MISTAKES``; chapter 02's
multi-head layer as the judge computes it (``random_weights``, ``reference`` / ``expected``, ``head_mistakes`` and
``mha_mistakes``, and ``expect_layer``, which compares a layer's answer with all of them: chapters 02, 03 and 04); the
checks of a mask on the student's own weights (``expect_masked``, ``fitted_scale``). All run in the judge.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnkit import MultiHeadAttention as RefMHA
from attnkit import merge_heads as ref_merge
from attnkit import softmax as ref_softmax
from attnkit import split_heads as ref_split
from attnkit.torch_twins import to_torch_multihead
from autograder.judging.checks import mistakes
from autograder.judging.checks.compare import close, expect_close, expect_tensor
from autograder.judging.checks.verdicts import CheckFailed
from autograder.judging.checks.trial import Trial

UNIFORM_ROWS = ("a query whose keys are all masked gets equal weights on every key instead of zeros: filling with a "
                "large negative number (such as torch.finfo(dtype).min) instead of -inf makes such a row uniform. The "
                "contract asks for zero weights and a zero output row there (fill with -inf and turn the NaN rows "
                "into 0, or zero the rows that have no allowed key)")

# attention's classic mistakes in the words of chapters 01 and 04, tried in this order (the first one equalled is named)
ATTENTION_MISTAKES = {
    mistakes.NOT_SCALED: "the scores are not scaled: divide Q K^T by sqrt(d_k)",
    mistakes.BY_D_K: "the scores are divided by d_k; the scale is 1/sqrt(d_k)",
    mistakes.TIMES_SQRT_D_K: "the scores are multiplied by sqrt(d_k); the scale is 1/sqrt(d_k): divide Q K^T by "
                             "sqrt(d_k)",
    mistakes.BY_SQRT_D_V: "the scores are scaled by sqrt(d_v); the scale uses the key width d_k",
    mistakes.OVER_QUERIES: "the softmax runs over the queries (dim=-2); it must run over the keys (dim=-1)",
    mistakes.WEIGHTS_ON_KEYS: "the weights multiply the keys; they must multiply the values",
    mistakes.MASK_INVERTED: "the mask polarity is inverted: True means 'may attend', so fill where the mask is False",
    mistakes.MASK_AFTER: "the mask is applied after the softmax: masked weights are zero but the rest no longer sum "
                         "to 1. Fill the scores with -inf before the softmax",
    mistakes.FINITE_FILL: UNIFORM_ROWS,
}


NO_TRANSPOSE_SPLIT = ("it reshapes to (B, H, n, Dh) without the transpose, which mixes positions into heads: "
                      "view as (B, n, H, Dh) first, then transpose(1, 2)")
INTERLEAVED_SPLIT = ("the heads are interleaved (head h gets features h, h + H, ...): view the last axis as "
                     "(H, Dh), not (Dh, H), so head h gets the contiguous block h*Dh:(h+1)*Dh")
NO_TRANSPOSE_MERGE = ("it reshapes (B, H, n, Dh) to (B, n, H*Dh) without the transpose, which mixes positions "
                      "into features: transpose(1, 2) back to (B, n, H, Dh) first, then reshape")
REVERSED_HEADS = ("the heads are concatenated in reverse order (head H-1 first): merge head h into features "
                  "h*Dh:(h+1)*Dh, in head order, with transpose(1, 2) then reshape")
NAN_ROWS = ("a query whose keys are all masked gets NaN: the softmax of a row of -inf is 0/0. The contract "
            "asks for zero weights there (so that row's output is out_proj of zeros): use the given "
            "scaled_dot_product_attention, or turn the NaN rows of your softmax into 0")
MASK_AXES = ("a (B, n, m) mask lines up with the wrong axes of the (B, H, n, m) scores: add a head axis with "
             "mask.unsqueeze(1) so the same mask applies to every head")


# -- MultiHeadAttention ---------------------------------------------------------------------------

Params = dict[str, Tensor]


def random_weights(t: Trial, e: int, bias: bool = True) -> Params:
    """Weights for a MultiHeadAttention(e, H), drawn from the trial (also loaded by chapters 03 and 04)."""
    p = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        p[f"{name}.weight"] = t.randn(e, e, scale=1.0 / math.sqrt(e))
        if bias:
            p[f"{name}.bias"] = t.randn(e, scale=0.5)
    return p


def _lin(p: Params, name: str, x: Tensor) -> Tensor:
    y = x.double() @ p[f"{name}.weight"].double().T
    return y + p[f"{name}.bias"].double() if f"{name}.bias" in p else y


def _per_head(mask: Tensor | None) -> Tensor | None:
    """``mask`` broadcastable to (B, H, n, m): a 3-D (B, n, m) one applies to every head."""
    return mask.unsqueeze(1) if mask is not None and mask.dim() == 3 else mask


def _heads(p: Params, qp: Tensor, kp: Tensor, vp: Tensor, h: int, mask: Tensor | None = None, *,
           scale: float | None = None, out_proj: bool = True,
           split: Callable[[Tensor, int], Tensor] = ref_split,
           merge: Callable[[Tensor], Tensor] = ref_merge) -> tuple[Tensor, Tensor]:
    """Multi-head attention from projected inputs, with switches that reproduce the layer's classic mistakes."""
    q, k, v = split(qp, h), split(kp, h), split(vp, h)  # (B, H, n|m, Dh)
    s = q @ k.transpose(-2, -1) / math.sqrt(scale or q.shape[-1])  # (B, H, n, m)
    if mask is not None:
        s = s.masked_fill(~_per_head(mask), float("-inf"))
    w = ref_softmax(s)
    o = merge(w @ v)  # (B, n, E)
    return (_lin(p, "out_proj", o) if out_proj else o), w


def reference(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _heads(p, _lin(p, "q_proj", q), _lin(p, "k_proj", k), _lin(p, "v_proj", v), h, mask)


def expected(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The right (output, weights): torch.nn.MultiheadAttention holding ``p``, in float64, or the formula where a query
    has no allowed key (torch gives NaN; the contract asks for zero weights, so that row's output is out_proj(0))."""
    (b, n, e), m = q.shape, k.shape[1]
    full = None if mask is None else _per_head(mask).expand(b, h, n, m)
    if full is not None and not bool(full.any(-1).all()):
        return reference(p, q, k, v, h, mask)
    ref = RefMHA(e, h, bias="q_proj.bias" in p).double()
    ref.load_state_dict({name: x.double() for name, x in p.items()})
    hidden = None if full is None else ~full.reshape(-1, n, m)  # torch's bool mask: True = may NOT attend
    with torch.no_grad():
        return to_torch_multihead(ref)(q.double(), k.double(), v.double(), attn_mask=hidden, average_attn_weights=False)


def head_mistakes(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> mistakes.Pairs:
    """message -> (output, weights) of the layer when every head makes one of attention's classic mistakes
    (unscaled scores, the mask ignored, inverted, applied after the softmax, filled with a finite number)."""
    e = q.shape[-1]
    heads = mistakes.wrong_attention(*(ref_split(_lin(p, f"{c}_proj", x), h) for c, x in zip("qkv", (q, k, v))),
                                     _per_head(mask))
    messages = {
        mistakes.MASK_IGNORED: "the mask is ignored: pass it to the attention of every head (True = may attend)",
        mistakes.MASK_INVERTED: "the mask polarity is inverted: True means 'may attend', so fill the scores where the "
                                "mask is False",
        mistakes.MASK_AFTER: "the mask is applied after the softmax: mask the scores with -inf before the softmax",
        mistakes.FINITE_FILL: UNIFORM_ROWS,
        **({mistakes.NOT_SCALED: f"the scores are not scaled: divide each head's Q K^T by sqrt(head_dim) = "
                                 f"sqrt({e // h})"} if e > h else {}),
    }
    return {msg: (_lin(p, "out_proj", ref_merge(o)), w) for msg, (o, w) in mistakes.named(heads, messages).items()}


def mha_mistakes(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None = None) -> mistakes.Pairs:
    """message -> (output, weights) a classic mistake would produce on these inputs and weights."""
    e = q.shape[-1]
    Q, K, V = _lin(p, "q_proj", q), _lin(p, "k_proj", k), _lin(p, "v_proj", v)
    kv, vk = _lin(p, "k_proj", v), _lin(p, "v_proj", k)  # k_proj(value), v_proj(key)

    def run(keys: Tensor = K, values: Tensor = V, **kw: Any) -> tuple[Tensor, Tensor]:
        return _heads(p, Q, keys, values, h, mask, **kw)

    def bad_split(x: Tensor, heads: int) -> Tensor:  # (B, n, E) read as (B, H, n, Dh): no transpose
        return x.reshape(x.shape[0], heads, x.shape[1], x.shape[2] // heads)

    def bad_merge(x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[2], x.shape[1] * x.shape[3])

    out: mistakes.Pairs = {}
    if h > 1:
        out[f"the scores are divided by sqrt(embed_dim) = sqrt({e}); each head is a {e // h}-wide attention, so "
            f"divide by sqrt(head_dim) = sqrt({e // h})"] = run(scale=e)
    out["the output projection out_proj is missing: apply it to the concatenated heads"] = run(out_proj=False)
    out |= head_mistakes(p, q, k, v, h, mask)
    if h > 1:
        out["splitting the heads: " + NO_TRANSPOSE_SPLIT] = run(split=bad_split)
        out["splitting the heads: " + INTERLEAVED_SPLIT] = run(
            split=lambda x, heads: x.unflatten(-1, (-1, heads)).permute(0, 3, 1, 2))
        out["merging the heads: " + NO_TRANSPOSE_MERGE] = run(merge=bad_merge)
        out["merging the heads: " + REVERSED_HEADS] = run(merge=lambda x: ref_merge(x.flip(1)))
        out["the heads are split and merged with reshape but no transpose, which mixes positions into heads: "
            "view as (B, n, H, Dh), then transpose(1, 2)"] = run(split=bad_split, merge=bad_merge)
    wrong = "a projection is applied to the wrong input: "
    out[wrong + "k_proj and v_proj are swapped (keys must go through k_proj, values through v_proj)"] = run(vk, kv)
    out[wrong + "the key and value tensors are swapped (k_proj(value), v_proj(key)); keys are k_proj(key), "
        "values v_proj(value)"] = run(kv, vk)
    out[wrong + "the keys are projected with q_proj; use k_proj"] = run(_lin(p, "q_proj", k))
    out[wrong + "the values are projected with k_proj; use v_proj"] = run(values=kv)
    out[wrong + "the values go through k_proj(key) instead of v_proj(value)"] = run(values=K)
    out[wrong + "the keys come from the value tensor (k_proj(value)); keys are k_proj(key)"] = run(kv)
    out[wrong + "the values come from the key tensor (v_proj(key)); values are v_proj(value)"] = run(values=vk)
    if q.shape == k.shape:
        out[wrong + "the keys come from the query tensor (k_proj(query)); keys are k_proj(key)"] = run(
            _lin(p, "k_proj", q))
        out[wrong + "the values come from the query tensor; values are v_proj(value)"] = run(
            values=_lin(p, "v_proj", q))
    if mask is not None and mask.dim() == 3 and mask.shape[0] == h:
        out[MASK_AXES] = _heads(p, Q, K, V, h, mask.unsqueeze(0))  # example b's mask lands on head b
    return out


def expect_layer(out, w, p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None, layer: str,
                 weights_name: str = "weights", also: mistakes.Pairs | None = None) -> None:
    """A layer's ``(out, w)`` must be MultiHeadAttention's with weights ``p`` on (q, k, v, mask): no NaN, shapes
    (B, n, E) and (B, H, n, m), then the values, naming the layer's classic mistakes and those in ``also``."""
    (b, n, e), m = q.shape, k.shape[1]
    if mask is not None:
        mistakes.expect_no_nan({weights_name: w, "output": out}, f" of {layer}", f": {NAN_ROWS}")
    expect_tensor(out, (b, n, e), f"the output of {layer}")
    expect_tensor(w, (b, h, n, m), f"the {weights_name} of {layer}")
    exp_out, exp_w = expected(p, q, k, v, h, mask)
    wrong = mha_mistakes(p, q, k, v, h, mask) | (also or {})
    expect_close(out, exp_out, f"the output of {layer}", mistakes.outputs(wrong))
    expect_close(w, exp_w, f"the {weights_name} of {layer}", mistakes.weights(wrong))


# -- the mask, as a property of the student's own weights -------------------------------------------


def renormalised(w0: Tensor, full: Tensor) -> Tensor:
    """``w0`` (weights computed without a mask) as masking the scores with ``full`` (True = may attend) before the
    softmax makes them, whatever the scores: the allowed keys' weights scaled to sum 1, a row with no allowed key 0."""
    kept = w0.double() * full
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp_min(1e-300), 0.0)


def expect_masked(w: Tensor, w0: Tensor, full: Tensor, what: str, wrong_masks: dict[str, Tensor] | None = None,
                  name: str = "the mask") -> None:
    """Weights ``w`` under the mask ``full`` must be the student's own unmasked weights ``w0`` :func:`renormalised`:
    the mask's property alone (a wrong scale or projection costs the checks of the values). Names the mask's classic
    mistakes and ``wrong_masks`` (message -> the mask a mistake applies); ``name``: the mask's name in the messages."""
    expect_distributions(w0, what.replace("weights", "weights without the mask", 1))
    right = renormalised(w0, full)
    expect_close(w, right, what, {
        **{message: renormalised(w0, wrong) for message, wrong in (wrong_masks or {}).items()},
        ATTENTION_MISTAKES[mistakes.MASK_INVERTED]: renormalised(w0, ~full),
        ATTENTION_MISTAKES[mistakes.MASK_AFTER]: w0.double() * full,
        f"{name} is ignored: the keys where it is False must get weight 0 (True = may attend)": w0.double(),
        UNIFORM_ROWS: torch.where(full.any(-1, keepdim=True), right, 1.0 / w.shape[-1])})


def expect_distributions(w: Tensor, what: str) -> None:
    """Each row of ``w`` sums to 1 (or is all zero: a query with no allowed key), and not every row is zero: what
    a check of the mask or of a fully masked row takes for granted (weights of zeros hide nothing)."""
    sums = w.double().sum(-1)
    ones, zeros = (sums - 1).abs() < 1e-4, sums.abs() < 1e-6
    if not bool((ones | zeros).all()) or not bool(ones.any()):
        raise CheckFailed(f"{what}: the weights of a query that may see some key must sum to 1 over the keys (a "
                          "softmax along the keys, dim=-1)")


def hidden_keys_changed(value: Tensor, full: Tensor) -> Tensor | None:
    """``value`` (B, m, ...) with the rows of the keys that ``full`` (B, ..., n, m) hides from every query changed,
    or None when it hides none: the output must not change (a hidden key must not reach it)."""
    hidden = ~full.flatten(1, -2).any(1)  # (B, m)
    return value + 10.0 * hidden.reshape(*hidden.shape, *[1] * (value.dim() - 2)) if bool(hidden.any()) else None


def fitted_scale(scores: Tensor, w: Tensor, allowed: Tensor | None = None) -> float | None:
    """The student's own scale: ``c`` with ``w = softmax(c * scores)`` on the ``allowed`` keys, fitted by least squares
    on the log-weights, row by row, for checks of other properties (a wrong scale costs the check of the values
    alone). None when the weights do not follow the scores (c <= 0.01: uniform weights, say): the right scale holds."""
    s = scores.double().expand(w.shape)
    keep = (w.double() > 1e-12) & (True if allowed is None else allowed.expand(w.shape))
    n = keep.sum(-1, keepdim=True).clamp_min(1)
    lw = torch.where(keep, w.double().clamp_min(1e-300).log(), 0.0)
    x = torch.where(keep, s - (s * keep).sum(-1, keepdim=True) / n, 0.0)
    y = torch.where(keep, lw - lw.sum(-1, keepdim=True) / n, 0.0)
    c = float((x * y).sum() / (x * x).sum().clamp_min(1e-300))
    return c if math.isfinite(c) and c > 0.01 else None


def scaled_reference(p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, mask: Tensor | None,
                     w: Tensor) -> tuple[Tensor, Tensor]:
    """MultiHeadAttention's ``(output, weights)`` with weights ``p`` at the scale the student's per-head weights ``w``
    show (:func:`fitted_scale`): the reference for a check of the mask or of causality, not of the scale."""
    Q, K, V = _lin(p, "q_proj", q), _lin(p, "k_proj", k), _lin(p, "v_proj", v)
    full = None if mask is None else _per_head(mask).expand(q.shape[0], h, q.shape[1], k.shape[1])
    c = fitted_scale(ref_split(Q, h) @ ref_split(K, h).transpose(-2, -1), w, full)
    return _heads(p, Q, K, V, h, mask, scale=None if c is None else 1.0 / c ** 2)


# -- anchors: a property judged relative to the student's own answer is paid only when that answer follows its inputs

NOT_ATTENTION = ("the weights do not follow the scores: they must be softmax(c * Q K^T) over the keys, for a scale "
                 "c > 0 (1/sqrt(d_k)); weights that ignore the queries or the keys (uniform over the allowed keys, "
                 "say) earn nothing here, because this check compares your answer with your own answer on related "
                 "inputs and so first needs it to be attention of its inputs")
NOT_LAYER = ("it is not attention of its inputs: with the weights loaded into your module, the weights must be "
             "softmax(c * Q K^T) of its projections (for a scale c > 0) and the output out_proj of the weights times "
             "the projected values, or one of the layer's classic mistakes that the value checks name; an answer that "
             "ignores its inputs (uniform weights, say) earns nothing here, because this check compares your answer "
             "with your own answer on related inputs")


def attention_scale(scores: Tensor, w: Tensor, allowed: Tensor | None = None, atol: float = 1e-4,
                    scale: tuple[float, int] | None = None) -> tuple[float, int] | None:
    """``(c, dim)`` when ``w`` is ``softmax(c * scores)`` along ``dim`` over the ``allowed`` keys (zeros elsewhere, and
    in a row with no allowed key) for the student's own scale ``c > 0`` (:func:`fitted_scale`); ``dim`` is -1 (the
    keys) or -2 (the queries: the named mistake a value check charges). None when ``w`` does not follow the scores:
    the anchor of a check that judges ``w`` against the student's own answer. ``scale``: a ``(c, dim)`` found on
    other inputs, tested instead of fitting one (scores so large that the weights are one-hot show no scale)."""
    if not isinstance(w, Tensor) or not w.is_floating_point() or w.dim() < 2 \
            or tuple(torch.broadcast_shapes(scores.shape, w.shape)) != tuple(w.shape):
        return None
    s = scores.double().expand(w.shape)
    full = torch.ones_like(s, dtype=torch.bool) if allowed is None else allowed.expand(w.shape)
    for dim in (-1, -2) if scale is None else (scale[1],):
        c = scale[0] if scale is not None else fitted_scale(s.transpose(-1, dim), w.transpose(-1, dim),
                                                            full.transpose(-1, dim))
        if c is not None and close(w, ref_softmax((c * s).masked_fill(~full, float("-inf")), dim=dim), atol, atol):
            return c, dim
    return None


def follows_scores(scores: Tensor, w: Tensor, allowed: Tensor | None = None, atol: float = 1e-4) -> bool:
    """Whether ``w`` is softmax attention of ``scores`` at the student's own scale (:func:`attention_scale`)."""
    return attention_scale(scores, w, allowed, atol) is not None


def expect_attention_of(q: Tensor, k: Tensor, v: Tensor, out: Tensor, w: Tensor, what: str,
                        allowed: Tensor | None = None, atol: float = 1e-4,
                        scale: tuple[float, int] | None = None) -> tuple[float, int]:
    """The anchor of a check of attention relative to the student's own answer: the weights ``w`` follow the scores
    ``q k^T`` at the student's own scale (:func:`follows_scores`) and the output is ``w @ v``. A wrong scale passes
    (it costs the check of the values alone); weights or an output that ignore their inputs do not. Returns the
    student's ``(c, dim)`` (:func:`attention_scale`; ``scale``: one found on other inputs, tested instead)."""
    found = attention_scale(q @ k.transpose(-2, -1), w, allowed, atol, scale)
    if found is None:
        raise CheckFailed(f"{what}: {NOT_ATTENTION}")
    if not close(out, w.double() @ v.double(), atol, atol):
        raise CheckFailed(f"{what}: the output is not the weights times the values (weights @ value); an output that "
                          "does not follow its inputs earns nothing here")
    return found


def expect_layer_of(out, w, p: Params, q: Tensor, k: Tensor, v: Tensor, h: int, what: str,
                    also: mistakes.Pairs | None = None) -> None:
    """The anchor of a layer's check relative to the student's own answer (the mask, a permutation): the unmasked
    ``(out, w)`` of MultiHeadAttention with weights ``p`` on (q, k, v) at the student's own scale
    (:func:`scaled_reference`), or one of the layer's named mistakes (:func:`mha_mistakes`, ``also``), which the
    value checks charge. Ignoring the inputs (uniform weights, an output of zeros) passes neither."""
    if not isinstance(out, Tensor) or not isinstance(w, Tensor):
        raise CheckFailed(f"{what}: {NOT_LAYER}")
    right = scaled_reference(p, q, k, v, h, None, w)
    candidates = [right, *mha_mistakes(p, q, k, v, h).values(), *(also or {}).values()]
    if not any(close(out, o) and close(w, ww) for o, ww in candidates):
        raise CheckFailed(f"{what}: {NOT_LAYER}")


def follows_keys(keys: Tensor, w: Tensor, allowed: Tensor | None = None, atol: float = 1e-4) -> bool:
    """Whether each row of ``w`` (..., n, m) is ``softmax(q_i . keys^T)`` over the ``allowed`` keys (zeros elsewhere)
    for some query ``q_i`` of its own, and no row with two allowed keys or more is uniform: the row-space test, for
    weights whose queries the judge cannot rebuild (a block's cross-attention reads the output of the sublayers before
    it, wherever the student put the norms). ``keys`` (..., m, d), broadcastable against ``w``'s leading axes. A row's
    log-weights must lie in the span of the keys' columns and the constant: a test with teeth where more keys are
    allowed than d + 1, and the uniform rows (a query ignored, or keys ignored) are refused everywhere."""
    if not isinstance(w, Tensor) or not w.is_floating_point() or w.dim() < 2 or keys.shape[-2] != w.shape[-1]:
        return False
    wd = w.double()
    full = torch.ones_like(wd, dtype=torch.bool) if allowed is None else allowed.expand(wd.shape)
    if not bool(torch.isfinite(wd).all()) or bool((wd[~full].abs() > atol).any()):
        return False
    keep = full & (wd > 1e-12)
    k = keys.double().unsqueeze(-3).expand(*wd.shape, keys.shape[-1])  # (..., n, m, d): row i's keys
    count = keep.sum(-1, keepdim=True).clamp_min(1)
    kc = torch.where(keep[..., None], k - (k * keep[..., None]).sum(-2, keepdim=True) / count[..., None], 0.0)
    lw = torch.where(keep, wd.clamp_min(1e-300).log(), 0.0)
    yc = torch.where(keep, lw - lw.sum(-1, keepdim=True) / count, 0.0)
    beta = torch.linalg.lstsq(kc, yc[..., None], driver="gelsd").solution  # (..., n, d, 1): the row's c * q_i
    rebuilt = ref_softmax((kc @ beta)[..., 0].masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    if not close(wd * keep, rebuilt * (keep.sum(-1, keepdim=True) > 0), atol, atol):
        return False
    on = torch.where(full, wd, float("nan"))
    spread = on.nan_to_num(-1.0).amax(-1) - on.nan_to_num(2.0).amin(-1)  # max - min over the allowed keys
    return not bool(((full.sum(-1) >= 2) & (spread <= 1e-7)).any())
