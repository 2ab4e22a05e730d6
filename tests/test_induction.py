"""attnkit.induction (chapter 09): the repeated-block data, scores a positional look-up cannot fool, ablation."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.gpt import GPT
from attnkit.induction import (RepeatedBatch, attention_only_gpt, fixed_offset_induction_score, head_mask,
                               induction_score, measure, repeated_block_batch, second_copy_bits,
                               second_copy_queries, train_on_repeats)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pattern(B: int, n: int, key_of) -> torch.Tensor:
    """(B, 1, n, n) weights: query i of sequence b puts all its weight on key_of(b, i) (itself if that is < 0)."""
    w = torch.zeros(B, 1, n, n)
    for b in range(B):
        for i in range(n):
            k = key_of(b, i)
            w[b, 0, i, k if 0 <= k <= i else i] = 1
    return w


def test_repeated_block_batch_copies_one_block_at_its_offset():
    data = repeated_block_batch(200, n=24, vocab_size=32, lengths=(3, 10), generator=torch.Generator().manual_seed(0))
    assert data.tokens.shape == (200, 24) and (data.tokens[:, 0] == 32).all()
    assert (data.tokens[:, 1:] < 32).all()
    assert data.length.min() == 3 and data.length.max() == 10 and data.first.min() == 1
    assert len(set(data.first.tolist())) > 10  # the offset varies from sequence to sequence
    for b in range(200):
        f, L = int(data.first[b]), int(data.length[b])
        assert f + 2 * L <= 24
        assert torch.equal(data.tokens[b, f:f + L], data.tokens[b, f + L:f + 2 * L])
    fixed = repeated_block_batch(5, lengths=(11, 11), start=1, generator=torch.Generator().manual_seed(1))
    assert (fixed.first == 1).all() and (fixed.length == 11).all()
    assert torch.equal(fixed.tokens[:, 1:12], fixed.tokens[:, 12:23])
    with pytest.raises(ValueError, match="lengths"):
        repeated_block_batch(2, n=10, lengths=(3, 5))
    with pytest.raises(ValueError, match="start"):
        repeated_block_batch(2, n=24, lengths=(3, 10), start=5)


def test_second_copy_queries_are_the_predictable_positions():
    q = second_copy_queries(torch.tensor([1, 4]), torch.tensor([3, 5]), 16)
    assert q[0].nonzero().flatten().tolist() == [4, 5]  # copy at 4..6; token 7 is not copied
    assert q[1].nonzero().flatten().tolist() == [9, 10, 11, 12]


def test_induction_score_one_for_the_induction_pattern_zero_for_previous_token():
    data = repeated_block_batch(16, generator=torch.Generator().manual_seed(2))
    L = data.length.tolist()
    induction = pattern(16, 24, lambda b, i: i - L[b] + 1)
    previous = pattern(16, 24, lambda b, i: i - 1)
    assert induction_score(induction, data.first, data.length).tolist() == [1.0]
    assert induction_score(previous, data.first, data.length).tolist() == [0.0]
    duplicate = pattern(16, 24, lambda b, i: i - L[b])  # the earlier copy of the token itself
    assert induction_score(duplicate, data.first, data.length).tolist() == [0.0]


def test_a_positional_look_up_fools_the_fixed_offset_score_not_the_random_offset_one():
    """A head that attends from position i to i - 10 whatever the tokens: perfect on the layout it was
    made for, near zero once each sequence has its own offset and length."""
    look_up = pattern(64, 24, lambda b, i: i - 10)
    assert fixed_offset_induction_score(look_up, 1, 11).item() == 1.0
    data = repeated_block_batch(64, generator=torch.Generator().manual_seed(3))
    random_offset = induction_score(look_up, data.first, data.length).item()
    assert random_offset == 0.0  # blocks are 3..10 long: i - 10 is never the key after the earlier copy


def test_induction_score_bad_input():
    w = torch.softmax(torch.randn(2, 3, 8, 8), -1)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        induction_score(w, torch.tensor([1]), torch.tensor([3]))
    with pytest.raises(ValueError, match="fit twice"):
        induction_score(w, torch.tensor([1, 2]), torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"\(B, H, n, n\)"):
        induction_score(w[0], torch.tensor([1, 2]), torch.tensor([3, 3]))


def test_second_copy_bits_zero_when_copying_chance_when_uniform():
    data = repeated_block_batch(8, n=16, vocab_size=5, lengths=(2, 4), generator=torch.Generator().manual_seed(4))
    perfect = torch.full((8, 16, 6), -30.0)
    perfect.scatter_(-1, data.tokens.roll(-1, dims=1)[..., None], 30.0)  # position i predicts token i + 1
    assert second_copy_bits(perfect, data) < 1e-6
    assert second_copy_bits(torch.zeros(8, 16, 6), data) == pytest.approx(math.log2(6))


def test_attention_only_gpt_is_the_gpt_without_its_feed_forward():
    torch.manual_seed(0)
    model = attention_only_gpt(vocab_size=9, embed_dim=8, num_layers=2, max_len=12)
    assert all(b.feed_forward is None and b.norm2 is None for b in model.blocks)
    assert model.readout.weight is not model.token_embed.weight
    assert 0.8 < model.token_embed.weight.std() < 1.2  # PyTorch's N(0, 1), not GPT-2's N(0, 0.02)
    full = GPT(9, 8, 2, 2, max_len=12, position="rope", tie_weights=False)
    full.load_state_dict(model.state_dict(), strict=False)
    for block in full.blocks:  # a feed-forward network whose output is zero adds nothing
        for p in block.feed_forward.parameters():
            torch.nn.init.zeros_(p)
    tokens = torch.randint(0, 9, (3, 12))
    torch.testing.assert_close(model(tokens)[0], full(tokens)[0])
    with pytest.raises(ValueError, match="init"):
        GPT(9, 8, 2, 1, init="xavier")


def test_head_mask_and_ablating_the_only_source_of_copying():
    model = attention_only_gpt(vocab_size=9, embed_dim=8, num_layers=2, max_len=12)
    mask = head_mask(model, [(0, 1), (1, 0)])
    assert mask.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert head_mask(model, (1, 1)).tolist() == [[1.0, 1.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="no head"):
        head_mask(model, (2, 0))
    data = repeated_block_batch(4, n=12, vocab_size=8, lengths=(2, 4), generator=torch.Generator().manual_seed(5))
    everything_off = measure(model, data, torch.zeros(2, 2))
    with torch.no_grad():  # every head ablated: the embedding plus each out_proj's bias, nothing mixed
        x = model.token_embed(data.tokens) + sum(b.self_attn.attn.out_proj.bias for b in model.blocks)
        direct = model.readout(model.norm(x))
    assert everything_off["second_copy_bits"] == pytest.approx(second_copy_bits(direct, data), rel=1e-5)
    assert everything_off["induction"].shape == (2, 2) and everything_off["previous_token"].shape == (2, 2)


def test_train_on_repeats_records_scores_and_lowers_the_loss():
    torch.manual_seed(0)
    model = attention_only_gpt(vocab_size=9, embed_dim=16, num_layers=2, max_len=12)
    history = train_on_repeats(model, steps=40, batch=16, eval_every=20, n=12, lengths=(2, 4))
    assert history.steps == [0, 20, 40]
    assert history.second_copy_bits[-1] < history.second_copy_bits[0]
    assert all(s.shape == (2, 2) for s in history.induction + history.previous_token)
    assert isinstance(RepeatedBatch(torch.zeros(1, 2), torch.zeros(1), torch.ones(1)), RepeatedBatch)


class _Copier(torch.nn.Module):
    """Predicts, after the last position, the token ``length`` back: perfect copying of a block of ``length``;
    with any head removed it predicts token 0 everywhere."""

    vocab_size, max_len, position = 33, 24, "rope"

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length, self.dummy = length, torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens, head_mask=None):
        B, n = tokens.shape
        logits = torch.zeros(B, n, self.vocab_size)
        if head_mask is None or bool(head_mask.all()):
            logits[torch.arange(B), -1, tokens[:, n - self.length]] = 1.0
        return logits, []


def test_complete_copies_prompts_a_block_and_scores_the_greedy_rest():
    """The prompt is start, noise, block, the block's first tokens; the model writes the rest greedily and the
    accuracy is the share written right; a mask reaches the model (here: a model that stops copying)."""
    from attnkit.induction import complete_copies
    model = _Copier(8)
    done = complete_copies(model, batch=50, generator=torch.Generator().manual_seed(0))
    assert done.prompt.shape == (50, 1 + 3 + 8 + 2) and done.written.shape == done.expected.shape == (50, 6)
    assert bool((done.prompt[:, 0] == 32).all()) and done.prompt[:, 1:].max() < 32
    assert torch.equal(done.prompt[:, 4:6], done.prompt[:, 12:14])  # the copy starts like the block
    assert torch.equal(done.prompt[:, 6:12], done.expected) and done.accuracy == 1.0
    broken = complete_copies(model, batch=50, mask=torch.ones(2, 2).index_put_((torch.tensor(0), torch.tensor(1)),
                                                                               torch.tensor(0.0)),
                             generator=torch.Generator().manual_seed(0))
    assert bool((broken.written == 0).all()) and broken.accuracy == float((broken.expected == 0).double().mean())
    with pytest.raises(ValueError, match="given"):
        complete_copies(model, length=4, given=4)
