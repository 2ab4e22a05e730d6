"""The one way student code is run: a :class:`Runner`, in the sandbox and in a notebook kernel.

In the sandbox, :func:`main` (started by :mod:`autograder.isolation.sandbox` or forked by the zygote with two
pipe descriptors) answers the judge's requests with a Runner: execute a cell, call a function or
method defined by the student, compute a gradient, read a plain value, read or load a module's
parameters, list the names defined, build a fixture from the judge's own source (never from a name the
student defined). Locally (``checks.run_local``, the grading tests) the judge's
``LocalBackend`` hands the same requests to a Runner over a notebook's ``globals()``, so both give
the same values and the same errors. The Runner never decides a grade: every result goes back as
plain arrays (:mod:`wire`), and the judge compares them with the reference in a process the
student never ran in.

During every judged call a :class:`Guard` makes torch's own attention, and whatever else the part
being graded bans (torch's softmax in the softmax exercise), refuse to run, at the dispatcher, for
everything that runs during the call, whoever's Python reaches it. The guard is installed for the
call only and checked outside the student's code, before and after it: a switched-off guard costs
the call its points. Before any student code, :func:`main` makes the process unable to start another
process or program (:func:`confine_processes`, a seccomp filter the judge reads from outside), so no
helper process can compute for a judged call. What code in this process can still do to the guard is
listed in ``autograder/README.md`` ("What the grader does not promise").

Whatever the student does to this process (patch torch, replace this module's functions, print
"passed") can only change the numbers it sends back, never the verdict. This file is copied into
the sandbox with ``wire.py``, ``torch_names.py`` and ``magics.py``, and imports only those, the
standard library, numpy and torch.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import io
import linecache
import os
import sys
import traceback
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

if __package__:  # imported as autograder.in_sandbox.harness (the judge's local runner, the tests)
    from autograder.in_sandbox import magics, torch_names, wire
else:  # run as a script in the sandbox, beside copies of its sibling modules
    import magics  # type: ignore[no-redef]
    import torch_names  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]

MAX_REQUEST = 256 << 20
OUT_CAP = 64 << 10
MAX_DEPTH = 8  # nesting of a returned value


def _numbers(v: Any, depth: int = 0) -> Any:
    """A question's answer with numpy scalars (``np.float64`` is a float, ``np.int64`` an integer) as the
    Python numbers they are, at any depth of its tuples and lists (issue 20)."""
    if isinstance(v, np.generic):
        return v.item()
    if depth < MAX_DEPTH and isinstance(v, tuple):
        return tuple(_numbers(x, depth + 1) for x in tuple.__iter__(v))
    if depth < MAX_DEPTH and type(v) is list:
        return [_numbers(x, depth + 1) for x in v]
    return v


class Delegated(RuntimeError):
    """Raised when graded code reaches torch's own implementation of what the part asks to write."""


class Tampered(RuntimeError):
    """The run-time guard was found switched off or bypassed around a judged call."""


# -- the guard: bans that hold during a judged call ------------------------------------------------------


class Guard:
    """Run-time bans for judged calls: torch's attention always, a part's own bans (``fragments``) too.

    At the dispatcher, the kernels of the banned aten operators are replaced, for the duration of the
    call only, by one that raises :class:`Delegated` (a ``torch.library.Library`` created before the
    call and destroyed after it, which restores torch's own kernels). Every other operator keeps its
    kernel, so ordinary code runs exactly as fast as before. torch's Python functions that compute the
    same thing without reaching those operators (``nn.MultiheadAttention``'s forward, the Python
    decompositions and references of ``torch._decomp`` and ``torch._refs``) are guarded in place once per
    process (their own code starts with a call of the banned operator), so they refuse while a call bans
    them, and no unguarded original is left for a closure or a table to hand out.

    Integrity is checked around every call (in the sandbox by the request loop, which bound :meth:`judged`
    before any student code ran; locally by the Runner), outside the student's code: before it, a
    banned operator is called on a tiny tensor, through the whole dispatcher (modes and kernels the
    notebook may have registered included), and must be refused by this guard's kernel; after it, the
    dispatcher's table for the banned operators must be exactly what was installed. Anything else
    raises :class:`Tampered`.
    """

    def __init__(self, torch: types.ModuleType) -> None:
        self.torch = torch
        self.all_ops = sorted(torch._C._dispatch_get_all_op_names())
        self.active: tuple[str, ...] | None = None  # the fragments banned by the call under way
        self.refusals: list[str] = []  # what was refused during the call (even if the student caught it)
        self.hits = 0  # refusals by this guard's kernels, counted for the integrity probe
        self._plans: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        self._tables: dict[tuple[str, ...], list[str]] = {}  # the dispatcher's table with the guard installed
        self._guard_python_implementations()

    # the dispatcher's part ----------------------------------------------------------------------
    def _plan(self, fragments: tuple[str, ...]) -> list[tuple[str, str]]:
        """(operator, dispatch key) pairs to replace for ``fragments``, computed once per ban set."""
        if fragments not in self._plans:
            has = self.torch._C._dispatch_has_kernel_for_dispatch_key
            pairs = []
            for full in torch_names.matching_ops(self.all_ops, fragments):
                for key in torch_names.GUARD_KEYS:
                    try:
                        if has(full, key):
                            pairs.append((full[len("aten::"):], key))
                    except RuntimeError:
                        pass
            self._plans[fragments] = pairs
        return self._plans[fragments]

    def _refuser(self, op: str):
        def refuse(*args: Any, **kwargs: Any) -> Any:
            self.hits += 1
            what = f"torch.ops.aten.{op}"
            self.refusals.append(what)
            raise Delegated(f"{what} is torch's own implementation (a part's answer may not reach it, by any "
                            "route); the exercise asks you to compute it yourself")

        return refuse

    def _install(self, fragments: tuple[str, ...]) -> Any:
        lib = self.torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            for op, key in self._plan(fragments):
                try:
                    lib.impl(op, self._refuser(op.split(".")[0]), key)
                except (RuntimeError, ValueError):
                    pass
        return lib

    def _table(self, fragments: tuple[str, ...]) -> list[str]:
        """The dispatcher's active kernels of the guarded operators, at the guarded keys (one line each:
        ``CPU: registered at <file:line> ...``); kernels the notebook registered at other keys do not count."""
        dump = self.torch._C._dispatch_dump
        keys = tuple(f"{key}: " for key in torch_names.GUARD_KEYS)
        return [line for op in sorted({op for op, _ in self._plan(fragments)})
                for line in dump("aten::" + op).splitlines() if line.startswith(keys)]

    def _probe(self, fragments: tuple[str, ...]) -> None:
        """Call one banned operator per ban on a tiny tensor: this guard's kernel must refuse it."""
        torch = self.torch
        x = torch.zeros(1, 1, 1)
        probes = [("scaled_dot_product_attention", lambda: torch.ops.aten._scaled_dot_product_attention_math(x, x, x))]
        if "softmax" in fragments:
            probes.append(("softmax", lambda: torch.ops.aten._softmax(x, -1, False)))
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
            if fragments not in self._tables:  # the same registrations give the same table: dumped once
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

    # torch's Python entry points ----------------------------------------------------------------
    def _guard_python_implementations(self) -> None:
        """Guard, in place and once per process, torch's Python functions that compute attention or a softmax
        without reaching its aten operator: the references and decompositions (``torch._refs``,
        ``torch._decomp``, ``torch._prims``), ``F.multi_head_attention_forward`` and the forwards of the
        attention modules (``nn.MultiheadAttention`` with ``need_weights`` multiplies and softmaxes by hand).

        Nothing wraps them: each function's own code is compiled again from its source with one line first,
        which calls the corresponding banned aten operator (``_softmax``, or the math attention) on a tiny
        tensor, straight to its CPU kernel (past any dispatch mode). So such a function refuses exactly when
        the dispatcher refuses its operator (during a judged call that bans it, where the probe and the table
        check cover the dispatcher), and runs as before otherwise; no closure, ``__wrapped__`` or table keeps
        an unguarded copy of its code (the check sits in ``co_consts`` as a ``functools.partial`` of a C method,
        whose attributes are read-only). Functions are found by walking every function object of the
        process (``gc``), so the references in decomposition tables, closures and other modules are the
        same, guarded objects.
        """
        torch = self.torch
        import torch.nn.functional as F

        if getattr(F.multi_head_attention_forward, "__guarded__", False):
            return  # already done by an earlier guard in this process
        for name in ("torch._refs", "torch._refs.nn.functional", "torch._refs.special", "torch._decomp",
                     "torch._decomp.decompositions"):
            importlib.import_module(name)  # imported now, so no fresh unguarded copy can be imported later
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
        x = torch.zeros(1, 1, 1)
        checks = {"softmax": functools.partial(torch.ops.aten._softmax.default._handle.redispatch_boxed,
                                               keys, x, -1, False),
                  "attention": functools.partial(
                      torch.ops.aten._scaled_dot_product_attention_math.default._handle.redispatch_boxed,
                      keys, x, x, x)}
        targets = [F.multi_head_attention_forward]
        targets += [getattr(torch.nn, c).forward for c in torch_names.ATTENTION_MODULES if hasattr(torch.nn, c)]
        roots = tuple(os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("_refs", "_decomp", "_prims"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() on a deprecated module attribute warns
            targets += [f for f in gc.get_objects() if isinstance(f, types.FunctionType)
                        and f.__code__.co_filename.startswith(roots) and self._touches_a_ban(f.__code__.co_name)]
        failed = []
        for fn in {id(f): f for f in targets}.values():
            kind = "softmax" if "softmax" in torch_names.squash(fn.__code__.co_name) else "attention"
            try:
                fn.__code__ = _with_check_first(fn, checks[kind])
            except (OSError, TypeError, SyntaxError, ValueError) as e:
                failed.append(f"{fn.__module__}.{fn.__qualname__} ({e})")
        if failed:  # a torch whose source cannot be read here: say so rather than leave them silently open
            warnings.warn("the grader's guard could not guard torch's " + ", ".join(failed))
        F.multi_head_attention_forward.__guarded__ = True  # type: ignore[attr-defined]

    @staticmethod
    def _touches_a_ban(name: str) -> bool:
        """Whether ``name`` could be banned by some part (attention, or a softmax-like name)."""
        return bool(torch_names.is_torch_attention(name)) or "softmax" in torch_names.squash(name)


GUARD_MARK = "__attention_course_guard__"  # placeholder constant, replaced by the check in the compiled code


def _with_check_first(fn: types.FunctionType, check: Any) -> types.CodeType:
    """``fn``'s code compiled again from its source, with ``check()`` as its first statement.

    The new code keeps ``fn``'s name, file, line numbers and free variables (compiled inside a scaffold
    function that binds the same names, so its closure still fits); ``check`` goes into its constants.
    Raises when the source cannot be read or the result does not fit ``fn``.
    """
    import ast
    import inspect
    import textwrap

    code = fn.__code__
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)) or fdef.name != code.co_name:
        raise ValueError("its source is not a plain def")
    fdef.decorator_list = []  # already applied around the function object we change
    first = 1 if fdef.body and isinstance(fdef.body[0], ast.Expr) and isinstance(
        getattr(fdef.body[0], "value", None), ast.Constant) and isinstance(fdef.body[0].value.value, str) else 0
    call = ast.Expr(ast.Call(ast.Constant(GUARD_MARK), [], []))
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
        outer = compile(scaffold, code.co_filename, "exec")
    found = [c for c in outer.co_consts if isinstance(c, types.CodeType)]
    inner = [c for c in (found[0].co_consts if found else ()) if isinstance(c, types.CodeType) and c.co_name == code.co_name]
    if len(inner) != 1 or inner[0].co_freevars != code.co_freevars:
        raise ValueError(f"its recompiled code does not fit its closure ({[c.co_freevars for c in inner]} for {code.co_freevars})")
    new = inner[0].replace(co_consts=tuple(check if c == GUARD_MARK else c for c in inner[0].co_consts),
                           co_qualname=code.co_qualname)
    return new


# -- the runner -------------------------------------------------------------------------------------------


class _NoIPython:
    """Stands in for ``get_ipython()``: notebook-only calls (magics, display hooks) do nothing here."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Runner:
    """Runs a student's code on request: one namespace, the objects kept for the judge, conversions.

    ``namespace``: the student's globals (a fresh ``__main__`` in the sandbox, a notebook's globals
    locally). Requests and replies are plain dicts of wire values (:mod:`wire`); :meth:`handle` never
    raises: an error in the student's code is a reply with ``ok: False``.
    """

    def __init__(self, torch: types.ModuleType, namespace: dict[str, Any] | None = None,
                 device: str = "cpu") -> None:
        self.torch = torch
        self.device = torch.device(device)
        self.provided: set[str] = set()  # names the runner defines for the notebook (Jupyter's built-ins)
        if namespace is None:
            namespace = {"__name__": "__main__", "__builtins__": __builtins__,
                         "display": lambda *a, **k: print(*a), "get_ipython": lambda: _NoIPython()}
            self.provided = {"display", "get_ipython"}
        self.ns = namespace
        self.refs: dict[int, Any] = {}
        self.guard = _process_guard(torch)
        self.guarded_outside = False  # set by the sandbox's loop, which then guards every call request itself

    # conversions ----------------------------------------------------------------------------------
    def to_torch(self, v: Any) -> Any:
        """A wire value (arrays, refs, containers) as the student's code receives it."""
        return wire.map_leaves(v, self._leaf_to_torch)

    def _leaf_to_torch(self, v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return self.torch.from_numpy(v.copy()).to(self.device)
        return self.refs[v.id] if isinstance(v, wire.Ref) else v

    def to_wire(self, v: Any, depth: int = 0, expected: str = "torch tensors") -> Any:
        """What the student's code returned, as a wire value: plain tensors become arrays (bfloat16 and
        complex as float32), tuples (a namedtuple too) and lists stay containers; nothing else goes
        (``expected`` says what should have come, in the error)."""
        torch = self.torch
        if depth > MAX_DEPTH:
            raise TypeError("the result is nested too deeply")
        if type(v) is torch.Tensor or type(v) is torch.nn.Parameter:
            t = v.detach()
            if t.is_complex() or t.dtype == torch.bfloat16:
                t = t.to(torch.float32)
            return t.to("cpu").contiguous().numpy().copy()
        if isinstance(v, torch.Tensor):
            raise TypeError(f"returned a {type(v).__module__}.{type(v).__qualname__}, a subclass of torch.Tensor; "
                            "return a plain torch.Tensor")
        if v is None or type(v) in (bool, int, float, str):
            return v
        if isinstance(v, tuple):  # a namedtuple or torch.Size too, read as the tuple it is
            return tuple(self.to_wire(x, depth + 1, expected) for x in tuple.__iter__(v))
        if type(v) is list:
            return [self.to_wire(x, depth + 1, expected) for x in v]
        raise TypeError(f"returned a {type(v).__name__}, expected {expected}")

    def resolve(self, target: Any) -> Any:
        if isinstance(target, wire.Ref):
            return self.refs[target.id]
        if target not in self.ns:
            defined = sorted(k for k, v in self.ns.items() if not k.startswith("_") and k not in self.provided
                             and callable(v) and not isinstance(v, types.ModuleType))
            raise NameError(f"nothing named {target!r} is defined "
                            f"(your notebook defines: {', '.join(defined) or 'nothing callable'})")
        return self.ns[target]

    # requests ------------------------------------------------------------------------------------
    def handle(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one request; an exception in the student's code becomes ``{"ok": False, "error": ...}``."""
        try:
            op = req.get("op")
            method = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            if method is None:
                return {"ok": False, "error": f"unknown request {op!r}"}
            return {"ok": True, "value": method(req)}
        except BaseException as e:  # noqa: BLE001 - anything the student raises is reported, never fatal
            return self._error_reply(e)

    def _error_reply(self, e: BaseException) -> dict[str, Any]:
        try:
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            # Keep the student's frames, drop the runner's own.
            text = "".join(line for line in tb if "harness.py" not in line)
            message = f"{type(e).__name__}: {e}"
        except BaseException:  # noqa: BLE001 - an exception whose str() itself fails
            text, message = "", f"{type(e).__name__} (its message could not be shown)"
        reply = {"ok": False, "error": message[:2000], "traceback": text[-4000:]}
        if isinstance(e, SystemExit):
            reply["error"] = f"SystemExit({e.code}) raised: the notebook tried to exit"
        return reply

    def op_exec(self, req: Mapping[str, Any]) -> None:
        """Run a cell as Jupyter would: its source registered for ``inspect`` (so ``torch.jit.script``
        finds it), ``%%writefile`` writing into the working folder, other magics doing nothing."""
        code, label = str(req["code"]), str(req.get("label", "<cell>"))
        magic = magics.cell_magic(code)
        if magic is not None and magic[0] in ("writefile", "file"):
            self._write_file(magic[1], magic[2])
            return None
        code = magics.strip_magics(code)
        linecache.cache[label] = (len(code), None, code.splitlines(True), label)
        exec(compile(code, label, "exec"), self.ns)
        return None

    @staticmethod
    def _write_file(args: str, body: str) -> None:
        words = args.split()
        append = bool(words) and words[0] in ("-a", "--append")
        name = " ".join(words[1:] if append else words).strip("'\"")
        if not name:
            raise ValueError("%%writefile needs a file name")
        with open(name, "a" if append else "w") as f:
            f.write(body if body.endswith("\n") else body + "\n")
        importlib.invalidate_caches()  # the next cell may import it
        print(("Appended to" if append else "Writing") + f" {name}")

    def _judged(self, req: Mapping[str, Any]) -> contextlib.AbstractContextManager:
        if self.guarded_outside:  # the sandbox's request loop guards the whole request itself (see main)
            return contextlib.nullcontext()
        return self.guard.judged(tuple(torch_names.runtime_fragments(req.get("bans") or ())))

    def _refused(self) -> None:
        """A refusal the student's code caught still costs the call: the part reached a banned operator."""
        if not self.guarded_outside:  # else the request loop checks, with the list it bound at start-up
            _raise_if_refused(self.guard.refusals)

    def op_call(self, req: Mapping[str, Any]) -> Any:
        """Call a function, class or method; ``keep``: keep the result here and send a reference;
        ``grad``: send the gradient of ``sum(out * probe)`` with respect to ``args[grad]``."""
        torch = self.torch
        fn = self.resolve(req["target"])
        if req.get("attr"):
            fn = getattr(fn, req["attr"])
        args = self.to_torch(list(req.get("args", [])))
        kwargs = self.to_torch(dict(req.get("kwargs", {})))
        grad = req.get("grad")
        if grad is not None:
            args[grad] = args[grad].requires_grad_(True)
        with self._judged(req):
            try:
                with torch.set_grad_enabled(grad is not None or bool(req.get("keep"))):
                    result = fn(*args, **kwargs)
                if grad is not None:
                    # One vector-Jacobian product; the backward pass runs under the same bans.
                    out = result[0] if isinstance(result, tuple) else result
                    probe = self.to_torch(req["probe"])
                    (g,) = torch.autograd.grad((out * probe).sum(), args[grad], allow_unused=True)
                    result = torch.zeros_like(args[grad]) if g is None else g
            except Exception:
                self._refused()  # a refusal wrapped in another error (TorchScript's) is still a refusal
                raise
            self._refused()
        if req.get("keep"):
            self.refs[len(self.refs) + 1] = result
            return wire.Ref(len(self.refs))
        return self.to_wire(result)

    def op_value(self, req: Mapping[str, Any]) -> Any:
        """A conceptual question's answer: a plain value the student assigned (tensors and numpy arrays
        travel as arrays, numpy scalars as numbers, ``torch.Size`` as a tuple); the judge checks its type."""
        name = req["target"]
        if name not in self.ns:
            raise NameError(f"nothing named {name!r} is defined: assign your answer to {name}")
        v = self.ns[name]
        if isinstance(v, np.ndarray):
            v = self.torch.from_numpy(v.copy())
        if isinstance(v, tuple) and type(v) is not tuple:
            v = tuple(v)
        return self.to_wire(_numbers(v), expected=f"{name} to hold a plain number, string, bool, tuple or list")

    def op_trusted(self, req: Mapping[str, Any]) -> wire.Ref:
        """Build a fixture from the judge's own source (``source``: a module's text; ``target``: the name in
        it to call with ``args``, ``kwargs``), executed into a fresh namespace of its own: never a name
        looked up in the student's namespace, so redefining it in a cell changes nothing. The object is
        kept here and sent back as a reference, for the judge to hand to the student's code."""
        ns: dict[str, Any] = {"__name__": "trusted_fixture", "__builtins__": __builtins__}
        exec(compile(str(req["source"]), "<the grader's fixture>", "exec"), ns)
        obj = ns[str(req["target"])](*self.to_torch(list(req.get("args", []))),
                                     **self.to_torch(dict(req.get("kwargs", {}))))
        self.refs[len(self.refs) + 1] = obj
        return wire.Ref(len(self.refs))

    def op_params(self, req: Mapping[str, Any]) -> dict[str, Any]:
        return {k: self.to_wire(v) for k, v in self.resolve(req["target"]).state_dict().items()}

    def op_load(self, req: Mapping[str, Any]) -> None:
        """Copy the judge's parameters into the student's module, name by name and shape by shape."""
        obj = self.resolve(req["target"])
        state = self.to_torch(req["state"])
        with self.torch.no_grad():
            own = obj.state_dict()
            for k, v in state.items():
                if k not in own:
                    raise KeyError(f"your module has no parameter named {k!r} (it has: {', '.join(own)})")
                if tuple(own[k].shape) != tuple(v.shape):
                    raise ValueError(f"parameter {k!r} has shape {tuple(own[k].shape)}, expected {tuple(v.shape)}")
                own[k].copy_(v)
        return None

    def op_names(self, req: Mapping[str, Any]) -> list[str]:
        return sorted(k for k in self.ns if not k.startswith("__"))


def _raise_if_refused(refusals: list[str]) -> None:
    if refusals:
        raise Delegated(f"{refusals[0]} is torch's own implementation (a part's answer may not reach it, by any "
                        "route); the exercise asks you to compute it yourself")


_GUARDS: dict[int, Guard] = {}  # one per torch module: the dispatcher and torch's functions are per process


def _process_guard(torch: types.ModuleType) -> Guard:
    if id(torch) not in _GUARDS:
        _GUARDS[id(torch)] = Guard(torch)
    return _GUARDS[id(torch)]


def prepare_guard(torch: types.ModuleType) -> None:
    """Do the guard's one-off setup now: the operator list, the wrapped entry points and the plan of the bans
    every call carries. The zygote calls it once, before it forks, so every sandbox it forks inherits them
    (its dispatcher is torch's own: no student code has run in the zygote)."""
    _process_guard(torch)._plan(tuple(torch_names.runtime_fragments(())))


# -- no second process: a seccomp filter installed before any student code ---------------------------------

# System call numbers per architecture (the audit arch the kernel reports in seccomp_data.arch). x86_64 has fork
# and vfork calls of its own; aarch64 creates processes through clone and clone3 only.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {"x86_64": {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435,
                       "seccomp": 317},
            "aarch64": {"clone": 220, "execve": 221, "execveat": 281, "clone3": 435, "seccomp": 277}}
CLONE_THREAD = 0x10000
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: another numbering, refused as a whole


def _bpf_program(arch: str) -> list[tuple[int, int, int, int]]:
    """The classic BPF program of :func:`confine_processes` for ``arch``: ``(code, jt, jf, k)`` rows.

    fork, vfork, execve, execveat: EPERM; clone: allowed only with ``CLONE_THREAD`` (a thread of this
    process), else EPERM; clone3 (whose flags sit behind a pointer a filter cannot read): ENOSYS, so
    glibc falls back to clone for its threads; another architecture's calls (an i386 ``int 0x80``, x32): EPERM.
    """
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, JSET|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    nr = SYSCALLS[arch]
    denied = [nr[n] for n in ("fork", "vfork", "execve", "execveat") if n in nr]
    # Symbolic program: jumps name labels; resolved to the forward offsets BPF needs below.
    prog: list[tuple] = [(ld, 4), (jeq, AUDIT_ARCH[arch], None, "deny"), (ld, 0)]
    if arch == "x86_64":
        prog.append((jge, X32_SYSCALL_BIT, "deny", None))
    prog.append((jeq, nr["clone"], "clone", None))
    prog += [(jeq, n, "deny", None) for n in denied]
    prog += [(jeq, nr["clone3"], "nosys", None), (ret, allow),
             ("clone",), (ld, 16), (jset, CLONE_THREAD, "allow", "deny"),
             ("allow",), (ret, allow), ("deny",), (ret, eperm), ("nosys",), (ret, enosys)]
    labels, at = {}, 0
    for row in prog:
        if len(row) == 1:
            labels[row[0]] = at
        else:
            at += 1
    out, at = [], 0
    for row in prog:
        if len(row) == 1:
            continue
        code, k, *jumps = row
        jt, jf = ((labels[j] - at - 1 if j else 0) for j in (jumps + [None, None])[:2])
        out.append((code, jt, jf, k))
        at += 1
    return out


def confine_processes() -> str:
    """Make this process unable to start another process or program, for good; '' or why it could not.

    A seccomp filter (Linux): fork, vfork, execve, execveat and clone without ``CLONE_THREAD`` fail with
    EPERM; clone3 fails with ENOSYS and glibc creates its threads with clone instead, so torch's threads and
    Python's work as before. A filter cannot be removed once installed, and it holds for every thread
    (``SECCOMP_FILTER_FLAG_TSYNC``) and every thread started later. The harness installs it before the
    student's first line runs; the judge reads it from outside (``Seccomp: 2`` in ``/proc/<pid>/status``).
    """
    import ctypes
    import platform

    arch = platform.machine()
    if sys.platform != "linux" or arch not in SYSCALLS:
        return f"no seccomp filter for {sys.platform}/{arch}"
    rows = _bpf_program(arch)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(rows))(*[SockFilter(*r) for r in rows])
    prog = SockFprog(len(rows), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to install a filter without privileges
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog): every thread of the process at once.
    ret = libc.syscall(ctypes.c_long(SYSCALLS[arch]["seccomp"]), ctypes.c_long(1), ctypes.c_long(1),
                       ctypes.byref(prog))
    if ret != 0:
        return f"seccomp(SECCOMP_SET_MODE_FILTER) failed: {os.strerror(ctypes.get_errno()) if ret < 0 else ret}"
    return ""


# -- the sandbox's loop -----------------------------------------------------------------------------------


class _Capped(io.TextIOBase):
    """A text sink that keeps the first ``cap`` characters and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.parts, self.size, self.dropped = cap, [], 0, 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
            self.size += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[... {self.dropped} more characters of output cut]"
        self.parts, self.size, self.dropped = [], 0, 0
        return text


def main() -> None:
    # First, before anything of the student's can run: no second process, ever (see confine_processes). Where
    # this fails the judge sees it from outside (no "Seccomp: 2") and says so in the result's log.
    unconfined = confine_processes()
    if unconfined:
        os.write(2, f"harness: processes not confined: {unconfined}\n".encode())
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    device_name = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.path.insert(0, os.getcwd())  # the working folder is importable, as in Jupyter (%%writefile modules)
    import torch

    torch.set_num_threads(1)
    runner = Runner(torch, device=device_name)
    sink = _Capped(OUT_CAP)
    # What a judged call's guard needs, bound now, before any student code, into this frame's locals: rebinding
    # Guard.judged, Runner._judged, the runner's guard or this module's globals later (a notebook that walks
    # the stack up to here) changes none of them. The whole request, conversions included, runs guarded.
    runner.guarded_outside = True
    judged, refusals, handle, error_reply = runner.guard.judged, runner.guard.refusals, runner.handle, runner._error_reply
    fragments_of, raise_if_refused = torch_names.runtime_fragments, _raise_if_refused
    recv, send, capped_take = wire.recv, wire.send, sink.take
    while True:
        try:
            req = recv(rfd, MAX_REQUEST)
        except EOFError:
            return
        req = req if isinstance(req, dict) else {}
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = sink
        try:
            if req.get("op") == "call":
                try:
                    with judged(tuple(fragments_of(req.get("bans") or ()))):
                        reply = handle(req)
                        raise_if_refused(refusals)  # even when the student's code caught the refusal
                except BaseException as e:  # noqa: BLE001 - the guard's verdict (Delegated, Tampered) is a reply
                    reply = error_reply(e)
            else:
                reply = handle(req)
        finally:
            sys.stdout, sys.stderr = old_out, old_err
        reply["output"] = capped_take()
        try:
            send(wfd, reply)
        except wire.WireError as e:
            send(wfd, {"ok": False, "error": f"the result could not be sent: {e}", "output": ""})


if __name__ == "__main__":
    main()
