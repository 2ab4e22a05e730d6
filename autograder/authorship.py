"""Honest authorship: answers that delegate to the reference package or to torch's own attention earn nothing.

A static pass over the student's code finds references to ``attnkit`` and to
torch's built-in attention (``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``, the ``nn.Transformer*`` layers, ...), including
through helpers the answer calls and names spelled out in strings. The harness
backs it up at run time by making those torch functions refuse to run.

Taint follows Python's scopes, not bare names: a function is tainted by a global it
reads (a helper, a value computed with torch's attention), never by a local variable or
parameter that happens to share a name with one. So a student's self-check cell that
compares an answer with ``F.scaled_dot_product_attention`` costs nothing.
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


def _offences(nodes: Iterable[ast.AST], extra: Mapping[str, str], own: set[str] = frozenset()) -> list[str]:
    """What in ``nodes`` delegates (``extra``: names this part must not use, with what they are).

    ``own``: the functions and methods the student defined; ``self.<one of them>`` is the
    student's own method even when it shares a name with torch's.
    """
    found: list[str] = []
    for n in nodes:
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
            if n.attr in own and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
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


COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _units(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The module's statements, and the definitions nested in its compound statements (``if``, ``try``, ...)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, COMPOUND):
            for block in ("body", "orelse", "finalbody"):
                yield from (u for u in _units(getattr(stmt, block, [])) if isinstance(u, DEFS))
            for handler in getattr(stmt, "handlers", []):
                yield from (u for u in _units(handler.body) if isinstance(u, DEFS))


def _module_level(stmt: ast.stmt) -> Iterable[ast.AST]:
    """``ast.walk`` of a statement that runs at module level, without the bodies of definitions nested in it
    (those are units of their own)."""
    todo = [stmt]
    while todo:
        node = todo.pop()
        yield node
        if node is not stmt and isinstance(node, DEFS):
            continue
        todo.extend(ast.iter_child_nodes(node))


def _bound_names(stmt: ast.stmt) -> set[str]:
    """The global names a module-level statement binds (for a compound one, apart from the definitions in it)."""
    if isinstance(stmt, DEFS):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return {n.id for n in _module_level(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _global_reads(stmt: ast.stmt) -> set[str]:
    """The names ``stmt`` reads from the module's globals.

    For a function or class: the names it reads minus those it binds itself (parameters,
    assignments, imports, nested definitions), unless declared ``global``. Conservative for
    nested scopes: a name bound anywhere inside counts as local throughout.
    """
    if not isinstance(stmt, DEFS):
        return {n.id for n in _module_level(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    reads: set[str] = set()
    local: set[str] = set()
    declared: set[str] = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name):
            (reads if isinstance(n.ctx, ast.Load) else local).add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, DEFS) and n is not stmt:
            local.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            local.add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
    return reads - (local - declared)


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
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defs: dict[str, tuple[list[str], set[str]]] = {}
    for stmt in _units(tree.body):
        bound = _bound_names(stmt)
        refs = _global_reads(stmt)
        nodes = list(ast.walk(stmt) if isinstance(stmt, DEFS) else _module_level(stmt))
        for name in bound:
            off = _offences(nodes, extra.get(name, {}), own)
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
