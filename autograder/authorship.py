"""Honest authorship: answers that delegate to the reference package or to torch's own attention earn nothing.

A static pass over the student's code finds references to ``attnkit`` and to
torch's built-in attention (``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``, the ``nn.Transformer*`` layers, ...), including
through helpers the answer calls and names spelled out in strings. The harness
backs it up at run time by making those torch functions refuse to run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

TORCH_ATTENTION = {
    "scaled_dot_product_attention": "torch's scaled_dot_product_attention",
    "multi_head_attention_forward": "torch's multi_head_attention_forward",
    "_native_multi_head_attention": "torch's native multi-head attention",
    "MultiheadAttention": "torch.nn.MultiheadAttention",
    "TransformerEncoderLayer": "torch.nn.TransformerEncoderLayer",
    "TransformerDecoderLayer": "torch.nn.TransformerDecoderLayer",
    "TransformerEncoder": "torch.nn.TransformerEncoder",
    "TransformerDecoder": "torch.nn.TransformerDecoder",
    "Transformer": "torch.nn.Transformer",
}
STRING_HINTS = ("attnkit", "scaled_dot_product", "multi_head_attention", "multiheadattention", "transformerencoderlayer",
                "transformerdecoderlayer")


def _offences(node: ast.AST, extra: Mapping[str, str]) -> list[str]:
    """What in ``node`` delegates (``extra``: names this part must not use, with what they are)."""
    found: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            found += ["imports the reference package attnkit" for a in n.names if a.name.split(".")[0] == "attnkit"]
        elif isinstance(n, ast.ImportFrom):
            if (n.module or "").split(".")[0] == "attnkit":
                found.append("imports the reference package attnkit")
            for a in n.names:
                if a.name in TORCH_ATTENTION:
                    found.append(f"uses {TORCH_ATTENTION[a.name]}")
                elif a.name in extra:
                    found.append(f"uses {extra[a.name]}")
        elif isinstance(n, ast.Attribute):
            if n.attr in TORCH_ATTENTION:
                found.append(f"uses {TORCH_ATTENTION[n.attr]}")
            elif n.attr in extra:
                found.append(f"uses {extra[n.attr]}")
        elif isinstance(n, ast.Name) and n.id == "attnkit":
            found.append("uses the reference package attnkit")
        elif isinstance(n, ast.Call) and _reflective(n.func):
            for arg in ast.walk(n):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    low = arg.value.lower()
                    if any(h in low for h in STRING_HINTS):
                        found.append(f"looks up {arg.value[:60]!r} by name (a way to reach the reference or torch's attention)")
    return found


REFLECTIVE = {"getattr", "__import__", "import_module", "eval", "exec", "compile", "__getattribute__", "vars", "globals"}


def _reflective(func: ast.expr) -> bool:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in REFLECTIVE


def _bound_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    names: set[str] = set()
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        for a in stmt.names:
            names.add((a.asname or a.name).split(".")[0])
        return names
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
    return names


def delegations(code: str, parts: Iterable[str], extra: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """Map each part whose answer delegates to a sentence saying how.

    ``code`` is all the student's code in notebook order; ``extra`` adds, per part,
    names that part must not use (``{"softmax": {"softmax": "torch's softmax"}}``).
    A helper that delegates taints every part that calls it; another part does not.
    """
    extra = extra or {}
    parts = list(parts)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    # name -> (offences, names it refers to)
    defs: dict[str, tuple[list[str], set[str]]] = {}
    for stmt in tree.body:
        bound = _bound_names(stmt)
        refs = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        for name in bound:
            off = _offences(stmt, extra.get(name, {}))
            old = defs.get(name, ([], set()))
            defs[name] = (old[0] + off, old[1] | (refs - {name}))
    tainted: dict[str, str] = {n: d[0][0] for n, d in defs.items() if d[0]}
    changed = True
    while changed:
        changed = False
        for name, (_, refs) in defs.items():
            if name in tainted:
                continue
            # Parts are graded on their own: calling another (delegating) part does not taint this one.
            hit = next((r for r in sorted(refs) if r in tainted and r not in parts), None)
            if hit is not None:
                tainted[name] = f"calls {hit}, which {tainted[hit]}"
                changed = True
    return {p: f"{p} {tainted[p]}" for p in parts if p in tainted}
