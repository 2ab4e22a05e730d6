"""Graded checks for exercise 07_transformer_block (its requirements: ``STATED_REQUIREMENTS``). The copied-weights
twin: the expected values come from :mod:`attnkit.transformer` (equal to torch's layers in both norm orders,
``tests/test_transformer.py``) with fresh weights, layer norms included so that a misplaced norm shows; the mask and
dropout checks test the masks and the dropout alone, so a misplaced norm costs the norm checks alone; they compare the
block with itself, so they first anchor its attention weights to its inputs (``_anchor``, issue 34)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit import FeedForward as RefFeedForward
from attnkit import TransformerDecoderBlock as RefDecoder
from attnkit import TransformerEncoderBlock as RefEncoder
from attnkit import causal_mask
from autograder.judging.checks import (CheckFailed, Obj, StudentError, Suite, Trial, choice, close, expect_close,
                                       expect_tensor, label, mistakes, number, requirements, twin)
from autograder.judging.checks.common import expect_masked, follows_keys, follows_scores, hidden_keys_changed

SUITE = Suite("07_transformer_block")
_FF, _FF_DROP, _DROP = "test_feed_forward", "test_feed_forward_dropout", "test_blocks_dropout"
_ENC_POST, _ENC_PRE, _ENC_MASK = (f"test_encoder_block_{c}" for c in ("post_norm", "pre_norm", "mask"))
_DEC_POST, _DEC_PRE, _DEC_MASKS = (f"test_decoder_block_{c}" for c in ("post_norm", "pre_norm", "masks"))
AFTER_RELU = 'apply the dropout after the relu, on the hidden units'
BEFORE_RESIDUAL = "apply dropout to each sublayer's output before adding the residual"
NO_NAN = 'a query row with no allowed key (an example that is all padding) gets zero weights, never nan'
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'ff: linear2(relu(linear1(x)))': (_FF, 'linear', 'linear1 widens from embed_dim', (_FF_DROP,)),
    'ff: dropout after the ReLU, not on the output': (_FF_DROP, "linear2's output", AFTER_RELU),
    'ff: dropout after the ReLU, not on the input': (_FF_DROP, 'input x', AFTER_RELU),
    'ff: dropout applied in training': (_FF_DROP, 'never applied', 'drops in training'),
    'ff: no dropout in eval mode': (_FF_DROP, 'eval mode too', 'identity after .eval()'),
    'encoder: post-norm by default': (_ENC_POST, 'wrong place',
        'post-norm (norm_first=false, the original paper): x = norm(x + sublayer(x))'),
    'encoder: pre-norm with norm_first': (_ENC_PRE, 'wrong place',
        'pre-norm (norm_first=true): x = x + sublayer(norm(x))'),
    'encoder: mask reaches the self-attention': (_ENC_MASK, 'mask is ignored',
        'forward(x, mask=none) returns (output, weights): output (b, n, e), self-attention weights'),
    'encoder: all-padding example gives no NaN': (_ENC_MASK, 'NaN', NO_NAN),
    'encoder: dropout on the sublayer output before the residual': (_DROP, 'without dropout', BEFORE_RESIDUAL),
    'decoder: cross-attention keys from memory': (_DEC_POST, 'keys come from x',
        'whose keys and values come from memory', (_DEC_MASKS, _DROP)),
    'decoder: memory_mask to the cross-attention': (_DEC_MASKS, 'memory_mask is ignored',
        'keys and values come from memory (with memory_mask)'),
    'decoder: self_mask to the self-attention': (_DEC_MASKS, 'self_mask is ignored',
        'masked self-attention over x (with self_mask)'),
    'decoder: empty memory gives no NaN': (_DEC_MASKS, 'NaN', NO_NAN),
    'decoder: dropout on the sublayer output before the residual': (_DROP, 'without dropout', BEFORE_RESIDUAL),
    'blocks: no dropout in eval mode': (_DROP, 'eval mode', 'dropout acts in training only'),
})
FF, ENC, DEC = "FeedForward", "TransformerEncoderBlock", "TransformerDecoderBlock"
REFERENCE = {FF: RefFeedForward, ENC: RefEncoder, DEC: RefDecoder}
SUBLAYERS = {ENC: [("self-attention", "self_attn"), ("feed-forward network", "feed_forward")],
             DEC: [("self-attention", "self_attn"), ("cross-attention", "cross_attn"),
                   ("feed-forward network", "feed_forward")]}

LINEAR_FF = ("the feed-forward network is linear: without the ReLU between linear1 and linear2 the two layers "
             "collapse into one matrix; apply torch.relu to linear1's output")
WRONG_ORDER_POST = ("a norm is in the wrong place for norm_first=False: this is the pre-norm order x + sublayer(norm(x)). "
                    "Post-norm (the default, as in the paper) normalises after the residual: x = norm(x + sublayer(x))")
WRONG_ORDER_PRE = ("a norm is in the wrong place for norm_first=True: this is the post-norm order norm(x + sublayer(x)). "
                   "Pre-norm normalises the sublayer's input and adds the un-normalised x: x = x + sublayer(norm(x))")
RESIDUAL_NORMED = ("the residual adds the normalised x{where}: in pre-norm the skip path carries x itself, "
                   "x = x + sublayer(norm(x)); keep x and put norm(x) in a new variable (h = norm(x))")
NORM_ON_OUTPUT = ("the norm is applied to the sublayer's output before the residual (x + norm(sublayer(x))); "
                  "post-norm normalises the sum: norm(x + sublayer(x))")
OWN_ENC = "each sublayer has its own norm (norm1 for the self-attention, norm2 for the feed-forward): use each one once"
OWN_DEC = ("each sublayer has its own norm (norm1 for the self-attention, norm2 for the cross-attention, norm3 for the "
           "feed-forward): use each one once")
CROSS_CALL = "cross_attn(x, memory, memory, memory_mask)"
MASKS_SWAPPED = ("self_mask and memory_mask are swapped: self_mask (causal) goes to the self-attention, memory_mask "
                 "(padding of memory) to the cross-attention")
SAME_LENGTH = ("cross keys from x", "cross queries from memory")  # mistakes computed only where memory is as long as x
# the mistakes of each block beyond the norm order and a missing residual: (message, the switches of _block that
# compute it), tried in this order
BLOCK_MISTAKES = {
    ENC: [("both residual connections are missing: each sublayer's input must be added to its output",
           {"residual": (False, False)}),
          (LINEAR_FF, {"act": "none"}),
          ("the feed-forward uses GELU; the block (like torch's default and the paper) uses ReLU", {"act": "gelu"}),
          ("norm1 and norm2 are swapped: norm1 belongs to the self-attention sublayer, norm2 to the feed-forward",
           {"norms": (2, 1)}),
          ("norm1 is used for both sublayers: " + OWN_ENC, {"norms": (1, 1)}),
          ("norm2 is used for both sublayers: " + OWN_ENC, {"norms": (2, 2)})],
    DEC: [(LINEAR_FF, {"act": "none"}),
          ("the cross-attention uses self_attn's weights: the second sublayer must call cross_attn",
           {"bug": "cross uses self_attn"}),
          ("the cross-attention's queries come from the block's input; they must come from the output of the "
           "self-attention sublayer", {"bug": "cross queries from the block input"}),
          ("the cross-attention attends to x itself: its keys and values must come from memory, " + CROSS_CALL,
           {"bug": "cross attends to itself"}),
          ("the cross-attention's keys come from x: keys and values must both come from memory, " + CROSS_CALL,
           {"bug": "cross keys from x"}),
          ("the cross-attention's queries come from memory and its keys and values from x: the queries come from x, "
           "the keys and values from memory, " + CROSS_CALL, {"bug": "cross queries from memory"}),
          ("norm1 is used twice (for the self- and the cross-attention): " + OWN_DEC, {"norms": (1, 1, 3)}),
          ("norm2 is used twice (for the cross-attention and the feed-forward): " + OWN_DEC,
           {"norms": (1, 2, 2)}),
          ("norm1 is used for every sublayer: " + OWN_DEC, {"norms": (1, 1, 1)})],
}


def _ff(ref: RefFeedForward, x: Tensor, act: str = "relu") -> Tensor:
    return ref.linear2({"relu": torch.relu, "none": lambda v: v, "gelu": F.gelu}[act](ref.linear1(x)))


def _block(ref: RefEncoder | RefDecoder, x: Tensor, memory: Tensor | None, pre: bool, residual=(True, True, True),
           act: str = "relu", bug: str = "", norms=(1, 2, 3), student: Obj | None = None) -> Tensor:
    """The encoder (``memory`` None) or decoder block ``ref`` on ``x``, without masks, each classic mistake a switch:
    ``residual`` and ``norms`` (the number of the norm it uses) per sublayer, ``act`` the feed-forward's activation,
    ``bug`` the rest. With ReLU the feed-forward is the ``student`` block's own submodule, run in the student's
    process: the block checks grade the block's wiring, and a wrong FeedForward costs only test_feed_forward."""
    def ffn(h: Tensor) -> Tensor:
        if act != "relu" or student is None:
            return _ff(ref.feed_forward, h, act)
        return expect_tensor(student.method("feed_forward", h), h.shape, "the output of the block's feed_forward")

    def cross(h: Tensor, x_in: Tensor) -> Tensor:
        q = (ref.norm2(x_in) if pre else x_in) if bug == "cross queries from the block input" else h
        qkv = {"cross attends to itself": (h, h, h), "cross keys from x": (h, h, memory),
               "cross queries from memory": (memory, h, h)}.get(bug, (q, memory, memory))
        return (ref.self_attn if bug == "cross uses self_attn" else ref.cross_attn).attn(*qkv)[0]

    subs = [lambda h, _: ref.self_attn.attn(h, h, h)[0], *([cross] if memory is not None else []), lambda h, _: ffn(h)]
    x_in = x
    for i, sub in enumerate(subs):  # sub(h, x_in) gets the (normed) input and the block's input
        norm = getattr(ref, f"norm{norms[i]}")
        if pre:
            h = norm(x)
            base = h if bug in ("residual of the normed x", f"residual of the normed x@{i}") else x
            x = base + sub(h, x_in) if residual[i] else sub(h, x_in)
        else:
            y = sub(x, x_in)
            x = (x + norm(y) if bug == "norm on the sublayer output" else norm(x + y)) if residual[i] else norm(y)
    return x


def _mistakes(name: str, pre: bool, run: Callable[..., Tensor], same_length: bool) -> dict[str, Tensor]:
    """message -> the output of block ``name`` making each classic mistake (``run(**switches)``: see ``_block``)."""
    subs = SUBLAYERS[name]
    out = {WRONG_ORDER_PRE if pre else WRONG_ORDER_POST: run(pre=not pre)}
    for i, (sub, attr) in enumerate(subs):
        out[f"the residual connection around the {sub} is missing: add its input back (x + {attr}(...))"] = run(
            residual=tuple(j != i for j in range(len(subs))))
    out |= {message: run(**switches) for message, switches in BLOCK_MISTAKES[name]
            if same_length or switches.get("bug") not in SAME_LENGTH}
    if not pre:
        out[NORM_ON_OUTPUT] = run(bug="norm on the sublayer output")
        return out
    out[RESIDUAL_NORMED.format(where="")] = run(bug="residual of the normed x")
    for i, (sub, _) in enumerate(subs):
        out[RESIDUAL_NORMED.format(where=f" around the {sub}")] = run(bug=f"residual of the normed x@{i}")
    return out


def _fresh(t: Trial, shapes: dict) -> dict[str, Tensor]:
    """Random weights for every parameter; layer norms far from the identity so their place matters."""
    return {k: 0.4 * t.randn(*s) + float(k.endswith("weight")) if k.startswith("norm") else
            t.randn(*s, scale=0.5 / max(1, s[-1]) ** 0.5 if len(s) > 1 else 0.2) for k, s in shapes.items()}


def _build(t: Trial, name: str, *args, **kwargs) -> tuple[Obj, torch.nn.Module]:
    """The copied-weights twin. attnkit builds its blocks from SelfAttention / CrossAttention
    (self_attn.attn.q_proj); the exercise's blocks hold a MultiHeadAttention directly (self_attn.q_proj)."""
    ref = REFERENCE[name](*args, **kwargs)
    obj, fresh = twin(t, name, *args, **kwargs, reference=ref, names=lambda k: k.replace("_attn.attn.", "_attn."),
                      draw=_fresh, hint=": use the attribute names of the exercise (self_attn, cross_attn, "
                      "feed_forward.linear1/linear2, norm1, norm2, norm3)")
    obj.weights = fresh
    return obj, ref.eval()


def _returns(obj: Obj, name: str, *args: Tensor | None, hint: str = "", empty: str = "") -> tuple:
    """The block's answer on ``args``: (output, weights), or (output, self_weights, cross_weights) from a decoder. An
    error it raises where x and memory differ in length ends with ``hint`` (which input goes where); ``empty``: the
    example that has no allowed key, where the output and the (last) weights must hold no NaN."""
    n, m = args[0].shape[1], (args[1] if name == DEC else args[0]).shape[1]
    try:
        value = obj(*args)
    except StudentError as err:
        if hint and n != m and not err.placeholder:
            raise CheckFailed(f"{err}, with x of length {n} and memory of length {m}: {hint}") from None
        raise
    shape = "(output, weights)" if name == ENC else "(output, self_weights, cross_weights)"
    if not isinstance(value, (tuple, list)) or len(value) != shape.count(",") + 1:
        got = f"a {type(value).__name__}" + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise CheckFailed(f"{name} should return {shape}, got {got}")
    if empty:
        mistakes.expect_no_nan({"output": value[0], "weights": value[-1]}, f" of {name} with {empty}", ": a query row "
                               "with no allowed key must get zero weights (softmax over a row of -inf is 0/0; replace "
                               "the NaN by zeros)")
    return tuple(value)


# -- anchors (issue 34): the mask and dropout checks compare the block with itself, so they first need its attention to
# be attention of its inputs; which input depends on where the norms are, and a misplaced norm costs the norm checks alone

NOT_SELF_ATTENTION = ("do not follow the scores: they must be softmax(c * Q K^T) of self_attn's projections of the "
                      "block's input (x in post-norm, norm1(x) in pre-norm), for a scale c > 0")
NOT_CROSS_ATTENTION = ("do not follow the keys: each query's weights must be softmax(c * q K^T) over the keys "
                       "K = cross_attn.k_proj(memory), for a scale c > 0")
COMPARES_ITSELF = ("; weights that ignore the queries or the keys (uniform over the allowed keys, say) earn nothing "
                   "here, because this check compares your block with itself on related inputs and so first needs its "
                   "attention to be attention of its inputs")


def _inputs(p: dict[str, Tensor], v: Tensor) -> list[Tensor]:
    """``v`` and each of the block's norms of ``v``: what a sublayer may read, wherever the student put the norms."""
    v = v.double()
    return [v, *(F.layer_norm(v, v.shape[-1:], p[f"norm{i}.weight"].double(), p[f"norm{i}.bias"].double())
                 for i in (1, 2, 3) if f"norm{i}.weight" in p)]


def _heads(p: dict[str, Tensor], proj: str, v: Tensor, h: int) -> Tensor:
    """``proj`` (such as self_attn.q_proj) of ``v`` (B, n, E), split into ``h`` heads: (B, H, n, E // H)."""
    y = v @ p[f"{proj}.weight"].double().T + (p[f"{proj}.bias"].double() if f"{proj}.bias" in p else 0.0)
    return y.unflatten(-1, (h, -1)).transpose(1, 2)


def _anchor(p: dict[str, Tensor], x: Tensor, memory: Tensor | None, ws: tuple, what: str,
            self_masks: tuple = (None,), cross_masks: tuple = (None,)) -> None:
    """The anchor of the checks that compare the block with itself: its self-attention weights ``ws[0]`` are
    softmax attention of self_attn's projections of x or of a norm of x (:func:`follows_scores`, at the student's own
    scale), and its cross-attention weights ``ws[1]`` pass the row-space test on the keys of memory (or of x: the
    cross-attention that attends to x is a mistake the value checks name): their queries depend on the sublayers
    before them. ``self_masks``/``cross_masks``: the masks each unmasked call may have applied (a swapped mask is a
    mistake the mask check names). ``p``: the weights loaded into the block."""
    w = ws[0]
    h = w.shape[1] if isinstance(w, Tensor) and w.dim() == 4 else 1
    if not any(follows_scores(_heads(p, "self_attn.q_proj", u, h) @ _heads(p, "self_attn.k_proj", u, h).transpose(
            -2, -1), w, allowed) for u in _inputs(p, x) for allowed in self_masks):
        raise CheckFailed(f"the self-attention weights{what} {NOT_SELF_ATTENTION}{COMPARES_ITSELF}")
    if memory is None:
        return
    sources = _inputs(p, memory) + _inputs(p, x)
    if not any(follows_keys(_heads(p, f"{attn}.k_proj", u, h), ws[1], allowed) for attn in ("cross_attn", "self_attn")
               for u in sources for allowed in cross_masks):
        raise CheckFailed(f"the cross-attention weights{what} {NOT_CROSS_ATTENTION}{COMPARES_ITSELF}")


def _anchor_output(obj: Obj, ref: RefEncoder | RefDecoder, name: str, out: Tensor, x: Tensor, memory: Tensor | None,
                   pre: bool, what: str) -> None:
    """The anchor of the output half of the mask checks (padding must not reach it): the block's unmasked output is
    the block's with these weights, or one of the classic mistakes the value checks name (a misplaced norm, say), so
    an output that computes nothing (x itself, which padding never reaches) earns nothing."""
    run = partial(_block, ref, x, memory, pre=pre, student=obj)
    with torch.no_grad():
        if close(out, run()) or any(close(out, wrong) for wrong in _mistakes(
                name, pre, run, memory is None or memory.shape[1] == x.shape[1]).values()):
            return
    raise CheckFailed(f"the output{what} without masks is not the block's output (nor a classic mistake the block "
                      "checks name): it must be the block's sublayers, each with its residual and norm, applied to x; "
                      "an output that ignores the attention (x itself, say) earns nothing here, because this check "
                      "compares your block's output with itself on related inputs")


@SUITE.check(_FF, parts=[FF])
def feed_forward(t: Trial) -> None:
    """linear1 (ff_dim, E), linear2 (E, ff_dim); output linear2(relu(linear1(x))) for any leading dimensions."""
    for e, hdim in [(8, 16), (6, 4)]:
        obj, ref = _build(t, FF, e, hdim)
        for shape in [(2, 5, e), (3, e), (2, 2, 3, e)]:
            x = t.randn(*shape, scale=1.5)
            with torch.no_grad():
                exp = _ff(ref, x)
                wrong = {LINEAR_FF: _ff(ref, x, "none"),
                         "the activation is GELU; the feed-forward uses ReLU": _ff(ref, x, "gelu"),
                         "a ReLU is also applied to the output of linear2: only linear1's output goes through it":
                             torch.relu(exp),
                         "the ReLU is applied to the input x; it belongs between the layers, on linear1's output: "
                         "linear2(relu(linear1(x)))": ref.linear2(ref.linear1(torch.relu(x)))}
            expect_close(obj(x), exp, f"FeedForward({e}, {hdim}) on x of shape {shape}", wrong)


BLOCK_CASES = {ENC: [(2, 5, 5, 8, 2, 16), (1, 3, 3, 12, 3, 8)],  # (B, n, m, E, H, ff_dim); m: memory's length
               DEC: [(2, 4, 4, 8, 2, 16), (2, 3, 6, 8, 2, 16), (1, 5, 2, 12, 3, 8)]}


def _check_block(t: Trial, name: str, pre: bool) -> None:
    kw = {"norm_first": True} if pre else {}
    for b, n, m, e, h, f in BLOCK_CASES[name]:
        obj, ref = _build(t, name, e, h, f, **kw)
        x = t.randn(b, n, e)
        args = (x,) if name == ENC else (x, t.randn(b, m, e))
        what = f"the output of {label(name, e, h, f, **kw)}" + (f" for x {(b, n, e)}, memory {(b, m, e)}" if
                                                                  name == DEC else "")
        out, *ws = _returns(obj, name, *args, hint=f"the cross-attention's keys and values must come from memory "
                            f"({CROSS_CALL})")
        if n != m and isinstance(ws[-1], Tensor) and tuple(ws[-1].shape) == (b, h, n, n):
            raise CheckFailed(f"the cross-attention weights have shape {(b, h, n, n)}: the cross-attention attends to "
                              f"x itself; its keys and values must come from memory, giving {(b, h, n, m)}")
        kinds = ["self-attention", "cross-attention"][:len(ws)]
        for kind, w, shape in zip(kinds, ws, [(b, h, n, n), (b, h, n, m)]):
            expect_tensor(w, shape, f"the {kind} weights returned by {name}")
        run = partial(_block, ref, x, args[1] if name == DEC else None, pre=pre, student=obj)
        with torch.no_grad():
            _, *exp_ws = ref(*args)
            exp_out, wrong = run(), _mistakes(name, pre, run, n == m)
        expect_close(out, exp_out, what, wrong)
        for kind, w, exp in zip(kinds, ws, exp_ws):
            expect_close(w, exp, f"the {kind} weights returned by {name}" + (
                " (self_attn must see the normalised input norm1(x) in pre-norm)" if pre and name == ENC else ""))


SUITE.add(_ENC_POST, [ENC], partial(_check_block, name=ENC, pre=False), "Post-norm (default) "
          "equals torch.nn.TransformerEncoderLayer with the same weights; returns (output, weights).")
SUITE.add(_ENC_PRE, [ENC], partial(_check_block, name=ENC, pre=True),
          "norm_first=True equals torch.nn.TransformerEncoderLayer(norm_first=True) with the same weights.")


def _padding(t: Trial, b: int, n: int, keep: int) -> Tensor:
    """A (B, 1, n) padding mask: example 0 keeps ``keep`` tokens, the last one none (every query row fully masked)."""
    lengths = torch.randint(1, n + 1, (b,), generator=t.gen)
    lengths[0], lengths[-1] = keep, 0
    return (torch.arange(n) < lengths[:, None])[:, None, :]


@SUITE.check(_ENC_MASK, parts=[ENC])
def encoder_mask(t: Trial) -> None:
    """A (B, 1, n) padding mask reaches the self-attention (both norm orders); padding never reaches a real token."""
    for kw in ({}, {"norm_first": True}):
        b, n, e, h, f = 3, 6, 8, 2, 16
        obj, ref = _build(t, ENC, e, h, f, **kw)
        x, mask = t.randn(b, n, e), _padding(t, b, n, n - 2)
        what = f" of {label(ENC, e, h, f, **kw)}"
        out0, w0 = _returns(obj, ENC, x)
        w0 = expect_tensor(w0, (b, h, n, n), f"the self-attention weights{what}")
        _anchor(obj.weights, x, None, (w0,), what)
        _anchor_output(obj, ref, ENC, out0, x, None, bool(kw), what)
        what += " with a padding mask"
        out, w = _returns(obj, ENC, x, mask, empty="an example that is all padding (mask all False)")
        full = mask[:, None].expand(b, h, n, n)
        expect_masked(expect_tensor(w, (b, h, n, n), f"the self-attention weights{what}"), w0, full,
                      f"the self-attention weights{what}")
        real = mask[:, 0, :]  # (B, n): the outputs of real tokens must not see the padding
        expect_close(_returns(obj, ENC, hidden_keys_changed(x, full), mask)[0][real], out[real], f"the output{what} at "
                     "the real tokens when only padded tokens change (a padded token must not reach them)")


SUITE.add(_DEC_POST, [DEC], partial(_check_block, name=DEC, pre=False),
          "Post-norm equals torch.nn.TransformerDecoderLayer with the same weights (n == m and n != m).")
SUITE.add(_DEC_PRE, [DEC], partial(_check_block, name=DEC, pre=True),
          "norm_first=True equals torch.nn.TransformerDecoderLayer(norm_first=True) with the same weights.")


@SUITE.check(_DEC_MASKS, parts=[DEC])
def decoder_masks(t: Trial) -> None:
    """self_mask reaches self-attention, memory_mask cross-attention; hidden positions never reach the output."""
    for kw in ({}, {"norm_first": True}):
        for b, n, m, e, h, f in [(3, 5, 5, 8, 2, 16), (2, 4, 7, 8, 4, 16)]:
            obj, ref = _build(t, DEC, e, h, f, **kw)
            x, memory, sm, mm = t.randn(b, n, e), t.randn(b, m, e), causal_mask(n), _padding(t, b, m, m - 1)
            what = f" of {label(DEC, e, h, f, **kw)} for x {(b, n, e)}, memory {(b, m, e)}"

            def run(x=x, memory=memory, sm=sm, mm=mm):
                empty = "" if sm is None or mm is None else \
                    "an example whose memory is all padding (memory_mask all False)"
                out, ws, wc = _returns(obj, DEC, x, memory, sm, mm, hint="memory_mask belongs to the cross-attention, "
                                       "self_mask to the self-attention", empty=empty)
                return out, expect_tensor(ws, (b, h, n, n), f"the self-attention weights{what}"), \
                    expect_tensor(wc, (b, h, n, m), f"the cross-attention weights{what}")

            out, ws, wc = run()
            self_full, memory_full = sm.expand(b, h, n, n), mm[:, None].expand(b, h, n, m)
            (_, ws0, _), (_, _, wc0) = run(sm=None), run(mm=None)  # each unmasked in turn
            swapped = (memory_full,) if n == m else ()  # masks swapped: the other mask reaches each unmasked call
            _anchor(obj.weights, x, memory, (ws0, wc0), what, (None, *swapped), (None, *(self_full,) * (n == m)))
            _anchor_output(obj, ref, DEC, run(sm=None, mm=None)[0], x, memory, bool(kw), what)
            expect_masked(ws, ws0, self_full, f"the self-attention weights{what} with a causal self_mask",
                          {MASKS_SWAPPED: mm[:, None].expand(b, h, n, n)} if n == m else {}, "self_mask")
            expect_masked(wc, wc0, memory_full, f"the cross-attention weights{what} with a memory "
                          "padding mask", name="memory_mask")
            expect_close(run(memory=hidden_keys_changed(memory, memory_full))[0], out, f"the output{what} when only "
                         "padded memory positions change (they must not reach the output)")
            future = torch.cat([x[:, :-1], x[:, -1:] + 10.0], dim=1)  # only the last position changes
            expect_close(run(x=future)[0][:, :-1], out[:, :-1], f"the output{what} at positions before the last when "
                         "only the last position of x changes (the causal self_mask hides the future)")


# -- dropout: in training only, where the exercise puts it ----------------------------------------------


def _train(obj: Obj, mode: bool) -> None:
    """``obj.train(mode)`` in the student's process (it returns the module itself, which is kept there)."""
    obj.trial.backend.call(obj.ref, [mode], {}, obj.trial.bans, attr="train", keep=True)


@SUITE.check(_FF_DROP, parts=[FF])
def feed_forward_dropout(t: Trial) -> None:
    """dropout=1.0 drops every hidden unit in training (output = linear2's bias) and does nothing in eval mode."""
    obj, ref = _build(t, FF, 6, 10, 1.0)
    x = t.randn(2, 3, 6, scale=1.5)
    with torch.no_grad():
        clean = _ff(ref, x)
        dropped = ref.linear2.bias.expand_as(clean).clone()
        there = "it belongs after the ReLU, on the hidden units: linear2(dropout(relu(linear1(x))))"
        wrong = {"the dropout is applied to linear2's output; " + there: torch.zeros_like(clean),
                 "the dropout is applied to the input x; " + there:
                     ref.linear2(torch.relu(ref.linear1.bias)).expand_as(clean),
                 "the dropout is never applied in training: create nn.Dropout(dropout) and call it after the ReLU "
                 "in forward": clean}
    _train(obj, True)
    expect_close(obj(x), dropped, "FeedForward(6, 10, dropout=1.0) in training mode (every hidden unit dropped)", wrong)
    _train(obj, False)
    expect_close(obj(x), clean, "FeedForward(6, 10, dropout=1.0) in eval mode (dropout must do nothing)", {
        "the dropout is applied in eval mode too: use nn.Dropout (or F.dropout(h, p, training=self.training)), "
        "which is the identity after model.eval()": dropped})


@SUITE.check(_DROP, parts=[ENC, DEC])
def blocks_dropout(t: Trial) -> None:
    """dropout=1.0 drops every sublayer's output in training; in eval mode the block equals one without dropout."""
    for kw in ({}, {"norm_first": True}):
        x, memory = t.randn(2, 4, 8), t.randn(2, 5, 8)
        for name, args in [(ENC, (x,)), (DEC, (x, memory))]:
            obj, ref = _build(t, name, 8, 2, 16, 1.0, **kw)
            plain = twin(t, name, 8, 2, 16, 0.0, **kw, reference=obj.weights)[0]
            clean, *ws = _returns(plain, name, *args)
            called = label(name, 8, 2, 16, dropout=1.0, **kw)
            _anchor(obj.weights, x, args[1] if name == DEC else None, ws, f" of {label(name, 8, 2, 16, **kw)}")
            with torch.no_grad():  # pre-norm: x itself; post-norm: the norms of x
                dropped = [x, torch.nn.Sequential(*(getattr(ref, f"norm{i}") for i in range(1, len(args) + 2)))(x)]
            _train(obj, True)
            out = expect_tensor(_returns(obj, name, *args)[0], tuple(x.shape), f"the output of {called}")
            if close(out, clean):
                raise CheckFailed(f"{called} ignores dropout in training: apply an nn.Dropout to each sublayer's "
                                  "output before adding the residual")
            if not any(close(out, d) for d in dropped):
                raise CheckFailed(f"the output of {called} in training mode is neither x nor the norms applied to x: "
                                  "with dropout=1.0 every sublayer's output (the cross-attention's too) is zeroed "
                                  "before the residual; is a sublayer's output added without dropout, or the dropout "
                                  "applied after the residual?")
            _train(obj, False)
            eval_msg = ("in eval mode (dropout must do nothing after model.eval(): use nn.Dropout, or F.dropout with "
                        "training=self.training)")
            expect_close(_returns(obj, name, *args)[0], clean, f"the output of {called} {eval_msg}",
                         {"dropout is applied in eval mode too: " + eval_msg: d for d in dropped})


# -- conceptual questions ------------------------------------------------------------------------------

E_Q, H_Q, F_Q = 512, 8, 2048
ATTN_Q = 4 * (E_Q * E_Q + E_Q)  # q, k, v, out projections with biases
FFN_Q = E_Q * F_Q + F_Q + F_Q * E_Q + E_Q
NORMS_Q = 2 * 2 * E_Q  # two LayerNorms, weight and bias each
TOTAL_Q = ATTN_Q + FFN_Q + NORMS_Q

SUITE.questions({
    "q_block_params": number(TOTAL_Q, "Parameters of an encoder block with E=512, H=8, ff_dim=2048 (biases and "
                             "LayerNorms included).", {
        "the two LayerNorms are missing: each has a weight and a bias of E entries": ATTN_Q + FFN_Q,
        "the biases are missing (every nn.Linear has one, and each LayerNorm has a weight and a bias)":
            4 * E_Q * E_Q + 2 * E_Q * F_Q,
        "the biases of the linear layers are missing": 4 * E_Q * E_Q + 2 * E_Q * F_Q + NORMS_Q,
        "the heads do not multiply the parameters: the H heads split the E-wide projections, each head using "
        "E/H of the columns": H_Q * ATTN_Q + FFN_Q + NORMS_Q,
        "the feed-forward network has two linear layers (E -> ff_dim and ff_dim -> E)":
            ATTN_Q + E_Q * F_Q + F_Q + NORMS_Q,
        "that counts three projections; multi-head attention has four (q, k, v and the output projection)":
            3 * (E_Q * E_Q + E_Q) + FFN_Q + NORMS_Q}, rel=1e-6),
    "q_prenorm_position": choice("input", "Where LayerNorm sits in a pre-norm block.", ["input", "sum", "output"], {
        "sum": "normalising the sum, norm(x + sublayer(x)), is post-norm (the original paper); pre-norm normalises the "
               "sublayer's input and leaves the residual path untouched: x + sublayer(norm(x))",
        "output": "x + norm(sublayer(x)) normalises the branch's output; pre-norm normalises its input: "
                  "x + sublayer(norm(x))"}),
    "q_ff_share": number(FFN_Q / TOTAL_Q, "The fraction of an encoder block's parameters in the feed-forward network "
                         "(E=512, ff_dim=2048).", {
        "that is the attention's share: the question asks for the feed-forward network's": ATTN_Q / TOTAL_Q,
        "that is the ratio of feed-forward to attention parameters, not the share of the whole block": FFN_Q / ATTN_Q,
        "that counts only one of the feed-forward's two linear layers":
            (E_Q * F_Q + F_Q) / (ATTN_Q + E_Q * F_Q + F_Q + NORMS_Q)},
        rel=1e-4),  # four significant digits; the slips q_block_params names (biases, LayerNorms left out) are 2.4e-4 away or more
})
