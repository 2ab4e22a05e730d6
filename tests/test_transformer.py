"""attnkit.transformer (chapter 07) against torch.nn.TransformerEncoderLayer / DecoderLayer and the model's properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit import (CrossAttention, FeedForward, SelfAttention, MultiHeadAttention, Transformer, TransformerDecoderBlock, TransformerEncoderBlock,
                     causal_mask, padding_mask, to_torch_decoder_layer, to_torch_encoder_layer)

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def torch_encoder_twin(block: TransformerEncoderBlock, num_heads: int) -> nn.TransformerEncoderLayer:
    assert block.self_attn.attn.num_heads == num_heads
    return to_torch_encoder_layer(block).eval()


def torch_decoder_twin(block: TransformerDecoderBlock, num_heads: int) -> nn.TransformerDecoderLayer:
    assert block.self_attn.attn.num_heads == num_heads
    return to_torch_decoder_layer(block).eval()


def randomise_norms(module: nn.Module) -> None:
    """LayerNorms start as the identity affine map; give them random weights so the test sees them."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)


def test_feed_forward_is_linear_relu_linear():
    torch.manual_seed(0)
    ff = FeedForward(6, 10)
    x = torch.randn(2, 3, 6)
    expected = torch.relu(x @ ff.linear1.weight.T + ff.linear1.bias) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), expected)
    assert ff.linear1.weight.shape == (10, 6) and ff.linear2.weight.shape == (6, 10)
    # position-wise: each position on its own
    torch.testing.assert_close(ff(x[:, 1:2]), ff(x)[:, 1:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("B, n, E, H, F", [(2, 5, 8, 2, 16), (1, 1, 12, 3, 8), (3, 7, 16, 4, 32)])
def test_encoder_block_equals_torch(B, n, E, H, F, norm_first, dtype):
    torch.manual_seed(1)
    block = TransformerEncoderBlock(E, H, F, norm_first=norm_first).to(dtype)
    randomise_norms(block)
    twin = torch_encoder_twin(block, H)
    x = torch.randn(B, n, E, dtype=dtype)
    out, w = block(x)
    assert out.shape == (B, n, E) and w.shape == (B, H, n, n) and out.dtype == dtype
    torch.testing.assert_close(out, twin(x), **TOL[dtype])
    lengths = torch.randint(1, n + 1, (B,))
    keep = padding_mask(lengths, n)  # (B, 1, n)
    # torch's masks are True = NOT allowed: invert ours
    ref = twin(x, src_key_padding_mask=~keep[:, 0])
    torch.testing.assert_close(block(x, keep)[0], ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("B, n, m, E, H, F", [(2, 5, 3, 8, 2, 16), (1, 2, 9, 12, 3, 8), (3, 6, 6, 16, 4, 32)])
def test_decoder_block_equals_torch(B, n, m, E, H, F, norm_first, dtype):
    torch.manual_seed(2)
    block = TransformerDecoderBlock(E, H, F, norm_first=norm_first).to(dtype)
    randomise_norms(block)
    twin = torch_decoder_twin(block, H)
    x, memory = torch.randn(B, n, E, dtype=dtype), torch.randn(B, m, E, dtype=dtype)
    out, ws, wc = block(x, memory)
    assert out.shape == (B, n, E) and ws.shape == (B, H, n, n) and wc.shape == (B, H, n, m)
    torch.testing.assert_close(out, twin(x, memory), **TOL[dtype])
    lengths = torch.randint(1, m + 1, (B,))
    keep = padding_mask(lengths, m)  # (B, 1, m)
    out, ws, wc = block(x, memory, causal_mask(n), keep)
    ref = twin(x, memory, tgt_mask=~causal_mask(n), memory_key_padding_mask=~keep[:, 0])  # torch: True = NOT allowed
    torch.testing.assert_close(out, ref, **TOL[dtype])
    assert (ws.triu(1) == 0).all()
    assert (wc.masked_select(~keep[:, None].expand_as(wc)) == 0).all()


def test_blocks_have_the_contract_attributes_and_keep_no_state():
    enc = TransformerEncoderBlock(8, 2, 16)
    dec = TransformerDecoderBlock(8, 2, 16, norm_first=True)
    # built from chapter 03's SelfAttention and chapter 05's CrossAttention
    assert isinstance(enc.self_attn, SelfAttention) and isinstance(enc.feed_forward, FeedForward)
    assert isinstance(dec.self_attn, SelfAttention) and isinstance(dec.cross_attn, CrossAttention)
    assert isinstance(dec.cross_attn.attn, MultiHeadAttention) and isinstance(dec.norm3, nn.LayerNorm)
    before = set(vars(dec))
    dec(torch.randn(1, 3, 8), torch.randn(1, 4, 8))
    assert set(vars(dec)) == before


def test_decoder_cross_attention_reads_the_memory():
    """Output position i changes when the memory changes; with norm_first, too."""
    torch.manual_seed(3)
    for norm_first in (False, True):
        dec = TransformerDecoderBlock(8, 2, 16, norm_first=norm_first)
        x, memory = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
        a = dec(x, memory)[0]
        b = dec(x, memory + torch.randn_like(memory))[0]
        assert (a - b).abs().amax(-1).min() > 1e-4
        perm = torch.randperm(5)
        torch.testing.assert_close(dec(x, memory[:, perm])[0], a)  # the memory is a set


def test_attention_is_linear_in_the_values_and_the_feed_forward_is_not():
    """Attention mixes values: with the queries and keys fixed, scaling and adding values scales and adds the
    output (no bias); the feed-forward network's ReLU breaks this, which is why a block needs it."""
    torch.manual_seed(4)
    attn = MultiHeadAttention(8, 2, bias=False)
    x, v1, v2 = torch.randn(1, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    out1, w1 = attn(x, x, v1)
    out2, w2 = attn(x, x, v2)
    out, w = attn(x, x, 2 * v1 - 3 * v2)
    torch.testing.assert_close(w, w1)
    torch.testing.assert_close(w1, w2)  # the weights depend on queries and keys only
    torch.testing.assert_close(out, 2 * out1 - 3 * out2)
    ff = FeedForward(8, 16)
    assert not torch.allclose(ff(2 * x) - ff(torch.zeros_like(x)), 2 * (ff(x) - ff(torch.zeros_like(x))))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_shapes_causality_and_padding(norm_first):
    torch.manual_seed(5)
    model = Transformer(7, 9, embed_dim=16, num_heads=2, ff_dim=32, num_layers=2, norm_first=norm_first)
    src, tgt = torch.randint(0, 7, (3, 6)), torch.randint(0, 9, (3, 4))
    logits, cross = model(src, tgt)
    assert logits.shape == (3, 4, 9) and len(cross) == 2 and cross[0].shape == (3, 2, 4, 6)
    # changing target token 3 leaves the logits at positions 0..2 unchanged (causal decoder)
    tgt2 = tgt.clone()
    tgt2[:, 3] = (tgt[:, 3] + 1) % 9
    torch.testing.assert_close(model(src, tgt2)[0][:, :3], logits[:, :3])
    # padded source tokens are invisible
    lengths = torch.tensor([6, 4, 2])
    keep = padding_mask(lengths, 6)
    src2 = torch.where(keep[:, 0], src, torch.randint(0, 7, src.shape))
    torch.testing.assert_close(model(src2, tgt, keep)[0], model(src, tgt, keep)[0])
    assert model.state_dict().keys().isdisjoint({"positions.table"})  # the sinusoidal table is not a weight


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), steps=st.integers(1, 6))
def test_greedy_decode_agrees_with_teacher_forcing_on_its_own_output(seed, steps):
    torch.manual_seed(seed)
    model = Transformer(5, 6, embed_dim=16, num_heads=2, ff_dim=16, num_layers=1).eval()
    src = torch.randint(0, 5, (2, 4))
    out = model.greedy_decode(src, bos_id=5, steps=steps)
    assert out.shape == (2, steps)
    inp = torch.cat([torch.full((2, 1), 5), out[:, :-1]], dim=1)
    torch.testing.assert_close(model(src, inp)[0].argmax(-1), out)


def test_a_short_training_run_learns_to_copy():
    """Sanity check of the whole model: 150 steps of copying 4 digits cut the loss to a fraction (chapter 07 trains fully)."""
    torch.manual_seed(6)
    model = Transformer(10, 11, embed_dim=32, num_heads=2, ff_dim=64, num_layers=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds synchronisation on a busy 2-core machine
    try:
        train_steps(model, opt, losses)
    finally:
        torch.set_num_threads(threads)
    assert sum(losses[-10:]) / 10 < 0.3 * losses[0], (losses[0], losses[-10:])


def train_steps(model, opt, losses):
    for _ in range(150):
        src = torch.randint(0, 10, (64, 4))
        logits, _ = model(src, torch.cat([torch.full((64, 1), 10), src[:, :-1]], 1))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), src.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())


def test_blocks_pass_their_dropout_to_attention_and_their_twins():
    enc = TransformerEncoderBlock(8, 2, 16, dropout=0.25)
    dec = TransformerDecoderBlock(8, 2, 16, dropout=0.25)
    assert enc.self_attn.attn.dropout == dec.self_attn.attn.dropout == dec.cross_attn.attn.dropout == 0.25
    assert to_torch_encoder_layer(enc).self_attn.dropout == 0.25
    assert to_torch_decoder_layer(dec).multihead_attn.dropout == 0.25
    x = torch.randn(2, 4, 8)
    torch.manual_seed(0)
    a = enc(x)[1]
    assert (a == 0).any()  # train mode: some weights dropped
    enc.eval()
    torch.testing.assert_close(enc(x)[1].sum(-1), torch.ones(2, 2, 4))  # eval: none dropped
