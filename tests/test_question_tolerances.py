"""Issue 34: every conceptual question's tolerance separates the mistakes its chapter names.

For each chapter's question table (``SUITE.questions``), each ``number`` question accepts its answer and rejects
every wrong value named in it and in its sibling questions (the same chapter's other number questions), and
every mistake named in a sibling that carries over to it (``CARRIED``: the same slip, worked through this question).
"""

from __future__ import annotations

import math

import pytest

from autograder.judging.checks import CheckFailed, load_suite

CHAPTERS = ["01_single_head", "02_multi_head", "03_self_attention", "04_masked_attention", "05_cross_attention",
            "06_positional_encoding", "07_transformer_block", "08_efficient_attention", "09_tiny_gpt",
            "10_flash_triton"]

E, F = 512, 2048
ATTN, ATTN_NB = 4 * (E * E + E), 4 * E * E  # with and without biases
FFN, FFN_NB = 2 * E * F + F + E, 2 * E * F
NORMS = 4 * E
# The mistakes a sibling question names, worked through this question: chapter 07's q_block_params names the missing
# biases and LayerNorms; the feed-forward share computed with the same slips.
CARRIED = {
    ("07_transformer_block", "q_ff_share"): {
        "biases and LayerNorms left out": FFN_NB / (ATTN_NB + FFN_NB),  # 2/3 exactly
        "the linear layers' biases left out": FFN_NB / (ATTN_NB + FFN_NB + NORMS),
        "the LayerNorms left out": FFN / (ATTN + FFN),
    },
}


def _pairs(mistakes) -> list[tuple[str, object]]:
    return list(mistakes.items()) if hasattr(mistakes, "items") else list(mistakes)


def _rejects(q, value, name: str) -> bool:
    try:
        q.judge(value, name)
    except CheckFailed:
        return True
    return False


def test_every_chapter_has_its_question_table():
    numbers = {c: [n for n, q in load_suite(c).asked.items() if q.kind == "number"] for c in CHAPTERS}
    assert sum(map(len, numbers.values())) >= 20, numbers
    for (chapter, name) in CARRIED:
        assert name in numbers[chapter], (chapter, name)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_number_tolerance_rejects_the_chapters_named_mistakes(chapter):
    table = load_suite(chapter).asked
    numbers = {n: q for n, q in table.items() if q.kind == "number"}
    named = [(f"{n}: {m}", v) for n, q in numbers.items() for m, v in _pairs(q.mistakes)
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    swallowed = []
    for name, q in numbers.items():
        assert not _rejects(q, q.answer, name), f"{chapter} {name} rejects its own answer"
        wrong = named + [(f"{name} (carried): {m}", v) for m, v in CARRIED.get((chapter, name), {}).items()]
        for why, v in wrong:
            if v == q.answer or (isinstance(v, float) and math.isnan(v) and not why.startswith(name)):
                continue  # a sibling's wrong value that is this question's right one; another's NaN is refused below
            if not _rejects(q, v, name):
                swallowed.append(f"{name} accepts {v!r} ({why})")
    assert not swallowed, f"{chapter}: " + "; ".join(swallowed)


def test_nan_and_infinity_are_refused_by_every_number_question():
    for chapter in CHAPTERS:
        for name, q in load_suite(chapter).asked.items():
            if q.kind == "number":
                for v in (math.nan, math.inf, -math.inf):
                    assert _rejects(q, v, name), (chapter, name, v)


def test_the_feed_forward_share_to_four_significant_digits_is_accepted():
    q = load_suite("07_transformer_block").asked["q_ff_share"]
    assert not _rejects(q, float(f"{q.answer:.4g}"), "q_ff_share") and _rejects(q, 2 / 3, "q_ff_share")
