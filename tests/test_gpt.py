"""attnkit.gpt, .text, .ngram, .probes (chapter 09): the model against torch's own layers, the cache, sampling,
training, the text, the counting baseline, the head scores."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnkit import TransformerEncoderBlock, causal_mask
from attnkit.torch_twins import to_torch_encoder_layer
from attnkit.gpt import GPT, POSITIONS, generate, language_model_loss, sample_next, windowed_bits_per_char
from attnkit.ngram import ngram_bits_per_char
from attnkit.probes import previous_token_scores, repeated_random_tokens
from attnkit.text import CORPUS_PATH, CharTokenizer, shakespeare_corpus

V, E, H, L, N = 11, 16, 4, 2, 12
CORPUS_SHA = "b4cdae46936d3d0b"  # sha256 of the shipped text, train + validation


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread is faster than several, and much faster on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(position: str = "learned", **kwargs) -> GPT:
    torch.manual_seed(0)
    return GPT(V, E, H, L, ff_dim=24, max_len=32, position=position, **kwargs).double()


class TorchGPT(nn.Module):
    """The same model from torch's layers: nn.TransformerEncoderLayer(norm_first=True) with a causal mask."""

    def __init__(self, ours: GPT) -> None:
        super().__init__()
        self.ours = ours  # embeddings, final norm and read-out are plain torch modules already
        self.layers = nn.ModuleList(to_torch_encoder_layer(block) for block in ours.blocks)

    def forward(self, tokens: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
        x = self.ours.token_embed(tokens)
        if table is not None:
            x = x + table[: tokens.shape[1]]
        not_allowed = ~causal_mask(tokens.shape[1])  # torch's mask: True = may NOT attend
        for layer in self.layers:
            x = layer(x, src_mask=not_allowed)
        return nn.functional.linear(self.ours.norm(x), self.ours.token_embed.weight)  # the tied read-out


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_logits_equal_a_model_from_torch_layers(position, need_weights):
    model = tiny(position).eval()
    tokens = torch.randint(0, V, (3, N))
    if position == "learned":
        table = model.position_embed.weight
    elif position == "sinusoidal":
        from attnkit import sinusoidal_positional_encoding
        table = sinusoidal_positional_encoding(32, E, dtype=torch.float64)
    else:
        table = None
    ours, weights = model(tokens, need_weights=need_weights)
    torch.testing.assert_close(ours, TorchGPT(model).eval()(tokens, table))
    assert len(weights) == L
    assert all((w is None) != need_weights for w in weights)


def test_weights_are_tied_causal_and_blocks_are_attnkits():
    model = tiny()
    assert model.readout.weight is model.token_embed.weight
    assert all(isinstance(b, TransformerEncoderBlock) and b.norm_first for b in model.blocks)
    untied = GPT(V, E, H, L, tie_weights=False)
    assert untied.readout.weight is not untied.token_embed.weight
    _, weights = model(torch.randint(0, V, (2, N)), need_weights=True)
    for w in weights:
        assert w.shape == (2, H, N, N)
        assert torch.all(w.triu(1) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, H, N, dtype=w.dtype))


@pytest.mark.parametrize("position", POSITIONS)
def test_causal_future_tokens_do_not_change_past_logits(position):
    model = tiny(position).eval()
    a = torch.randint(0, V, (2, N))
    b = a.clone()
    b[:, 7:] = (b[:, 7:] + 1) % V
    torch.testing.assert_close(model(a)[0][:, :7], model(b)[0][:, :7])
    assert not torch.allclose(model(a)[0][:, 7:], model(b)[0][:, 7:])


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_alibi_logits_equal_the_blocks_with_alibi_attention(dropout):
    """position="alibi": nothing added to the embeddings, each head's scores get ALiBi's bias: the blocks run with
    chapter 06's alibi_attention give the same logits, on the fused path, with weights, and (the same random
    draws) with attention dropout in training."""
    from functools import partial
    from attnkit import alibi_attention, alibi_slopes, merge_heads, split_heads
    torch.manual_seed(0)
    model = GPT(V, E, H, L, ff_dim=24, max_len=32, position="alibi", dropout=dropout).double()
    assert model.position_embed is None
    tokens = torch.randint(0, V, (2, N))
    attend = partial(alibi_attention, slopes=alibi_slopes(H, dtype=torch.float64))

    def by_hand() -> torch.Tensor:
        x = model.dropout(model.token_embed(tokens))
        for block in model.blocks:
            a, h = block.self_attn.attn, block.norm1(x)
            q, k, v = (split_heads(p(h), H) for p in (a.q_proj, a.k_proj, a.v_proj))
            out, w = attend(q, k, v, causal_mask(N))
            if model.training and a.dropout:
                out = torch.nn.functional.dropout(w, a.dropout) @ v
            x = x + block.dropout1(a.out_proj(merge_heads(out)))
            x = x + block.dropout2(block.feed_forward(block.norm2(x)))
        return model.readout(model.norm(x))

    model.eval()
    for need_weights in (False, True):
        torch.testing.assert_close(model(tokens, need_weights=need_weights)[0], by_hand())
    if dropout:
        model.train()
        torch.manual_seed(3)
        ours = model(tokens)[0]
        torch.manual_seed(3)
        torch.testing.assert_close(ours, by_hand())


def test_rope_logits_equal_explicit_rotary_attention():
    """With RoPE, the layer equals the block with rotated queries and keys written out by hand."""
    from attnkit import apply_rotary_embedding, merge_heads, scaled_dot_product_attention, split_heads
    model = tiny("rope").eval()
    tokens = torch.randint(0, V, (2, N))
    x = model.token_embed(tokens)
    for block in model.blocks:
        a, h = block.self_attn.attn, block.norm1(x)
        q, k, v = (split_heads(p(h), H) for p in (a.q_proj, a.k_proj, a.v_proj))
        out, _ = scaled_dot_product_attention(apply_rotary_embedding(q), apply_rotary_embedding(k), v, causal_mask(N))
        x = x + a.out_proj(merge_heads(out))
        x = x + block.feed_forward(block.norm2(x))
    torch.testing.assert_close(model(tokens)[0], model.readout(model.norm(x)))


@pytest.mark.parametrize("position", POSITIONS)
def test_cached_decode_equals_the_full_forward(position):
    """Every scheme, ALiBi's bias included: a prompt then one token at a time through the cache."""
    model = tiny(position).eval()
    tokens = torch.randint(0, V, (2, N))
    full, _ = model(tokens)
    first, cache = model.decode(tokens[:, :5])                  # a prompt of 5 in one go
    steps = [first]
    for t in range(5, N):
        logits, cache = model.decode(tokens[:, t:t + 1], cache)  # then one token at a time
        steps.append(logits)
    assert cache[0][0].shape == (2, H, N, E // H)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("position", ["learned", "rope"])
@pytest.mark.parametrize("top_k", [None, 3])
def test_cached_and_uncached_generation_give_the_same_tokens(position, top_k):
    model = tiny(position)
    prompt = torch.randint(0, V, (2, 4))
    runs = [generate(model, prompt, 15, temperature=1.3, top_k=top_k, generator=torch.Generator().manual_seed(5),
                     use_cache=c) for c in (True, False)]
    assert runs[0].shape == (2, 19) and torch.equal(runs[0][:, :4], prompt)
    assert torch.equal(runs[0], runs[1])
    assert model.training  # the mode is restored
    one = generate(model, prompt[0], 3, temperature=0)
    assert one.shape == (7,)


def test_the_cache_is_used_each_step_feeds_one_token(monkeypatch):
    model = tiny()
    seen = []
    original = model.decode
    monkeypatch.setattr(model, "decode", lambda t, c=None: (seen.append(t.shape[1]), original(t, c))[1])
    generate(model, torch.randint(0, V, (1, 5)), 4)
    assert seen == [5, 1, 1, 1]


def test_sample_next_temperature_top_k_and_greedy():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0]]).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample_next(logits[:2], 0.0), torch.tensor([4, 4]))
    top2 = sample_next(logits, 1.0, top_k=2, generator=g)
    assert set(top2.tolist()) == {0, 4}
    for t in (0.5, 2.0):
        freq = torch.bincount(sample_next(logits, t, generator=g), minlength=5).double() / len(logits)
        torch.testing.assert_close(freq, torch.softmax(logits[0].double() / t, -1), atol=0.03, rtol=0)
    again = [sample_next(logits[:50], 1.0, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(*again)


def test_a_tiny_training_run_lowers_the_loss():
    torch.manual_seed(0)
    model = GPT(V, E, H, L, max_len=32, dropout=0.1)
    data = torch.arange(200) % 7  # a periodic sequence: easy to learn
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):
        starts = torch.randint(0, 180, (8,))
        batch = torch.stack([data[s:s + 16] for s in starts])
        loss = language_model_loss(model(batch)[0], batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > math.log(V) - 0.5
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


def blocks_forward(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """The GPT computed by chapter 07's blocks themselves, run with the causal mask (learned positions)."""
    n = tokens.shape[1]
    x = model.dropout(model.token_embed(tokens) + model.position_embed(torch.arange(n)))
    for block in model.blocks:
        x, _ = block(x, causal_mask(n))
    return model.readout(model.norm(x))


@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_is_multihead_attentions_own(need_weights):
    """Issue 15: in training GPT drops the attention weights as MultiHeadAttention does, the same random
    draws included, so it equals chapter 07's blocks run in order; in eval it is the dropout-free model."""
    model = tiny(dropout=0.3)
    assert all(b.self_attn.attn.dropout == 0.3 for b in model.blocks)
    tokens = torch.randint(0, V, (2, N))
    torch.manual_seed(7)
    ours, weights = model(tokens, need_weights=need_weights)
    torch.manual_seed(7)
    torch.testing.assert_close(ours, blocks_forward(model, tokens))
    torch.manual_seed(8)
    assert not torch.allclose(ours, model(tokens)[0])  # a different draw, a different result
    if need_weights:  # the weights returned are the dropped ones, as MultiHeadAttention's
        assert all((w == 0).any() and w.max() > 1 for w in weights)
    evaluated = model.eval()(tokens)[0]
    assert not torch.allclose(ours, evaluated)
    torch.testing.assert_close(evaluated, tiny().eval()(tokens)[0], rtol=0, atol=0)
    torch.testing.assert_close(evaluated, blocks_forward(model, tokens))


def test_attention_dropout_alone_changes_training_and_decode_refuses_it():
    """Only the attention weights are dropped here (the other dropouts are 0): training differs from eval
    through them alone, p = 1 leaves only out_proj's bias of each attention, and decode refuses training."""
    model = tiny()
    for block in model.blocks:
        block.self_attn.attn.dropout = 0.5
    tokens = torch.randint(0, V, (2, N))
    torch.manual_seed(0)
    assert not torch.allclose(model(tokens)[0], model.eval()(tokens)[0])
    model.train()
    for block in model.blocks:
        block.self_attn.attn.dropout = 1.0
    with torch.no_grad():
        for block in model.blocks:  # with every weight dropped, attention outputs out_proj's bias alone
            block.self_attn.attn.out_proj.weight.normal_()
    dropped, reference = model(tokens)[0], tiny()
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        for block in reference.blocks:
            block.self_attn.attn.out_proj.weight.zero_()
    torch.testing.assert_close(dropped, reference.eval()(tokens)[0])
    with pytest.raises(ValueError, match="model.eval"):
        model.decode(tokens[:, :3])
    model.eval().decode(tokens[:, :3])


def test_language_model_loss_shifts_targets_by_one():
    tokens = torch.tensor([[1, 2, 3]])
    logits = torch.full((1, 3, 5), -30.0)
    logits[0, 0, 2] = logits[0, 1, 3] = 30.0  # a perfect prediction of the *next* token; the last row is ignored
    assert language_model_loss(logits, tokens).item() < 1e-6
    with pytest.raises(ValueError, match="must match tokens"):
        language_model_loss(logits[:, :2], tokens)


def test_tokenizer_round_trip_and_bad_input():
    tok = CharTokenizer("hello, world\n")
    text = "low, hell\nworld"
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert tok.decode(ids) == text and tok.decode(ids.tolist()) == text
    assert len(tok) == len(set("hello, world\n"))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("xyz")
    with pytest.raises(ValueError, match="ids in 0.."):
        tok.decode([0, 99])
    with pytest.raises(ValueError):
        CharTokenizer("")


def test_bad_input_errors():
    model = tiny()
    with pytest.raises(ValueError, match="position must be one of"):
        GPT(V, E, H, L, position="xpos")
    with pytest.raises(ValueError, match="int64 tensor of shape"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="token ids must lie"):
        model(torch.full((1, 3), V))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="head_mask"):
        model(torch.zeros(1, 3, dtype=torch.long), head_mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match="top_k"):
        sample_next(torch.zeros(1, 4), top_k=5)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 4), temperature=-1)
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(0, dtype=torch.long), 3)
    longer = GPT(V, E, H, L, max_len=8, position="rope")
    assert generate(longer, torch.zeros(1, 4, dtype=torch.long), 10).shape == (1, 14)  # no length limit
    with pytest.raises(ValueError, match="window"):
        generate(longer, torch.zeros(1, 4, dtype=torch.long), 3, window=0)


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_generate_with_a_window_crops_the_context(position):
    """Up to `window` tokens it is plain generation; beyond, each step sees only the last `window` tokens,
    from position 0: learned positions never run out, and the logits are those of the cropped text alone."""
    model = tiny(position).eval()
    prompt = torch.randint(0, V, (2, 3))
    short = generate(model, prompt, 5, 1.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        generate(model, prompt, 5, 1.0, generator=torch.Generator().manual_seed(0), window=8), short)
    long = generate(model, prompt, 40, 0.0, window=6)  # 43 > max_len = 32 positions
    assert long.shape == (2, 43)
    for i in range(10, 43):  # greedy: each token is the arg max given the 6 before it
        logits, _ = model(long[:, i - 6:i])
        assert torch.equal(long[:, i], logits[:, -1].argmax(-1))


def test_head_mask_zeroes_a_head():
    model = tiny().eval()
    tokens = torch.randint(0, V, (2, N))
    keep = torch.ones(L, H, dtype=torch.float64)
    torch.testing.assert_close(model(tokens, head_mask=keep)[0], model(tokens)[0])
    keep[1, 2] = 0
    with torch.no_grad():  # zeroing the head's rows of out_proj's input is the same ablation
        model.blocks[1].self_attn.attn.out_proj.weight[:, 2 * (E // H):3 * (E // H)] = 0
    torch.testing.assert_close(model(tokens, head_mask=keep)[0], model(tokens)[0])


def test_head_scores_on_hand_built_weights():
    n = 6
    previous = torch.zeros(1, 2, n, n)
    previous[0, 0, 0, 0] = 1
    previous[0, 0, torch.arange(1, n), torch.arange(n - 1)] = 1       # head 0 looks one back
    previous[0, 1] = causal_mask(n) / causal_mask(n).sum(-1, keepdim=True)  # head 1 is uniform
    scores = previous_token_scores(previous)
    assert scores[0] == 1 and scores[1] == pytest.approx(sum(1 / i for i in range(2, n + 1)) / (n - 1))
    seq = repeated_random_tokens(3, 5, 7, torch.Generator().manual_seed(0))
    assert seq.shape == (3, 10) and torch.equal(seq[:, :5], seq[:, 5:])


def test_ngram_baseline_matches_counting_by_hand():
    train = torch.tensor([0, 1, 0, 1, 0, 2])
    val = torch.tensor([0, 1, 0, 2])
    # bigram counts on train: after 0 -> 1 twice, 2 once; after 1 -> 0 twice
    p = [(2 + 0.5) / (3 + 1.5), (2 + 0.5) / (2 + 1.5), (1 + 0.5) / (3 + 1.5)]
    expected = -sum(math.log2(x) for x in p) / 3
    assert ngram_bits_per_char(train, val, 2, 3, alpha=0.5) == pytest.approx(expected)
    assert ngram_bits_per_char(train, val, 1, 3, alpha=0.0) == pytest.approx(
        -sum(math.log2(c / 6) for c in (3, 2, 3, 1)) / 4)


def test_shakespeare_corpus_is_shipped_fixed_and_split_by_work():
    """The text is the package's own file (the same characters on every Python: a fixed hash), every 10th work
    held out whole; nothing is read from the running Python's installation."""
    import hashlib
    assert CORPUS_PATH.is_file() and CORPUS_PATH.stat().st_size < 3_000_000
    train, val, titles = shakespeare_corpus()
    assert (len(train), len(val)) == (4_599_954, 457_244)
    assert hashlib.sha256((train + val).encode()).hexdigest()[:16] == CORPUS_SHA
    assert titles == ["King Henry V", "Macbeth", "The Rape of Lucrece", "Twelfth Night"]
    assert "To-morrow, and to-morrow, and to-morrow" in val and "To be, or not to be" in train
    assert len(CharTokenizer(train + val)) == 84 and set(val) <= set(train)
    assert all(c == "\n" or " " <= c <= "~" for c in set(train + val))
    other = shakespeare_corpus(every=5)
    assert len(other[2]) == 8 and other[0] + other[1] != train + val
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="every"):
            shakespeare_corpus(every=bad)


def test_a_checkpoints_tokenizer_comes_from_its_own_characters():
    """CharTokenizer("".join(chars)) rebuilds the very tokenizer a checkpoint stored, whatever text is at hand."""
    tok = CharTokenizer("hello, world")
    again = CharTokenizer("".join(tok.chars))
    assert again.chars == tok.chars and torch.equal(again.encode("low"), tok.encode("low"))


def test_bench_gpt_pair_computes_the_same_logits_and_runs():
    """attnkit.bench's GPT training-step row compares like with like: the torch-built twin gives the same logits."""
    from attnkit import bench
    model = GPT(V, E, H, L, max_len=N)
    twin = bench._TorchGPT(model)
    tokens = torch.randint(0, V, (2, N))
    for training in (False, True):
        model.train(training)
        twin.train(training)
        torch.testing.assert_close(model(tokens)[0], twin(tokens), atol=1e-5, rtol=1e-5)
    row = bench.gpt_train_step_row(batch=2, n=8, embed_dim=16, num_heads=2, num_layers=1, vocab_size=V, repeats=2)
    assert row.module == "gpt" and row.ratio > 0 and len(row.ours_runs_ms) == 2


def test_windowed_bits_scores_each_character_once_with_enough_context():
    """Each character from min_context to end is scored once, from the context the windows give it:
    the same number as scoring every position one by one from its own window."""
    model = tiny("rope").eval()
    ids = torch.randint(0, V, (50,))
    bits, end = windowed_bits_per_char(model, ids, context=8, min_context=3)
    stride = 6
    assert end == 3 + ((50 - stride) // stride) * stride
    expected = []
    for target in range(3, end):
        start = (target - 3) // stride * stride  # the window that scores it
        logits, _ = model(ids[None, start:start + 9])
        expected.append(-torch.log_softmax(logits[0, target - start - 1], -1)[ids[target]].item())
    assert bits == pytest.approx(sum(expected) / len(expected) / math.log(2), rel=1e-6)
    with pytest.raises(ValueError, match="min_context"):
        windowed_bits_per_char(model, ids, context=8, min_context=9)


def test_committed_checkpoint_loads_into_the_chapters_model():
    """attnkit/data/tiny_gpt (shipped with the package): float16 weights under 1 MB that fit GPT(**config['model'])
    with the read-out tied, and a config that records how they were made (chapter 09 re-scores them on the
    validation text); load_tiny_gpt gives that model, in eval mode, with the checkpoint's own tokenizer."""
    import json
    from pathlib import Path
    from attnkit.gpt import TINY_GPT_PATH, load_tiny_gpt
    folder = TINY_GPT_PATH
    assert folder == Path(__file__).resolve().parents[1] / "solutions" / "attnkit" / "data" / "tiny_gpt"
    config = json.loads((folder / "config.json").read_text())
    assert (folder / "checkpoint.pt").stat().st_size < 1_000_000
    train, val, _ = shakespeare_corpus()
    assert config["chars"] == CharTokenizer(train + val).chars  # trained on the shipped text
    assert config["model"]["vocab_size"] == len(config["chars"]) and config["training"]["steps"] > 0
    assert 0 < config["validation_bits_per_char"] < 3 and "windowed_bits_per_char" in config["scored"]
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    assert all(v.dtype == torch.float16 for v in state.values())
    model = GPT(**config["model"])
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    assert missing == ["readout.weight"] and not unexpected
    assert model.readout.weight is model.token_embed.weight
    loaded, tokenizer, same = load_tiny_gpt()
    assert not loaded.training and same == config and tokenizer.chars == config["chars"]
    assert torch.equal(loaded.token_embed.weight, model.token_embed.weight)


def test_load_tiny_gpt_refuses_weights_that_do_not_fit_the_config(tmp_path):
    """A checkpoint folder whose weights belong to another model: a clear error naming the keys, never a silent
    half-loaded model."""
    import json
    from attnkit.gpt import TINY_GPT_PATH, load_tiny_gpt
    config = json.loads((TINY_GPT_PATH / "config.json").read_text())
    config["model"]["num_layers"] += 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "checkpoint.pt").write_bytes((TINY_GPT_PATH / "checkpoint.pt").read_bytes())
    with pytest.raises(ValueError, match="does not fit"):
        load_tiny_gpt(tmp_path)
