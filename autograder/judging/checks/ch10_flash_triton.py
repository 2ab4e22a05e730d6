"""Checks of exercise 10_flash_triton, run in Triton's interpreter on the CPU (n <= 130, tiles of 32 or 64, two
launches a check at most; the judge never imports Triton). The kernel's checks launch it on the stated grid themselves
(a wrong wrapper costs no kernel check): inputs in buffers that go on with NaN (a load without a mask reads them),
outputs in buffers of a marker (a row never written keeps it, a store past the end changes the tail). The wrapper is
judged against that launch of the student's own kernel (a wrong kernel costs no wrapper check). The references come
from a float64 emulation of the tiled loop whose switches make the classic mistakes (attnkit.flash_diagnose: the same
messages reach the student in the exercise's visible tests). What a GPU refuses but the
interpreter runs is tested by its effect: tile sizes (a ValueError), masks (the NaN), bfloat16 in tl.dot (one-hot rows).
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

import torch
from torch import Tensor

from attnkit.flash_diagnose import (LN_2, LOG2_E, UNWRITTEN, causal_mistake, grid_mistake, lse_mistake,
                                    not_row_after_row, output_mistake, scale_mistake, stores_past_the_end,
                                    unwritten_or_nan)
from autograder.judging.checks import (PLACEHOLDER, CheckFailed, Obj, StudentError, Suite, Trial, expect_value_error,
                                       explained, number, requirements)

SUITE = Suite("10_flash_triton")
KERNEL, WRAPPER = "flash_forward_kernel", "flash_attention_forward"
KERNEL_CHECKS = _TILES, _RAGGED, _CAUSAL, _LSE = ("test_kernel_tiles", "test_kernel_ragged", "test_kernel_causal",
                                                  "test_kernel_lse")
_LAUNCH, _SHAPES, _STRIDES = "test_wrapper_launch", "test_wrapper_shapes", "test_wrapper_strides"
STATED_REQUIREMENTS = requirements({  # name -> (check(s), words of the message, words of the text[, also fails])
    'the running max rescales the sum and the accumulator': (_TILES, 'rescale', 'rescales the sum and the accumulator',
        (_RAGGED, _CAUSAL)),
    'exp2 with log2(e) folded into the scale': (_TILES, 'log2(e)', 'log2(e) folded into the scale', KERNEL_CHECKS[1:]),
    'masked loads': (_RAGGED, 'tl.load without a mask', 'a mask on every tl.load and tl.store', (_CAUSAL,)),
    'masked stores': (_RAGGED, 'tl.store without a mask', 'a mask on every tl.load and tl.store', (_CAUSAL,)),
    'keys past m are not attended': (_RAGGED, 'positions >= m', 'keys past the end (positions >= m)', (_CAUSAL,)),
    'causal: query i sees keys j <= i': (_CAUSAL, 'j <= i', 'query i sees the keys j <= i'),
    'the log-sum-exp is a natural log': (_LSE, 'natural log', 'as a natural logarithm'),
    'no bfloat16 in tl.dot': (_TILES, 'bfloat16', "keep tl.dot's operands in the dtype", KERNEL_CHECKS[1:]),
    'program ids: query tile, then head': (_TILES, 'program_id(0)', 'tl.program_id(0) of head tl.program_id(1)',
        (_RAGGED, _CAUSAL)),
    'the wrapper returns (output, lse)': (_SHAPES, '(output, lse)', 'returns (output, lse)', (_LAUNCH, _STRIDES)),
    'tile sizes are powers of two of at least 16': ('test_wrapper_blocks', 'power of two',
        'is not a power of two of at least 16'),
    'qk_scale = log2(e) / sqrt(d)': (_LAUNCH, 'log2(e)', 'qk_scale = log2_e / math.sqrt(d)'),
    'the grid covers the last partial tile': (_LAUNCH, 'triton.cdiv', 'the grid (triton.cdiv(n, block_m), b * h)'),
    'causal is passed to the kernel': (_LAUNCH, 'causal', 'causal as causal'),
    'q, k, v made contiguous': (_STRIDES, 'contiguous', 'makes q, k, v contiguous'),
})

# The exercise asks for the kernel and the launch: what each may call is its vocabulary (attnkit.vocabulary, printed
# in the exercise): no softmax in either, no matrix product (nor `@`) in the wrapper; the kernel may use triton.language.
# The classic mistakes and their messages are attnkit.flash_diagnose's, which the exercise's visible tests call too.


# -- the grader's tools in the student's process, built from this source (lower, launch, record) ------------------

TOOLS = '''"""The grader's tools for chapter 10, built from this source in the student's process (never a name of the
student's): lower a kernel to Triton IR for a GPU target (no GPU needed), launch it on padded buffers, record the
launches a wrapper makes. What they return is data (text, numbers, copies of memory); the judge decides."""

import inspect
import sys
import types

import torch
import triton

try:
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - every Triton the course admits has the interpreter
    InterpretedFunction = None
from triton.runtime.jit import JITFunction

KINDS = tuple(k for k in (JITFunction, InterpretedFunction) if k is not None)
UNWRITTEN = -7777.0
ARGS = 12  # Q, K, V, O, LSE, n, m, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM


def _api():
    """Triton's front end, as this Triton spells it: (ASTSource, make_backend, GPUTarget, ir); a clear error when it
    moved."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource, make_backend
        from triton._C.libtriton import ir
        import triton.compiler.code_generator  # noqa: F401 - imported while the interpreter's flag is as it was
    except ImportError as e:
        raise RuntimeError(f"the grader cannot lower kernels with Triton {triton.__version__}: {e} (the course "
                           "admits the Triton of requirements.txt)") from None
    return ASTSource, make_backend, GPUTarget, ir


def _remade(f, g):
    new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    new.__kwdefaults__, new.__annotations__ = f.__kwdefaults__, dict(getattr(f, "__annotations__", {}))
    new.__module__, new.__qualname__, new.__doc__ = f.__module__, f.__qualname__, f.__doc__
    return new


def _jit(fn):
    """Triton's own library function ``fn`` as a JITFunction, made once per process (reading its source is slow)."""
    import triton.runtime.interpreter as interpreter

    made = interpreter.__dict__.setdefault("_grader_jit_functions", {})
    if fn not in made:
        made[fn] = JITFunction(fn)
    return made[fn]


def _interpreted(val):
    """Whether ``val`` is one of the interpreter's stand-ins for a piece of triton.language."""
    import functools
    import triton.runtime.interpreter as interpreter

    if isinstance(val, functools.partial):
        val = val.func
    code = getattr(val, "__code__", None)
    return val is print or (code is not None and code.co_filename == interpreter.__file__)


class _Compiled:
    """While lowering: every interpreted function in reach (the kernel's module, Triton's language modules and the
    tensor methods they define) seen as the JITFunction it would be without the interpreter, and the interpreter's
    flag off; everything put back after."""

    def __init__(self, kernel):
        self.kernel, self.undo = kernel, []

    def _swap(self, owner, name, new):
        self.undo.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, new)

    def __enter__(self):
        fn = self.kernel.fn
        if InterpretedFunction is None or type(self.kernel) is JITFunction:
            self.flag = None
            return self.kernel
        g = dict(fn.__globals__)
        own = fn.__globals__
        for key, val in list(g.items()):
            if type(val) is InterpretedFunction:
                g[key] = JITFunction(_remade(val.fn, g) if val.fn.__globals__ is own else val.fn)
        lang = triton.language
        for name, module in list(sys.modules.items()):
            if name.startswith("triton.language") and module is not None:
                for key, val in list(vars(module).items()):
                    if type(val) is InterpretedFunction:
                        self._swap(module, key, _jit(val.fn))
                    elif _interpreted(val):  # left patched by a device function the interpreter ran
                        kw = getattr(val, "__kwdefaults__", None) or {}
                        plain = kw.get("member", getattr(lang, key, None))
                        if plain is not None and not _interpreted(plain):
                            self._swap(module, key, plain)
        for cls in (lang.core.tensor, lang.core.dtype, lang.core.condition):
            for key, val in list(vars(cls).items()):
                if _interpreted(val) and "member" in (getattr(val, "__kwdefaults__", None) or {}):
                    self._swap(cls, key, val.__kwdefaults__["member"])
        tensor = triton.language.core.tensor
        for key, val in list(vars(tensor).items()):
            cells = getattr(val, "__closure__", None) or ()
            inner = [c.cell_contents for c in cells if type(c.cell_contents) is InterpretedFunction]
            if inner:
                self._swap(tensor, key, _jit(inner[0].fn))
        self.flag = triton.knobs.runtime.interpret
        triton.knobs.runtime.interpret = False
        return JITFunction(_remade(fn, g))

    def __exit__(self, *exc):
        if self.flag is not None:
            triton.knobs.runtime.interpret = self.flag
        while self.undo:
            owner, name, val = self.undo.pop()
            setattr(owner, name, val)


def lower(kernel, constexprs, dtype="fp32"):
    """``kernel`` lowered to Triton IR for an NVIDIA GPU (sm_80), with these constexprs: ("ir", text), or
    ("error", the compiler's message), or ("kind", what the object is when it is no Triton kernel at all)."""
    if type(kernel) not in KINDS:
        return ("kind", f"a {type(kernel).__module__}.{type(kernel).__qualname__}")
    names = list(inspect.signature(kernel.fn).parameters)
    if len(names) != ARGS:
        return ("error", f"it takes {len(names)} parameters ({', '.join(names)}); the exercise's kernel takes "
                         f"{ARGS}: Q, K, V, O, LSE, n, m, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM")
    types_ = [f"*{dtype}"] * 4 + ["*fp32", "i32", "i32", "fp32"] + ["constexpr"] * 4
    ASTSource, make_backend, GPUTarget, ir = _api()
    target = GPUTarget("cuda", 80, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    codegen, modules = backend.get_codegen_implementation(options), backend.get_module_map()
    try:
        with _Compiled(kernel) as fn:
            src = ASTSource(fn, dict(zip(names, types_)), dict(zip(names[8:], constexprs)))
            module = src.make_ir(target, options, codegen, modules, context)
    except Exception as e:  # noqa: BLE001 - the compiler's message is the verdict's evidence
        return ("error", f"{type(e).__name__}: {e}")
    return ("ir", str(module))


def _raw(x):
    """The memory a kernel reads at ``x``'s pointer as a contiguous tensor would lay it out: numel elements."""
    return x.as_strided((x.numel(),), (1,))


def _padded(x, tail, fill):
    """x's memory followed by at least ``tail`` elements of ``fill``, and by at least as many as x has."""
    return torch.cat([_raw(x), torch.full((max(tail, x.numel()),), fill, dtype=x.dtype)])


class Launch:
    """Inputs (B, H, len, d) in buffers that go on with ``tail`` NaN (a load past the end reads NaN), outputs in
    buffers of UNWRITTEN with the same tail (a row never written keeps it, a store past the end changes the tail);
    called with ``(kernel, qk_scale, causal, block_m, block_n)``, it runs the kernel on its grid
    ``(cdiv(n, block_m), B * H)`` and returns copies of the whole output buffers, tails included, and the error the
    kernel raised (or None)."""

    def __init__(self, q, k, v, tail):
        self.q, self.k, self.v = (_padded(x.contiguous(), tail, float("nan"))[: x.numel()].view(x.shape)
                                  for x in (q, k, v))
        self.o_buf = torch.full((q.numel() + tail,), UNWRITTEN, dtype=q.dtype)  # tail: as the judge sends it
        self.lse_buf = torch.full((q[..., 0].numel() + tail,), UNWRITTEN, dtype=torch.float32)

    def __call__(self, kernel, qk_scale, causal, block_m, block_n):
        if type(kernel) not in KINDS:
            raise TypeError("not a Triton kernel")
        (B, H, n, d), m = self.q.shape, self.k.shape[2]
        o, lse = self.o_buf[: self.q.numel()].view(B, H, n, d), self.lse_buf[: B * H * n].view(B, H, n)
        error = None
        try:
            type(kernel).run(kernel, self.q, self.k, self.v, o, lse, n, m, qk_scale, causal, block_m, block_n, d,
                             grid=(-(-n // block_m), B * H), warmup=False)
        except Exception as e:  # noqa: BLE001 - the judge reads it
            error = f"{type(e).__name__}: {e}"[:2000]
        return self.o_buf.clone(), self.lse_buf.clone(), error


class Tools:
    """The student's kernel object, lowered (:func:`lower`) and launched (:class:`Launch`) by the grader's code."""

    def __init__(self, kernel):
        self.kernel = kernel

    def lower(self, constexprs):
        return lower(self.kernel, tuple(constexprs))

    def launch(self, q, k, v, tail, qk_scale, causal, block_m, block_n):
        return Launch(q, k, v, tail)(self.kernel, qk_scale, causal, block_m, block_n)


def strided(x):
    """x (B, n, H, d) seen as (B, H, n, d): a view whose rows are not contiguous."""
    return x.transpose(1, 2)


def _value(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype), _raw(v).clone())
    if v is None or type(v) in (bool, int, float, str):
        return ("value", v)
    return ("other", type(v).__name__)


class Recorder:
    """While installed, every launch of a Triton kernel (JITFunction or interpreted) is recorded, and run on copies
    of its tensors' memory padded with ``tail`` NaN (a store past the end lands there), the results copied back into
    the launched tensors. A kernel's error is recorded, not raised (a kernel bug costs the wrapper nothing).
    ``take()`` uninstalls and returns, per launch: (the student's kernel?, its name, grid, arguments before,
    arguments after, error)."""

    def __init__(self, kernel, tail):
        self.kernel, self.tail, self.launches, self.saved = kernel, tail, [], []

    def install(self):
        for cls in KINDS:
            self.saved.append((cls, cls.__dict__.get("run")))
            cls.run = self._recording(cls.run)

    def _recording(self, run):
        recorder = self

        def recorded(kernel, *args, grid, warmup=False, **kwargs):
            if warmup:
                return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            return recorder._launch(run, kernel, args, kwargs, grid)

        return recorded

    def _launch(self, run, kernel, args, kwargs, grid):
        error, before, after, shape = None, (), (), None
        try:
            bound = inspect.signature(kernel.fn).bind_partial(*args, **{k: v for k, v in kwargs.items()
                                                                         if k not in ("num_warps", "num_stages")})
            named = dict(bound.arguments)
            before = tuple(_value(v) for v in named.values())
            shape = tuple(int(g) for g in (grid(named) if callable(grid) else grid))
            padded = {k: _padded(v, self.tail, float("nan")) if isinstance(v, torch.Tensor) else v
                      for k, v in named.items()}
            views = {k: p[: named[k].numel()].view(named[k].shape) if isinstance(named[k], torch.Tensor) else p
                     for k, p in padded.items()}
            try:
                run(kernel, grid=shape, warmup=False, **views)
            except Exception as e:  # noqa: BLE001 - recorded
                error = f"{type(e).__name__}: {e}"[:2000]
            for k, v in named.items():
                if isinstance(v, torch.Tensor):
                    _raw(v).copy_(padded[k][: v.numel()])
            after = tuple(_value(v) for v in named.values())
        except Exception as e:  # noqa: BLE001 - the launch could not be recorded: the judge says so
            error = error or f"{type(e).__name__}: {e}"[:2000]
        self.launches.append((kernel is self.kernel, str(getattr(kernel, "__name__", "?")), shape, before, after,
                              error))

    def take(self):
        while self.saved:
            cls, run = self.saved.pop()
            if run is None:
                del cls.run
            else:
                cls.run = run
        return tuple(self.launches)
'''
assert f"UNWRITTEN = {UNWRITTEN}" in TOOLS


def _tail(q: Tensor) -> int:
    """How far the grader's buffers go on past the end: a whole tensor more (a store at the wrong head or with no
    mask lands there, not in another buffer)."""
    return q.numel() + 64 * q.shape[-1]


def _kernel(t: Trial) -> Obj:
    """The grader's tools around the student's kernel object (the object itself, never called by name)."""
    ref = t.backend.ask({"op": "ref", "target": KERNEL})
    return t.trusted(TOOLS, "Tools", Obj(t, ref))


def _where(ir: str, line: str) -> str:
    """The source line an IR operation comes from (its location, followed through named and call-site ones)."""
    table = dict(re.findall(r"^(#loc\d*) = (.*)$", ir, re.M))
    ref = re.search(r"loc\((#loc\d*)\)\s*$", line)
    text, seen = (table.get(ref.group(1), "") if ref else ""), 0
    while text and seen < 50:
        seen += 1
        found = re.search(r'"([^"]+)":(\d+):\d+', text)
        if found:
            return f"line {found.group(2)} of {found.group(1)}"
        nxt = re.search(r"#loc\d*", text)
        text = table.get(nxt.group(0), "") if nxt else ""
    return "a line the compiler did not locate"


def unmasked(ir: str) -> list[str]:
    """Each tl.load and tl.store of a tile (a tensor of pointers) without a mask operand in the IR, with its line."""
    found = []
    for line in ir.splitlines():
        op = re.search(r"\btt\.(load|store) ((?:%[\w.#]+(?:, )?)+)\s*(?:\{[^}]*\}\s*)?:\s*(\S+)", line)
        if not op or not op.group(3).startswith("tensor<"):
            continue
        operands = op.group(2).count("%")
        if operands < (2 if op.group(1) == "load" else 3):
            found.append(f"the tl.{op.group(1)} at {_where(ir, line)}")
    return found


def _lowered(t: Trial, tools: Obj, causal: bool, bm: int, bn: int, d: int) -> str:
    """The kernel's Triton IR for an NVIDIA GPU with these constexprs (what ``triton.compile`` builds first); a
    kernel that is no Triton kernel, or does not lower, fails the check with the compiler's own message."""
    got = tools.method("lower", (causal, bm, bn, d))
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(x, str) for x in got)):
        raise CheckFailed("the grader's lowering of your kernel could not be read back")
    kind, text = got
    if kind == "kind":
        raise CheckFailed(f"{KERNEL} is {text}, not a Triton kernel: define it with @triton.jit (the grade lowers "
                          "it to Triton IR for a GPU before it runs it)")
    if kind == "error":
        if re.search(r"\bNotImplementedError\b", text):
            raise StudentError(PLACEHOLDER)
        raise CheckFailed(f"{KERNEL} does not compile for a GPU: Triton's compiler, lowering it to Triton IR for an "
                          f"NVIDIA GPU (CAUSAL={causal}, BLOCK_M={bm}, BLOCK_N={bn}, HEAD_DIM={d}), stopped with "
                          f"{text[-1200:]}\nEverything a @triton.jit function calls must be Triton: tl.* operations "
                          "and other @triton.jit functions, on shapes known when it compiles (tl.constexpr); no "
                          "Python helpers, numpy or torch, which only Triton's interpreter runs")
    if kind != "ir" or "tt.func" not in text:
        raise CheckFailed("the grader's lowering of your kernel could not be read back")
    return text


def _launch(t: Trial, tools: Obj, q: Tensor, k: Tensor, v: Tensor, causal: bool, bm: int, bn: int,
            qk_scale: float | None = None, tails: bool = False, ir: str = "") -> tuple[Tensor, Tensor]:
    """The student's kernel launched by the grader's tools on the stated grid: (output, lse); with ``tails``, a store
    past the end of either fails the check (``ir``: the kernel's IR, which says whether its stores are masked)."""
    B, H, n, d = q.shape
    scale = LOG2_E / math.sqrt(d) if qk_scale is None else qk_scale
    tail = _tail(q)
    got = tools.method("launch", q, k, v, tail, scale, causal, bm, bn)
    if not (isinstance(got, tuple) and len(got) == 3 and isinstance(got[0], Tensor) and isinstance(got[1], Tensor)
            and got[0].numel() == q.numel() + tail and got[1].numel() == B * H * n + tail):
        raise CheckFailed("the kernel's outputs could not be read back")
    o_buf, lse_buf, error = got
    if error is not None:
        if "NotImplementedError" in str(error):
            raise StudentError(PLACEHOLDER)
        raise CheckFailed(f"{KERNEL} raised {str(error)[:600]}")
    where = "the row offsets are wrong: row i of head bh of O starts at (bh * n + i) * HEAD_DIM, of LSE at bh * n + i" \
        if ir and not unmasked(ir) else "a tl.store without a mask"
    message = stores_past_the_end(o_buf, lse_buf, q.numel(), B * H * n, where) if tails else None
    if message:
        raise CheckFailed(message)
    return o_buf[: q.numel()].view(q.shape), lse_buf[: B * H * n].view(B, H, n)


def _written_and_finite(got: Tensor, causal: bool, what: str) -> None:
    message = unwritten_or_nan(got, causal, what)
    if message:
        raise CheckFailed(message)


def _kernel_cases(t: Trial, causal: bool, cases: list[tuple[int, ...]], masks: bool = False) -> None:
    """The kernel's output on each case (B, H, n, m, d, BLOCK_M, BLOCK_N) against the emulation, classic mistakes
    named; each case lowered to Triton IR first (``masks``: every tile's load and store in it masked)."""
    tools = _kernel(t)
    ir = _lowered(t, tools, causal, *cases[-1][-2:], cases[-1][4])  # once: the last case's tiles
    for B, H, n, m, d, bm, bn in cases:
        if masks and unmasked(ir):
            raise CheckFailed(f"{unmasked(ir)[0]} of {KERNEL} is " + ("a tl.load" if "tl.load" in unmasked(ir)[0]
                              else "a tl.store") + " without a mask: a tile of the last query or key block reaches "
                              "past position n or m, where a GPU reads garbage or stops with an illegal memory access "
                              "(the interpreter does not complain). Give every tl.load and tl.store of a tile a mask "
                              "(mask=rows[:, None] < n, mask=keys[:, None] < m, other=0.0)")
        q, k, v = t.randn(B, H, n, d), t.randn(B, H, m, d), t.randn(B, H, m, d)
        got, _ = _launch(t, tools, q, k, v, causal, bm, bn, tails=True, ir=ir)
        what = (f"the output of {KERNEL} for q {(B, H, n, d)}, k and v {(B, H, m, d)}, BLOCK_M={bm}, BLOCK_N={bn}"
                + (", CAUSAL" if causal else ""))
        _written_and_finite(got, causal, what)
        message = output_mistake(got, q, k, v, causal, bm, bn, what)
        if message:
            raise CheckFailed(message)


for _gid, _causal, _cases, _doc in (
        (_TILES, False, [(1, 3, 128, 128, 32, 64, 64), (1, 1, 64, 128, 16, 64, 32)],
         "The kernel, lowered for a GPU and launched on the stated grid: several query and key tiles equal "
         "softmax(q k^T / sqrt(d)) v."),
        (_RAGGED, False, [(2, 1, 50, 130, 32, 64, 64), (1, 2, 100, 80, 16, 64, 64)],
         "Lengths that are not a multiple of the tiles: every tile's load and store masked, keys past m never "
         "attended."),
        (_CAUSAL, True, [(1, 2, 128, 128, 16, 64, 32), (1, 1, 130, 100, 16, 64, 64), (1, 1, 128, 128, 16, 32, 64)],
         "With CAUSAL, query i sees the keys j <= i (tiles of 64 queries by 32 keys and by 64, 32 queries by 64 keys; "
         "more queries than keys).")):
    SUITE.add(_gid, [KERNEL], partial(_kernel_cases, causal=_causal, cases=_cases, masks=_gid == _RAGGED), _doc)


@SUITE.check(_LSE, parts=[KERNEL])
def kernel_lse(t: Trial) -> None:
    """LSE holds the natural log-sum-exp of each query's scaled scores."""
    tools = _kernel(t)
    ir = _lowered(t, tools, False, 64, 64, 16)
    q, k, v = t.randn(1, 2, 128, 16), t.randn(1, 2, 128, 16), t.randn(1, 2, 128, 16)
    _, lse = _launch(t, tools, q, k, v, False, 64, 64, tails=True, ir=ir)
    what = f"the LSE of {KERNEL} for q, k, v {tuple(q.shape)}"
    _written_and_finite(lse, False, what)
    message = lse_mistake(lse, q, k, v, 64, 64, what)
    if message:
        raise CheckFailed(message)


# -- the wrapper, judged by the launch it makes ------------------------------------------------------------------------
# While a wrapper check calls the wrapper, the grader's Recorder stands in for every Triton launch in the student's
# process: it records the kernel, the grid and the arguments (copies of the memory each tensor argument points at),
# runs the kernel on padded copies (an unmasked store cannot reach the wrapper's own buffers) and copies the results
# back. The judge checks what was recorded against what it knows: the inputs it sent, the stated grid and scale, the
# buffers the wrapper returned, and its own launch of the same kernel.

_PARAMS = ("Q", "K", "V", "O", "LSE", "n", "m", "qk_scale", "CAUSAL", "BLOCK_M", "BLOCK_N", "HEAD_DIM")


def identical(a: Tensor, b: Tensor) -> bool:
    """The same shape and the same values, NaN equal to NaN and inf to inf (a kernel's NaN is the kernel's)."""
    return tuple(a.shape) == tuple(b.shape) and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _observed(t: Trial, what: str, *args, **kwargs) -> tuple[Any, list]:
    """The wrapper's result on ``args`` and the launches it made, recorded; a wrapper error is passed on."""
    recorder = t.trusted(TOOLS, "Recorder", Obj(t, t.backend.ask({"op": "ref", "target": KERNEL})), 64 * 32)
    recorder.method("install")
    try:
        with explained(lambda err: f"{what} raised: {err}"):
            result = t.call(WRAPPER, *args, **kwargs)
    finally:
        launches = recorder.method("take")
    if not isinstance(launches, tuple):
        raise CheckFailed("the grader's record of the launches could not be read back")
    return result, list(launches)


def _one_launch(launches: list, what: str) -> dict[str, Any]:
    """The one launch of the student's kernel a wrapper call made: its grid and its arguments (before and after)."""
    if not launches:
        raise CheckFailed(f"{what} never launched a Triton kernel: the wrapper launches {KERNEL}[grid](...) once, and "
                          "the kernel computes the attention (the wrapper computes nothing itself)")
    if len(launches) > 1:
        raise CheckFailed(f"{what} launched {len(launches)} Triton kernels: launch {KERNEL} once, on the grid "
                          "(triton.cdiv(n, block_m), B * H), which covers every query tile of every head")
    try:
        mine, name, grid, before, after, error = launches[0]
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        named = {p: (b, a) for p, b, a in zip(_PARAMS, before, after, strict=True)}
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} launched its kernel with {len(launches[0][3]) if isinstance(launches[0], tuple) and len(launches[0]) > 3 else 'other'} "
                          f"arguments the grader could not read; {KERNEL} takes 12: {', '.join(_PARAMS)}") from None
    if mine is not True:
        raise CheckFailed(f"{what} launched {name}, not {KERNEL}: launch the kernel you wrote")
    if error is not None and "could not" in str(error) and not named:
        raise CheckFailed(f"{what}: the grader could not record the launch ({str(error)[:300]})")
    return {"grid": grid, "args": named, "error": error}


def _tensor_arg(launch: dict, name: str, what: str, numel: int, after: bool = False) -> Tensor:
    value = launch["args"][name][1 if after else 0]
    if not (isinstance(value, tuple) and len(value) == 4 and value[0] == "tensor" and isinstance(value[3], Tensor)):
        raise CheckFailed(f"{what} passes {name} a {value[1] if isinstance(value, tuple) and len(value) > 1 else '?'}"
                          f", not a tensor: pass {KERNEL} q, k, v, out, lse, n, m, qk_scale, causal, block_m, block_n, d")
    if value[3].numel() != numel:
        raise CheckFailed(f"{what} passes as {name} a tensor of shape {tuple(value[1])} ({value[3].numel()} numbers); "
                          f"the kernel reads or writes {numel} there")
    return value[3]


def _scalar(launch: dict, name: str) -> Any:
    value = launch["args"][name][0]
    return value[1] if isinstance(value, tuple) and len(value) == 2 and value[0] == "value" else value


def _returned(result: Any, launch: dict, what: str, B: int, H: int, n: int, d: int) -> tuple[Tensor, Tensor]:
    """The pair the wrapper returned, which must be the buffers the launch wrote (O and LSE after the launch)."""
    out, lse = _pair(result, what)
    for got, name, numel in ((out, "O", B * H * n * d), (lse, "LSE", B * H * n)):
        written = _tensor_arg(launch, name, what, numel, after=True)
        if got.numel() != numel or not identical(got.flatten(), written):
            raise CheckFailed(f"{what} returns {'an output' if name == 'O' else 'an lse'} that is not the buffer "
                              f"passed to {KERNEL} as {name}: the launch writes into out and lse; return (output, lse), "
                              "those two buffers")
    return out, lse


@SUITE.check(_SHAPES, parts=[WRAPPER])
def wrapper_shapes(t: Trial) -> None:
    """Returns (output, lse), the buffers its one launch wrote: (B, H, n, d) in the inputs' dtype and (B, H, n) float32,
    for n != m."""
    q, k, v = t.randn(2, 2, 64, 16), t.randn(2, 2, 96, 16), t.randn(2, 2, 96, 16)
    what = f"{WRAPPER}(q, k, v)"
    result, launches = _observed(t, what, q, k, v)
    out, lse = _pair(result, what)
    for name, x, shape in (("output", out, (2, 2, 64, 16)), ("lse", lse, (2, 2, 64))):
        if tuple(x.shape) != shape or x.dtype != torch.float32:
            raise CheckFailed(f"the {name} of {WRAPPER} for q (2, 2, 64, 16), k and v (2, 2, 96, 16) has shape "
                              f"{tuple(x.shape)} and dtype {x.dtype}; expected {shape}, torch.float32")
    _returned(result, _one_launch(launches, what), what, 2, 2, 64, 16)


def _arguments(launch: dict, what: str, q: Tensor, k: Tensor, v: Tensor, causal: bool, bm: int, bn: int) -> None:
    """The recorded launch against the stated one: grid, sizes, qk_scale, CAUSAL, tiles."""
    (B, H, n, d), m = q.shape, k.shape[2]
    message = grid_mistake(launch["grid"], n, bm, B * H, what)
    if message:
        raise CheckFailed(message)
    for name, expected in (("n", n), ("m", m), ("BLOCK_M", bm), ("BLOCK_N", bn), ("HEAD_DIM", d)):
        got = _scalar(launch, name)
        if type(got) not in (int, bool) or got != expected:
            raise CheckFailed(f"mistake in {what}: it passes {name} = {got!r}; expected {expected}")
    message = causal_mistake(_scalar(launch, "CAUSAL"), causal, what) or scale_mistake(_scalar(launch, "qk_scale"), d,
                                                                                       what)
    if message:
        raise CheckFailed(message)
    for name, x in (("Q", q), ("K", k), ("V", v)):
        if not identical(_tensor_arg(launch, name, what, x.numel()), x.contiguous().flatten()):
            raise CheckFailed(f"mistake in {what}: what {KERNEL} reads at {name} is not {name.lower()} row after row: "
                              f"pass q, k, v as Q, K, V, made contiguous")


@SUITE.check(_LAUNCH, parts=[WRAPPER])
def wrapper_launch(t: Trial) -> None:
    """The wrapper launches its kernel once, as stated: grid (cdiv(n, block_m), B * H), qk_scale, CAUSAL, the tiles;
    it returns what that launch wrote, the grader's own launch of the same kernel."""
    tools = _kernel(t)
    for B, H, n, m, d, causal, bm, bn in [(1, 3, 100, 100, 16, True, 64, 32), (2, 1, 70, 90, 32, False, 32, 64)]:
        q, k, v = t.randn(B, H, n, d), t.randn(B, H, m, d), t.randn(B, H, m, d)
        what = f"{WRAPPER}(q {(B, H, n, d)}, k and v {(B, H, m, d)}, causal={causal}, block_m={bm}, block_n={bn})"
        result, launches = _observed(t, what, q, k, v, causal=causal, block_m=bm, block_n=bn)
        launch = _one_launch(launches, what)
        _arguments(launch, what, q, k, v, causal, bm, bn)
        out, lse = _returned(result, launch, what, B, H, n, d)
        got = tools.method("launch", q, k, v, _tail(q), LOG2_E / math.sqrt(d), causal, bm, bn)
        if not (isinstance(got, tuple) and len(got) == 3 and isinstance(got[0], Tensor) and isinstance(got[1], Tensor)):
            raise CheckFailed("the kernel's outputs could not be read back")
        for mine, own in ((out.flatten(), got[0][: out.numel()]), (lse.flatten(), got[1][: lse.numel()])):
            written = own != UNWRITTEN
            if mine.numel() != own.numel() or not identical(mine[written], own[written]):
                raise CheckFailed(f"{what} does not return what {KERNEL} writes when the grader launches it with the "
                                  "same arguments: the output must come from that one launch")


@SUITE.check(_STRIDES, parts=[WRAPPER])
def wrapper_strides(t: Trial) -> None:
    """Inputs whose rows are not contiguous (a transposed view) reach the kernel made contiguous."""
    x = [t.randn(1, 64, 2, 16) for _ in range(3)]  # (B, n, H, d)
    views = [t.trusted(TOOLS, "strided", xi) for xi in x]  # (B, H, n, d) views, rows not contiguous
    what = f"{WRAPPER} on q, k, v of shape (1, 2, 64, 16) whose rows are not contiguous (x.transpose(1, 2))"
    result, launches = _observed(t, what, *views)
    launch = _one_launch(launches, what)
    _pair(result, what)
    for name, xi in zip(("Q", "K", "V"), x):
        if not identical(_tensor_arg(launch, name, what, xi.numel()), xi.transpose(1, 2).contiguous().flatten()):
            raise CheckFailed(not_row_after_row(name, what))


@SUITE.check("test_wrapper_blocks", parts=[WRAPPER])
def wrapper_blocks(t: Trial) -> None:
    """ValueError when block_m, block_n or d is not a power of two of at least 16 (what the GPU compiler needs), and
    a launch when they are."""
    q = t.randn(1, 1, 32, 16)
    hint = ("Check the sizes before launching: tl.arange needs a power of two and a GPU's tl.dot at least 16, "
            "even where the interpreter runs other sizes")
    for kwargs, why in (({"block_m": 48}, "block_m = 48 is not a power of two"),
                        ({"block_n": 8}, "block_n = 8 is a power of two below 16")):
        expect_value_error(lambda: t.call(WRAPPER, q, q, q, **kwargs), f"{WRAPPER}(..., {why})", hint)
    x = t.randn(1, 1, 32, 24)
    expect_value_error(lambda: t.call(WRAPPER, x, x, x), f"{WRAPPER} on inputs of width d = 24 (not a power of two)",
                       hint)
    what = f"{WRAPPER}(q, k, v, block_m=16, block_n=32) on inputs (1, 1, 32, 16)"
    _one_launch(_observed(t, what, q, q, q, block_m=16, block_n=32)[1], what)


def _pair(value, what: str) -> tuple[Tensor, Tensor]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = type(value).__name__ + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else "")
        raise CheckFailed(f"{what} should return a pair (output, lse), got a {got}")
    out, lse = value
    if not isinstance(out, Tensor) or not isinstance(lse, Tensor):
        raise CheckFailed(f"{what} should return two tensors (output, lse), got {type(out).__name__}, "
                          f"{type(lse).__name__}")
    return out, lse


# -- conceptual questions (the inputs are in the question; the answer is a value) ---------------------------------

SUITE.questions({
    "q_programs": number(4 * 8 * math.ceil(1000 / 128), "Q1: programs in the grid for B=4, H=8, n=1000, BLOCK_M=128",
                         {f"{wrong} {why}": wrong for wrong, why in [
        (4 * 8 * (1000 // 128), "= B·H·(n // BLOCK_M) leaves out the last, partial tile of 1000 - 7·128 = 104 "
                                "queries: the grid has cdiv(n, BLOCK_M) tiles"),
        (32, "= B·H is one program per (batch, head); each also splits its queries into tiles of BLOCK_M"),
        (8, "is the number of query tiles of one (batch, head); the grid has one such row per (batch, head)")]}),
    "q_state_floats": number(2 * 128 + 2 * 128 * 128 + 128 * 64, "Q2: float32 numbers live in one program during its "
                             "loop (BLOCK_M=128, BLOCK_N=64, HEAD_DIM=128)", {f"{wrong} {why}": wrong for wrong, why in [
        (128 + 128 + 128 * 128, "counts the online-softmax state alone (m_i, l_i, acc); the query tile and the tile of "
                                "scores are live in registers too: 2·BLOCK_M + 2·BLOCK_M·HEAD_DIM + BLOCK_M·BLOCK_N"),
        (2 * 128 + 2 * 128 * 128, "leaves out the tile of scores s, BLOCK_M·BLOCK_N numbers live while p is formed"),
        (2 * 128 + 128 * 128 + 128 * 64, "leaves out the query tile, BLOCK_M·HEAD_DIM numbers loaded once and live for "
                                         "the whole loop"),
        (128 * 128, "counts the accumulator alone; the running max and sum, the query tile and the scores are live too")]}),
    "q_qk_scale": number(LOG2_E / 8, "Q3: qk_scale for d = 64", {
        "0.125 = 1/sqrt(64) leaves out log2(e): exp2(s/8) is 2^(s/8), not e^(s/8)": 0.125,
        f"{LN_2 / 8:.4f} uses ln 2; exp(x) = exp2(x · log2(e)), so the factor is log2(e) ≈ 1.4427": LN_2 / 8,
        f"{LOG2_E / 64:.4f} divides by d; the scale is 1/sqrt(d)": LOG2_E / 64,
    }),
    "q_alpha": number(0.25, "Q4: the rescaling factor alpha when the running max goes from 3 to 5 (base 2)", {
        f"{math.exp(-2):.4f} = e^(3-5): the kernel's scores are in base-2 units, so alpha = exp2(m_i - m_new)":
            math.exp(-2),
        "4 is the inverse: the old sum was computed under a smaller max, so it shrinks, by 2^(3-5)": 4.0,
        "1 would keep the old sum as it is; it was computed under the old max and must be rescaled": 1.0,
    }),
    "q_tile_bytes": number(2 * 64 * 128 * 2, "Q5: bytes of one K tile and one V tile, 64 x 128 in float16", {
        "16384 is one tile; each step loads a tile of K and a tile of V": 64 * 128 * 2,
        "65536 counts 4 bytes per number; float16 takes 2": 2 * 64 * 128 * 4,
        "8192 counts numbers of one tile, not bytes of both": 64 * 128,
    }),
})
