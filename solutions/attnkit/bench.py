"""Benchmark: attnkit's fast path against torch's own attention, in one run on the same inputs (chapter 08).

    python -m attnkit.bench --json bench.json                     # the full run (a few minutes on CPU)
    python -m attnkit.bench --sizes 64,256 --repeats 3 --json q.json   # a quick run

Three pairs, each timed forward (``torch.no_grad()``, both modules in ``eval()``, so torch's
own inference fast paths apply where they can) and forward+backward (both in ``train()`` with
dropout 0, gradients of the input and of every parameter):

* ``sdpa``: ``attnkit.fused_attention(q, k, v)`` against
  ``torch.nn.functional.scaled_dot_product_attention(q, k, v)``, inputs ``(B, H, n, Dh)``;
* ``mha``: ``attnkit.MultiHeadAttention(E, H, attention=fused_attention)(x, x, x)`` against
  ``torch.nn.MultiheadAttention(E, H, batch_first=True)(x, x, x, need_weights=False)``;
* ``encoder``: ``attnkit.TransformerEncoderBlock(E, H, F, attention=fused_attention)(x)`` against
  ``torch.nn.TransformerEncoderLayer(E, H, F, dropout=0, batch_first=True)``.

Both sides of a pair get the same weights (copied), the same inputs, dtype and device. Calls
alternate between the two sides (ours, torch, torch, ours, ...) so that a machine shared with
other jobs slows both alike. The table shows the median time of each and ``ratio`` =
median(ours) / median(torch); below 1 means attnkit is faster. With ``--with-explicit``, rows
for the textbook path (``scaled_dot_product_attention``, the weights materialised) are added for contrast.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.attention import scaled_dot_product_attention
from attnkit.efficient import fused_attention
from attnkit.multihead import MultiHeadAttention
from attnkit.torch_twins import to_torch_encoder_layer, to_torch_multihead
from attnkit.transformer import TransformerEncoderBlock

__all__ = ["Row", "run", "main", "WHAT_RUNS", "gpt_train_step_row"]

MODULES = ("sdpa", "mha", "encoder")
MODES = ("forward", "backward")
DEFAULT_SIZES = (128, 512, 1024, 4096)
TARGET = 1.10

WHAT_RUNS = {
    "sdpa": ("attnkit.fused_attention(q, k, v)",
             "torch.nn.functional.scaled_dot_product_attention(q, k, v)"),
    "mha": ("attnkit.MultiHeadAttention(E, H, attention=fused_attention)(x, x, x)",
            "torch.nn.MultiheadAttention(E, H, batch_first=True)(x, x, x, need_weights=False)"),
    "encoder": ("attnkit.TransformerEncoderBlock(E, H, F, attention=fused_attention)(x)",
                "torch.nn.TransformerEncoderLayer(E, H, F, dropout=0.0, batch_first=True)(x)"),
}
MODE_NOTE = {"forward": "torch.no_grad(), modules in eval() (torch's inference fast paths allowed)",
             "backward": "forward + backward of out * g, modules in train() with dropout 0, grads of input and weights"}


@dataclass
class Row:
    """One timed pair: ``ratio`` = median(ours) / median(torch)."""

    device: str
    module: str
    mode: str
    batch: int
    seq_len: int
    embed_dim: int
    num_heads: int
    dtype: str
    ours_ms: float
    torch_ms: float
    ratio: float
    ratio_paired: float  # median over repeats of ours/torch measured back to back
    repeats: int
    variant: str = "fast"  # "fast" (fused_attention) or "explicit" (scaled_dot_product_attention)
    ours_runs_ms: list[float] = field(default_factory=list)
    torch_runs_ms: list[float] = field(default_factory=list)


# -- the pairs: weights copied from ours into torch's (attnkit.torch_twins) -----------------------


def make_pair(module: str, batch: int, n: int, embed_dim: int, num_heads: int, ff_dim: int,
              device: torch.device, dtype: torch.dtype, explicit: bool = False
              ) -> tuple[Callable[..., Tensor], Callable[..., Tensor], list[Tensor], list[nn.Module]]:
    """``(ours, theirs, inputs, modules)``: two callables computing the same tensor from ``inputs``."""
    gen = torch.Generator().manual_seed(0)
    attention = scaled_dot_product_attention if explicit else fused_attention
    if module == "sdpa":
        d = embed_dim // num_heads
        inputs = [torch.randn(batch, num_heads, n, d, generator=gen).to(device, dtype) for _ in range(3)]  # (B, H, n, Dh)
        return (lambda q, k, v: attention(q, k, v)[0],
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v), inputs, [])
    x = torch.randn(batch, n, embed_dim, generator=gen).to(device, dtype)  # (B, n, E)
    if module == "mha":
        with torch.random.fork_rng(devices=[]):  # seeded weights, the caller's random state untouched
            torch.manual_seed(0)
            ours = MultiHeadAttention(embed_dim, num_heads, attention=attention).to(device, dtype)
        theirs = to_torch_multihead(ours)
        return (lambda x: ours(x, x, x)[0],
                lambda x: theirs(x, x, x, need_weights=False)[0], [x], [ours, theirs])
    if module == "encoder":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            ours = TransformerEncoderBlock(embed_dim, num_heads, ff_dim, attention=attention).to(device, dtype)
        theirs = to_torch_encoder_layer(ours)
        return (lambda x: ours(x)[0], lambda x: theirs(x), [x], [ours, theirs])
    raise ValueError(f"unknown module {module!r}; choose from {', '.join(MODULES)}")


# -- timing ----------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer(fn: Callable[..., Tensor], inputs: list[Tensor], mode: str, modules: list[nn.Module],
           device: torch.device) -> Callable[[], float]:
    """A function that runs ``fn`` once in ``mode`` and returns the seconds it took."""
    if mode == "forward":
        def once() -> float:
            _sync(device)
            start = time.perf_counter()
            with torch.no_grad():
                fn(*inputs)
            _sync(device)
            return time.perf_counter() - start
        return once

    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    probe = torch.randn(fn(*leaves).shape, generator=torch.Generator().manual_seed(1)).to(device, inputs[0].dtype)

    def once() -> float:
        for x in leaves:
            x.grad = None
        for m in modules:
            m.zero_grad(set_to_none=True)
        _sync(device)
        start = time.perf_counter()
        fn(*leaves).backward(probe)
        _sync(device)
        return time.perf_counter() - start
    return once


def time_pair(ours: Callable[[], float], theirs: Callable[[], float], repeats: int, warmup: int = 1
              ) -> tuple[list[float], list[float]]:
    """Interleaved timings (seconds) of the two sides; the order alternates to cancel drift."""
    for _ in range(warmup):
        ours(), theirs()
    a, b = [], []
    for i in range(repeats):
        if i % 2:
            b.append(theirs())
            a.append(ours())
        else:
            a.append(ours())
            b.append(theirs())
    return a, b


def run(devices: Sequence[str] = ("cpu",), sizes: Sequence[int] = DEFAULT_SIZES,
        modules: Sequence[str] = MODULES, modes: Sequence[str] = MODES, repeats: int = 7,
        embed_dim: int = 256, num_heads: int = 8, ff_dim: int = 1024, tokens: int = 4096,
        batch: int | None = None, dtype: torch.dtype = torch.float32, with_explicit: bool = False,
        log: Callable[[str], None] | None = print) -> list[Row]:
    """Time every (device, module, mode, size) pair; batch = ``batch`` or ``max(1, tokens // n)``."""
    rows = []
    for dev in devices:
        device = torch.device(dev)
        for module in modules:
            for mode in modes:
                for n in sizes:
                    b = batch or max(1, tokens // n)
                    for explicit in ([False, True] if with_explicit else [False]):
                        ours, theirs, inputs, mods = make_pair(module, b, n, embed_dim, num_heads, ff_dim, device,
                                                               dtype, explicit)
                        for m in mods:
                            m.train(mode == "backward")
                        a, t = time_pair(_timer(ours, inputs, mode, mods, device),
                                         _timer(theirs, inputs, mode, mods, device), repeats)
                        row = Row(dev, module, mode, b, n, embed_dim, num_heads, str(dtype).replace("torch.", ""),
                                  ours_ms=1e3 * statistics.median(a), torch_ms=1e3 * statistics.median(t),
                                  ratio=statistics.median(a) / statistics.median(t),
                                  ratio_paired=statistics.median(x / y for x, y in zip(a, t)), repeats=repeats,
                                  variant="explicit" if explicit else "fast",
                                  ours_runs_ms=[round(1e3 * x, 4) for x in a],
                                  torch_runs_ms=[round(1e3 * x, 4) for x in t])
                        rows.append(row)
                        if log:
                            log(format_row(row))
                        del inputs, mods
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
    return rows


# -- a GPT training step (chapter 09): attnkit's GPT against the same model from torch's layers -------


class _TorchGPT(nn.Module):
    """attnkit's GPT rebuilt from ``nn.TransformerEncoderLayer(norm_first=True)`` with a causal mask, weights copied."""

    def __init__(self, ours: nn.Module) -> None:
        super().__init__()
        E = ours.token_embed.embedding_dim
        self.token_embed = nn.Embedding(*ours.token_embed.weight.shape).to(ours.token_embed.weight)
        self.position_embed = nn.Embedding(*ours.position_embed.weight.shape).to(ours.token_embed.weight)
        self.layers = nn.ModuleList(to_torch_encoder_layer(block) for block in ours.blocks)  # norm_first, same dropout
        self.norm = nn.LayerNorm(E).to(ours.token_embed.weight)
        with torch.no_grad():
            self.token_embed.weight.copy_(ours.token_embed.weight)
            self.position_embed.weight.copy_(ours.position_embed.weight)
        self.norm.load_state_dict(ours.norm.state_dict())

    def forward(self, tokens: Tensor) -> Tensor:
        n = tokens.shape[1]
        x = self.token_embed(tokens) + self.position_embed(torch.arange(n, device=tokens.device))  # (B, n, E)
        not_allowed = torch.ones(n, n, dtype=torch.bool, device=tokens.device).triu(1)  # torch: True = may NOT attend
        for layer in self.layers:
            x = layer(x, src_mask=not_allowed, is_causal=True)
        return F.linear(self.norm(x), self.token_embed.weight)  # (B, n, V): read-out tied to the embedding


def gpt_train_step_row(device: str = "cpu", batch: int = 16, n: int = 128, embed_dim: int = 128, num_heads: int = 4,
                       num_layers: int = 4, vocab_size: int = 96, repeats: int = 7,
                       dtype: torch.dtype = torch.float32) -> Row:
    """One training step (forward, next-token loss, backward) of ``attnkit.gpt.GPT`` against the same model
    from torch's layers with copied weights, both in ``dtype``; ``ratio`` = median(ours) / median(torch)."""
    from attnkit.gpt import GPT, language_model_loss

    dev = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ours = GPT(vocab_size, embed_dim, num_heads, num_layers, max_len=n).to(dev, dtype)
    theirs = _TorchGPT(ours)
    tokens = torch.randint(0, vocab_size, (batch, n), generator=torch.Generator().manual_seed(0)).to(dev)

    def step(model: nn.Module, logits_of: Callable[[Tensor], Tensor]) -> Callable[[], float]:
        def once() -> float:
            model.zero_grad(set_to_none=True)
            _sync(dev)
            start = time.perf_counter()
            language_model_loss(logits_of(tokens), tokens).backward()
            _sync(dev)
            return time.perf_counter() - start
        return once

    a, t = time_pair(step(ours, lambda x: ours(x)[0]), step(theirs, theirs), repeats)
    return Row(device, "gpt", "train", batch, n, embed_dim, num_heads, str(dtype).replace("torch.", ""),
               ours_ms=1e3 * statistics.median(a), torch_ms=1e3 * statistics.median(t),
               ratio=statistics.median(a) / statistics.median(t),
               ratio_paired=statistics.median(x / y for x, y in zip(a, t)), repeats=repeats,
               ours_runs_ms=[round(1e3 * x, 4) for x in a], torch_runs_ms=[round(1e3 * x, 4) for x in t])


# -- output ----------------------------------------------------------------------------------------

HEADER = f"{'device':6s} {'module':8s} {'mode':8s} {'variant':8s} {'B':>3s} {'n':>5s} " \
         f"{'ours ms':>10s} {'torch ms':>10s} {'ratio':>6s} {'paired':>6s}"


def format_row(r: Row) -> str:
    flag = "" if r.variant != "fast" else ("  ok" if r.ratio <= TARGET else f"  > {TARGET:.2f}")
    return (f"{r.device:6s} {r.module:8s} {r.mode:8s} {r.variant:8s} {r.batch:3d} {r.seq_len:5d} "
            f"{r.ours_ms:10.3f} {r.torch_ms:10.3f} {r.ratio:6.2f} {r.ratio_paired:6.2f}{flag}")


def describe(embed_dim: int, num_heads: int, ff_dim: int, dtype: torch.dtype) -> str:
    lines = [f"attnkit.bench: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {platform.machine()}, "
             f"E={embed_dim}, H={num_heads}, F={ff_dim}, {str(dtype).replace('torch.', '')}"]
    for module, (ours, theirs) in WHAT_RUNS.items():
        lines.append(f"  {module:8s} ours:  {ours}\n  {'':8s} torch: {theirs}")
    for mode, note in MODE_NOTE.items():
        lines.append(f"  {mode:8s} {note}")
    lines.append("  ratio = median(ours) / median(torch); paired = median of back-to-back ratios; "
                 f"target ratio <= {TARGET:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(prog="python -m attnkit.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the rows (each with its ratio) to this file")
    parser.add_argument("--devices", default="auto",
                        help="comma-separated: cpu, cuda; 'auto' (default) is cpu plus cuda when available")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="sequence lengths n")
    parser.add_argument("--modules", default=",".join(MODULES), help=f"any of {', '.join(MODULES)}")
    parser.add_argument("--modes", default=",".join(MODES), help="forward, backward (= forward + backward)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per side (after one warm-up)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: max(1, tokens // n))")
    parser.add_argument("--tokens", type=int, default=4096, help="batch * n when --batch is not given")
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ff-dim", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--gpt-step", action="store_true",
                        help="add a row: one GPT training step in --dtype, attnkit.gpt.GPT against torch's encoder "
                             "layers (ch. 09)")
    parser.add_argument("--with-explicit", action="store_true",
                        help="add rows for the explicit textbook path (scaled_dot_product_attention) for contrast")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if devices == ["auto"]:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        print("attnkit.bench: CUDA is not available, skipping it")
        devices = [d for d in devices if d != "cuda"]
    dtype = getattr(torch, args.dtype)
    sizes = [int(s) for s in args.sizes.split(",")]
    modules = [m.strip() for m in args.modules.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    for name, given, allowed in (("module", modules, MODULES), ("mode", modes, MODES)):
        bad = [g for g in given if g not in allowed]
        if bad:
            parser.error(f"unknown {name} {bad}; choose from {', '.join(allowed)}")

    print(describe(args.embed_dim, args.heads, args.ff_dim, dtype))
    print(HEADER)
    rows = run(devices, sizes, modules, modes, args.repeats, args.embed_dim, args.heads, args.ff_dim, args.tokens,
               args.batch, dtype, args.with_explicit)
    if args.gpt_step:  # GPT training step (chapter 09), on each device
        for dev in devices:
            rows.append(gpt_train_step_row(dev, repeats=args.repeats, dtype=dtype))
            print(format_row(rows[-1]) + "   <- gpt: attnkit.gpt.GPT vs nn.TransformerEncoderLayer(norm_first=True)")
    fast = [r for r in rows if r.variant == "fast"]
    if fast:
        worst = max(fast, key=lambda r: r.ratio)
        print(f"{sum(r.ratio <= TARGET for r in fast)}/{len(fast)} rows within ratio {TARGET:.2f}; worst "
              f"{worst.ratio:.2f} ({worst.device} {worst.module} {worst.mode} n={worst.seq_len})")
    if args.json:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
                "embed_dim": args.embed_dim, "num_heads": args.heads, "ff_dim": args.ff_dim, "dtype": args.dtype,
                "target_ratio": TARGET, "what_runs": WHAT_RUNS, "modes": MODE_NOTE,
                "cuda": torch.cuda.get_device_name() if "cuda" in devices else None}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
        print(f"wrote {len(rows)} rows to {args.json}")
    return rows


if __name__ == "__main__":
    main()
