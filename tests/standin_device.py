"""Run a chapter as if on a GPU, on a machine that has none: a stand-in ``cuda`` device.

Usage: ``python tests/standin_device.py book/06_positional_encoding.ipynb`` executes every code
cell of the chapter in one process with ``attnkit.default_device()`` returning ``cuda``. The
tensors the chapter puts there are ordinary CPU tensors (so every value and every assertion is
the CPU's) of the class :class:`StandIn`, which says ``device == cuda`` and refuses what CUDA
refuses:

* an operation mixing a stand-in tensor with a CPU tensor of one element or more (a CPU
  scalar tensor is allowed, as on CUDA; so are CPU index tensors and ``copy_`` across);
* a stand-in tensor turned into a NumPy array (``.numpy()``, ``np.asarray``, matplotlib);
* a generator of the other device passed with ``generator=``.

Tensors made with ``device=`` a CUDA device, moved with ``.to(...)``/``.cuda()``, module
parameters and buffers moved by ``Module.to``, and everything computed from them, are
stand-ins; ``.cpu()`` and ``.to("cpu")`` give plain CPU tensors back.

The chapter also takes its GPU branches (``device.type == "cuda"``): ``torch.cuda``'s
synchronize and memory functions are replaced by a model of the CUDA caching allocator that
counts the bytes of the tensors alive (like ``attnkit.efficient.peak_memory``'s counter, on
``meta`` copies so that large sizes cost no arithmetic), rounds each allocation up to 512
bytes, and allocates a matrix library's workspace at the first matrix product and keeps it, as
PyTorch does with cuBLAS's workspace (allocated through the caching allocator, which is why
``torch._C._cuda_clearCublasWorkspaces`` exists; several MiB, up to 32 MiB on recent GPUs).

What it cannot see is listed in tests/test_chapter_devices.py.
"""

from __future__ import annotations

import math
import sys
import time
import traceback
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

CUDA = torch.device("cuda")
CPU = torch.device("cpu")
WORKSPACE_BYTES = 32 * 2**20  # a cuBLAS workspace, allocated on first use and kept
BLOCK = 512  # the caching allocator's smallest block: every allocation is rounded up to it
_MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "einsum",
            "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention"}


# operations that take tensors of two devices on CUDA too
_ACROSS = {"copy_", "_has_compatible_shallow_copy_type", "__set__", "set_", "to", "cpu", "cuda"}


class DeviceMismatch(RuntimeError):
    """What CUDA would raise: tensors on two devices in one operation."""


def _is_cuda(device: Any) -> bool:
    if device is None or isinstance(device, (torch.dtype, torch.Tensor)):
        return False
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _plain(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _stand_in(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and not isinstance(t, StandIn):
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(StandIn)
    return t


_CUDA_GENERATORS: set[int] = set()
_ALLOCATOR: _Allocator | None = None


class StandIn(torch.Tensor):
    """A CPU tensor that says it is on ``cuda`` and refuses to be mixed with CPU tensors."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return CUDA

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def grad(self):  # autograd stores a plain tensor: it lives where its parameter does
        with torch._C.DisableTorchFunctionSubclass():
            g = torch._C.TensorBase.grad.__get__(self)
        return None if g is None else _stand_in(g)

    @grad.setter
    def grad(self, value):
        with torch._C.DisableTorchFunctionSubclass():
            torch._C.TensorBase.grad.__set__(self, value)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first. (stand-in device)")
        if func in (torch.Tensor.__repr__, torch.Tensor.__str__, torch.Tensor.__format__):
            plain = tree_map(lambda a: _plain(a) if isinstance(a, StandIn) else a, args)
            return func(*plain, **kwargs)
        _check_same_device(func, name, args, kwargs)
        if _ALLOCATOR is not None and name in _MATMULS:
            _ALLOCATOR.first_matmul()
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **kwargs)
        if func in torch.overrides.get_default_nowrap_functions():
            return ret
        if isinstance(ret, torch.Tensor):
            return _stand_in(ret)
        return tree_map(_stand_in, ret) if isinstance(ret, (tuple, list, dict)) else ret


def _tensors(obj, out: list) -> list:
    """The tensors in args/kwargs (nested tuples, lists, dicts): a fast tree_flatten."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _check_same_device(func, name: str, args, kwargs) -> None:
    tensors = _tensors(args, _tensors(kwargs, []))
    if name in _ACROSS or not tensors:
        return
    if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
        # CUDA takes CPU indices (and values, by copy); a CPU tensor indexed by a CUDA one fails
        if isinstance(args[0], StandIn):
            return
        tensors = _tensors(args[1], [args[0]])
    on = [isinstance(t, StandIn) for t in tensors]
    cpu = [t for t, s in zip(tensors, on) if not s and t.dim() > 0]
    if any(on) and cpu:
        shapes = [tuple(t.shape) for t in cpu]
        raise DeviceMismatch(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"cuda:0 and cpu! ({name}: CPU tensors of shapes {shapes}; stand-in device)")
    gen = kwargs.get("generator")
    if gen is not None and any(on) and id(gen) not in _CUDA_GENERATORS:
        raise DeviceMismatch(f"{name}: Expected a 'cuda' device type for generator but found "
                             "'cpu' (stand-in device)")


class _Placement(TorchFunctionMode):
    """Makes ``device=cuda`` factories, ``.to(cuda)`` and ``.cuda()`` give stand-in tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return self._move(func, args, kwargs)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = CPU
            gen = kwargs.get("generator")
            if gen is not None and id(gen) not in _CUDA_GENERATORS:
                raise DeviceMismatch(f"{func.__name__}: Expected a 'cuda' device type for "
                                     "generator but found 'cpu' (stand-in device)")
            out = func(*args, **kwargs)
            return tree_map(_stand_in, out) if not isinstance(out, torch.Tensor) else _stand_in(out)
        return func(*args, **kwargs)

    @staticmethod
    def _move(func, args, kwargs):
        self, rest = args[0], args[1:]
        if func is torch.Tensor.cuda:
            target = CUDA
        elif func is torch.Tensor.cpu:
            target = CPU
        else:
            if rest and isinstance(rest[0], torch.Tensor):  # .to(other): its device and dtype
                other = rest[0]
                rest = (other.device, other.dtype) + tuple(rest[1:])
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
            target = None if device is None else torch.device(device)
            plain = _plain(self) if isinstance(self, StandIn) else self
            moved = plain.to(dtype=dtype or plain.dtype,
                             **({"memory_format": memory_format} if memory_format else {}))
            if target is None:
                return _stand_in(moved) if isinstance(self, StandIn) else moved
            self = _stand_in(moved) if isinstance(self, StandIn) else moved
        if target.type == "cuda":  # a copy, as from the CPU to a GPU (clone keeps autograd)
            return self if isinstance(self, StandIn) else _stand_in(self.clone())
        if isinstance(self, StandIn):
            return _plain(self.clone())
        return self


class _Counter(TorchDispatchMode):
    """Counts the bytes of storages created and alive (rounded to blocks), on meta copies."""

    def __init__(self, allocator: _Allocator) -> None:
        super().__init__()
        self.allocator = allocator
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in _MATMULS:
            self.allocator.first_matmul()
        with torch._C.DisableTorchFunction():
            meta = tree_map(lambda a: a.as_subclass(torch.Tensor).to("meta")
                            if isinstance(a, torch.Tensor) else a,
                            (args, kwargs or {}))
            out = func(*meta[0], **meta[1])
        outs = out if isinstance(out, (tuple, list)) else (out,)
        fresh = [r.alias_info is None for r in func._schema.returns]
        fresh = fresh * len(outs) if len(fresh) == 1 else fresh
        for t, new in zip(outs, fresh):
            if new and isinstance(t, torch.Tensor):
                storage = t.untyped_storage()  # _unsafe_view says "new" and is a view
                if id(storage) in self.seen:
                    continue
                self.seen.add(id(storage))
                nbytes = math.ceil(storage.nbytes() / BLOCK) * BLOCK
                self.live += nbytes
                weakref.finalize(storage, self._free, id(storage), nbytes)
                self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.seen.discard(key)


class _Allocator:
    """``torch.cuda``'s memory statistics for the stand-in device (see the module docstring)."""

    def __init__(self) -> None:
        self.workspace = 0
        self.counter: _Counter | None = None

    def first_matmul(self) -> None:
        if not self.workspace:
            self.workspace = WORKSPACE_BYTES
            if self.counter is not None:
                self.counter.live += WORKSPACE_BYTES
                self.counter.peak = max(self.counter.peak, self.counter.live)

    def memory_allocated(self, device=None) -> int:
        return self.workspace

    def reset_peak_memory_stats(self, device=None) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
        self.counter = _Counter(self)
        self.counter.live = self.counter.peak = self.workspace
        self.counter.__enter__()

    def max_memory_allocated(self, device=None) -> int:
        if self.counter is None:
            return self.workspace
        self.counter.__exit__(None, None, None)
        peak, self.counter = self.counter.peak, None
        return peak


def install() -> None:
    """Make this process's chapter code run on the stand-in device (for good: run it in its own process)."""
    global _ALLOCATOR
    import attnkit
    import attnkit.device

    _ALLOCATOR = _ALLOCATOR or _Allocator()
    attnkit.default_device = attnkit.device.default_device = lambda: CUDA
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # Module.to swaps parameters
    class Generator(torch.Generator):  # a CPU generator, remembered as CUDA's when asked for one
        def __new__(cls, device="cpu"):
            g = super().__new__(cls, "cpu")
            if _is_cuda(device):
                _CUDA_GENERATORS.add(id(g))
            return g

        def __init__(self, device="cpu"):
            pass

    torch.Generator = Generator  # type: ignore[misc]
    torch.cuda.synchronize = lambda device=None: None
    for name in ("memory_allocated", "reset_peak_memory_stats", "max_memory_allocated"):
        setattr(torch.cuda, name, getattr(_ALLOCATOR, name))
    torch.cuda.empty_cache = lambda: None
    _Placement().__enter__()


def run_chapter(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.show = lambda *a, **k: plt.close("all")
    torch.set_num_threads(1)  # the chapter's small tensors, on a shared machine
    install()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.chapters import code_cells  # the device check's reading of a chapter, magics as `pass`

    namespace: dict[str, Any] = {"__name__": "__main__"}
    for i, code in code_cells(path):
        start = time.monotonic()
        where = f"{path.name}, cell {i}"
        try:
            exec(compile(code, where, "exec"), namespace)
        except BaseException as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == where]
            line = code.splitlines()[frames[-1].lineno - 1].strip() if frames else ""
            print(f"STANDIN-FAILED {where}, line {frames[-1].lineno if frames else '?'} "
                  f"({line!r}): {type(exc).__name__}: {exc}", file=sys.stderr)
            raise
        print(f"cell {i}: {time.monotonic() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    run_chapter(Path(sys.argv[1]))
