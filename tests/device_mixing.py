"""A dispatch mode that refuses an operation whose tensors live on different devices, as CUDA does.

torch refuses most meta/CPU mixes by itself, but not all: ``meta @ cpu`` returns a meta tensor
where ``cuda @ cpu`` raises. Under :class:`SameDevice` every aten operation checks its tensor
arguments, so a constant made on the CPU and combined with inputs on another device is caught on
a machine without a GPU. What CUDA itself allows is allowed: 0-dimensional CPU tensors (scalars),
copies between devices (``.to()``, ``copy_``) and CPU index tensors.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_CROSSING = {"copy_", "_to_copy", "to", "index", "index_put_", "_index_put_impl_", "lift_fresh", "lift_fresh_copy"}


class DeviceMixing(RuntimeError):
    """An operation took tensors on different devices."""


class SameDevice(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in _CROSSING:
            devices = {t.device for t in tree_leaves((args, kwargs or {}))
                       if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu")}
            if len(devices) > 1:
                raise DeviceMixing(f"{func} took tensors on {', '.join(sorted(map(str, devices)))}")
        return func(*args, **(kwargs or {}))
