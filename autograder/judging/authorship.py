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

A part's own bans (``extra``: torch's softmax in the softmax exercise) apply to everything the
part reaches through global reads (helpers, import aliases, classes), not to other parts.
The code is read cell by cell as the harness runs it: IPython magics are transformed the
same way, and a cell that does not parse is skipped alone.
"""

from __future__ import annotations

import ast
import collections
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from attnkit.vocabulary import COMPOUND, DEFS  # noqa: F401 - the units the vocabulary reads, read the same way
from attnkit.vocabulary import module_units as _units
from autograder.in_sandbox.magics import cell_magic, strip_magics
from autograder.in_sandbox.torch_names import ATEN_ATTENTION, is_torch_attention, squash

STRING_HINTS = ("attnkit", "multiheadattention", "transformerencoderlayer", "transformerdecoderlayer", *ATEN_ATTENTION)


# What reaches into the grader's own code in the student's process (the run-time guard, the request loop, the
# originals of banned functions), and has no place in an attention answer: frames, the garbage collector's
# object walks, closures and code objects, ctypes, the dispatcher's registrations, the harness's modules.
# Used anywhere in the notebook, it costs every part that reaches it, and every part when it runs at module
# level (a cell can switch the guard off before any part is called). Threads, ``import os``, ``gc.collect``
# and ``inspect.signature`` stay honest.
TAMPERING_ATTRS = {
    "_getframe": "sys._getframe (the stack above the answer is the grader's)",
    "_current_frames": "sys._current_frames (the grader's stack)",
    "currentframe": "inspect.currentframe (the grader's stack)",
    "getouterframes": "inspect.getouterframes (the grader's stack)",
    "getinnerframes": "inspect.getinnerframes (frames)",
    "walk_stack": "traceback.walk_stack (the grader's stack)",
    "walk_tb": "traceback.walk_tb (frames)",
    "f_back": "a frame's f_back (the grader's stack)",
    "f_locals": "a frame's f_locals (the grader's variables)",
    "f_globals": "a frame's f_globals (the grader's variables)",
    "tb_frame": "a traceback's frames (the grader's stack)",
    "gi_frame": "a generator's frame", "cr_frame": "a coroutine's frame", "ag_frame": "a generator's frame",
    "get_objects": "gc.get_objects (every object of the grader's process)",
    "get_referrers": "gc.get_referrers (the grader's objects)",
    "get_referents": "gc.get_referents (the grader's objects)",
    "__closure__": "a function's __closure__ (what torch's and the grader's functions hold)",
    "cell_contents": "a closure cell's contents (what torch's and the grader's functions hold)",
    "getclosurevars": "inspect.getclosurevars (what torch's and the grader's functions hold)",
    "__globals__": "a function's __globals__ (the grader's module)",
    "__code__": "a function's __code__ (rewriting torch's or the grader's code)",
    "__subclasses__": "__subclasses__ (every class of the grader's process)",
}
TAMPERING_MODULES = {"ctypes": "ctypes (writing the process's memory)", "_ctypes": "ctypes (writing the process's memory)",
                     "harness": "the grader's harness", "wire": "the grader's channel", "torch_names": "the grader's bans",
                     "ban": "the grader's ban", "runner": "the grader's runner", "confine": "the grader's process limit",
                     "magics": "the grader's magics", "torch.library": "torch.library (the dispatcher's registrations)"}
TAMPER_HINTS = tuple(squash(n) for n in TAMPERING_ATTRS)


def _tampering(n: ast.AST, unit: "_Unit", ctx: "_Context") -> str | None:
    """What ``n`` uses that reaches into the grader's process (see ``TAMPERING_ATTRS``), if anything."""
    if isinstance(n, ast.Import):
        for a in n.names:
            what = TAMPERING_MODULES.get(a.name) or TAMPERING_MODULES.get(a.name.split(".")[0])
            if what and a.name.split(".")[0] not in ctx.modules:
                return what
    elif isinstance(n, ast.ImportFrom):
        module = n.module or ""
        if module in ctx.modules or n.level:
            return None
        what = TAMPERING_MODULES.get(module) or TAMPERING_MODULES.get(module.split(".")[0])
        if what:
            return what
        if module == "torch" and any(a.name == "library" for a in n.names):
            return TAMPERING_MODULES["torch.library"]
        return next((TAMPERING_ATTRS[a.name] for a in n.names if a.name in TAMPERING_ATTRS), None)
    elif isinstance(n, ast.Attribute):
        if _students_own(n, unit, ctx):
            return None
        if n.attr in TAMPERING_ATTRS:
            return TAMPERING_ATTRS[n.attr]
        if n.attr.startswith("_dispatch_") or (n.attr == "library" and isinstance(n.value, ast.Name) and n.value.id == "torch"):
            return TAMPERING_MODULES["torch.library"]
        if n.attr in ("stack", "trace") and isinstance(n.value, ast.Name) and n.value.id == "inspect":
            return f"inspect.{n.attr} (the grader's stack)"
    elif isinstance(n, ast.Name) and n.id in ("ctypes", "_ctypes"):
        return TAMPERING_MODULES["ctypes"]
    return None


@dataclass
class _Context:
    """What the whole notebook defines, for the exemptions and for folding strings."""

    class_methods: dict[str, set[str]] = field(default_factory=dict)  # student classes -> names defined in them
    instances: dict[str, set[str]] = field(default_factory=dict)  # global -> names defined in its class
    consts: dict[str, ast.expr] = field(default_factory=dict)  # globals bound once, to a string expression
    modules: set[str] = field(default_factory=set)  # modules the notebook wrote itself (%%writefile helper.py)
    module_names: set[str] = field(default_factory=set)  # the names those modules are imported as
    globals_bound: set[str] = field(default_factory=set)  # every global name a cell binds (for bare names)
    attr_stores: set[tuple[str, str]] = field(default_factory=set)  # (name, attr) of every ``name.attr = ...``
    deadline: float = float("inf")  # time.monotonic() past which the scan gives up (ScanLimit)


class _Unit:
    """A module-level statement or definition: the global names it binds and reads."""

    def __init__(self, stmt: ast.stmt) -> None:
        self.stmt = stmt
        self.is_def = isinstance(stmt, DEFS)
        self.bound = _bound_names(stmt)
        self.reads = _global_reads(stmt)
        self.nodes = list(ast.walk(stmt) if self.is_def else _module_level(stmt))

    def is_global(self, name: str) -> bool:
        """Whether ``name``, read in this unit, is the module's global of that name."""
        return not self.is_def or name in self.reads


def _offences(unit: _Unit, ctx: _Context) -> list[str]:
    """What in ``unit`` reaches into the grader's process (see ``TAMPERING_ATTRS``)."""
    found: list[str] = []
    for n in unit.nodes:
        tamper = _tampering(n, unit, ctx)
        if tamper:
            found.append(f"uses {tamper}, which reaches into the grader's own process (its run-time guard, its "
                         "request loop); an answer has no use for it")
        elif _looks_up(n):
            for arg in ast.walk(n):
                text = _fold(arg, unit, ctx)
                if text is None or text in ctx.modules:  # the student's own module, looked up by its name
                    continue
                if squash(text) in TAMPER_HINTS or text in TAMPERING_MODULES:
                    found.append(f"looks up {text[:60]!r} by name, which reaches into the grader's own process "
                                 "(its run-time guard, its request loop)")
    return found


def _students_own(n: ast.Attribute, unit: _Unit, ctx: _Context) -> bool:
    v = n.value
    if isinstance(v, ast.Name) and v.id in ctx.module_names:
        return True  # helper.stable_softmax, from a module the notebook wrote with %%writefile
    if isinstance(v, ast.Name) and not unit.is_global(v.id) and (v.id, n.attr) in ctx.attr_stores:
        return True  # ctx.softmax_out, read back from a local (a parameter) where the notebook stores it
    if isinstance(v, ast.Name):
        if v.id in ("self", "cls"):  # the student's own only if this class (or a student base class) defines it
            if not isinstance(unit.stmt, ast.ClassDef):
                return False
            bases = [b.id for b in unit.stmt.bases if isinstance(b, ast.Name)]
            return n.attr in _class_names(unit.stmt) or any(n.attr in ctx.class_methods.get(b, ()) for b in bases)
        if unit.is_global(v.id):
            return n.attr in ctx.class_methods.get(v.id, ()) or n.attr in ctx.instances.get(v.id, ())
    if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and unit.is_global(v.func.id):
        return n.attr in ctx.class_methods.get(v.func.id, ())
    return False


REFLECTIVE = {"getattr", "__import__", "import_module", "eval", "exec", "compile", "__getattribute__", "__getattr__",
              "vars", "globals", "methodcaller", "attrgetter", "getattr_static", "resolve_name", "_get_operation_overload",
              "_jit_get_operation"}


def _reflective(func: ast.expr) -> bool:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return name in REFLECTIVE


def _reflective_value(value: ast.expr) -> bool:
    """Whether subscripting ``value`` looks a name up (``vars(m)[...]``, ``m.__dict__[...]``, ``sys.modules[...]``)."""
    return (isinstance(value, ast.Call) and _reflective(value.func)) or (
        isinstance(value, ast.Attribute) and value.attr == "__dict__") or _sys_modules(value)


def _sys_modules(node: ast.expr) -> bool:
    """``sys.modules`` (a table of every module of the process, the grader's among them)."""
    return isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def _looks_up(n: ast.AST) -> bool:
    """Whether ``n`` looks a name up reflectively: ``getattr(m, ...)``, ``vars(m)[...]``, ``sys.modules[...]``,
    ``sys.modules.get(...)``."""
    if isinstance(n, ast.Call):
        return _reflective(n.func) or (isinstance(n.func, ast.Attribute) and _sys_modules(n.func.value)
                                        and n.func.attr in ("get", "pop", "setdefault", "__getitem__"))
    return isinstance(n, ast.Subscript) and _reflective_value(n.value)


def _fold(node: ast.AST, unit: _Unit, ctx: _Context, depth: int = 0) -> str | None:
    """The string ``node`` evaluates to when it is built from constants (``'a' + 'b'``, ``''.join([...])``,
    f-strings, a global bound once to such a string); else ``None``."""
    if depth > 20:
        return None
    _check_budget(ctx.deadline)
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left, unit, ctx, depth + 1), _fold(node.right, unit, ctx, depth + 1)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        pieces = []
        for v in node.values:
            piece = _fold(v.value if isinstance(v, ast.FormattedValue) else v, unit, ctx, depth + 1)
            if piece is None:
                return None
            pieces.append(piece)
        return "".join(pieces)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep = _fold(node.func.value, unit, ctx, depth + 1)
        items = [_fold(e, unit, ctx, depth + 1) for e in node.args[0].elts]
        return sep.join(items) if sep is not None and None not in items else None
    if isinstance(node, ast.Name) and node.id in ctx.consts and unit.is_global(node.id):
        return _fold(ctx.consts[node.id], unit, ctx, depth + 1)
    return None


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


PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)
MAX_REPAIRS = 50  # parses of the joined code; past that, one statement at a time


def _parse(code: str | Sequence[str]) -> list[ast.Module]:
    """The student's code as the harness runs it: magics transformed, a cell that does not parse skipped.

    ``code``: the cells' sources in notebook order, or (older callers) all of them joined in one string;
    then a statement that does not parse is skipped alone, with the lines indented under it.
    """
    if isinstance(code, str):
        return _parse_joined(code)
    trees = []
    for cell in code:
        try:
            trees.append(ast.parse(strip_magics(str(cell))))
        except PARSE_ERRORS:
            continue
    return trees


def _starts_statement(line: str) -> bool:
    """Whether ``line`` starts a top-level statement (as far as one line tells)."""
    return bool(line) and not line[0].isspace() and not line.startswith("#") and not line.startswith(
        ("else", "elif", "except", "finally", "case ", ")", "]", "}"))


def _parse_joined(code: str) -> list[ast.Module]:
    try:
        code = strip_magics(code)
    except Exception:  # noqa: BLE001 - IPython's transformer choked: parse what is there
        pass
    lines = ["" if "\0" in line else line for line in code.split("\n")]
    for _ in range(MAX_REPAIRS):
        try:
            return [ast.parse("\n".join(lines))]
        except SyntaxError as e:
            bad = min(max((e.lineno or len(lines)) - 1, 0), len(lines) - 1)
        except PARSE_ERRORS:
            break
        # Blank the statement the error is in (line numbers stay) and try again.
        start = next((i for i in range(bad, -1, -1) if _starts_statement(lines[i])), bad)
        end = next((i for i in range(bad + 1, len(lines)) if _starts_statement(lines[i])), len(lines))
        if not any(lines[start:end]):
            break  # nothing left to blank there: parse what can be parsed
        for i in range(start, end):
            lines[i] = ""
    # Too broken to repair one error at a time: parse each top-level statement alone.
    trees, chunk = [], []
    for line in lines + ["pass"]:
        if _starts_statement(line) and chunk:
            try:
                trees.append(ast.parse("\n".join(chunk)))
            except PARSE_ERRORS:
                pass
            chunk = []
        chunk.append(line)
    return trees


def _context(units: list[_Unit], modules: set[str], exports: Mapping[str, set[str]] | None = None) -> _Context:
    ctx = _Context(modules=modules)
    binders: dict[str, list[_Unit]] = {}
    declared_global: set[str] = set()
    for u in units:
        for name in u.bound:
            binders.setdefault(name, []).append(u)
        ctx.globals_bound |= u.bound
        for n in ast.walk(u.stmt):
            if isinstance(n, ast.Global):
                declared_global.update(n.names)
            elif isinstance(n, ast.Import):
                ctx.module_names.update(a.asname or a.name for a in n.names if a.name in modules)
            elif isinstance(n, ast.ImportFrom) and (n.module or "") in modules and any(a.name == "*" for a in n.names):
                ctx.globals_bound |= set((exports or {}).get(n.module or "", ()))  # a star import of the student's own
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name):
                ctx.attr_stores.add((n.value.id, n.attr))
    # A global is a student's class (or an instance of one) only when nothing else ever binds it.
    for name, us in binders.items():
        if name not in declared_global and all(isinstance(u.stmt, ast.ClassDef) for u in us):
            ctx.class_methods[name] = set().union(*(_class_names(u.stmt) for u in us))
    for name, us in binders.items():
        if name in declared_global or name in ctx.class_methods:
            continue
        value = _single_assignment(us, name)
        if value is None:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ctx.class_methods:
            ctx.instances[name] = ctx.class_methods[value.func.id]
        elif isinstance(value, ast.Call) and _reflective(value.func) and value.args and isinstance(
                value.args[0], ast.Constant) and value.args[0].value in modules:
            ctx.module_names.add(name)  # _m = importlib.import_module("my_softmax"): the student's own module
        elif isinstance(value, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)):
            ctx.consts[name] = value
    return ctx


def _single_assignment(units: list[_Unit], name: str) -> ast.expr | None:
    """The value of ``name = <value>`` when that is the only statement binding ``name``."""
    if len(units) != 1 or not isinstance(units[0].stmt, ast.Assign):
        return None
    stmt = units[0].stmt
    if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == name:
        return stmt.value
    return None


def _class_names(cls: ast.ClassDef) -> set[str]:
    """The names a class body defines (methods, class attributes) and the ``self.<name>`` its methods assign."""
    names: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, DEFS):
            names.add(stmt.name)
        else:
            names |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
    return names


def _written_modules(code: str | Sequence[str]) -> dict[str, set[str]]:
    """The modules the notebook writes itself with ``%%writefile NAME.py`` (their code is scanned as a cell), with
    the global names each defines (an import of the module reads them, so their taint flows to its importer)."""
    found: dict[str, set[str]] = {}
    for cell in [] if isinstance(code, str) else code:
        magic = cell_magic(str(cell))
        if magic and magic[0] in ("writefile", "file"):
            name = (magic[1].split() or [""])[-1].strip("'\"")
            if name.endswith(".py") and "/" not in name:
                try:
                    body = ast.parse(magic[2]).body
                except PARSE_ERRORS:
                    body = []
                found.setdefault(name[:-3], set()).update(*(_bound_names(stmt) for stmt in _units(body)))
    return found


MAX_SCAN_CHARS = 1_000_000  # characters of student code the scan reads at most
SCAN_SECONDS = 20.0  # the scan's time budget per notebook
MAX_CHAIN_SHOWN = 4  # helpers named in a "calls a, which calls b, ..." sentence


class ScanLimit(Exception):
    """The student's code is too large, or too costly, to scan within the limits; the message says which."""


def _check_budget(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise ScanLimit(f"the authorship scan of this notebook took more than its budget of {SCAN_SECONDS:.0f} s "
                        "(an unusually long chain of definitions); it cannot be graded as it is")


def _chain_sentence(name: str, hops: Mapping[str, str], offence: Mapping[str, str]) -> str:
    """``calls a, which calls b, which <offence>`` from ``name`` along ``hops``, long chains shortened."""
    chain, at = [], name
    while at in hops:
        at = hops[at]
        chain.append(at)
    shown = chain if len(chain) <= MAX_CHAIN_SHOWN else chain[:MAX_CHAIN_SHOWN - 1] + [
        f"{len(chain) - MAX_CHAIN_SHOWN} more helpers, then {chain[-1]}"]
    return "".join(f"calls {n}, which " for n in shown) + offence[at]


def bound_names(code: str | Sequence[str]) -> set[str]:
    """The global names ``code`` (cells) binds: the setup cells' names, which a bare name may read."""
    return {name for tree in _parse(code) for stmt in _units(tree.body) for name in _bound_names(stmt)}


def delegations(code: str | Sequence[str], parts: Iterable[str],
                extra: Mapping[str, Mapping[str, str]] | None = None, budget_s: float | None = None,
                provided: Iterable[str] = (), assignment: str = "", setup: Sequence[str] = ()) -> dict[str, str]:
    """Map each part that earns nothing to a sentence saying why: it reaches something outside its vocabulary
    (:mod:`attnkit.vocabulary`: the rule the exercise prints), or the notebook reaches into the grader's process.

    ``code``: the student's cells in notebook order (a list of sources), or all of them joined in
    one string; ``assignment``: whose vocabularies (:data:`attnkit.vocabulary.VOCABULARIES`); ``extra``: per part,
    more names outside (``{"softmax": {"softmax": "torch's softmax"}}``), added to its vocabulary's words;
    ``setup``: the course's own cells (their imports and names resolve the student's), ``provided``: names they bind.
    Bounded: more than ``MAX_SCAN_CHARS`` of code, or more than ``budget_s`` seconds
    (``SCAN_SECONDS`` by default), raises :class:`ScanLimit`; the work is linear in the code's size.
    """
    size = len(code) if isinstance(code, str) else sum(len(str(c)) for c in code)
    if size > MAX_SCAN_CHARS:
        raise ScanLimit(f"the notebook's code is {size} characters long, more than the grader reads "
                        f"({MAX_SCAN_CHARS}); it cannot be graded as it is")
    deadline = time.monotonic() + (SCAN_SECONDS if budget_s is None else budget_s)
    extra = extra or {}
    parts = list(parts)
    trees = _parse(code)
    units = []
    for tree in trees:
        _check_budget(deadline)
        units += [_Unit(stmt) for stmt in _units(tree.body)]
    exports = _written_modules(code)
    ctx = _context(units, set(exports), exports)
    ctx.globals_bound |= set(provided)
    ctx.deadline = deadline
    found: dict[str, str] = {}
    # Code that reaches into the grader's process costs the parts that reach it; at module level it runs before
    # any part is called, whoever calls it: every part is answered in a process it may have changed.
    for unit in units:  # importing the student's own module reads what it defines
        n = unit.stmt
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for m in [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]:
                unit.reads |= exports.get(m, set())
    defs: dict[str, tuple[list[str], set[str]]] = {}
    for unit in units:
        _check_budget(deadline)
        off = _offences(unit, ctx)
        for name in unit.bound:
            old = defs.get(name, ([], set()))
            defs[name] = (old[0] + off, old[1] | (unit.reads - {name}))
    callers: dict[str, list[str]] = {}
    for name in sorted(defs):
        for ref in sorted(defs[name][1]):
            callers.setdefault(ref, []).append(name)
    tampers = {n: d[0][0] for n, d in defs.items() if d[0]}
    hops: dict[str, str] = {}
    todo = collections.deque(sorted(tampers))  # and the helpers that call them, as far as they go
    while todo:
        _check_budget(deadline)
        at = todo.popleft()
        for caller in callers.get(at, ()):
            if caller not in tampers and caller not in hops:
                hops[caller] = at
                todo.append(caller)
    for p in parts:
        if p not in found and (p in tampers or p in hops):
            found[p] = f"{p} {_chain_sentence(p, hops, tampers)}"
    tamper = next((f"the notebook at module level {off}" for unit in units if not unit.is_def
                   for off in _offences(unit, ctx)), None) or next(
        (f"the notebook at module level calls {name}, which {_chain_sentence(name, hops, tampers)}"
         for unit in units if not unit.is_def for name in sorted(unit.reads) if name in tampers or name in hops), None)
    if tamper:
        found.update({p: f"{p} earns nothing: {tamper}" for p in parts if p not in found})
    _check_budget(deadline)
    for p, why in _vocabulary_findings(code, trees, [p for p in parts], assignment, extra, setup).items():
        found.setdefault(p, why)
    return {p: found[p] for p in parts if p in found}


def _vocabulary_findings(code: str | Sequence[str], trees: list[ast.Module], parts: list[str], assignment: str,
                         extra: Mapping[str, Mapping[str, str]], setup: Sequence[str]) -> dict[str, str]:
    """Each part's first call outside its vocabulary, as a sentence (:func:`attnkit.vocabulary.outside`)."""
    from dataclasses import replace

    from attnkit.vocabulary import outside, vocabulary

    modules: dict[str, str] = {}
    cells: list[str] = []
    if isinstance(code, str):
        cells = [ast.unparse(t) for t in trees]  # repaired statement by statement, as the scan reads it
    else:
        for cell in code:
            magic = cell_magic(str(cell))
            if magic and magic[0] in ("writefile", "file"):
                name = (magic[1].split() or [""])[-1].strip("'\"")
                if name.endswith(".py") and "/" not in name:
                    modules[name[:-3]] = modules.get(name[:-3], "") + magic[2] + "\n"
                continue
            try:
                cells.append(strip_magics(str(cell)))
            except Exception:  # noqa: BLE001 - IPython's transformer choked: the cell is read as it is
                cells.append(str(cell))
    table = {}
    for p in parts:
        if extra.get(p):
            v = vocabulary(assignment, p)
            table[p] = replace(v, words=v.words + tuple(squash(name) for name in extra[p]),
                               topic=v.topic if v.words else f"`{p}` is yours to write here")
    found = outside(cells, parts, assignment, setup=setup, modules=modules, table=table)
    return {p: f"{p} " + found[p][0].sentence().removeprefix(f"{p} ") for p in found}
