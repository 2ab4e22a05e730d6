"""The ban: torch's own attention, and whatever else a part asks the student to write, refused in the process.

The property (issue 29), in the sandbox: **the process that answers a part is banned from its first student
line to its exit.** :func:`ban_for_life` runs in the harness's ``main`` before the first request is read,
with the bans of the parts that process will answer (a part whose bans differ is answered by a process of
its own, see :mod:`autograder.judging.judge`), and nothing ever lifts it. So there is no window: every line
the process runs after it (a cell, a hook a cell planted in ``json.loads`` or ``numpy.ascontiguousarray``,
the request loop itself, however rebound) runs banned.

It is made of three parts, none of them an object student code can reach and switch off:

1. **Kernels.** At the dispatcher, every banned aten operator's kernels (at the keys of
   :data:`torch_names.GUARD_KEYS`) are replaced by one that raises :class:`Delegated`. The registration's
   handle (a ``torch._C._DispatchModule``, a C++ object the garbage collector does not track) is dropped
   with its reference count raised by one: no Python object holds it, so nothing can deregister it, and
   torch's own kernel for that operator is never called again in this process. A kernel a notebook
   registers on top is the notebook's own code: it cannot call torch's kernel either (there is no handle to
   the one below). The refusing kernel is a function of this file (see 3).
2. **torch's Python re-implementations.** Some of torch's Python code computes a softmax or attention with
   allowed operators (the references and decompositions, ``nn.MultiheadAttention`` with weights,
   ``torch.ao``'s quantizable ``MultiheadAttention``, flex attention's math path, any later one). No list of
   them is kept: **every function in torch's files whose qualified name names a softmax and whose code calls
   a softmax, a logsumexp or an exponential, or names attention and whose code calls a softmax (or a
   logsumexp)** (:func:`code_kind`: ``softmax``, ``SoftmaxTransform._call``,
   ``MultiheadAttention._forward_impl``, ``math_attention``; not torch's code that only registers, traces or
   rewrites the student's own softmax, as ``torch.compile``'s one-process backends do) starts with a call of the matching banned operator (the math attention, or ``_softmax``) straight to its
   CPU kernel, so it refuses exactly where that operator is banned. Functions already loaded are compiled
   again from their source with that call first (:func:`guard_loaded`); a torch module loaded later is
   compiled from its source the same way by the import system (:func:`_guarded_get_code`). The call is a
   bound C method and a tuple of arguments in the code's constants: nothing in it can be rebound.
3. **An audit hook** (:func:`_audit`, ``sys.addaudithook``: it cannot be removed) checks every code
   object of torch's files that is executed (``exec``, an import) or made into a function
   (``types.FunctionType``, ``f.__code__ = ...``): one whose covered function lacks the call of 2 is refused, so reloading a torch module, re-importing it past the import system's guard or
   building a function from torch's unguarded code fails. It also refuses changing the code or defaults
   of this folder's functions (the hook itself, the kernels), and tracing (``sys.settrace``,
   ``sys.setprofile``: a tracer can change a running frame's local variables, the hook's own included).
   It reads no global name: everything it uses is a default argument (immutable builtins and C objects)
   or a method of a builtin type, and it tests types with ``type()``, so no object handed to it runs code.

What stays open is listed in ``autograder/README.md`` ("What the grader does not promise").

Locally (a notebook's ``run_local``, the tests) there is no sandbox: :class:`Guard` bans per call, with a
``torch.library.Library`` created for the call and destroyed after it, in the instructor's own process.

Copied into the sandbox beside the harness; imports only its siblings, the standard library and torch
(passed in).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import os
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from typing import Any

if __package__:
    from autograder.in_sandbox import torch_names
else:
    import torch_names  # type: ignore[no-redef]


class Delegated(RuntimeError):
    """Raised when graded code reaches torch's own implementation of what the part asks to write."""


class Tampered(RuntimeError):
    """The local guard was found switched off or bypassed around a judged call."""


HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


# -- which of torch's functions a ban covers --------------------------------------------------------------


def ban_kind(qualname: str, _attention: str = "attention", _softmax: str = "softmax", _str: Any = str,
             _lse: str = "logsumexp") -> str:
    """``"attention"`` when a segment of ``qualname`` names attention, else ``"softmax"`` when one names a
    softmax or a log-sum-exp (the softmax's normaliser: a distribution built from logits computes it), else ``''``
    (case and underscores ignored). Reads no global name and calls ``str``'s own methods
    unbound (a str subclass in a code object runs no code of its own here): the audit hook calls it."""
    kind = ""
    for part in _str.split(qualname, "."):
        s = _str.replace(_str.lower(part), "_", "")
        if _str.__contains__(s, _attention):
            return _attention
        if _str.__contains__(s, _softmax) or _str.__contains__(s, _lse):
            kind = _softmax
    return kind


def code_kind(code: Any, _kind: Any = ban_kind, _names: tuple = ("softmax", "logsumexp"),
              _exps: tuple = ("exp", "exp_", "exp2", "exp2_", "expm1"), _str: Any = str) -> str:
    """Which ban covers the function whose code is ``code``: the kind its qualified name names (:func:`ban_kind`)
    when its code computes one, else ``''``. A function computes attention when it names a softmax (or a
    logsumexp) it calls, as computing attention in Python does (``MultiheadAttention._forward_impl``,
    ``math_attention``, ``multi_head_attention_forward``; not flex attention's registration helpers, which torch
    calls while it imports); a softmax when it names a softmax, a logsumexp or an exponential (``exp``, ``exp2``,
    ``expm1``) it calls (``torch._refs.softmax``, the decompositions, ``SoftmaxTransform._call``,
    ``F.softmax``). So torch's code that only registers, traces or rewrites the student's own softmax (the
    pattern builders of ``torch._inductor``'s joint-graph passes, which ``torch.compile``'s one-process backends
    import; a meta kernel that computes shapes; a module's ``__init__``) is not covered: it computes nothing
    for the caller. Lambdas, comprehensions and class bodies are not covered. Reads no global name."""
    if not code.co_flags & 2 or _str.startswith(code.co_name, "<"):  # a function (CO_NEWLOCALS), not a lambda
        return ""
    kind = _kind(code.co_qualname)
    if not kind:
        return ""
    for name in code.co_names:
        low = _str.lower(name)
        for n in _names:
            if _str.__contains__(low, n):
                return kind
        if kind == "softmax":
            for n in _exps:
                if low == n:
                    return kind
    return ""


def _missing_check(code: Any, _kind: Any = code_kind, _code: Any = types.CodeType, _checks: tuple = (),
                   _type: Any = type) -> str:
    """The qualified name of the first function in ``code`` (or nested in it) that :func:`code_kind` covers and
    whose constants lack the guard's call, or ``''``. Reads no global name (the audit hook calls it); its
    ``_checks`` are set once, by :func:`ban_for_life`."""
    todo = [code]
    while todo:
        c = todo.pop()
        for k in c.co_consts:
            if _type(k) is _code:  # type() itself: an object in the constants runs no code of its own here
                todo.append(k)
        if _kind(c):
            found = False
            for k in c.co_consts:
                for f in _checks:
                    if k is f:
                        found = True
            if not found:
                return c.co_qualname
    return ""


# The call a guarded function starts with: placeholders compiled in, replaced by the call's two constants.
MARK_FN = {"softmax": "__attention_course_softmax_fn__", "attention": "__attention_course_attention_fn__"}
MARK_ARGS = {"softmax": "__attention_course_softmax_args__", "attention": "__attention_course_attention_args__"}
_STATE: dict[str, Any] = {}  # this process's checks and torch's folder, made once (guard_loaded)


def _checks(torch: types.ModuleType) -> dict[str, tuple[Any, tuple]]:
    """Per kind, ``(fn, args)``: ``fn(*args)`` calls the banned operator on a tiny tensor, straight to its CPU
    kernel (past any dispatch mode): ``_softmax``, or the math attention."""
    if "checks" not in _STATE:
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
        x = torch.zeros(1, 1, 1)
        _STATE["checks"] = {
            "softmax": (torch.ops.aten._softmax.default._handle.redispatch_boxed, (keys, x, -1, False)),
            "attention": (torch.ops.aten._scaled_dot_product_attention_math.default._handle.redispatch_boxed,
                          (keys, x, x, x))}
        _STATE["torch_root"] = os.path.dirname(torch.__file__) + os.sep
    return _STATE["checks"]


def _fill(code: types.CodeType, table: dict[str, Any]) -> types.CodeType:
    """``code`` with the placeholders of ``table`` replaced in its constants and its nested code's."""
    consts = tuple(_fill(c, table) if isinstance(c, types.CodeType) else
                   table[c] if isinstance(c, str) and c in table else c for c in code.co_consts)
    return code.replace(co_consts=consts)


def _table(torch: types.ModuleType) -> dict[str, Any]:
    checks = _checks(torch)
    return {**{MARK_FN[k]: checks[k][0] for k in checks}, **{MARK_ARGS[k]: checks[k][1] for k in checks}}


def _check_statement(kind: str) -> ast.stmt:
    return ast.Expr(ast.Call(ast.Constant(MARK_FN[kind]), [ast.Starred(ast.Constant(MARK_ARGS[kind]), ast.Load())], []))


def _with_check_first(fn: types.FunctionType, kind: str, table: dict[str, Any]) -> types.CodeType:
    """``fn``'s code compiled again from its source with the check of ``kind`` as its first statement."""
    return _recompiled(fn.__code__, inspect.getsource(fn), kind, table)


def _recompiled(code: types.CodeType, source: str, kind: str, table: dict[str, Any]) -> types.CodeType:
    """The function whose code is ``code`` compiled again from ``source`` (its ``def`` block, decorators and all)
    with the check of ``kind`` as its first statement; keeps its name, qualified name, file, line numbers and
    free variables (compiled inside a scaffold function that binds the same names, so its closure still fits).
    Functions nested in it come out as compiled from source (:func:`_guarded_tree` guards those it covers).
    Raises when the source does not fit."""
    tree = ast.parse(textwrap.dedent(source))
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) or fdef.name != code.co_name:
        raise ValueError("its source is not a plain def")
    fdef.decorator_list = []  # already applied around the function object we change
    first = 1 if fdef.body and isinstance(fdef.body[0], ast.Expr) and isinstance(
        getattr(fdef.body[0], "value", None), ast.Constant) and isinstance(fdef.body[0].value.value, str) else 0
    call = _check_statement(kind)
    fdef.body.insert(first, call)
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    ast.copy_location(call, fdef.body[first + 1] if len(fdef.body) > first + 1 else fdef)
    ast.fix_missing_locations(call)
    body: list[ast.stmt] = [ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in code.co_freevars]
    if fdef.name not in code.co_freevars:  # a function that names itself reads a global, as the original does
        body.insert(0, ast.Global([fdef.name]))
    scaffold = ast.Module([ast.FunctionDef("__scaffold__", ast.arguments([], [], None, [], [], None, []),
                                           body + [fdef, ast.Return(ast.Constant(None))], [])], [])
    ast.fix_missing_locations(scaffold)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable": the placeholder, replaced below
        outer = compile(scaffold, code.co_filename, "exec", dont_inherit=True)
    found = [c for c in outer.co_consts if isinstance(c, types.CodeType)]
    inner = [c for c in (found[0].co_consts if found else ()) if isinstance(c, types.CodeType) and c.co_name == code.co_name]
    if len(inner) != 1 or inner[0].co_freevars != code.co_freevars:
        raise ValueError(f"its recompiled code does not fit its closure ({[c.co_freevars for c in inner]} for {code.co_freevars})")
    return _fill(inner[0], table).replace(co_qualname=code.co_qualname)


def guard_loaded(torch: types.ModuleType) -> None:
    """Guard in place, once per process, every function of torch's files already loaded that :func:`code_kind`
    covers (found by walking every function object of the process, so the copies that decomposition tables,
    closures and other modules hold are the same, guarded objects). A function whose source cannot be
    compiled again is named in a warning rather than left silently open."""
    if _STATE.get("loaded"):
        return
    table = _table(torch)
    for name in ("torch._refs", "torch._refs.nn.functional", "torch._refs.special", "torch._decomp",
                 "torch._decomp.decompositions"):
        importlib.import_module(name)  # loaded now (they are loaded by torch's own compile paths anyway)
    root = _STATE["torch_root"]
    import gc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on a deprecated module attribute warns
        targets = [f for f in gc.get_objects() if isinstance(f, types.FunctionType)
                   and f.__code__.co_filename.startswith(root) and code_kind(f.__code__)]
    failed = []
    checks = tuple(v[0] for v in _checks(torch).values())
    for fn in {id(f): f for f in targets}.values():
        if any(c is k for c in fn.__code__.co_consts for k in checks):
            continue  # guarded already
        try:
            fn.__code__ = _with_check_first(fn, code_kind(fn.__code__), table)
        except (OSError, TypeError, SyntaxError, ValueError) as e:
            failed.append(f"{fn.__module__}.{fn.__qualname__} ({e})")
    if failed:
        warnings.warn("the grader's guard could not guard torch's " + ", ".join(failed))
    _STATE["loaded"] = True


def _guarded_tree(code: types.CodeType, lines: list[str], table: dict[str, Any], checks: tuple) -> types.CodeType:
    """``code`` with every function in it that :func:`code_kind` covers compiled again from ``lines`` (the
    module's source) with the check first: only those functions are compiled, not the whole module."""
    kind = code_kind(code)
    if kind and not any(c is k for c in code.co_consts for k in checks):
        code = _recompiled(code, "".join(inspect.getblock(lines[code.co_firstlineno - 1:])), kind, table)
    consts = [_guarded_tree(c, lines, table, checks) if isinstance(c, types.CodeType) else c for c in code.co_consts]
    if any(a is not b for a, b in zip(consts, code.co_consts)):
        code = code.replace(co_consts=tuple(consts))
    return code


def _guarded_module_code(code: types.CodeType, source: str | bytes | None, table: dict[str, Any]) -> types.CodeType:
    """A torch module's code with the check first in every covered function (each compiled again from
    ``source``); left as it is without source (the audit hook then refuses to run it)."""
    if source is None:
        return code
    if isinstance(source, bytes):
        source = importlib.util.decode_source(source)
    checks = tuple(table[m] for m in MARK_FN.values())
    return _guarded_tree(code, source.splitlines(True), table, checks)


def _guarded_get_code(original: Any, torch: types.ModuleType) -> Any:
    """The import system's ``get_code``, guarding torch's modules as it loads them (part 2 of the ban)."""
    table, root = _table(torch), _STATE["torch_root"]
    checks = tuple(v[0] for v in _checks(torch).values())

    def get_code(self: Any, fullname: str) -> Any:
        code = original(self, fullname)
        if code is not None and code.co_filename.startswith(root) and \
                _missing_check(code, code_kind, types.CodeType, checks):
            code = _guarded_module_code(code, self.get_source(fullname), table)
        return code

    get_code.__guards_torch__ = True  # type: ignore[attr-defined]
    return get_code


# -- the ban for the process's life (the sandbox) ---------------------------------------------------------


def refusal_message(op: str, namespace: str = "aten") -> str:
    if namespace == "aten" and torch_names.op_class(op) == "contraction" and not torch_names.is_torch_attention(op):
        return (f"torch.ops.aten.{op} is a matrix product (a contraction), refused by the grader's guard in this "
                "exercise's process (by any route: torch.mm, matmul, @, einsum, tensordot, F.linear, a convolution, "
                "...): the exercise's products are computed in your kernel, with tl.dot")
    return (f"torch.ops.{namespace}.{op} is torch's own implementation, refused by the grader's guard (a part's answer "
            "may not reach it, by any route); the exercise asks you to compute it yourself")


# What the kernels refused since the Runner last cleared it: a refusal the student's code caught still costs the
# call, as locally. (Anyone may empty it; that gains nothing: torch's kernel did not run.)
REFUSALS: list[str] = []


def _refuse(*args: Any, **kwargs: Any) -> Any:
    """A banned operator's kernel: always raises (its message is a constant, set per operator)."""
    REFUSALS.append("__attention_course_message__")
    raise Delegated("__attention_course_message__")


def _kernel(op: str, namespace: str = "aten") -> types.FunctionType:
    message = refusal_message(op, namespace)
    code = _refuse.__code__
    code = code.replace(co_consts=tuple(message if c == "__attention_course_message__" else c for c in code.co_consts))
    return types.FunctionType(code, _refuse.__globals__, "refuse")


def plan(torch: types.ModuleType, fragments: tuple[str, ...]) -> list[tuple[str, str]]:
    """(operator, dispatch key) pairs whose kernels the ban of ``fragments`` (and torch's attention) replaces; each
    fragment's share is found once per process (the zygote finds the common ones before it forks)."""
    plans = _STATE.setdefault("plans", {})
    pairs: set[tuple[str, str]] = set()
    for one in ("",) + tuple(f for f in fragments if not f.startswith(torch_names.IMPORT)):
        if one not in plans:
            ops = _STATE.setdefault("ops", sorted(torch._C._dispatch_get_all_op_names()))
            has = torch._C._dispatch_has_kernel_for_dispatch_key
            found = []
            for full in torch_names.matching_ops(ops, (one,) if one else ()):
                for key in torch_names.GUARD_KEYS:
                    try:
                        if has(full, key):
                            found.append((full, key))
                    except RuntimeError:
                        pass
            plans[one] = found
        pairs.update(plans[one])
    return sorted(pairs)


def prepare(torch: types.ModuleType) -> None:
    """The ban's one-off work, before any ban is installed: torch's loaded functions guarded, the operator
    list and the plans of the bans parts use. The zygote does it once before it forks."""
    import torch.onnx  # noqa: F401 - its operators (rotary embedding, attention) exist before any ban names them
    guard_loaded(torch)  # (after: torch.onnx's Python attention is guarded in place like the rest)
    plan(torch, ("softmax", "softmin", "logsumexp", "logcumsumexp", "crossentropy", "rotary", "namespace:onnx",
                 *(torch_names.CLASS + c for c in torch_names.CLASSES)))


def _audit(event: str, args: tuple, _missing: Any = None, _torch: str = "\0", _own: str = "\0", _function: Any = None,
           _code: Any = None, _error: Any = PermissionError, _type: Any = type, _str: Any = str, _refused: tuple = (),
           _notfound: Any = ImportError) -> None:
    """The audit hook (part 3 of the ban); its defaults are set once, by :func:`ban_for_life`, before it is added.

    Events: importing a library outside the vocabulary (``import``: refused as not found, so torch's own
    optional imports of it fall back as they do without it); running code (``exec``) or making a function of it
    (``function.__new__``); setting or deleting an
    attribute of a function (``object.__setattr__``/``__delattr__``: its code, defaults); tracing
    (``sys.settrace``/``sys.setprofile``, which could change this hook's own local variables as it runs). It
    tests types with ``type()`` and calls ``str``'s own methods, so an object handed to it runs no code of its
    own here."""
    if _type(event) is not _str:
        return
    if event == "import":
        name = args[0]
        if _type(name) is _str:
            for lib in _refused:
                if name == lib or _str.startswith(name, lib + "."):
                    raise _notfound(_str.join("", (name, " is outside this exercise's vocabulary: the grader's process "
                                                  "does not import it (see 'What your code may call')")), name=name)
    elif event == "exec" or event == "function.__new__":
        code = args[0]
        if _type(code) is _code and _str.startswith(code.co_filename, _torch):
            name = _missing(code)
            if name:
                raise _error(_str.join("", ("torch's ", name, " (in ", code.co_filename, ") cannot run unguarded in "
                                            "the grader's process: it computes attention or a softmax with torch's "
                                            "own code")))
    elif event == "object.__setattr__" or event == "object.__delattr__":
        fn = args[0]
        if _type(fn) is _function:
            attr = args[1]
            if _type(attr) is not _str:
                raise _error("a function's attributes are named by plain strings in the grader's process")
            if attr == "__code__" or attr == "__defaults__" or attr == "__kwdefaults__":
                if _str.startswith(fn.__code__.co_filename, _own):
                    raise _error("the grader's own functions cannot be changed in its process")
                if attr == "__code__" and event == "object.__setattr__":
                    code = args[2]
                    if _type(code) is _code and _str.startswith(code.co_filename, _torch):
                        name = _missing(code)
                        if name:
                            raise _error(_str.join("", ("torch's ", name, " cannot run unguarded in the grader's "
                                                        "process")))
    elif event == "sys.settrace" or event == "sys.setprofile":
        raise _error("the grader's process cannot be traced (sys.settrace, sys.setprofile): a tracer can change "
                     "what the grader's own code is doing")


def ban_for_life(torch: types.ModuleType, fragments: tuple[str, ...]) -> list[tuple[str, str]]:
    """Ban ``fragments`` and torch's attention in this process, for the rest of its life (see the module's
    docstring); the (operator, key) pairs refused. Called once, before any student line runs."""
    if _STATE.get("banned") is not None:
        if _STATE["banned"] != fragments:
            raise RuntimeError(f"this process is already banned for {_STATE['banned']}, not {fragments}")
        return plan(torch, fragments)
    prepare(torch)
    checks = tuple(v[0] for v in _checks(torch).values())
    # 2: torch's modules loaded from now on are guarded as they are compiled.
    from importlib import _bootstrap_external

    loader = _bootstrap_external.SourceLoader
    if not getattr(loader.get_code, "__guards_torch__", False):
        loader.get_code = _guarded_get_code(loader.get_code, torch)
    # 1: the kernels, registered through a handle no Python object keeps (one per namespace: aten, onnx, ...).
    pairs = plan(torch, fragments)
    kernels: dict[str, types.FunctionType] = {}
    for namespace in sorted({full.split("::")[0] for full, _ in pairs}):
        lib = torch._C._dispatch_library("IMPL", namespace, "")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            for full, key in pairs:
                if not full.startswith(namespace + "::"):
                    continue
                op = full[len(namespace) + 2:]
                base = op.split(".")[0]
                kernels.setdefault(full.split(".")[0], _kernel(base, namespace))
                try:
                    lib.impl(op, key, kernels[full.split(".")[0]])
                except (RuntimeError, ValueError):
                    pass
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(lib))  # kept alive for the process's life, by nothing in Python
        del lib
    # 3: the audit hook, its defaults set before it is added (afterwards they cannot be changed).
    _missing_check.__defaults__ = (code_kind, types.CodeType, checks, type)
    code_kind.__defaults__ = (ban_kind, ("softmax", "logsumexp"), ("exp", "exp_", "exp2", "exp2_", "expm1"), str)
    _audit.__defaults__ = (_missing_check, _STATE["torch_root"], HERE, types.FunctionType, types.CodeType,
                           PermissionError, type, str, torch_names.refused_imports(fragments), ModuleNotFoundError)
    ban_kind.__defaults__ = ("attention", "softmax", str, "logsumexp")
    sys.addaudithook(_audit)
    _STATE["banned"] = fragments
    return pairs


# -- per call, locally (run_local and the tests; no sandbox) ----------------------------------------------


class Guard:
    """Bans for one judged call at a time, in a process that is not a sandbox (a notebook's ``run_local``,
    the tests): at the dispatcher, the kernels of the banned operators are replaced for the call only (a
    ``torch.library.Library`` created before it and destroyed after it); torch's Python re-implementations are
    guarded in place (:func:`guard_loaded`). Integrity is checked around every call: before it, a banned
    operator is called and must be refused by this guard's kernel; after it, the dispatcher's table for the
    banned operators must be what was installed. Anything else raises :class:`Tampered`. This is no
    security boundary (the process is the instructor's own); the sandbox's ban is :func:`ban_for_life`."""

    def __init__(self, torch: types.ModuleType) -> None:
        self.torch = torch
        self.active: tuple[str, ...] | None = None
        self.refusals: list[str] = []  # what was refused during the call (even if the student caught it)
        self.hits = 0
        self._tables: dict[tuple[str, ...], list[str]] = {}
        guard_loaded(torch)

    def _refuser(self, op: str):
        def refuse(*args: Any, **kwargs: Any) -> Any:
            self.hits += 1
            self.refusals.append(refusal_message(op))
            raise Delegated(refusal_message(op))

        return refuse

    def _install(self, fragments: tuple[str, ...]) -> Any:
        lib = self.torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for full, key in plan(self.torch, fragments):
                if not full.startswith("aten::"):
                    continue  # other namespaces are refused in the sandbox only (this guard is no boundary)
                op = full[len("aten::"):]
                try:
                    lib.impl(op, self._refuser(op.split(".")[0]), key)
                except (RuntimeError, ValueError):
                    pass
        return lib

    def _table(self, fragments: tuple[str, ...]) -> list[str]:
        dump = self.torch._C._dispatch_dump
        keys = tuple(f"{key}: " for key in torch_names.GUARD_KEYS)
        return [line for op in sorted({op for op, _ in plan(self.torch, fragments) if op.startswith("aten::")})
                for line in dump(op).splitlines() if line.startswith(keys)]

    def _probe(self, fragments: tuple[str, ...]) -> None:
        torch = self.torch
        x = torch.zeros(1, 1, 1)
        probes = [("scaled_dot_product_attention", lambda: torch.ops.aten._scaled_dot_product_attention_math(x, x, x))]
        if "softmax" in fragments:
            probes.append(("softmax", lambda: torch.ops.aten._softmax(x, -1, False)))
        if torch_names.CLASS + "contraction" in fragments:
            probes.append(("matrix products", lambda: torch.ops.aten.mm(x[0], x[0])))
        for what, probe in probes:
            before = self.hits
            try:
                probe()
            except Delegated:
                if self.hits == before + 1:
                    continue
            except Exception:  # noqa: BLE001 - anything but this guard's refusal means it is not in place
                pass
            raise Tampered(f"the grader's run-time guard against torch's {what} was switched off or bypassed "
                           "(through the garbage collector, the dispatcher or a dispatch mode); this part earns "
                           "no points")
        self.refusals.clear()

    @contextlib.contextmanager
    def judged(self, fragments: tuple[str, ...]) -> Iterator[None]:
        """Bans ``fragments`` and torch's attention while the block (one judged call) runs."""
        lib = self._install(fragments)
        try:
            if fragments not in self._tables:
                self._tables[fragments] = self._table(fragments)
            table = self._tables[fragments]
            self._probe(fragments)
            self.refusals.clear()
            self.active = fragments
            try:
                yield
            finally:
                self.active = None
            if self._table(fragments) != table:
                raise Tampered("the grader's run-time guard was changed during the call (a kernel of a banned "
                               "operator was removed or replaced); this part earns no points")
        finally:
            self.active = None
            lib._destroy()
