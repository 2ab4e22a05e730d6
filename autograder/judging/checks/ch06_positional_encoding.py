"""Graded checks for exercise 06_positional_encoding: the sinusoidal table, the shift matrix, learned embeddings,
rotary embeddings (RoPE) and four conceptual questions; the requirements the exercise states are STATED_REQUIREMENTS."""

from __future__ import annotations

import math

import torch

from attnkit import apply_rotary_embedding as ref_rope
from attnkit import position_shift_matrix as ref_shift
from attnkit import sinusoidal_positional_encoding as ref_pe
from autograder.judging.checks.compare import expect_computes
from autograder.judging.checks import (CheckFailed, StudentError, Suite, Trial, close, expect_close, expect_tensor,
                                       expect_value_error, number, requirements)

SUITE = Suite("06_positional_encoding")
_PE_SHAPE, _PE_VALUES, _PE_ODD = (f"test_sinusoidal_{c}" for c in ("shape", "values", "odd_dim"))
_SHIFT, _LEARNED, _MAX_LEN = "test_shift_matrix_property", "test_learned_embedding", "test_learned_embedding_max_len"
_ROPE, _ROPE_ODD, _RELATIVE = (f"test_rotary_{c}" for c in ("values", "odd_dim", "relative"))
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'table: float32': (_PE_SHAPE, 'float32', 'return a float32 tensor of shape'),
    'table: values': (_PE_VALUES, 'swapped', 'p[i, 2j] = \\sin(i\\, w_j)'),
    'table: odd dim raises ValueError': (_PE_ODD, 'ValueError', 'an odd dim cannot be split into pairs'),
    'table: ValueError, not another exception': (_PE_ODD, 'TypeError', 'raise a valueerror that says so'),
    'shift: row-vector direction': (_SHIFT, 'wrong way', 'row vector multiplied on the left'),
    'learned: x + table[:n]': (_LEARNED, 'without adding x', 'returns x plus row p'),
    'learned: ValueError past max_len': (_MAX_LEN, 'ValueError', 'if n > max_len'),
    'learned: the ValueError names max_len': (_MAX_LEN, 'does not name max_len', 'that names max_len'),
    'rope: rotation direction': (_ROPE, 'wrong way', 'x_{2j}\\sin(p w_j) + x_{2j+1}\\cos(p w_j)'),
    'rope: neighbouring pairs': (_ROPE, 'rotate half', 'the column pair (x_{2j}, x_{2j+1})'),
    'rope: frequencies': (_ROPE, 'factor 2', 'w_j = 10000^{-2j/d} as in the table'),
    'rope: default positions from 0': (_ROPE, 'start at 1', 'by default 0 .. n-1'),
    'rope: given positions used': (_ROPE, 'positions argument is ignored', '1-d tensor of the n rows'),
    "rope: x's dtype": (_ROPE, "return x's dtype", 'shape and dtype (a float64 x'),
    'rope: odd d raises ValueError': (_ROPE_ODD, 'ValueError', 'an odd d cannot be split'),
    'rope: depends on i - j only': (_RELATIVE, 'offset only', 'on q, k and i - j only', (_ROPE, _ROPE_ODD)),
    'rope: a rotation keeps lengths': (_RELATIVE, 'length', 'rotates each query and key', (_ROPE, _ROPE_ODD)),
})
PE, SHIFT, LEARNED = "sinusoidal_positional_encoding", "position_shift_matrix", "LearnedPositionalEmbedding"
ROPE = "apply_rotary_embedding"
LEARNED_FROM_1 = ("the positions start at 1: the row of position i is table[i], counted from 0, so a sequence of "
                  "n positions uses rows 0..n-1 (torch.arange(n))")


# -- the sinusoidal table -------------------------------------------------------------------------


def _w(d: int, k: float = 2, base: float = 10000.0) -> torch.Tensor:
    """The pair frequencies base^(-k j / d), j = 0 .. d/2 - 1: the exercise's w_j (k = 2), or a mistake's."""
    return base ** (-k * torch.arange(d // 2, dtype=torch.float64) / d)


def _table(n: int, d: int, w: torch.Tensor, sin_first: bool = True, start: int = 0) -> torch.Tensor:
    """An interleaved sin/cos table with the pair frequencies ``w``, for positions start..start+n-1."""
    a = torch.arange(start, start + n, dtype=torch.float64)[:, None] * w  # (n, d/2)
    first, second = (a.sin(), a.cos()) if sin_first else (a.cos(), a.sin())
    return torch.stack([first, second], -1).reshape(n, d)


def _pe_mistakes(n: int, d: int) -> dict[str, torch.Tensor]:
    i, c = torch.arange(n, dtype=torch.float64)[:, None], torch.arange(d, dtype=torch.float64)
    per_column = i * 10000.0 ** (-c / d)  # each column its own frequency
    a = i * _w(d)
    return {
        "sin and cos are swapped: even columns 2j hold sin(i w_j), odd columns 2j+1 hold cos(i w_j)":
            _table(n, d, _w(d), sin_first=False),
        "the frequency exponent is missing its factor 2: w_j = 10000^(-2j/dim), with j counting sin/cos pairs":
            _table(n, d, _w(d, 1)),
        "the frequency exponent uses the column index 2j where it needs the pair index j: w_j = 10000^(-2j/dim), "
        "so the pair in columns (2j, 2j+1) uses j, not 2j": _table(n, d, _w(d, 4)),
        "the frequency exponent has the wrong sign: w_j = 10000^(-2j/dim) shrinks as j grows (10000^(+2j/dim) grows)":
            _table(n, d, _w(d, -2)),
        "each column got its own frequency 10000^(-c/dim); the sin and cos of pair j share one frequency "
        "w_j = 10000^(-2j/dim)": torch.where(c.long() % 2 == 0, per_column.sin(), per_column.cos()),
        "sin fills the first half of the columns and cos the second; they must interleave: column 2j is sin, 2j+1 cos":
            torch.cat([a.sin(), a.cos()], -1),
        "the base is 1000; the frequencies are w_j = 10000^(-2j/dim)": _table(n, d, _w(d, base=1000.0)),
        "the positions start at 1: row i is position i, counted from 0 (torch.arange(num_positions)), so row 0 is "
        "[sin 0, cos 0, ...] = [0, 1, 0, 1, ...]": _table(n, d, _w(d), start=1),
    }


@SUITE.check(_PE_SHAPE, parts=[PE])
def sinusoidal_shape(t: Trial) -> None:
    """Shape (num_positions, dim), float32 (the values are test_sinusoidal_values')."""
    for n, d in [(5, 4), (1, 2), (17, 10)]:
        P = expect_tensor(t.call(PE, n, d), (n, d), f"sinusoidal_positional_encoding({n}, {d})")
        if P.dtype != torch.float32:
            raise CheckFailed(f"sinusoidal_positional_encoding({n}, {d}) has dtype {P.dtype}; the exercise asks for "
                              "float32 (the dtype of the embeddings it is added to: a float64 table would turn x + P "
                              "into float64). Compute in float64 if you like, then .float()")
    expect_computes(P, ref_pe(n, d, dtype=torch.float64), f"sinusoidal_positional_encoding({n}, {d})", _pe_mistakes(n, d),
                    atol=2e-4)


SUITE.oracle(_PE_VALUES, PE, "Every entry equals sin(i w_j) / cos(i w_j) with w_j = 10000^(-2j/dim), "
             "for several sizes.", cases=[(12, 8), (60, 32), (7, 6)],
             reference=lambda n, d: ref_pe(n, d, dtype=torch.float64), mistakes=_pe_mistakes, atol=2e-4)


@SUITE.check(_PE_ODD, parts=[PE])
def sinusoidal_odd_dim(t: Trial) -> None:
    """An odd dim raises a ValueError (the columns come in sin/cos pairs)."""
    for d in (5, 1):
        expect_value_error(lambda: t.call(PE, 4, d), f"sinusoidal_positional_encoding(4, {d})",
                            "With an odd dim the last sin column would have no cos partner: check dim % 2 first")
    P = expect_tensor(t.call(PE, 3, 2), (3, 2), "sinusoidal_positional_encoding(3, 2) (the smallest even dim must work)")
    expect_computes(P, ref_pe(3, 2, dtype=torch.float64), "sinusoidal_positional_encoding(3, 2)", _pe_mistakes(3, 2))


# -- the shift matrix -----------------------------------------------------------------------------


def _rotation(delta: int, w: torch.Tensor) -> torch.Tensor:
    """The block-diagonal shift matrix (row-vector convention) with pair frequencies ``w``."""
    c, s = torch.cos(delta * w), torch.sin(delta * w)
    return torch.block_diag(*torch.stack([c, -s, s, c], -1).reshape(-1, 2, 2))


def _shift_mistakes(delta: int, d: int) -> dict[str, torch.Tensor]:
    return {
        "the rotation frequencies are missing the factor 2: block j turns by delta * w_j with "
        "w_j = 10000^(-2j/dim), the frequency of the table's pair j": _rotation(delta, _w(d, 1)),
        "the rotation frequencies use the column index 2j where the pair index j belongs: block j turns by "
        "delta * w_j with w_j = 10000^(-2j/dim)": _rotation(delta, _w(d, 4)),
        "M rotates the wrong way: P[i] @ M gives P[i - delta]. For row vectors, block j is "
        "[[cos(delta w_j), -sin(delta w_j)], [sin(delta w_j), cos(delta w_j)]]; you built its transpose "
        "(the column-vector rotation)": ref_shift(delta, d, dtype=torch.float64).T,
        "the rotation angles ignore delta: block j turns by delta * w_j, not w_j": ref_shift(1, d, dtype=torch.float64),
    }


@SUITE.check("test_shift_matrix_shape", parts=[SHIFT])
def shift_matrix_shape(t: Trial) -> None:
    """Shape (dim, dim); delta = 0 gives the identity; M is block diagonal with 2x2 blocks."""
    expect_close(t.call(SHIFT, 0, 6), torch.eye(6), "position_shift_matrix(0, 6) (a shift by 0 changes nothing)")
    M = expect_tensor(t.call(SHIFT, 3, 8), (8, 8), "position_shift_matrix(3, 8)")
    block = torch.block_diag(*[torch.ones(2, 2)] * 4).bool()
    if M.to(torch.float64)[~block].abs().max() > 1e-6:
        raise CheckFailed("position_shift_matrix(3, 8) has non-zero entries outside the 2x2 diagonal blocks: each "
                          "sin/cos pair (columns 2j, 2j+1) rotates on its own")
    # the identity passes the two checks above for every delta: M(3, 8) is not the identity (issue 34)
    expect_computes(M, ref_shift(3, 8, dtype=torch.float64), "position_shift_matrix(3, 8)", _shift_mistakes(3, 8))


@SUITE.check(_SHIFT, parts=[SHIFT])
def shift_matrix_property(t: Trial) -> None:
    """P[i + delta] = P[i] @ M for every position i, several offsets (including negative) and widths."""
    n = 40
    for delta, d in [(1, 4), (5, 16), (-3, 8), (int(t.randint(10, 60, (1,))), 12)]:
        P = ref_pe(n + abs(delta), d, dtype=torch.float64)
        M = expect_tensor(t.call(SHIFT, delta, d), (d, d), f"position_shift_matrix({delta}, {d})")
        i = torch.arange(max(0, -delta), n)
        expect_close(P[i] @ M.to(torch.float64), P[i + delta], f"P[i] @ position_shift_matrix({delta}, {d}) (should "
                     f"be P[i + {delta}])", {msg: P[i] @ W for msg, W in _shift_mistakes(delta, d).items()}, atol=2e-4)


# -- learned embeddings ---------------------------------------------------------------------------


def _table_of(obj, max_len: int, dim: int) -> tuple[str, torch.Tensor]:
    found = [(k, v) for k, v in obj.params().items() if tuple(v.shape) == (max_len, dim)]
    if len(found) != 1:
        raise CheckFailed(f"LearnedPositionalEmbedding({max_len}, {dim}) should hold one learned table of shape "
                          f"({max_len}, {dim}) (for example nn.Embedding({max_len}, {dim})); found "
                          f"{len(found)} parameter(s) of that shape")
    return found[0]


def _learned_mistakes(x: torch.Tensor, table: torch.Tensor) -> dict[str, torch.Tensor]:
    n = x.shape[-2]
    return {
        LEARNED_FROM_1: x + table[torch.arange(1, n + 1).clamp_max(table.shape[0] - 1)],
        "it returns the position rows without adding x: forward must return x + the row of each position":
            table[:n].expand_as(x).clone(),
        "every position got the same row: the positions run along axis -2 (x.shape[-2] or x.shape[1]), "
        "not the batch axis 0": x + table[0],
    }


@SUITE.check(_LEARNED, parts=[LEARNED])
def learned_embedding(t: Trial) -> None:
    """forward(x) = x + table[:n] for (B, n, dim) inputs, with the module's own table and with loaded weights."""
    max_len, dim = 12, 6
    obj = t.new(LEARNED, max_len, dim)
    name, table = _table_of(obj, max_len, dim)
    for b, n in [(1, 5), (3, 7), (2, max_len)]:
        x = t.randn(b, n, dim)
        expect_close(obj(x), x + table[:n], f"LearnedPositionalEmbedding({max_len}, {dim}) on x of shape {(b, n, dim)}",
                     _learned_mistakes(x, table))
    new = t.randn(max_len, dim)
    obj.load({name: new})
    x = t.randn(2, 4, dim)
    expect_close(obj(x), x + new[:4], "the output after loading a new table into the module (forward must use the "
                 "module's own learned table)", _learned_mistakes(x, new))


@SUITE.check(_MAX_LEN, parts=[LEARNED])
def learned_embedding_max_len(t: Trial) -> None:
    """Sequences up to max_len work; a longer one raises a ValueError (there is no learned row for it)."""
    obj = t.new(LEARNED, 5, 4)
    name, table = _table_of(obj, 5, 4)
    table = t.randn(5, 4)  # a table of the judge's (a table of zeros would make x + table[:n] a copy of x)
    obj.load({name: table})
    try:
        out = obj(t.randn(2, 5, 4))
    except StudentError as err:
        if not err.placeholder:
            short = t.randn(2, 3, 4)
            try:
                from_1 = close(obj(short), short + table[1:4])
            except CheckFailed:  # (a StudentError too)
                from_1 = False
            if from_1:
                raise CheckFailed(f"a sequence of exactly max_len = 5 positions fails ({err}): {LEARNED_FROM_1}") from None
        raise
    expect_tensor(out, (2, 5, 4), "the output for a sequence of exactly max_len = 5 positions")
    x = t.randn(2, 3, 4)
    expect_computes(obj(x), x + table[:3], "LearnedPositionalEmbedding(5, 4) on x of shape (2, 3, 4)",
                    _learned_mistakes(x, table))
    expect_value_error(lambda: obj(t.randn(2, 6, 4)), "LearnedPositionalEmbedding(5, 4) on a sequence of 6 positions",
                        "Position 5 has no learned row: compare x.shape[-2] with max_len and raise a ValueError that "
                        "names both")
    try:
        obj(t.randn(1, 7, 4))
    except StudentError as err:
        if "max_len" not in str(err) and "5" not in str(err):
            raise CheckFailed("the ValueError for a sequence of 7 positions does not name max_len: say what the limit "
                              f"is (max_len = 5) and what came (7), got: {err}") from None


# -- rotary embeddings (RoPE) ----------------------------------------------------------------------


def _rope(x: torch.Tensor, positions: torch.Tensor, w: torch.Tensor, halves: bool = False) -> torch.Tensor:
    """RoPE with pair frequencies ``w``; ``halves`` pairs column j with j + d/2 (the rotate-half layout)."""
    a = positions.to(torch.float64)[:, None] * w  # (n, d/2)
    c, s = a.cos(), a.sin()
    x = x.to(torch.float64)
    x1, x2 = x.chunk(2, dim=-1) if halves else (x[..., 0::2], x[..., 1::2])
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    return torch.cat([y1, y2], -1) if halves else torch.stack([y1, y2], -1).flatten(-2)


def _rope_mistakes(x: torch.Tensor, positions: torch.Tensor | None) -> dict[str, torch.Tensor]:
    n, d = x.shape[-2], x.shape[-1]
    p, w = torch.arange(n) if positions is None else positions, _w(d)
    return {
        "each pair turns the wrong way (by -p w_j): the rotation of (x_2j, x_2j+1) by the angle a is "
        "(x_2j cos a - x_2j+1 sin a, x_2j sin a + x_2j+1 cos a)": _rope(x, -p, w),
        "the pairs are (j, j + d/2), the 'rotate half' layout; this exercise pairs neighbouring columns (2j, 2j+1), "
        "like the sinusoidal table": _rope(x, p, w, halves=True),
        "the frequency exponent is missing its factor 2: w_j = 10000^(-2j/d), j counting pairs": _rope(x, p, _w(d, 1)),
        "the frequency uses the column index 2j for the pair index j: w_j = 10000^(-2j/d)": _rope(x, p, _w(d, 4)),
        "the positions start at 1: row i is position i, counted from 0": _rope(x, p + 1, w),
        "the sinusoidal table was added instead of rotating: RoPE multiplies each pair by a rotation, it adds nothing":
            x.to(torch.float64) + ref_pe(n, d, dtype=torch.float64) if positions is None else x.to(torch.float64),
        **({} if positions is None else {
            "the positions argument is ignored: rotate row i by positions[i] w_j (0 .. n-1 only by default)":
                _rope(x, torch.arange(n), w)}),
    }


def _call_rope(t: Trial, x: torch.Tensor, positions: torch.Tensor | None, what: str) -> torch.Tensor:
    got = t.call(ROPE, x) if positions is None else t.call(ROPE, x, positions)
    return expect_tensor(got, tuple(x.shape), what)


@SUITE.check(_ROPE, parts=[ROPE])
def rotary_values(t: Trial) -> None:
    """Equals attnkit's RoPE for default and given positions, several shapes; keeps x's dtype (float32, float64)."""
    for shape, positions in [((2, 5, 8), None), ((3, 2, 6, 4), None), ((1, 4, 16), torch.tensor([7, 3, 12, 0])),
                             ((2, 3, 6), torch.tensor([2.5, 10.0, 41.0]))]:
        x = t.randn(*shape)
        given = "" if positions is None else f", positions={positions.tolist()}"
        what = f"apply_rotary_embedding(x of shape {shape}{given})"
        expect_close(_call_rope(t, x, positions, what), ref_rope(x.to(torch.float64), positions), what,
                     _rope_mistakes(x, positions), atol=1e-4)
    x = t.randn(2, 3, 4, dtype=torch.float64)
    for dtype, how in [("float64", " (build the cos and sin tables in x.dtype, or convert the result with "
                                   ".to(x.dtype))"), ("float32", "")]:
        got = _call_rope(t, x.to(getattr(torch, dtype)), None, f"apply_rotary_embedding(x {dtype} of shape (2, 3, 4))")
        if got.dtype != getattr(torch, dtype):
            raise CheckFailed(f"apply_rotary_embedding on a {dtype} x returned {got.dtype}: return x's dtype{how}")


@SUITE.check(_ROPE_ODD, parts=[ROPE])
def rotary_odd_dim(t: Trial) -> None:
    """An odd last dimension raises a ValueError (columns are rotated in pairs)."""
    expect_value_error(lambda: t.call(ROPE, t.randn(1, 3, 5)), "apply_rotary_embedding(x of shape (1, 3, 5))",
                        "With an odd width the last column has no partner to rotate with: check x.shape[-1] % 2")
    x = t.randn(1, 3, 4)
    expect_computes(_call_rope(t, x, None, "apply_rotary_embedding(x of shape (1, 3, 4))"),
                    ref_rope(x.to(torch.float64), None), "apply_rotary_embedding(x of shape (1, 3, 4))",
                    _rope_mistakes(x, None))


@SUITE.check(_RELATIVE, parts=[ROPE])
def rotary_relative(t: Trial) -> None:
    """The score rope(q)_i . rope(k)_j depends on i - j only (same q, k at every position); norms are kept."""
    n, d = 9, 8
    q, k = t.randn(d), t.randn(d)
    Q, K = (_call_rope(t, v.expand(1, n, d).clone(), None, f"apply_rotary_embedding(x of shape (1, {n}, {d}))")[0]
            .to(torch.float64) for v in (q, k))
    if not torch.allclose(Q.norm(dim=-1), q.to(torch.float64).norm().expand(n), atol=1e-4):
        raise CheckFailed("apply_rotary_embedding changes the length of the vectors: a rotation keeps every "
                          "(x_2j, x_2j+1) pair's length; use cos and sin of the same angle in the 2x2 rotation")
    S = Q @ K.T  # (n, n): S[i, j] = rope(q)_i . rope(k)_j
    for off in range(-n + 2, n - 1):
        diag = torch.diagonal(S, off)
        if (diag - diag[0]).abs().max() > 1e-3:
            raise CheckFailed(f"rope(q) at position i dotted with rope(k) at position j changes along i - j = {-off} "
                              "(for the same q and k): the score must depend on the offset only. Rotate every pair "
                              "of position p by p w_j, with the same w_j for queries and keys")
    if (S - S[0, 0]).abs().max() < 1e-6:
        raise CheckFailed("every score rope(q)_i . rope(k)_j is the same: the rotation ignores the positions")


# -- conceptual questions ------------------------------------------------------------------------------

SUITE.questions({
    "q_frequency": number(10000.0 ** (-4 / 8), "w_j of the sin/cos pair in columns 4 and 5 of a dim-8 table.", {
        "the exponent is missing its factor 2: w_j = 10000^(-2j/dim) with j = 2, the pair index": 10000.0 ** (-2 / 8),
        "that uses the column index 4 as the pair index: columns 4 and 5 are pair j = 2": 10000.0 ** (-8 / 8),
        "the exponent's sign is wrong: frequencies shrink from w_0 = 1": 10000.0 ** (4 / 8),
        "that is a wavelength (2 pi / w_j), not the frequency w_j": 2 * math.pi * 10000.0 ** (4 / 8)}),
    "q_pe_value": number(math.sin(1.0), "P[100, 2] of a dim-4 table (pair j = 1, w_1 = 0.01).", {
        "that is cos(1), the odd column 3: even columns hold the sine": math.cos(1.0),
        "that is sin(100 w_0) with w_0 = 1: column 2 belongs to pair j = 1, whose frequency is 0.01": math.sin(100.0),
        "the exponent is missing its factor 2 (w_1 = 10000^(-1/4) = 0.1)": math.sin(10.0),
        "the sine's argument was taken in degrees; torch and math work in radians": math.sin(math.radians(1.0))}),
    "q_rope_angle": number(0.5, "The angle RoPE turns pair j = 1 of a d = 4 vector at position 50.", {
        "that uses w_0 = 1: pair j = 1 turns with w_1 = 10000^(-2/4) = 0.01": 50.0,
        "the exponent is missing its factor 2 (w_1 = 10000^(-1/4))": 50 * 10000.0 ** (-1 / 4),
        "that is the frequency w_1 alone: the angle is the position times the frequency": 0.01,
        "that is in degrees; the angle p w_j is in radians": math.degrees(0.5)}),
    "q_dot_offset": number(math.cos(3.0), "The dot product P[5] . P[8] of a dim-2 table: cos of the offset.", {
        "sin a sin b + cos a cos b is cos(a - b), not sin(a - b)": math.sin(3.0),
        "sin a sin b + cos a cos b is cos(a - b), the difference of the positions, not their sum": math.cos(13.0),
        "rows of the table have length 1, but two different rows are not parallel: their dot product is cos of "
        "the angle between them": 1.0,
        "that is cos(5) cos(8), only the cos columns: the dot product also adds sin(5) sin(8)":
            math.cos(5.0) * math.cos(8.0)}),
})
