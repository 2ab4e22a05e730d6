"""What attnkit's inference forward launches, counted on the CPU, and the packed projections that cut it.

On a GPU most calls of the benchmark (``attnkit.bench``) are small next to their launch cost, so a
forward's speed against torch's fused inference paths is set by how many kernels it launches and
how much Python runs between them. Neither can be timed here; the kernels can be counted: every
aten operation that is not a view (a view launches nothing) is one kernel on a GPU. The counts
below are pinned, so an extra launch in the eval forward fails here before it costs a GPU run.
torch's own fused calls count as one op at this level (their kernels run below the dispatcher),
so the comparison with torch is in benchmarks/README.md, not here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import (CrossAttention, MultiHeadAttention, SelfAttention, TransformerDecoderBlock,
                     TransformerEncoderBlock, fused_attention, scaled_dot_product_attention)
from attnkit.transformer import _Dropout


class OpLog(TorchDispatchMode):
    """Every aten op run inside the mode: ``kernels`` are those that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.kernels: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        if not any(r.alias_info is not None for r in func._schema.returns):
            self.kernels.append(name)
        return func(*args, **(kwargs or {}))


def ops_of(fn, *args) -> OpLog:
    with torch.no_grad(), OpLog() as log:
        fn(*args)
    return log


E, H, F_DIM = 16, 4, 32

# eval forward under no_grad, no mask: (kernels, most ops in all). The kernels: one product for q, k, v
# (self-attention), the fused attention, the output projection; the block adds two residual adds,
# two layer norms, the feed-forward network's two products and its relu (torch's fused layer has
# the relu inside its first product: 9 kernels against our 10).
PINNED = {
    "sdpa": (1, 1),
    "mha": (3, 14),
    "self_attention": (3, 14),
    "encoder": (10, 27),
    "cross_attention": (4, 20),  # q, then k and v in one product
}


def _calls():
    torch.manual_seed(0)
    x, ctx = torch.randn(2, 5, E), torch.randn(2, 7, E)
    q = torch.randn(2, H, 5, E // H)
    mha = MultiHeadAttention(E, H, attention=fused_attention).eval()
    sa = SelfAttention(E, H, attention=fused_attention).eval()
    block = TransformerEncoderBlock(E, H, F_DIM, attention=fused_attention).eval()
    cross = CrossAttention(E, H, attention=fused_attention).eval()
    return {
        "sdpa": (lambda: fused_attention(q, q, q)),
        "mha": (lambda: mha(x, x, x)),
        "self_attention": (lambda: sa(x)),
        "encoder": (lambda: block(x)),
        "cross_attention": (lambda: cross(x, ctx)),
    }


@pytest.mark.parametrize("name", list(PINNED))
def test_eval_forward_launches_no_more_than_pinned(name):
    log = ops_of(_calls()[name])
    kernels, ops = PINNED[name]
    assert len(log.kernels) == kernels, (
        f"{name}: the eval forward now runs {len(log.kernels)} kernels (pinned {kernels}): {log.kernels}. "
        "Each is one launch on a GPU, where these calls are launch-bound (benchmarks/README.md)")
    assert len(log.ops) <= ops, f"{name}: {len(log.ops)} aten ops (at most {ops}): {log.ops}"


def test_eval_forward_with_grad_enabled_takes_the_three_products():
    """With autograd recording, every projection is its own nn.Linear (gradients reach each parameter)."""
    mha = MultiHeadAttention(E, H, attention=fused_attention).eval()
    x = torch.randn(2, 5, E)
    with OpLog() as log:
        mha(x, x, x)
    assert log.kernels.count("addmm") == 4


def _reference(mha: MultiHeadAttention, query, key, value, mask=None):
    """The textbook computation, one linear layer at a time, from the module's own parameters."""
    H, G = mha.num_heads, mha.num_kv_heads
    heads = lambda t, h: t.unflatten(-1, (h, -1)).transpose(1, 2)  # noqa: E731
    q = heads(F.linear(query, mha.q_proj.weight, mha.q_proj.bias), H)
    k = heads(F.linear(key, mha.k_proj.weight, mha.k_proj.bias), G).repeat_interleave(H // G, 1)
    v = heads(F.linear(value, mha.v_proj.weight, mha.v_proj.bias), G).repeat_interleave(H // G, 1)
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    return F.linear(out.transpose(1, 2).flatten(-2), mha.out_proj.weight, mha.out_proj.bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("attention", [scaled_dot_product_attention, fused_attention])
@pytest.mark.parametrize("inputs", ["self", "cross", "three"])
def test_packed_projection_computes_the_textbook_output(bias, num_kv_heads, attention, inputs):
    torch.manual_seed(1)
    mha = MultiHeadAttention(E, H, bias, num_kv_heads=num_kv_heads, attention=attention).double().eval()
    x, ctx, other = (torch.randn(2, n, E, dtype=torch.float64) for n in (5, 7, 7))
    query, key, value = {"self": (x, x, x), "cross": (x, ctx, ctx), "three": (x, ctx, other)}[inputs]
    mask = torch.rand(2, 5, key.shape[1]) > 0.3
    for m in (None, mask):
        want = _reference(mha, query, key, value, m)
        with torch.no_grad():
            fast, _ = mha(query, key, value, m)
        slow, _ = mha(query, key, value, m)  # grad enabled: three nn.Linear calls
        torch.testing.assert_close(fast, want)
        torch.testing.assert_close(slow.detach(), want)


def _packed_launches(mha: MultiHeadAttention, x: torch.Tensor) -> int:
    """Matrix products of a no-grad self-attention forward: 2 when packed, 4 when not."""
    kernels = ops_of(lambda: mha(x, x, x)).kernels
    return kernels.count("addmm") + kernels.count("mm")


def test_weights_changed_every_way_are_seen():
    """Whatever is done to the weights, the output is the textbook one: packed when the parameters still
    lie where they were packed, the three products when they were replaced."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(E, H).eval()
    x = torch.randn(2, 5, E)

    def check(packed: bool, what: str) -> None:
        with torch.no_grad():
            out, _ = mha(x, x, x)
            torch.testing.assert_close(out, _reference(mha, x, x, x), msg=what)
        assert (_packed_launches(mha, x) == 2) == packed, what

    check(True, "fresh")
    with torch.no_grad():
        mha.k_proj.weight.mul_(2.0)  # in place: an optimizer step
    check(True, "in place")
    mha.v_proj.weight.data.add_(1.0)  # in place through .data (no version bump)
    check(True, "in place through .data")
    mha.load_state_dict(MultiHeadAttention(E, H).state_dict())  # copies in place
    check(True, "load_state_dict")
    mha.q_proj.weight.data = torch.randn(E, E)  # a new tensor under the same Parameter
    check(False, ".data replaced")
    mha.to(torch.float64).to(torch.float32)  # .to() packs again
    x = x.float()
    check(True, "after .to()")
    mha.k_proj.bias = nn.Parameter(torch.randn(E))  # a new Parameter
    check(False, "Parameter replaced")
    mha.v_proj = nn.Linear(E, E)  # a new layer
    check(False, "layer replaced")
    mha.float()
    check(True, "after .float()")
    mha.q_proj.bias = None  # one bias of three: never packed, the others kept
    check(False, "one bias removed")
    mha.double().float()
    x = x.float()
    check(False, "one bias removed, after .to()")
    mha.k_proj.bias = mha.v_proj.bias = None
    mha.double().float()
    check(True, "no biases, after .to()")
    with torch.no_grad():
        mha.q_proj.weight.t_()  # same address, other strides
    check(False, "transposed in place")


def test_hooks_and_replaced_forwards_are_never_skipped():
    """A forward hook on a projection fires, and a patched forward runs, under no_grad too."""
    torch.manual_seed(4)
    mha = MultiHeadAttention(E, H).eval()
    x = torch.randn(2, 5, E)
    seen = []
    handle = mha.v_proj.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        mha(x, x, x)
    assert seen == [(2, 5, E)] and _packed_launches(mha, x) == 4
    handle.remove()
    assert _packed_launches(mha, x) == 2
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)  # a global hook
    try:
        assert _packed_launches(mha, x) == 4
    finally:
        handle.remove()
    mha.q_proj.forward = lambda t: torch.zeros(*t.shape[:-1], E)  # patched on the instance
    with torch.no_grad():
        out, weights = mha(x, x, x)
    assert torch.allclose(weights, torch.full_like(weights, 1 / 5))  # zero queries: uniform weights


def test_training_reaches_every_parameter_and_state_survives():
    torch.manual_seed(3)
    mha = MultiHeadAttention(E, H, attention=fused_attention)
    opt = torch.optim.Adam(mha.parameters(), lr=1e-2)
    x = torch.randn(2, 5, E)
    for _ in range(3):
        opt.zero_grad()
        mha(x, x, x)[0].square().mean().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.parameters())
        opt.step()
    mha.eval()
    assert _packed_launches(mha, x) == 2  # Adam updates in place: still packed
    with torch.no_grad():
        torch.testing.assert_close(mha(x, x, x)[0], _reference(mha, x, x, x))
    clone = copy.deepcopy(mha)  # its own tensors: correct, three products until .to()
    with torch.no_grad():
        torch.testing.assert_close(clone(x, x, x)[0], _reference(mha, x, x, x))
    state = {k: v.clone() for k, v in mha.state_dict().items()}
    assert set(state) == {f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")} | {"out_proj.weight",
                                                                                          "out_proj.bias"}
    assert state["q_proj.weight"].shape == (E, E)


def test_packed_on_meta_and_in_a_decoder_block():
    """``.to("meta")`` packs again on the new device; self- and cross-attention run there."""
    block = TransformerDecoderBlock(E, H, F_DIM, attention=fused_attention).to("meta").eval()
    x, memory = torch.randn(2, 5, E, device="meta"), torch.randn(2, 7, E, device="meta")
    with torch.no_grad():
        out, _, _ = block(x, memory)
    assert out.device.type == "meta" and out.shape == (2, 5, E)
    assert block.self_attn.attn._packed.weight.device.type == "meta"


def test_dropout_that_drops_nothing_costs_nothing():
    drop = _Dropout(0.5)
    assert isinstance(drop, nn.Dropout) and drop.p == 0.5
    x = torch.ones(1000)
    assert (drop(x) == 0).any()  # training mode: drops
    drop.eval()
    assert drop(x) is x
    assert _Dropout(0.0)(x) is x
    assert ops_of(lambda: drop(x)).ops == []
