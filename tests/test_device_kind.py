"""Every public attnkit function and module runs with its inputs on another device, without a GPU.

A tensor made on the CPU inside a function whose inputs live on a GPU is a bug that no CPU test
sees: there both are on the CPU. The ``meta`` device catches it here: meta tensors have shapes
and no values, and torch refuses to mix them with CPU tensors in most operations, as it refuses
to mix CUDA and CPU. Not always: ``meta @ cpu`` gives a meta tensor where ``cuda @ cpu`` raises, so
each call also runs under :class:`device_mixing.SameDevice`, which refuses any aten operation
whose tensors are on different devices (but for what CUDA allows too: 0-dimensional CPU
scalars, copies, CPU index tensors). Each call gets its inputs (and its module) on ``meta``
and must return meta tensors.

What this cannot see: code that reads values (``.item()``, ``if tensor:``, ``tolist()``: meta
has none, so such calls are left out or given CPU data where their contract reads values, e.g.
``padding_mask``'s lengths), CPU-only numerics (a result that differs on a GPU in its last bits),
byte counts and timings (the CPU allocator's and clock's, not the GPU's), and the few
operations torch lets mix devices anyway (0-dimensional CPU tensors broadcast onto any device).
Those are for the device check (tools/device_check.py) on a real GPU.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

import attnkit as ak
from device_mixing import DeviceMixing, SameDevice

META = torch.device("meta")
B, H, n, m, E, Dh = 2, 4, 5, 7, 16, 4


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device=META, dtype=dtype)


def _modules():
    return {
        "MultiHeadAttention": lambda: ak.MultiHeadAttention(E, H),
        "MultiHeadAttention (GQA, fused)": lambda: ak.MultiHeadAttention(E, H, num_kv_heads=2,
                                                                         attention=ak.fused_attention),
        "MultiHeadAttention (ALiBi)": lambda: ak.MultiHeadAttention(
            E, H, attention=partial(ak.alibi_attention, slopes=ak.alibi_slopes(H))),  # slopes made on the CPU
    }


q, k, v = meta(B, H, n, Dh), meta(B, H, m, Dh), meta(B, H, m, Dh)
mask = meta(B, 1, n, m, dtype=torch.bool)
x, ctx = meta(B, n, E), meta(B, m, E)

CALLS = {
    "softmax": lambda: ak.softmax(meta(B, n, m)),
    "scaled_dot_product_attention": lambda: ak.scaled_dot_product_attention(q, k, v, mask)[0],
    "scaled_dot_product_attention, CPU mask": lambda: ak.scaled_dot_product_attention(
        q, k, v, torch.ones(n, m, dtype=torch.bool))[0],
    "split_heads / merge_heads": lambda: ak.merge_heads(ak.split_heads(x, H)),
    "causal_mask": lambda: ak.causal_mask(n, device=META),
    "sliding_window_mask": lambda: ak.sliding_window_mask(n, 2, device=META),
    "causal & sliding": lambda: ak.causal_mask(n, device=META) & ak.sliding_window_mask(n, 2, device=META),
    "context_padding_mask": lambda: ak.context_padding_mask(meta(B, m, dtype=torch.bool), n),
    "sinusoidal_frequencies": lambda: ak.sinusoidal_frequencies(E, device=META),
    "sinusoidal_positional_encoding": lambda: ak.sinusoidal_positional_encoding(n, E, device=META),
    "position_shift_matrix": lambda: ak.position_shift_matrix(3, E, device=META),
    "apply_rotary_embedding": lambda: ak.apply_rotary_embedding(q),
    "apply_rotary_embedding, CPU positions": lambda: ak.apply_rotary_embedding(q, torch.arange(n)),
    "alibi_slopes": lambda: ak.alibi_slopes(H, device=META),
    "alibi_bias": lambda: ak.alibi_bias(ak.alibi_slopes(H, device=META), n, m),
    "alibi_attention, CPU slopes": lambda: ak.alibi_attention(q, k, v, mask, slopes=ak.alibi_slopes(H))[0],
    "fused_attention": lambda: ak.fused_attention(q, k, v)[0],
    "fused_attention, mask": lambda: ak.fused_attention(q, k, v, mask)[0],
    "fused_attention, CPU mask": lambda: ak.fused_attention(q, k, v, torch.ones(n, m, dtype=torch.bool))[0],
    "tiled_attention": lambda: ak.tiled_attention(q, k, v, mask, block_q=2, block_k=3),
    "tiled_attention, causal": lambda: ak.tiled_attention(q, k, v, causal=True, block_q=2, block_k=3),
    "online_softmax_update": lambda: ak.online_softmax_update(
        meta(B, n, 1), meta(B, n, 1), meta(B, n, Dh), meta(B, n, m), meta(B, m, Dh))[2],
    "append_to_cache": lambda: ak.append_to_cache((k, v), q, q)[0],
    "cached_attention": lambda: ak.cached_attention(q, q, q, (k, v))[0],
    "cached_attention, first step": lambda: ak.cached_attention(q, q, q, None)[0],
    "elu_feature_map": lambda: ak.elu_feature_map(q),
    "linear_attention": lambda: ak.linear_attention(q, k, v),
    "causal_linear_attention": lambda: ak.causal_linear_attention(q, q, q, chunk=2),
    "SelfAttention": lambda: ak.SelfAttention(E, H).to(META)(x, meta(B, n, n, dtype=torch.bool))[0],
    "CrossAttention": lambda: ak.CrossAttention(E, H).to(META)(x, ctx)[0],
    "SinusoidalPositionalEncoding": lambda: ak.SinusoidalPositionalEncoding(16, E).to(META)(x),
    "LearnedPositionalEmbedding": lambda: ak.LearnedPositionalEmbedding(16, E).to(META)(x),
    "FeedForward": lambda: ak.FeedForward(E, 32).to(META)(x),
    "TransformerEncoderBlock": lambda: ak.TransformerEncoderBlock(E, H, 32).to(META)(x)[0],
    "TransformerEncoderBlock, pre-norm, CPU mask": lambda: ak.TransformerEncoderBlock(E, H, 32, norm_first=True).to(
        META)(x, ak.causal_mask(n))[0],
    "TransformerDecoderBlock": lambda: ak.TransformerDecoderBlock(E, H, 32).to(META)(
        x, ctx, ak.causal_mask(n, device=META), meta(B, 1, m, dtype=torch.bool))[0],
    "Transformer": lambda: ak.Transformer(11, 13, E, H, 32, 1).to(META)(
        meta(B, m, dtype=torch.long), meta(B, n, dtype=torch.long))[0],
    "peak_memory": lambda: torch.tensor(ak.peak_memory(ak.scaled_dot_product_attention, q, k, v), device=META),
}
CALLS.update({name: (lambda make=make: make().to(META)(x, x, x, meta(B, n, n, dtype=torch.bool))[0]) for name, make in _modules().items()})


@pytest.mark.parametrize("name", list(CALLS))
def test_runs_on_the_inputs_device(name):
    with SameDevice():  # also what torch lets pass on meta (meta @ cpu), as CUDA would not
        out = CALLS[name]()
    assert out.device == META, f"{name} returned a tensor on {out.device}, its inputs were on meta"


def test_every_public_name_is_called_or_said_why_not():
    """A new public function or module gets a line above, or a reason here."""
    reads_values = {"padding_mask"}  # its lengths are checked against max_len: values, which meta has not
    no_tensors = {"kv_cache_bytes_per_token", "default_device", "ShapeError", "AttentionFn", "AttentionOptions"}
    checks = {"check_tensors", "check_mask", "check_inputs", "check_embeddings"}  # run inside every call above
    twins = {"to_torch_multihead", "to_torch_encoder_layer", "to_torch_decoder_layer"}  # torch's layers, the oracles
    chapter_09 = {"POSITIONS", "INITS"} | {name for name in ak.__all__  # i27's capstone: its own tests
                                          if getattr(getattr(ak, name), "__module__", "") in ("attnkit.gpt",
                                                                                              "attnkit.induction")}
    called = " ".join(CALLS) + " " + " ".join(_modules())
    missing = [name for name in ak.__all__ if name not in called
               and name not in reads_values | no_tensors | checks | twins | chapter_09]
    assert not missing, f"not run on another device: {missing}"


def test_the_mode_catches_what_meta_lets_pass():
    """The mistake of issue 26's chapter 06: a matrix made on the CPU times rows on the GPU."""
    rows, shift = meta(4, E), ak.position_shift_matrix(1, E)  # the matrix on the CPU
    assert (rows @ shift.T).device == META  # torch alone lets it pass on meta
    with SameDevice(), pytest.raises(DeviceMixing, match="cpu, meta"):
        rows @ shift.T
    with SameDevice():
        rows @ shift.to(META).T
        rows * torch.tensor(2.0)  # a CPU scalar: allowed on CUDA too


def test_padding_mask_follows_its_lengths():
    lengths = torch.tensor([3, 5])
    assert ak.padding_mask(lengths, n).device == lengths.device
