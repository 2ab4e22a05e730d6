"""Exercise 06's graded checks: full marks for correct answers however written, named failures for classic mistakes."""

from __future__ import annotations

import pytest

import checking
from autograder.judging.checks.ch06_positional_encoding import STATED_REQUIREMENTS
from chapter_checking import assert_earns_only, assert_requirement_broken_alone
from checking import assert_full_marks, assert_mistake_named, mutate, run_suite, source_code

A = "06_positional_encoding"
REF = source_code(A)
REST = REF[REF.index("def apply_rotary_embedding"):]  # RoPE and the answers to the questions

# RoPE written with complex numbers (a rotation is a multiplication by e^{i p w}), keyword positions.
ROPE_COMPLEX = '''
def apply_rotary_embedding(x, positions=None):
    n, d = x.shape[-2:]
    if d % 2:
        raise ValueError("odd width")
    p = torch.arange(n, dtype=torch.float64) if positions is None else positions.double().cpu()
    w = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    rot = torch.polar(torch.ones(n, d // 2, dtype=torch.float64), p[:, None] * w).to(x.device)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rot).reshape(x.shape).to(x.dtype)
''' + REST[REST.index("q_frequency ="):]

SETUP = "import math\nimport torch\nfrom torch import nn\n"

# Slicing assignment, float64 computations, a shift matrix from torch.block_diag and a bare nn.Parameter table.
SLICES_FLOAT64 = SETUP + '''
def sinusoidal_positional_encoding(num_positions, dim):
    if dim % 2 == 1:
        raise ValueError("dim must be even")
    pos = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    pe = torch.zeros(num_positions, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.float()  # computed in float64, returned as the float32 the exercise asks for

def position_shift_matrix(delta, dim):
    if dim % 2:
        raise ValueError("odd dim")
    blocks = []
    for j in range(dim // 2):
        b = torch.tensor(delta / 10000 ** (2 * j / dim), dtype=torch.float64)
        blocks.append(torch.stack([torch.stack([b.cos(), -b.sin()]), torch.stack([b.sin(), b.cos()])]))
    return torch.block_diag(*blocks)

class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len, dim):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x):
        if x.size(1) > self.pos.size(0):
            raise ValueError(f"at most {self.pos.size(0)} positions")
        return x + self.pos[: x.size(1)].unsqueeze(0)
''' + REST

# Complex numbers for the table and the shift (multiplying by e^{i delta w} rotates), an index_select for the rows.
COMPLEX = SETUP + '''
def _w(dim):
    if dim % 2 != 0:
        raise ValueError("need an even dim")
    return 10000.0 ** (-2 * torch.arange(dim // 2, dtype=torch.float64) / dim)

def sinusoidal_positional_encoding(num_positions, dim):
    z = torch.polar(torch.ones(num_positions, dim // 2, dtype=torch.float64),
                    torch.arange(num_positions, dtype=torch.float64)[:, None] * _w(dim))
    return torch.view_as_real(z).flip(-1).reshape(num_positions, dim).float()   # (sin, cos) = (imag, real)

def position_shift_matrix(delta, dim):
    w = _w(dim)
    M = torch.zeros(dim, dim)
    c, s = torch.cos(delta * w).float(), torch.sin(delta * w).float()
    idx = torch.arange(0, dim, 2)
    M[idx, idx], M[idx + 1, idx + 1] = c, c
    M[idx, idx + 1], M[idx + 1, idx] = -s, s
    return M

class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len, dim):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, dim)

    def forward(self, x):
        B, n, _ = x.shape
        if n > self.max_len:
            raise ValueError(f"n = {n} > max_len = {self.max_len}")
        rows = self.table.weight.index_select(0, torch.arange(n, device=x.device))
        return x + rows.expand(B, n, -1)
''' + ROPE_COMPLEX


def test_reference_gets_full_marks():
    assert_full_marks(A, REF)


@pytest.mark.parametrize("code", [SLICES_FLOAT64, COMPLEX], ids=["slices-float64-parameter", "complex-index-select"])
def test_unusual_correct_answers_get_full_marks(code):
    assert_full_marks(A, code)


STACK = "P = torch.stack([angles.sin(), angles.cos()], dim=-1)"
W = "w = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)"
ODD = '''    if dim % 2:
        raise ValueError(f"dim must be even (sin/cos pairs), got {dim}")
    i = torch.arange'''
MISTAKES = {
    # name: (mutated code, a check that must fail, words its message must contain)
    "sin/cos swapped": (mutate(REF, STACK, "P = torch.stack([angles.cos(), angles.sin()], dim=-1)"),
                        "test_sinusoidal_values", "swapped"),
    "exponent without the 2": (mutate(REF, W, "w = 10000.0 ** (-torch.arange(0, dim // 2, dtype=torch.float64) / dim)"),
                               "test_sinusoidal_values", "factor 2"),
    "exponent with column index": (mutate(REF, W, "w = 10000.0 ** (-2 * torch.arange(0, dim, 2, dtype=torch.float64) / dim)"),
                                   "test_sinusoidal_values", "pair index"),
    "exponent sign": (mutate(REF, W, "w = 10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)"),
                      "test_sinusoidal_values", "wrong sign"),
    "concatenated, not interleaved": (mutate(REF, STACK, "P = torch.cat([angles.sin(), angles.cos()], dim=-1)"),
                                      "test_sinusoidal_values", "interleave"),
    "base 1000": (mutate(REF, W, W.replace("10000.0", "1000.0")), "test_sinusoidal_values", "base is 1000"),
    "table positions from 1": (mutate(REF, "i = torch.arange(num_positions, dtype=torch.float64)",
                                      "i = torch.arange(1, num_positions + 1, dtype=torch.float64)"),
                               ["test_sinusoidal_values"], "positions start at 1"),  # shape and dtype are right
    "shift frequency without the 2": (mutate(REF, "b = delta * 10000.0 ** (-2 * j / dim)", "b = delta * 10000.0 ** (-j / dim)"),
                                      "test_shift_matrix_property", "missing the factor 2"),
    "learned positions from 1 (clamped)": (mutate(REF, "positions = torch.arange(n, device=x.device)",
                                                  "positions = torch.arange(1, n + 1, device=x.device).clamp_max(self.max_len - 1)"),
                                           ["test_learned_embedding"], "positions start at 1"),  # max_len itself works
    "learned positions from 1": (mutate(REF, "positions = torch.arange(n, device=x.device)",
                                        "positions = torch.arange(1, n + 1, device=x.device)"),
                                 ["test_learned_embedding", "test_learned_embedding_max_len"], "positions start at 1"),
    "odd dim accepted": (mutate(REF, ODD, "    i = torch.arange").replace(
        "dim, 2, dtype=torch.float64) / dim)  # (dim/2,)", "dim + dim % 2, 2, dtype=torch.float64) / dim)  # (dim/2,)"),
        "test_sinusoidal_odd_dim", "ValueError"),
    "shift rotates the wrong way": (mutate(REF, '''        M[2 * j, 2 * j], M[2 * j, 2 * j + 1] = math.cos(b), -math.sin(b)
        M[2 * j + 1, 2 * j], M[2 * j + 1, 2 * j + 1] = math.sin(b), math.cos(b)''', '''        M[2 * j, 2 * j], M[2 * j, 2 * j + 1] = math.cos(b), math.sin(b)
        M[2 * j + 1, 2 * j], M[2 * j + 1, 2 * j + 1] = -math.sin(b), math.cos(b)'''),
        "test_shift_matrix_property", "wrong way"),
    "shift ignores delta": (mutate(REF, "b = delta * 10000.0 ** (-2 * j / dim)", "b = 10000.0 ** (-2 * j / dim)"),
                            "test_shift_matrix_property", "ignore delta"),
    "positions from the batch axis": (mutate(REF, "n = x.shape[-2]", "n = x.shape[0]"), "test_learned_embedding", "batch axis"),
    "embedding not added to x": (mutate(REF, "return x + self.embedding(positions)", "return self.embedding(positions).expand_as(x)"),
                                 "test_learned_embedding", "without adding x"),
    "no max_len error": (mutate(REF, '''        if n > self.max_len:
            raise ValueError(f"sequence of length {n} is longer than max_len={self.max_len}")
''', ""), "test_learned_embedding_max_len", "ValueError"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_classic_mistake_loses_points_with_named_message(name):
    assert_mistake_named(A, name, *MISTAKES[name])


@pytest.mark.parametrize("name", ["sin/cos swapped", "table positions from 1", "exponent without the 2"])
def test_odd_dim_check_tests_only_the_odd_dim(name):
    """A wrong table costs the value checks, not the check that an odd dim raises a ValueError."""
    assert run_suite(A, MISTAKES[name][0])["test_sinusoidal_odd_dim"] == ""


def test_importing_attnkit_earns_nothing_for_that_part():
    code = REF + "\nfrom attnkit import position_shift_matrix\n"
    results = run_suite(A, code)
    assert results["test_shift_matrix_property"].startswith("earns no points"), results
    assert results["test_sinusoidal_values"] == ""


# -- stated requirements (issue 13): each one, broken alone, costs points on its check with a named message --

RETURN_PE = "return P.reshape(num_positions, dim).float()  # (n, dim)"
ROPE_ODD = '''    if d % 2:
        raise ValueError(f"the last dimension must be even (column pairs), got {d}")
'''
ROPE_OUT = "return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)  # (..., n, d)"
MAX_LEN_RAISE = 'raise ValueError(f"sequence of length {n} is longer than max_len={self.max_len}")'
REQUIREMENTS = {
    # requirement (as in STATED_REQUIREMENTS, which names its check and message): a mutant of the reference
    # that breaks only it
    "table: float32": mutate(REF, RETURN_PE, "return P.reshape(num_positions, dim)"),
    "table: values": MISTAKES["sin/cos swapped"][0],
    "table: odd dim raises ValueError": MISTAKES["odd dim accepted"][0],
    "table: ValueError, not another exception": mutate(REF, 'raise ValueError(f"dim must be even (sin/cos pairs), got {dim}")\n    i = torch.arange',
               'raise TypeError(f"dim must be even (sin/cos pairs), got {dim}")\n    i = torch.arange'),
    "shift: row-vector direction": MISTAKES["shift rotates the wrong way"][0],
    "learned: x + table[:n]": MISTAKES["embedding not added to x"][0],
    "learned: ValueError past max_len": MISTAKES["no max_len error"][0],
    "learned: the ValueError names max_len": mutate(REF, MAX_LEN_RAISE, 'raise ValueError("too long")'),
    "rope: rotation direction": mutate(REF, ROPE_OUT, "return torch.stack([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], "
                                        "dim=-1).flatten(-2)"),
    "rope: neighbouring pairs": mutate(REF, "x1, x2 = x[..., 0::2], x[..., 1::2]", "x1, x2 = x.chunk(2, dim=-1)").replace(
        ROPE_OUT, "return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)"),
    "rope: frequencies": mutate(REF, "w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)",
                                 "w = 10000.0 ** (-torch.arange(0, d // 2, dtype=torch.float64, device=x.device) / d)"),
    "rope: default positions from 0": mutate(REF, "positions = torch.arange(n, device=x.device)\n    w",
                                              "positions = torch.arange(1, n + 1, device=x.device)\n    w"),
    "rope: given positions used": mutate(REF, "    if positions is None:\n        positions = torch.arange(n, device=x.device)\n    w",
                                          "    positions = torch.arange(n, device=x.device)\n    w"),
    "rope: x's dtype": mutate(REF, "cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)",
                               "cos, sin = angles.cos().float(), angles.sin().float()\n    x = x.float()"),
    "rope: odd d raises ValueError": mutate(REF, ROPE_ODD, ""),
    "rope: depends on i - j only": mutate(REF, "angles = positions.to(device=x.device, dtype=torch.float64)[:, None] * w",
                                           "angles = positions.to(device=x.device, dtype=torch.float64)[:, None] ** 2 * w"),
    "rope: a rotation keeps lengths": mutate(REF, ROPE_OUT, "return torch.stack([x1 * cos - x2 * sin, x1 * cos + x2 * sin], "
                                              "dim=-1).flatten(-2)"),
}


@pytest.mark.parametrize("name", list(REQUIREMENTS))
def test_stated_requirement_broken_alone_loses_points_on_its_check(name):
    assert_requirement_broken_alone(A, STATED_REQUIREMENTS, REQUIREMENTS, name)


def test_rope_written_with_complex_numbers_gets_full_marks():
    assert_full_marks(A, COMPLEX)


# -- conceptual questions (issue 14): the reference's answers pass; each named wrong answer gets its message --

QUESTIONS = {
    "q_frequency": [("10000 ** (-2 / 8)", "factor 2"), ("1e-4", "column index"), ("100.0", "sign"),
                    ("2 * math.pi * 100", "wavelength"), ("0.5", "not right"), ('"0.01"', "should be a number")],
    "q_pe_value": [("math.cos(1)", "cos(1)"), ("math.sin(100)", "w_0 = 1"), ("math.sin(10)", "factor 2"),
                   ("math.sin(math.pi / 180)", "degrees")],
    "q_rope_angle": [("50", "w_0 = 1"), ("5.0", "factor 2"), ("0.01", "frequency w_1 alone"),
                     ("28.6479", "degrees")],
    "q_dot_offset": [("math.sin(3)", "not sin"), ("math.cos(13)", "not their sum"), ("1", "not parallel"),
                     ("math.cos(5) * math.cos(8)", "only the cos")],
}


@pytest.mark.parametrize("name, wrong, words", [(q, w, m) for q, cases in QUESTIONS.items() for w, m in cases])
def test_question_wrong_answer_is_named(name, wrong, words):
    checking.assert_only_question_named(A, checking.with_answer(REF, name, wrong), name, QUESTIONS, words)


# -- issue 34: a part that computes nothing earns nothing ------------------------------------------------

PLACEHOLDERS = REF + '''

def sinusoidal_positional_encoding(num_positions, dim):
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    return torch.zeros(num_positions, dim)


def position_shift_matrix(delta, dim):
    return torch.eye(dim)


class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, max_len, dim):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, dim)

    def forward(self, x):
        if x.shape[-2] > self.max_len:
            raise ValueError(f"{x.shape[-2]} positions, more than max_len = {self.max_len}")
        return x.clone()


def apply_rotary_embedding(x, positions=None):
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even, got {x.shape[-1]}")
    return x.clone()
'''


def test_placeholders_that_raise_the_stated_errors_earn_nothing():
    """Issue 34: zeros, the identity and copies of x that raise the stated ValueErrors earned 5 of chapter 06's code
    checks (the shapes, the errors and the identity shift matrix at delta = 3)."""
    results = assert_earns_only(A, PLACEHOLDERS, {"sinusoidal_positional_encoding", "position_shift_matrix",
                                                  "LearnedPositionalEmbedding", "apply_rotary_embedding"})
    assert "not the expected value" in results["test_shift_matrix_shape"], results
