"""Exercise 07's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest
import torch

import checking
from autograder.judging.checks.ch07_transformer_block import STATED_REQUIREMENTS
from chapter_checking import UNIFORM_LAYER, assert_earns_only, assert_requirement_broken_alone
from checking import assert_full_marks, assert_mistake_named, mutate, run_suite, source_code


@pytest.fixture(autouse=True)
def one_thread():
    """The checks run many tiny forward passes: on a busy 2-core machine a second thread only adds waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

A = "07_transformer_block"
REF = source_code(A)
SETUP = REF.split("class FeedForward")[0]
ANSWERS = "\n" + "\n".join(line for line in REF.splitlines() if line.startswith("q_")) + "\n"  # the questions

# A sublayer helper, F.relu / clamp, nn.Sequential inside FeedForward is NOT allowed (attribute names), so linear1/2
# stay; the blocks loop over (sublayer, norm) pairs and keep no dropout modules: F.dropout with self.training.
HELPER = SETUP + '''
import torch.nn.functional as F

class FeedForward(nn.Module):
    def __init__(self, embed_dim, ff_dim, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(embed_dim, ff_dim)
        self.linear2 = nn.Linear(ff_dim, embed_dim)
        self.p = dropout

    def forward(self, x):
        h = self.linear1(x).clamp(min=0)
        return self.linear2(F.dropout(h, self.p, self.training))


def residual(x, norm, fn, pre, p=0.0, training=False):
    drop = lambda v: F.dropout(v, p, training)
    return x + drop(fn(norm(x))) if pre else norm(x + drop(fn(x)))


class TransformerEncoderBlock(nn.Module):
    def __init__(self, embed_dim, num_heads, ff_dim, dropout=0.0, norm_first=False):
        super().__init__()
        self.pre, self.p = norm_first, dropout
        self.self_attn = MultiHeadAttention(embed_dim, num_heads)
        self.feed_forward = FeedForward(embed_dim, ff_dim, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(embed_dim), nn.LayerNorm(embed_dim)

    def forward(self, x, mask=None):
        kept = {}
        def attend(h):
            out, kept["w"] = self.self_attn(h, h, h, mask)
            return out
        x = residual(x, self.norm1, attend, self.pre, self.p, self.training)
        x = residual(x, self.norm2, self.feed_forward, self.pre, self.p, self.training)
        return x, kept["w"]


class TransformerDecoderBlock(nn.Module):
    def __init__(self, embed_dim, num_heads, ff_dim, dropout=0.0, norm_first=False):
        super().__init__()
        self.pre, self.p = norm_first, dropout
        self.self_attn = MultiHeadAttention(embed_dim, num_heads)
        self.cross_attn = MultiHeadAttention(embed_dim, num_heads)
        self.feed_forward = FeedForward(embed_dim, ff_dim, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(embed_dim) for _ in range(3))

    def forward(self, x, memory, self_mask=None, memory_mask=None):
        kept = {}
        def attend(h):
            out, kept["s"] = self.self_attn(h, h, h, self_mask)
            return out
        def cross(h):
            out, kept["c"] = self.cross_attn(h, memory, memory, memory_mask)
            return out
        x = residual(x, self.norm1, attend, self.pre, self.p, self.training)
        x = residual(x, self.norm2, cross, self.pre, self.p, self.training)
        x = residual(x, self.norm3, self.feed_forward, self.pre, self.p, self.training)
        return x, kept["s"], kept["c"]
''' + ANSWERS

# Layer norm written out by hand (float64 inside) and returned as lists instead of tuples.
MANUAL_NORM = HELPER.replace("def residual(x, norm, fn, pre, p=0.0, training=False):", '''def _norm(norm, x):
    x64 = x.double()
    mu = x64.mean(-1, keepdim=True)
    var = x64.var(-1, unbiased=False, keepdim=True)
    return ((x64 - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()).to(x.dtype)


def residual(x, norm, fn, pre, p=0.0, training=False):
    drop = lambda v: F.dropout(v, p, training)
    return x + drop(fn(_norm(norm, x))) if pre else _norm(norm, x + drop(fn(x)))


def _unused(x, norm, fn, pre, p=0.0, training=False):''').replace("return x, kept[\"w\"]", "return [x, kept[\"w\"]]")


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [HELPER, MANUAL_NORM], ids=["residual-helper-clamp", "hand-written-layernorm-lists"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


ENC_POST = '''            out, weights = self.self_attn(x, x, x, mask)
            x = self.norm1(x + self.dropout1(out))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))'''
ENC_PRE = '''            h = self.norm1(x)
            out, weights = self.self_attn(h, h, h, mask)
            x = x + self.dropout1(out)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))'''
DEC_CROSS_POST = "out, cross_weights = self.cross_attn(x, memory, memory, memory_mask)"
DEC_POST = '''            out, self_weights = self.self_attn(x, x, x, self_mask)
            x = self.norm1(x + self.dropout(out))
            out, cross_weights = self.cross_attn(x, memory, memory, memory_mask)
            x = self.norm2(x + self.dropout(out))
            x = self.norm3(x + self.dropout(self.feed_forward(x)))'''
MISTAKES = {
    # name: (mutated code, a check that must fail, words its message must contain)
    "linear feed-forward": (mutate(REF, "self.dropout(torch.relu(self.linear1(x)))", "self.dropout(self.linear1(x))"),
                            "test_feed_forward", "linear"),
    "relu on the output": (mutate(REF, "return self.linear2(self.dropout(torch.relu(self.linear1(x))))",
                                  "return torch.relu(self.linear2(self.dropout(torch.relu(self.linear1(x)))))"),
                           "test_feed_forward", "output of linear2"),
    "encoder: no residual around attention (post)": (mutate(REF, "x = self.norm1(x + self.dropout1(out))", "x = self.norm1(self.dropout1(out))"),
                                                     "test_encoder_block_post_norm", "residual connection around the self-attention"),
    "encoder: no residual around the FFN (pre)": (mutate(REF, "x = x + self.dropout2(self.feed_forward(self.norm2(x)))",
                                                         "x = self.dropout2(self.feed_forward(self.norm2(x)))"),
                                                  "test_encoder_block_pre_norm", "residual connection around the feed-forward"),
    "encoder: pre-norm when post-norm was asked": (mutate(REF, ENC_POST, ENC_PRE.replace("            ", "            ", 1)),
                                                   "test_encoder_block_post_norm", "wrong place"),
    "encoder: post-norm when pre-norm was asked": (mutate(REF, ENC_PRE, ENC_POST), "test_encoder_block_pre_norm", "wrong place"),
    "encoder: residual of the normalised x": (mutate(REF, ENC_PRE, '''            x = self.norm1(x)
            out, weights = self.self_attn(x, x, x, mask)
            x = x + self.dropout1(out)
            x = self.norm2(x)
            x = x + self.dropout2(self.feed_forward(x))'''), "test_encoder_block_pre_norm", "normalised x"),
    "encoder: norms swapped": (mutate(REF, "x = self.norm1(x + self.dropout1(out))\n            x = self.norm2(x + self.dropout2(self.feed_forward(x)))\n        return x, weights",
                                      "x = self.norm2(x + self.dropout1(out))\n            x = self.norm1(x + self.dropout2(self.feed_forward(x)))\n        return x, weights"),
                               "test_encoder_block_post_norm", "swapped"),
    "encoder: mask ignored": (mutate(REF, "out, weights = self.self_attn(x, x, x, mask)", "out, weights = self.self_attn(x, x, x)"),
                              "test_encoder_block_mask", "mask is ignored"),
    "decoder: cross-attention attends to itself": (mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.cross_attn(x, x, x)"),
                                                   "test_decoder_block_post_norm", "attends to x itself"),
    "decoder: cross-attention with self_attn": (mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.self_attn(x, memory, memory, memory_mask)"),
                                                "test_decoder_block_post_norm", "self_attn's weights"),
    "decoder: no residual around cross-attention": (mutate(REF, DEC_POST, DEC_POST.replace("x = self.norm2(x + self.dropout(out))", "x = self.norm2(self.dropout(out))")),
                                                    "test_decoder_block_post_norm", "around the cross-attention"),
    # the encoder's and the decoder's missing residuals share one message, hint included
    "decoder: no residual around self-attention": (
        mutate(REF, DEC_POST, DEC_POST.replace("x = self.norm1(x + self.dropout(out))",
                                               "x = self.norm1(self.dropout(out))")),
        "test_decoder_block_post_norm",
        "around the self-attention is missing: add its input back (x + self_attn(...))"),
    "decoder: post-norm when pre-norm was asked": (mutate(REF, '''            h = self.norm1(x)
            out, self_weights = self.self_attn(h, h, h, self_mask)
            x = x + self.dropout(out)
            out, cross_weights = self.cross_attn(self.norm2(x), memory, memory, memory_mask)
            x = x + self.dropout(out)
            x = x + self.dropout(self.feed_forward(self.norm3(x)))''', DEC_POST), "test_decoder_block_pre_norm", "wrong place"),
    "decoder: linear feed-forward only in the decoder": (mutate(REF, DEC_POST, DEC_POST.replace("self.feed_forward(x)", "self.feed_forward.linear2(self.feed_forward.linear1(x))")),
                                                         "test_decoder_block_post_norm", "linear"),
    "relu on the input": (mutate(REF, "return self.linear2(self.dropout(torch.relu(self.linear1(x))))",
                                 "return self.linear2(self.dropout(self.linear1(torch.relu(x))))"),
                          "test_feed_forward", "applied to the input"),
    "encoder: norm1 used twice": (mutate(REF, "x = self.norm2(x + self.dropout2(self.feed_forward(x)))",
                                         "x = self.norm1(x + self.dropout2(self.feed_forward(x)))"),
                                  "test_encoder_block_post_norm", "norm1 is used for both sublayers"),
    "decoder: cross-attention keys from x": (mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.cross_attn(x, x, memory, memory_mask)"),
                                             "test_decoder_block_post_norm", "keys come from x"),
    "decoder: cross-attention queries from memory": (mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.cross_attn(memory, x, x, memory_mask)"),
                                                     "test_decoder_block_post_norm", "queries come from memory"),
    "decoder: masks swapped": (mutate(mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.cross_attn(x, memory, memory, self_mask)"),
                                      "out, self_weights = self.self_attn(x, x, x, self_mask)",
                                      "out, self_weights = self.self_attn(x, x, x, memory_mask)"),
                               "test_decoder_block_masks", "swapped"),
    "decoder: residual of the normalised x (pre)": (mutate(REF, '''            h = self.norm1(x)
            out, self_weights = self.self_attn(h, h, h, self_mask)
            x = x + self.dropout(out)''', '''            x = self.norm1(x)
            out, self_weights = self.self_attn(x, x, x, self_mask)
            x = x + self.dropout(out)'''), "test_decoder_block_pre_norm", "normalised x"),
    "decoder: memory mask ignored": (mutate(REF, DEC_CROSS_POST, "out, cross_weights = self.cross_attn(x, memory, memory)"),
                                     "test_decoder_block_masks", "memory_mask is ignored"),
    "decoder: self mask ignored": (mutate(REF, "out, self_weights = self.self_attn(x, x, x, self_mask)", "out, self_weights = self.self_attn(x, x, x)"),
                                   "test_decoder_block_masks", "self_mask is ignored"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


def test_wrong_attribute_names_are_named():
    results = run_suite(A, REF.replace("self.feed_forward", "self.ffn"))
    assert "feed_forward" in results["test_encoder_block_post_norm"], results
    assert results["test_feed_forward"] == ""


def test_torch_layers_earn_nothing():
    code = REF + '''
class TransformerEncoderBlock(nn.Module):
    def __init__(self, embed_dim, num_heads, ff_dim, dropout=0.0, norm_first=False):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(embed_dim, num_heads, ff_dim, dropout, batch_first=True, norm_first=norm_first)

    def forward(self, x, mask=None):
        return self.layer(x), None
'''
    results = run_suite(A, code)
    assert results["test_encoder_block_post_norm"].startswith("earns no points"), results
    assert results["test_decoder_block_post_norm"] == ""


# -- stated requirements (issue 13): each one, broken alone, costs points on its check with a named message --

FF_OUT = "return self.linear2(self.dropout(torch.relu(self.linear1(x))))"
ENC_ATTN_POST = "out, weights = self.self_attn(x, x, x, mask)"
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "ff: linear2(relu(linear1(x)))": MISTAKES["linear feed-forward"][0],
    "ff: dropout after the ReLU, not on the output": mutate(REF, FF_OUT, "return self.dropout(self.linear2(torch.relu(self.linear1(x))))"),
    "ff: dropout after the ReLU, not on the input": mutate(REF, FF_OUT, "return self.linear2(torch.relu(self.linear1(self.dropout(x))))"),
    "ff: dropout applied in training": mutate(REF, FF_OUT, "return self.linear2(torch.relu(self.linear1(x)))"),
    "ff: no dropout in eval mode": mutate(REF, FF_OUT, "return self.linear2(nn.functional.dropout(torch.relu(self.linear1(x)), self.dropout.p, True))"),
    "encoder: post-norm by default": MISTAKES["encoder: pre-norm when post-norm was asked"][0],
    "encoder: pre-norm with norm_first": MISTAKES["encoder: post-norm when pre-norm was asked"][0],
    "encoder: mask reaches the self-attention": MISTAKES["encoder: mask ignored"][0],
    "encoder: all-padding example gives no NaN": mutate(REF, ENC_ATTN_POST, ENC_ATTN_POST + "\n            weights = weights / weights.sum(-1, keepdim=True)"),
    "encoder: dropout on the sublayer output before the residual": mutate(REF, "x = self.norm1(x + self.dropout1(out))", "x = self.norm1(x + out)"),
    "decoder: cross-attention keys from memory": MISTAKES["decoder: cross-attention keys from x"][0],
    "decoder: memory_mask to the cross-attention": MISTAKES["decoder: memory mask ignored"][0],
    "decoder: self_mask to the self-attention": MISTAKES["decoder: self mask ignored"][0],
    "decoder: empty memory gives no NaN": mutate(REF, DEC_CROSS_POST, DEC_CROSS_POST + "\n            cross_weights = cross_weights / cross_weights.sum(-1, keepdim=True)"),
    "decoder: dropout on the sublayer output before the residual": mutate(REF, "x = self.norm2(x + self.dropout(out))", "x = self.norm2(x + out)"),
    "blocks: no dropout in eval mode": mutate(REF, "x = self.norm1(x + self.dropout1(out))", "x = self.norm1(x + nn.functional.dropout(out, "
               "self.dropout1.p, True))"),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


# -- conceptual questions (issue 14): the reference's answers pass; each named wrong answer gets its message --

ATTN, FFN, NORMS = 4 * (512 * 512 + 512), 2 * 512 * 2048 + 2048 + 512, 4 * 512
QUESTIONS = {
    "q_block_params": [(str(ATTN + FFN), "layernorms are missing"), (str(4 * 512 ** 2 + 2 * 512 * 2048), "biases are missing"),
                       (str(8 * ATTN + FFN + NORMS), "heads do not multiply"),
                       (str(ATTN + 512 * 2048 + 2048 + NORMS), "two linear layers"),
                       (str(3 * (512 * 512 + 512) + FFN + NORMS), "four"), ("1000000", "not right")],
    "q_prenorm_position": [('"sum"', "post-norm"), ('"output"', "branch's output"), ('"middle"', "should be one of")],
    "q_ff_share": [(f"{ATTN / (ATTN + FFN + NORMS)}", "attention's share"), (f"{FFN / ATTN}", "ratio"),
                   ("0.4995", "one of the feed-forward's two")],
}


@pytest.mark.parametrize("name, wrong, words", [(q, w, m) for q, cases in QUESTIONS.items() for w, m in cases])
def test_question_wrong_answer_is_named(name, wrong, words):
    code = checking.with_answer(REF, name, wrong)
    if name == "q_block_params":  # Q3's reference answer divides by Q1's: keep it independent of Q1's mutation
        code = code.replace("/ q_block_params", f"/ {ATTN + FFN + NORMS}")
    checking.assert_only_question_named(A, code, name, QUESTIONS, words)


# -- issue 34: every check anchored to the reference ------------------------------------------------------

UNIFORM = (REF.replace("self.self_attn(", "_uniform(self.self_attn, ").replace("self.cross_attn(", "_uniform(self.cross_attn, ")
           + UNIFORM_LAYER)


def test_a_block_whose_attention_ignores_q_and_k_earns_nothing():
    """Issue 34: attention uniform over the allowed keys, whatever the queries and keys, earned the mask checks (its
    own weights renormalised; padding never reaches a mean over the real tokens) and the dropout check (its own block
    without dropout): they compare the block with itself, so they first anchor its attention weights."""
    results = assert_earns_only(A, UNIFORM, {"TransformerEncoderBlock", "TransformerDecoderBlock"})
    assert all("do not follow" in results[g] for g in
               ("test_encoder_block_mask", "test_decoder_block_masks", "test_blocks_dropout")), results


def test_a_cross_attention_that_ignores_q_and_k_earns_nothing():
    """The cross-attention's queries depend on the sublayers before it (wherever the norms are), so its anchor is the
    row-space test on the keys of memory: uniform cross weights with an honest self-attention fail it."""
    code = REF.replace("self.cross_attn(", "_uniform(self.cross_attn, ") + UNIFORM_LAYER
    results = assert_earns_only(A, code, "TransformerDecoderBlock")
    assert all("cross-attention weights" in results[g] and "do not follow the keys" in results[g]
               for g in ("test_decoder_block_masks", "test_blocks_dropout")), results


def test_a_block_whose_output_computes_nothing_earns_nothing():
    """Honest attention weights with an output that is x itself: padding never reaches x, so the mask checks' output
    half held; the block's unmasked output must first be the block's (or a classic mistake the value checks name)."""
    code = REF.replace("        return x, weights\n", "        return x0, weights\n").replace(
        '        """x (B, n, E), mask broadcastable to (B, n, n) (True = may attend).', '        x0 = x\n        """x')
    code = code.replace("        return x, self_weights, cross_weights", "        return x0, self_weights, cross_weights").replace(
        '        """x (B, n, E), memory (B, m, E).', '        x0 = x\n        """x')
    results = assert_earns_only(A, code, {"TransformerEncoderBlock", "TransformerDecoderBlock"})
    assert all("output" in results[g] for g in ("test_encoder_block_mask", "test_decoder_block_masks")), results
