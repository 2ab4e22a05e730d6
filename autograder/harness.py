"""The process that runs a student's code, inside the sandbox.

It is started by :mod:`autograder.sandbox` with two pipe descriptors and obeys
requests from the judge: execute a cell, call a function or method defined by
the student, read or load a module's parameters. It never decides a grade:
every result goes back to the judge as plain arrays (see :mod:`wire`), and the
judge compares them with the reference in a process the student never ran in.

Whatever the student does to this process (patch torch, replace this module's
functions, print "passed") can only change the numbers it sends back, never the
verdict. This file is copied into the sandbox and imports only the standard
library, numpy and torch (and IPython's input transformer, for a cell with IPython syntax).
"""

from __future__ import annotations

import ast
import io
import os
import sys
import traceback
import types

import numpy as np

try:
    import wire
except ImportError:  # imported from the autograder package (authorship reuses _strip_magics), not in the sandbox
    from autograder import wire

MAX_REQUEST = 256 << 20
OUT_CAP = 64 << 10


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


class Delegated(RuntimeError):
    """Raised when graded code calls torch's own attention instead of computing it."""


def _tripwires(torch: types.ModuleType) -> None:
    """Make torch's built-in attention refuse to run inside graded code."""

    def trip(name: str):
        def refuse(*args, **kwargs):
            raise Delegated(
                f"{name} is torch's own implementation; the exercise asks you to compute attention yourself"
            )

        return refuse

    import torch.nn.functional as F

    for mod, attr in [
        (F, "scaled_dot_product_attention"),
        (F, "multi_head_attention_forward"),
        (torch._C._nn, "scaled_dot_product_attention"),
        (torch, "_native_multi_head_attention"),
    ]:
        if hasattr(mod, attr):
            setattr(mod, attr, trip(f"{getattr(mod, '__name__', 'torch')}.{attr}"))
    for cls in ("MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer"):
        c = getattr(torch.nn, cls, None)
        if c is not None:
            c.forward = trip(f"torch.nn.{cls}")
    _dispatcher_tripwires(torch)


# aten operators that compute attention: reached through torch.ops.aten, the C bindings, fast paths and
# decompositions alike, they all end in one of these, whatever Python name led there.
ATEN_ATTENTION = ("scaled_dot_product", "multi_head_attention", "_transformer_encoder_layer", "scaled_dot_attention",
                  "_flash_attention", "_efficient_attention", "_cudnn_attention")
# The dispatch keys whose kernels are replaced (only those an operator has: the others keep their defaults).
TRIP_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
             "CPU", "CUDA", "MPS", "XPU", "NestedTensorCPU", "NestedTensorCUDA", "AutocastCPU", "AutocastCUDA")
_LIBRARIES: list = []  # the registrations last as long as their Library object


def _dispatcher_tripwires(torch: types.ModuleType) -> None:
    """Make the aten attention operators refuse to run, at the dispatcher.

    The kernels of these few operators are replaced by one that raises :class:`Delegated`; every other
    operator keeps its kernel, so ordinary code runs exactly as fast as before (unlike a dispatch mode,
    which would see every operator).
    """
    import warnings

    try:
        names = [n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
        lib = torch.library.Library("aten", "IMPL")
    except (AttributeError, RuntimeError):
        return
    _LIBRARIES.append(lib)
    for name in sorted(names):
        base = name.split(".")[0]
        if not any(s in base for s in ATEN_ATTENTION):
            continue

        def refuse(*args, _name=base, **kwargs):
            raise Delegated(f"torch.ops.aten.{_name} is torch's own implementation; "
                            "the exercise asks you to compute attention yourself")

        for key in TRIP_KEYS:
            try:
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
                        lib.impl(name, refuse, key)
            except (RuntimeError, ValueError):
                pass


class _NoIPython:
    """Stands in for ``get_ipython()``: notebook-only calls (magics, display hooks) do nothing here."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def _strip_magics(code: str) -> str:
    """Turn IPython-only syntax (``%magic``, ``!shell``, ``obj?``) into plain Python that does nothing.

    A cell magic on the first line (``%%time``, ``%%capture``, ...) becomes ``pass`` and the cell's body
    runs as plain Python. A cell that is plain Python is left exactly as it is (a continuation line
    ``% x.dim()`` or a ``%`` inside a string is no magic); one that is not is handed to IPython's own
    input transformer, which turns only real magics at the start of logical lines into
    ``get_ipython()`` calls (a no-op here). The grader's static authorship scan uses this same function.
    """
    lines = code.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("%%"):
            lines[i] = "pass  # " + stripped
        elif stripped:
            break
        i += 1
    code = "\n".join(lines)
    if not _maybe_ipython(lines):
        return code
    try:
        compile(code, "<cell>", "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        return code  # plain Python already
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager  # imported only for cells that need it

        return TransformerManager().transform_cell(code)
    except Exception:  # noqa: BLE001 - no IPython, or it choked: comment the magic lines out instead
        out = []
        for line in lines:
            stripped = line.lstrip()
            if stripped.startswith(("%", "!")):
                line = line[: len(line) - len(stripped)] + "pass  # " + stripped
            out.append(line)
        return "\n".join(out) + "\n"


def _maybe_ipython(lines: list[str]) -> bool:
    """Whether a line could be IPython syntax (a magic, a shell escape or a help request)."""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("%", "!")) or stripped.endswith("?"):
            return True
    return False


def main() -> None:
    rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
    device_name = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch

    torch.set_num_threads(1)
    _tripwires(torch)
    device = torch.device(device_name)

    refs: dict[int, object] = {}
    ns: dict[str, object] = {"__name__": "__main__", "__builtins__": __builtins__}
    ns["display"] = lambda *a, **k: print(*a)
    ns["get_ipython"] = lambda: _NoIPython()
    sink = _Capped(OUT_CAP)

    def to_torch(v):
        if isinstance(v, np.ndarray):
            return torch.from_numpy(v.copy()).to(device)
        if isinstance(v, wire.Ref):
            return refs[v.id]
        if isinstance(v, list):
            return [to_torch(x) for x in v]
        if isinstance(v, tuple):
            return tuple(to_torch(x) for x in v)
        if isinstance(v, dict):
            return {k: to_torch(x) for k, x in v.items()}
        return v

    def to_wire(v, depth=0):
        if depth > 8:
            raise TypeError("the result is nested too deeply")
        if type(v) is torch.Tensor or type(v) is torch.nn.Parameter:
            t = v.detach()
            if t.is_complex() or t.dtype == torch.bfloat16:
                t = t.to(torch.float32)
            return t.to("cpu").contiguous().numpy().copy()
        if isinstance(v, torch.Tensor):
            raise TypeError(
                f"returned a {type(v).__module__}.{type(v).__qualname__}, a subclass of torch.Tensor; return a plain torch.Tensor"
            )
        if v is None or type(v) in (bool, int, float, str):
            return v
        if type(v) is tuple:
            return tuple(to_wire(x, depth + 1) for x in v)
        if type(v) is list:
            return [to_wire(x, depth + 1) for x in v]
        raise TypeError(f"returned a {type(v).__name__}, expected torch tensors")

    def resolve(target):
        if isinstance(target, wire.Ref):
            return refs[target.id]
        if target not in ns:
            defined = sorted(k for k, v in ns.items() if not k.startswith("_") and callable(v) and not isinstance(v, types.ModuleType))
            raise NameError(f"nothing named {target!r} is defined (your notebook defines: {', '.join(defined) or 'nothing callable'})")
        return ns[target]

    while True:
        try:
            req = wire.recv(rfd, MAX_REQUEST)
        except EOFError:
            return
        op = req.get("op")
        reply: dict
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = sink
        try:
            if op == "exec":
                code = _strip_magics(req["code"])
                exec(compile(code, req.get("label", "<cell>"), "exec"), ns)
                reply = {"ok": True}
            elif op == "call":
                fn = resolve(req["target"])
                if req.get("attr"):
                    fn = getattr(fn, req["attr"])
                args = to_torch(req.get("args", []))
                kwargs = to_torch(req.get("kwargs", {}))
                grad = req.get("grad")
                if grad is not None:
                    args[grad] = args[grad].requires_grad_(True)
                with torch.set_grad_enabled(grad is not None or bool(req.get("keep"))):
                    result = fn(*args, **kwargs)
                if req.get("keep"):
                    refs[len(refs) + 1] = result
                    reply = {"ok": True, "value": wire.Ref(len(refs)), "type": type(result).__name__}
                elif grad is not None:
                    # The gradient of sum(out * probe) w.r.t. args[grad]: one vector-Jacobian product.
                    out = result[0] if isinstance(result, tuple) else result
                    probe = to_torch(req["probe"])
                    (g,) = torch.autograd.grad((out * probe).sum(), args[grad], allow_unused=True)
                    reply = {"ok": True, "value": to_wire(torch.zeros_like(args[grad]) if g is None else g)}
                else:
                    reply = {"ok": True, "value": to_wire(result)}
            elif op == "value":
                # A conceptual question's answer: a plain value the student assigned (a number, a tuple, a
                # choice). Tensors and numpy arrays travel as arrays; the judge checks the type.
                name = req["target"]
                if name not in ns:
                    raise NameError(f"nothing named {name!r} is defined: assign your answer to {name}")
                v = ns[name]
                if isinstance(v, np.ndarray):
                    v = torch.from_numpy(v.copy())
                if isinstance(v, np.generic):
                    v = v.item()
                if isinstance(v, tuple) and type(v) is not tuple:  # torch.Size, a namedtuple
                    v = tuple(v)
                reply = {"ok": True, "value": to_wire(v)}
            elif op == "params":
                obj = resolve(req["target"])
                reply = {"ok": True, "value": {k: to_wire(v) for k, v in obj.state_dict().items()}}
            elif op == "load":
                obj = resolve(req["target"])
                state = to_torch(req["state"])
                with torch.no_grad():
                    own = obj.state_dict()
                    for k, v in state.items():
                        if k not in own:
                            raise KeyError(f"your module has no parameter named {k!r} (it has: {', '.join(own)})")
                        if tuple(own[k].shape) != tuple(v.shape):
                            raise ValueError(f"parameter {k!r} has shape {tuple(own[k].shape)}, expected {tuple(v.shape)}")
                        own[k].copy_(v)
                reply = {"ok": True}
            elif op == "names":
                reply = {"ok": True, "value": sorted(k for k in ns if not k.startswith("__"))}
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}"}
        except BaseException as e:  # noqa: BLE001 - anything the student raises is reported, never fatal
            try:
                tb = traceback.format_exception(type(e), e, e.__traceback__)
                # Keep the student's frames, drop this harness's own.
                text = "".join(line for line in tb if "harness.py" not in line)
                message = f"{type(e).__name__}: {e}"
            except BaseException:  # noqa: BLE001 - an exception whose str() itself fails
                text, message = "", f"{type(e).__name__} (its message could not be shown)"
            reply = {"ok": False, "error": message[:2000], "traceback": text[-4000:]}
            if isinstance(e, SystemExit):
                reply["error"] = f"SystemExit({e.code}) raised: the notebook tried to exit"
        finally:
            sys.stdout, sys.stderr = old_out, old_err
        reply["output"] = sink.take()
        try:
            wire.send(wfd, reply)
        except wire.WireError as e:
            wire.send(wfd, {"ok": False, "error": f"the result could not be sent: {e}", "output": ""})


if __name__ == "__main__":
    main()
