"""The one way student code is run: a :class:`Runner`, in the sandbox and in a notebook kernel.

A Runner answers the judge's requests over one namespace: execute a cell, call a function or method
defined by the student, compute a gradient, read a plain value, read or load a module's parameters, list
the names defined, build a fixture from the judge's own source (never from a name the student defined). In
the sandbox the request loop (:mod:`harness`) hands it the requests; locally (``checks.run_local``, the
grading tests) the judge's ``LocalBackend`` does, over a notebook's ``globals()``, so both give the same
values and the same errors. The Runner never decides a grade: every result goes back as plain arrays
(:mod:`wire`), and the judge compares them with the reference in a process the student never ran in.

Bans: in the sandbox the whole process is banned for life before any student line
(:func:`ban.ban_for_life`), so the Runner adds nothing (``guard=None``); locally it bans each judged call
with a :class:`ban.Guard`.
"""

from __future__ import annotations

import __future__
import ast
import contextlib
import errno
import importlib
import linecache
import sys
import traceback
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

if __package__:
    from autograder.in_sandbox import ban, magics, torch_names, wire
    from autograder.in_sandbox.ban import Delegated, Tampered
else:
    import ban  # type: ignore[no-redef]
    import magics  # type: ignore[no-redef]
    import torch_names  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]
    from ban import Delegated, Tampered  # type: ignore[no-redef]

__all__ = ["Runner", "Delegated", "Tampered", "ONE_PROCESS"]

MAX_DEPTH = 8  # nesting of a returned value

ONE_PROCESS = ("the grader runs your notebook in one process: starting another process or program (subprocess, "
               "multiprocessing, os.fork, os.system, torch.compile's default backend, which compiles in helper "
               "processes) is not allowed there. Use torch.compile(backend=\"eager\"), or no torch.compile, and "
               "no subprocesses in graded code")


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
                 device: str = "cpu", banned_for_life: tuple[str, ...] | None = None) -> None:
        self.torch = torch
        self.device = torch.device(device)
        self.provided: set[str] = set()  # names the runner defines for the notebook (Jupyter's built-ins)
        if namespace is None:
            namespace = {"__name__": "__main__", "__builtins__": __builtins__,
                         "display": lambda *a, **k: print(*a), "get_ipython": lambda: _NoIPython()}
            self.provided = {"display", "get_ipython"}
        self.ns = namespace
        self.refs: dict[int, Any] = {}
        # In the sandbox (``banned_for_life``: the fragments this process is banned for) the process is banned
        # as a whole and there is no per-call guard; locally a Guard bans each judged call.
        self.banned_for_life = banned_for_life
        self.guard = None if banned_for_life is not None else _process_guard(torch)

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
            text = "".join(line for line in tb if "harness.py" not in line and "runner.py" not in line)
            message = f"{type(e).__name__}: {e}"
        except BaseException:  # noqa: BLE001 - an exception whose str() itself fails
            text, message = "", f"{type(e).__name__} (its message could not be shown)"
        try:
            if _started_a_process(e):
                message = f"{message} ({ONE_PROCESS})"
        except BaseException:  # noqa: BLE001 - an exception chain that cannot be read: the plain message
            pass
        reply = {"ok": False, "error": message[:2000], "traceback": text[-4000:]}
        if isinstance(e, SystemExit):
            reply["error"] = f"SystemExit({e.code}) raised: the notebook tried to exit"
        return reply

    def op_exec(self, req: Mapping[str, Any]) -> None:
        """Run a cell as Jupyter would: its source registered for ``inspect`` (so ``torch.jit.script``
        finds it), ``%%writefile`` writing into the working folder, a body Jupyter does not run as Python
        (``%%bash``, ``%%script false``, ``%%html``, ...) not run, line magics doing nothing.

        Its top-level statements run one at a time (a compound statement, ``def``, ``class``, ``for``, ``with``,
        is one): a statement that raises does not stop the ones after it, so a self-check that fails before a
        ``def`` leaves the function defined. The cell still fails with the first error (the judge logs it); a
        statement that uses what a failed one would have made fails too, as it would after it in Jupyter. A
        cell that does not parse runs nothing. ``SystemExit`` and ``KeyboardInterrupt`` stop the cell."""
        code, label = str(req["code"]), str(req.get("label", "<cell>"))
        magic = magics.cell_magic(code)
        if magic is not None and magic[0] in ("writefile", "file"):
            self._write_file(magic[1], magic[2])
            return None
        code = magics.strip_magics(code)
        linecache.cache[label] = (len(code), None, code.splitlines(True), label)
        tree = compile(code, label, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        flags, first = 0, None
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                for alias in stmt.names:  # a future import governs how the statements after it compile
                    feature = getattr(__future__, alias.name, None)
                    flags |= getattr(feature, "compiler_flag", 0)
            try:
                exec(compile(ast.Module([stmt], []), label, "exec", flags, dont_inherit=True), self.ns)
            except Exception as e:  # noqa: BLE001 - the cell goes on, and fails with its first error at the end
                if first is None:
                    first = e
                else:
                    print(f"{type(e).__name__} at line {stmt.lineno}: {str(e)[:200]}", file=sys.stderr)
        if first is not None:
            raise first
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
        fragments = tuple(torch_names.runtime_fragments(req.get("bans") or ()))
        if self.guard is None:  # the sandbox: the process is banned for life, for the bans it was started with
            if fragments != self.banned_for_life:
                raise RuntimeError(f"this process answers parts banned for {list(self.banned_for_life)}, not "
                                   f"{list(fragments)}: the grader sent the call to the wrong process")
            ban.REFUSALS.clear()
            return contextlib.nullcontext()
        return self.guard.judged(fragments)

    def _refused(self) -> None:
        """A refusal the student's code caught still costs the call: the part reached a banned operator."""
        _raise_if_refused(self.guard.refusals if self.guard is not None else ban.REFUSALS)

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
        travel as arrays, numpy scalars as numbers, ``torch.Size`` as a tuple, a set as ``{"set": [items]}``); the
        judge checks its type."""
        name = req["target"]
        if name not in self.ns:
            raise NameError(f"nothing named {name!r} is defined: assign your answer to {name}")
        v = self.ns[name]
        if isinstance(v, np.ndarray):
            v = self.torch.from_numpy(v.copy())
        if isinstance(v, tuple) and type(v) is not tuple:
            v = tuple(v)
        expected = f"{name} to hold a plain number, string, bool, tuple, list or set"
        if type(v) in (set, frozenset):  # an order-free answer: sent as {"set": [its items]} (questions.SET)
            return {"set": [self.to_wire(x, 1, expected) for x in _numbers(list(v))]}
        return self.to_wire(_numbers(v), expected=expected)

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

    def op_ref(self, req: Mapping[str, Any]) -> wire.Ref:
        """Keep the object the student named ``target`` as it is (not called) and send a reference: the judge hands
        it to its own fixture (chapter 10's lowers the student's kernel and launches it)."""
        obj = self.resolve(req["target"])
        self.refs[len(self.refs) + 1] = obj
        return wire.Ref(len(self.refs))

    def op_params(self, req: Mapping[str, Any]) -> dict[str, Any]:
        return {k: self.to_wire(v) for k, v in self.resolve(req["target"]).state_dict().items()}

    def op_shared(self, req: Mapping[str, Any]) -> list[list[str]]:
        """The names of the module's state that are one tensor (a module registered under two names, as in
        ``self.linear1`` and ``self.net = nn.Sequential(self.linear1, ...)``), each group in state order."""
        groups: dict[int, list[str]] = {}
        for k, v in self.resolve(req["target"]).state_dict(keep_vars=True).items():
            groups.setdefault(id(v), []).append(str(k))
        return [g for g in groups.values() if len(g) > 1]

    def op_load(self, req: Mapping[str, Any]) -> None:
        """Copy the judge's parameters into the student's module, name by name and shape by shape; a tensor
        that several names share is loaded once (two different values for it are refused)."""
        obj = self.resolve(req["target"])
        state = self.to_torch(req["state"])
        with self.torch.no_grad():
            own = obj.state_dict(keep_vars=True)
            loaded: dict[int, tuple[str, Any]] = {}
            for k, v in state.items():
                if k not in own:
                    raise KeyError(f"your module has no parameter named {k!r} (it has: {', '.join(own)})")
                if tuple(own[k].shape) != tuple(v.shape):
                    raise ValueError(f"parameter {k!r} has shape {tuple(own[k].shape)}, expected {tuple(v.shape)}")
                if id(own[k]) in loaded:
                    first, value = loaded[id(own[k])]
                    if not self.torch.equal(value, v):
                        raise ValueError(f"parameters {first!r} and {k!r} are one tensor in your module, where the "
                                         "exercise expects two separate parameters")
                    continue
                loaded[id(own[k])] = (k, v)
                own[k].copy_(v)
        return None

    def op_names(self, req: Mapping[str, Any]) -> list[str]:
        return sorted(k for k in self.ns if not k.startswith("__"))


def _raise_if_refused(refusals: list[str]) -> None:
    if refusals:
        raise Delegated(str(refusals[0]))


def _started_a_process(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it came from) is the seccomp filter's refusal of a new process: EPERM,
    raised where a process or program is started."""
    seen = 0
    while e is not None and seen < 20:
        seen += 1
        if isinstance(e, OSError) and e.errno == errno.EPERM:
            for frame in traceback.extract_tb(e.__traceback__):
                where = f"{frame.name} {frame.filename} {frame.line or ''}".lower()
                if any(w in where for w in ("fork", "exec", "spawn", "popen", "subprocess", "multiprocessing",
                                            "system(", "_launch", "start_new_session")):
                    return True
        e = e.__cause__ or e.__context__
    return False


_GUARDS: dict[int, Any] = {}  # locally, one Guard per torch module: the dispatcher and torch's functions are per process


def _process_guard(torch: types.ModuleType) -> "ban.Guard":
    if id(torch) not in _GUARDS:
        _GUARDS[id(torch)] = ban.Guard(torch)
    return _GUARDS[id(torch)]
