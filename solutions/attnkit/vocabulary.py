"""What each graded part of an exercise may call: its vocabulary, one table for the text, the tests and the grader.

"Write it yourself" is a rule a student can read. Each part of an exercise (a function or class the student
writes) has a :class:`Vocabulary`: the student's own code; Python's builtins, ``math`` and the other standard
modules of :data:`PYTHON_MODULES`; numpy; and torch's tensor modules (:data:`TORCH_MODULES`) with tensor
methods, **except** any name that contains one of the part's ``words`` (case and underscores ignored) or is one
of its ``names``. Torch's attention (``attention``, ``transformer``, ``scaled_dot_product``) is outside every
part; a part whose topic is the softmax adds ``softmax``, ``softmin``, ``logsumexp``, ... Nothing else is
inside: another library (``triton`` where the chapter does not teach it, ``scipy``), another torch module
(``torch.distributions``, ``torch.onnx``, ``torch.nn.attention``, ``torch._refs``, ``torch.ops``), the
reference package ``attnkit``, and any call whose target the code does not name (``eval``, ``exec``,
``__import__``, ``getattr`` with a name computed at run time, ``globals()``, ``vars()``, ``__dict__``, a
name that only a star import could have brought).

The same table is used three times:

* the exercise's text prints it (:func:`describe`, written into the source notebook by
  ``python -m tools.vocabulary`` and checked by ``tests/test_vocabulary.py``);
* a visible test calls :func:`check_vocabulary`, so a student learns, with the call and its line named,
  before submitting, that a routine is outside;
* the grader (``autograder/judging/judge.py``) calls :func:`outside` on the submitted notebook, and bans at
  run time the operators that do the part's topic (:meth:`Vocabulary.runtime_words`).

:func:`outside` reads what a part reaches: the part's own definition, the helpers and module-level names it
reads (and theirs), the methods of a class that its entry points call (``__init__``, ``forward``, dunders,
the reference class's methods; an unused debugging method is not read), and the modules the notebook writes
with ``%%writefile``. Receivers are resolved: ``self.x``, a local or global instance of the student's own
class, ``torch``, ``F``, ``nn``, a name imported from torch. A method called on any other value is a
tensor method, judged by its name.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Torch's modules a part may use (their public names, minus the part's words and names); and their
# submodules (``torch.nn.modules.linear``, ``torch.autograd.function``), except torch's own top-level ones.
TORCH_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.parameter",
                 "torch.nn.modules", "torch.linalg", "torch.special", "torch.fft", "torch.autograd",
                 "torch.jit", "torch.cuda", "torch.backends", "torch.testing", "torch.amp", "torch.random",
                 "torch.types")
# Python's standard library computes nothing of a part's topic; these of its modules reach a name or an object
# computed at run time (imports by name, frames, the object graph, code objects, unpickling), so they are outside.
REFLECTIVE_MODULES = ("importlib", "ctypes", "_ctypes", "inspect", "gc", "pickle", "_pickle", "marshal", "copyreg",
                      "shelve", "code", "codeop", "runpy", "pkgutil", "zipimport", "builtins", "dill")
PYTHON_MODULES = tuple(sorted(set(getattr(sys, "stdlib_module_names", ())) - set(REFLECTIVE_MODULES)) + ["numpy"]) \
    if hasattr(sys, "stdlib_module_names") else ("math", "cmath", "functools", "itertools", "collections",
                                                 "dataclasses", "typing", "numbers", "enum", "abc", "copy", "warnings",
                                                 "contextlib", "operator", "string", "random", "time", "statistics",
                                                 "__future__", "sys", "os", "numpy")
# Builtins (and functions) that reach a name computed at run time: outside every part, except ``getattr``,
# ``hasattr``, ``setattr`` and ``delattr`` with a constant name (read as the attribute), or on the student's own
# object.
REFLECTION = {"eval", "exec", "compile", "__import__", "globals", "vars", "locals", "breakpoint"}
PATH_REFLECTION = {"methodcaller", "attrgetter", "import_module", "__getattribute__", "__dict__", "__builtins__",
                   "__globals__", "__closure__", "__code__", "__subclasses__", "__mro__", "__bases__"}
ATTRIBUTE_BUILTINS = {"getattr", "hasattr", "setattr", "delattr"}

ATTENTION_WORDS = ("attention", "transformer", "scaleddotproduct")
SOFTMAX_WORDS = ("softmax", "softmin", "logsumexp", "logcumsumexp", "crossentropy")
CONTRACTION_NAMES = ("matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv", "dot", "vdot",
                     "inner", "outer", "ger", "einsum", "tensordot", "linear", "bilinear", "chain_matmul",
                     "multi_dot", "kron", "__matmul__", "__rmatmul__", "__imatmul__")


# What each run-time class of operators is, as the exercise's text says it (the grader's operator sets:
# autograder/in_sandbox/torch_names.py, CLASSES).
RUNTIME_CLASSES = {"contraction": "every matrix product of torch, however it is reached (`torch.mm`, `mv`, `dot`, "
                                  "`inner`, `outer`, `matmul`, `@`, `einsum`, `tensordot`, `kron`, `F.linear`, "
                                  "`F.bilinear`, the convolutions, `cdist`, a weighted `embedding_bag`, ...)"}


def squash(name: str) -> str:
    """``name`` lower-cased without underscores: the form in which names are compared with words."""
    return name.lower().replace("_", "")


@dataclass(frozen=True)
class Vocabulary:
    """What one part may call besides its own code: see the module's docstring.

    ``words``: a name that contains one of them (squashed) is outside, on top of torch's attention;
    ``names``: exact names outside (a setup helper the part must not call, the matrix products of chapter 10);
    ``operators``: Python operators outside (``"@"``); ``modules``: torch's modules inside (``libraries``: others
    inside, such as ``triton.language``); ``topic``: what the part computes itself, for the messages;
    ``runtime_classes``: classes of torch's operators its process refuses at run time, by what they compute
    (``"contraction"``: every matrix product, however reached; see :data:`RUNTIME_CLASSES`)."""

    topic: str = "attention is yours to write"
    words: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    modules: tuple[str, ...] = TORCH_MODULES
    libraries: tuple[str, ...] = PYTHON_MODULES
    outside_libraries: tuple[str, ...] = field(default=("triton", "torch.onnx"))
    # torch's operators outside every part, by dispatcher namespace: ONNX's attention and rotary embedding
    outside_namespaces: tuple[str, ...] = ("onnx",)
    runtime_classes: tuple[str, ...] = ()

    @property
    def all_words(self) -> tuple[str, ...]:
        return ATTENTION_WORDS + self.words

    def word_in(self, name: str) -> str | None:
        """The word of this vocabulary that ``name`` contains, if any."""
        low = squash(name)
        return next((w for w in self.all_words if w in low), None)

    def module_inside(self, module: str) -> bool:
        """Whether the names of ``module`` (a dotted path) may be used (before the words are applied)."""
        if any(module == lib or module.startswith(lib + ".") for lib in self.outside_libraries):
            return False
        if module in self.modules or module in self.libraries:
            return True
        root = module.split(".")[0]
        if root == "torch":  # a submodule of an allowed torch module, not of torch itself
            return any(module.startswith(m + ".") for m in self.modules if m != "torch")
        return any(module.startswith(lib + ".") for lib in self.libraries)

    def why(self, name: str) -> str | None:
        """Why ``name`` (one segment of a path, or a method) is outside, if it is."""
        w = self.word_in(name)
        if w in ATTENTION_WORDS:
            return f"torch's own attention is outside every part (names with *{w}* are outside)"
        if w:
            return f"{self.topic} (names with *{w}* are outside)"
        if name in self.names:
            return f"{self.topic} (`{name}` is outside)"
        return None

    def runtime_words(self) -> tuple[str, ...]:
        """What the grader refuses at run time for this part: the aten operators whose names contain these words
        (the part's topic done by torch's kernels, however reached), ``class:NAME`` for its classes of operators
        (refused by what they compute), ``import:LIB`` for the libraries outside (refused when the process imports
        them; torch's own modules are not refused as imports, since torch imports them itself, but their operators
        are: ``namespace:onnx``)."""
        return tuple(sorted(set(self.words))) + tuple(f"class:{c}" for c in self.runtime_classes) + tuple(
            f"import:{lib}" for lib in self.outside_libraries if lib.split(".")[0] != "torch") + tuple(
            f"namespace:{ns}" for ns in self.outside_namespaces)


BASE = Vocabulary()
SOFTMAX = Vocabulary(topic="the softmax is yours to write here", words=SOFTMAX_WORDS)

# The table: assignment -> part -> vocabulary. A part not listed has BASE.
VOCABULARIES: dict[str, dict[str, Vocabulary]] = {
    "01_single_head": {"softmax": SOFTMAX},
    "08_efficient_attention": {
        "online_softmax_update": Vocabulary(topic="the online softmax is yours to write here",
                                            words=SOFTMAX_WORDS),
        "tiled_attention": Vocabulary(topic="the tiled loop is yours to write (one block of keys at a "
                                      "time, through your online_softmax_update)", words=SOFTMAX_WORDS,
                                      names=("attention",)),
    },
    "06_positional_encoding": {"apply_rotary_embedding": Vocabulary(topic="the rotation is yours to write here",
                                                            words=("rotary",))},
    "10_flash_triton": {
        "flash_forward_kernel": Vocabulary(topic="the kernel's online softmax is yours to write",
                                           words=SOFTMAX_WORDS, runtime_classes=("contraction",),
                                           libraries=PYTHON_MODULES + ("triton", "triton.language"),
                                           outside_libraries=("torch.onnx",)),
        "flash_attention_forward": Vocabulary(topic="the wrapper launches your kernel, which does "
                                              "the arithmetic: no softmax or matrix product here", words=SOFTMAX_WORDS,
                                              names=CONTRACTION_NAMES, operators=("@",),
                                              runtime_classes=("contraction",),
                                              libraries=PYTHON_MODULES + ("triton",),
                                              outside_libraries=("torch.onnx",)),
    },
}


def vocabulary(assignment: str, part: str) -> Vocabulary:
    """The vocabulary of ``part`` in ``assignment`` (BASE unless the table says otherwise)."""
    return VOCABULARIES.get(assignment, {}).get(part, BASE)


# -- what the exercise's text says ---------------------------------------------------------------------------------

def describe(assignment: str, parts: Iterable[str]) -> str:
    """The exercise's text for the vocabularies of ``parts`` (markdown): written into the notebook."""
    lines = ["Each part is yours to write. It may call your own functions and classes, Python's builtins, `math` "
             "and numpy, and torch: `torch`, `torch.nn`, `torch.nn.functional`, `torch.linalg`, `torch.special`, "
             "`torch.fft`, `torch.autograd` and tensor methods, except torch's own attention (any name with "
             "*attention*, *transformer* or *scaled_dot_product* in it). Outside every part: the course's `attnkit`, "
             "other libraries (`scipy`, `triton`, ...), torch's other modules (`torch.distributions`, `torch.onnx`, "
             "`torch.nn.attention`, `torch.ops`, `torch._refs`, ...), and calls whose target the code does not name "
             "(`eval`, `exec`, `__import__`, `getattr` with a name computed at run time, `globals()`, a name from a "
             "star import)."]
    special = [(p, vocabulary(assignment, p)) for p in parts if vocabulary(assignment, p) != BASE]
    if special:
        lines += ["", "Some parts leave out more, because computing it is the exercise:", ""]
    for part, v in special:
        out = []
        if v.words:
            out.append("any name containing " + ", ".join(f"*{w}*" for w in v.words))
        if v.names:
            out.append(", ".join(f"`{n}`" for n in v.names))
        if v.operators:
            out.append("the operator " + ", ".join(f"`{o}`" for o in v.operators))
        libs = [lib for lib in v.libraries if lib not in PYTHON_MODULES]
        extra = f" It may also use `{'`, `'.join(libs)}`." if libs else ""
        runtime = "".join(f" At run time its process refuses {RUNTIME_CLASSES[c]}." for c in v.runtime_classes)
        lines.append(f"* `{part}`: {v.topic}, so these are outside too: {'; '.join(out)}.{extra}{runtime}")
    lines += ["", "The first visible test of each part checks this (`check_vocabulary`); the grader enforces the same "
              "rule, and a part that calls something outside earns no points. At run time the grader's process "
              "also refuses torch's kernels for a part's topic however they are reached (a distribution built from "
              "logits computes a softmax) and does not import a library outside."]
    return "\n".join(lines).strip() + "\n"


# -- reading the code -----------------------------------------------------------------------------------------------

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try))
ENTRY_METHODS = {"__init__", "forward", "__call__"}
MAX_CHAIN_SHOWN = 4  # helpers named in a "calls a, which calls b, ..." sentence


@dataclass
class Finding:
    """One thing a part reaches that is outside its vocabulary."""

    part: str
    line: int
    what: str
    why: str
    chain: tuple[str, ...] = ()  # the helpers through which the part reaches it

    def sentence(self) -> str:
        at = f" (line {self.line} of its cell)" if self.line else ""
        shown = list(self.chain) if len(self.chain) <= MAX_CHAIN_SHOWN else list(self.chain[:MAX_CHAIN_SHOWN - 1]) + [
            f"{len(self.chain) - MAX_CHAIN_SHOWN} more helpers, then {self.chain[-1]}"]
        via = "".join(f"calls {c}, which " for c in shown)
        return f"{self.part} {via}uses {self.what}{at}, which is outside its vocabulary: {self.why}"


@dataclass
class _Unit:
    """A module-level statement, or a definition nested in a compound one."""

    stmt: ast.stmt
    module: str | None = None  # the %%writefile module it belongs to, None for the notebook


def module_units(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The module's statements, and the definitions nested in its compound statements (``if``, ``try``, ...): what a
    notebook's cell binds at module level (the grader's tampering scan reads the same units)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, COMPOUND):
            for block in ("body", "orelse", "finalbody"):
                yield from (u for u in module_units(getattr(stmt, block, [])) if isinstance(u, DEFS))
            for handler in getattr(stmt, "handlers", []):
                yield from (u for u in module_units(handler.body) if isinstance(u, DEFS))


def _bound(stmt: ast.stmt) -> set[str]:
    """Global names a module-level statement binds (a compound one: apart from the definitions in it)."""
    if isinstance(stmt, DEFS):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"}
    return {n.id for n in _shallow(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _shallow(node: ast.AST) -> Iterable[ast.AST]:
    """``ast.walk`` without the bodies of definitions nested in ``node`` (their own units)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if n is not node and isinstance(n, DEFS):
            todo.extend(n.decorator_list)
            if isinstance(n, ast.ClassDef):
                todo.extend(n.bases)
            continue
        todo.extend(ast.iter_child_nodes(n))


def _locals(fn: ast.AST) -> set[str]:
    """Names a function binds itself (parameters, assignments, imports, nested definitions), minus ``global``."""
    local: set[str] = set()
    declared: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            local.add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, DEFS) and n is not fn:
            local.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            local.add(n.name)
        elif isinstance(n, ast.Global):
            declared.update(n.names)
    return local - declared


def _const(node: ast.AST | None) -> str | None:
    """The string ``node`` evaluates to when it is built from constants only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const(node.left), _const(node.right)
        return a + b if a is not None and b is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_const(v) for v in node.values]
        return "".join(parts) if None not in parts else None  # type: ignore[arg-type]
    return None


def _class_members(cls: ast.ClassDef) -> set[str]:
    names = {s.name for s in cls.body if isinstance(s, DEFS)}
    for s in cls.body:
        if not isinstance(s, DEFS):
            names |= {n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
    return names


def _member_types(scope: ast.AST, classes: Mapping[str, ast.ClassDef], receiver: str | None = None) -> dict[str, str]:
    """Names (``receiver.<name>`` when ``receiver`` is given, else plain locals) bound only to instances of one of the
    student's classes: ``h = Helper()``, ``self.core = Core()``."""
    found: dict[str, set[str]] = {}
    for n in ast.walk(scope):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                if receiver is None and isinstance(t, ast.Name):
                    key = t.id
                elif receiver and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == receiver:
                    key = t.attr
                else:
                    continue
                v = n.value
                kind = v.func.id if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in classes else ""
                found.setdefault(key, set()).add(kind)
    return {k: next(iter(v)) for k, v in found.items() if len(v) == 1 and "" not in v}


class _Reader:
    """The notebook (setup and student cells, the student's modules), read once; :meth:`part` judges one part."""

    def __init__(self, cells: Sequence[str], setup: Sequence[str], modules: Mapping[str, str], latest: bool) -> None:
        self.units: list[_Unit] = []
        self.setup_names: dict[str, str | None] = {}  # name -> module path when the setup imports it, else None
        for src in setup:
            tree = _parse(src)
            for stmt in tree.body if tree else []:
                for a in getattr(stmt, "names", []) if isinstance(stmt, (ast.Import, ast.ImportFrom)) else []:
                    if a.name == "*":
                        continue
                    if isinstance(stmt, ast.Import):
                        self.setup_names[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    else:
                        self.setup_names[a.asname or a.name] = f"{stmt.module}.{a.name}"
                for name in _bound(stmt):
                    self.setup_names.setdefault(name, None)
        self.modules = dict(modules)
        for name, src in self.modules.items():
            tree = _parse(src)
            self.units += [_Unit(s, name) for s in module_units(tree.body)] if tree else []
        for src in cells:
            tree = _parse(src)
            self.units += [_Unit(s) for s in module_units(tree.body)] if tree else []
        self.binders: dict[tuple[str | None, str], list[_Unit]] = {}
        for u in self.units:
            for name in _bound(u.stmt):
                self.binders.setdefault((u.module, name), []).append(u)
        if latest:  # the student's kernel history: only the newest definition of each name counts
            self.binders = {k: v[-1:] for k, v in self.binders.items()}
        self.own_stars: dict[str | None, list[str]] = {}  # module -> the student's modules it star-imports
        for u in self.units:
            if isinstance(u.stmt, ast.ImportFrom) and (u.stmt.module or "") in self.modules and any(
                    a.name == "*" for a in u.stmt.names):
                self.own_stars.setdefault(u.module, []).append(u.stmt.module or "")
        self.stars = [u for u in self.units if isinstance(u.stmt, ast.ImportFrom) and any(a.name == "*" for a in u.stmt.names)
                      and (u.stmt.module or "") not in self.modules]
        self.classes = {name: us[0].stmt for (mod, name), us in self.binders.items()
                        if mod is None and all(isinstance(u.stmt, ast.ClassDef) for u in us)}
        self.instances = {}
        for (mod, name), us in self.binders.items():
            if mod is None and len(us) == 1 and isinstance(us[0].stmt, ast.Assign):
                t = _member_types(us[0].stmt, self.classes)
                if name in t:
                    self.instances[name] = t[name]

    def part(self, part: str, v: Vocabulary, parts: Iterable[str], entries: Iterable[str] = ()) -> list[Finding]:
        others = set(parts) - {part}
        found: list[Finding] = []
        seen: set[int] = set()
        todo: list[tuple[ast.AST, _Unit, str | None]] = []  # (node to read, its unit, the class it is a method of)

        state = {"chain": ()}  # the helpers through which the unit being read was reached

        def visit_name(module: str | None, name: str) -> bool:
            """Queue the units binding ``name``; whether any did."""
            units = self.binders.get((module, name), [])
            chain = state["chain"] + ((name,) if name != part and name not in state["chain"][-1:] else ())
            for u in units:
                if id(u.stmt) in seen:
                    continue
                seen.add(id(u.stmt))
                if isinstance(u.stmt, ast.ClassDef):  # the part's class: from its entry points; a helper: whole
                    self._queue_class(u, todo, seen, entries if name == part else None, chain)
                else:
                    todo.append((u.stmt, u, None, chain))
            return bool(units)

        if not visit_name(None, part):
            return []
        while todo:
            node, unit, cls, state["chain"] = todo.pop(0)
            for f in self._read(node, unit, cls, part, v, others, visit_name, todo, seen, state["chain"]):
                f.chain = state["chain"]
                found.append(f)
        unique: dict[int, Finding] = {}
        for f in found:
            unique.setdefault(f.line, f)
        return list(unique.values())

    def _queue_class(self, u: _Unit, todo: list, seen: set[int], entries: Iterable[str] | None,
                     chain: tuple = ()) -> None:
        cls = u.stmt
        assert isinstance(cls, ast.ClassDef)
        for expr in cls.bases + cls.decorator_list + [k.value for k in cls.keywords]:
            todo.append((expr, u, None, chain))
        methods = {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for s in cls.body:
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                todo.append((s, u, cls.name, chain))  # class attributes, nested classes
        wanted = list(methods) if entries is None else [
            m for m in methods if m in ENTRY_METHODS or m in set(entries) or (m.startswith("__") and m.endswith("__"))
            or any(isinstance(d, ast.Name) and d.id == "property" for d in methods[m].decorator_list)]
        called = set(wanted)
        queue = list(wanted)
        while queue:  # methods reached from the entry points through self.<m> / cls.<m> / ClassName.<m>
            m = queue.pop()
            fn = methods[m]
            seen.add(id(fn))
            todo.append((fn, u, cls.name, chain))
            for n in ast.walk(fn):
                if isinstance(n, ast.Attribute) and n.attr in methods and n.attr not in called and isinstance(n.value, ast.Name) \
                        and n.value.id in ("self", "cls", cls.name):
                    called.add(n.attr)
                    queue.append(n.attr)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ATTRIBUTE_BUILTINS \
                        and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "self":
                    name = _const(n.args[1]) if len(n.args) > 1 else None
                    if name in methods and name not in called:
                        called.add(name)
                        queue.append(name)

    # -- one unit ----------------------------------------------------------------------------------------------------

    def _read(self, node: ast.AST, unit: _Unit, cls: str | None, part: str, v: Vocabulary, others: set[str],
              visit_name, todo: list, seen: set[int], chain: tuple = ()) -> list[Finding]:
        found: list[Finding] = []
        local = _locals(node)  # for a module-level statement: its lambdas' and comprehensions' names, and its own
        for n in ast.walk(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and n is not node:
                local |= _locals(n)  # nested functions read the same way
        local_types = _member_types(node, self.classes)
        self_types = _member_types(self.classes[cls], self.classes, "self") if cls in self.classes else {}

        def add(n: ast.AST, what: str, why: str) -> None:
            found.append(Finding(part, getattr(n, "lineno", 0), what, why))

        def resolve(expr: ast.AST) -> tuple[str, str] | None:
            """What an expression names: ('module', path) / ('torch', qualified name) / ('own', '') /
            ('class', name) (an instance or the class of the student's) / ('value', '') / None (unresolved)."""
            if isinstance(expr, ast.Name):
                name = expr.id
                if name in ("self", "cls") and cls:
                    return ("class", cls)
                if name in local:
                    return ("class", local_types[name]) if name in local_types else ("value", "")
                return self._global(name, unit, visit_name, others)
            if isinstance(expr, ast.Attribute):
                base = resolve(expr.value)
                if base is None:
                    return None
                kind, path = base
                if kind in ("module", "torch"):
                    return ("torch", f"{path}.{expr.attr}")
                if kind == "class":
                    if path == cls and expr.value.__class__ is ast.Name and expr.attr in self_types:
                        return ("class", self_types[expr.attr])
                    return ("own", "") if path in self.classes and expr.attr in _class_members(self.classes[path]) \
                        else ("value", "")
                if kind == "student-module":
                    visit_name(path, expr.attr)
                    return ("own", "")
                return ("value", "")
            if isinstance(expr, ast.Call):
                f = resolve(expr.func)
                if f and f[0] == "class" and isinstance(expr.func, ast.Name) and expr.func.id in self.classes:
                    return ("class", expr.func.id)
                if f and f[0] == "torch":
                    return ("value", "")
                return ("value", "")
            return ("value", "")

        def judge_path(n: ast.AST, path: str) -> None:
            """A name reached through a module: inside when its module is, and no segment has a word or a name."""
            import importlib

            segments = path.split(".")
            if segments[:2] == ["sys", "modules"]:
                return add(n, f"`{path}`", "it reaches a module by a name computed at run time")
            if segments[0] == "torch" and len(segments) > 1 and (segments[1] in ("ops", "library") or (
                    segments[1].startswith("_") and not segments[1].startswith("__"))):
                return add(n, f"`{path}`", f"`torch.{segments[1]}` is torch's machinery, not one of the modules this "
                           "part may use")
            for i, seg in enumerate(segments):
                if seg in PATH_REFLECTION:
                    return add(n, f"`{path}`", "it reaches a name computed at run time")
                why = v.why(seg) if i else None
                if why:
                    return add(n, f"`{path}`", why)
            # the longest prefix that is a module decides
            module = segments[0]
            for i in range(1, len(segments) + 1):
                candidate = ".".join(segments[:i])
                try:
                    obj = importlib.import_module(candidate) if i == 1 or _is_module(candidate) else None
                except Exception:  # noqa: BLE001 - not importable: judged by its prefix
                    obj = None
                if obj is not None:
                    module = candidate
            if not v.module_inside(module):
                add(n, f"`{path}`", f"`{module}` is not one of the modules this part may use")

        skip: set[int] = set()  # nodes already judged (importlib.import_module("the_students_own_module"))
        called = {id(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
        for n in _shallow(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ast.walk(node):
            if isinstance(n, ast.ClassDef) and n is not node:
                continue
            if isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ast.MatMult) and "@" in v.operators:
                add(n, "the operator `@`", f"{v.topic} (`@` is outside)")
            elif isinstance(n, (ast.Import, ast.ImportFrom)):  # in a function, or the part's (or a helper's) binding
                for a in n.names:
                    mod = a.name if isinstance(n, ast.Import) else (n.module or "")
                    if n.__class__ is ast.ImportFrom and n.level:
                        continue
                    if mod.split(".")[0] in self.modules:
                        continue
                    if isinstance(n, ast.ImportFrom):
                        if a.name == "*":
                            add(n, f"`from {mod} import *`", "a star import hides what is called")
                        else:
                            judge_path(n, f"{mod}.{a.name}")
                    else:
                        judge_path(n, mod)
            elif isinstance(n, ast.Call) and self._imports_own_module(n):
                skip.update(id(x) for x in ast.walk(n.func))
            elif isinstance(n, ast.Call):
                fname = n.func.id if isinstance(n.func, ast.Name) else n.func.attr if isinstance(n.func, ast.Attribute) else ""
                target = resolve(n.func) if isinstance(n.func, ast.Name) else None
                builtin = isinstance(n.func, ast.Name) and target == ("builtin", fname)
                if builtin and fname in REFLECTION:
                    add(n, f"`{fname}()`", "it reaches a name computed at run time")
                elif builtin and fname in ATTRIBUTE_BUILTINS and n.args:
                    name = _const(n.args[1]) if len(n.args) > 1 else None
                    recv = resolve(n.args[0])
                    if name is None:
                        if not recv or recv[0] not in ("class", "own"):
                            add(n, f"`{fname}()` with a name computed at run time", "the grader cannot tell what it calls")
                    elif recv and recv[0] in ("module", "torch"):
                        judge_path(n, f"{recv[1]}.{name}")
                    elif not (recv and recv[0] in ("class", "own")):
                        self._method(n, name, v, add)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and id(n) not in skip:
                if n.attr in ("__dict__", "__getattribute__"):
                    add(n, f"`{n.attr}`", "it reaches a name computed at run time")
                    continue
                if isinstance(n.value, ast.Name) and n.value.id == "sys" and n.attr == "modules":
                    add(n, "`sys.modules`", "it reaches a module by a name computed at run time")
                    continue
                base = resolve(n.value)
                if base is None:
                    add(n, f"`{ast.unparse(n)}`", "it comes from a star import, whose names the code does not show")
                elif base[0] in ("module", "torch"):
                    judge_path(n, f"{base[1]}.{n.attr}")
                elif base[0] == "class":
                    if not self._visit_method(base[1], n.attr, todo, seen, chain) and \
                            n.attr not in self._members(base[1]):
                        self._method(n, n.attr, v, add)  # inherited from torch (nn.Module, Tensor)
                elif base[0] == "value":
                    self._method(n, n.attr, v, add)
                elif base[0] == "student-module":
                    visit_name(base[1], n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local and id(n) not in skip \
                    and not (cls and n.id in ("self", "cls")):
                target = self._global(n.id, unit, visit_name, others)
                if target == ("builtin", n.id) and (n.id in REFLECTION or n.id in ATTRIBUTE_BUILTINS) \
                        and id(n) not in called:
                    add(n, f"`{n.id}` passed as a value", "what it reaches is computed at run time")
                    continue
                if n.id == "__builtins__":
                    add(n, "`__builtins__`", "it reaches a name computed at run time")
                    continue
                if target is None:
                    add(n, f"`{n.id}`", "it comes from a star import, whose names the code does not show")
                elif target[0] == "module" and target[1].split(".")[0] not in self.modules:
                    judge_path(n, target[1]) if "." in target[1] or not v.module_inside(target[1]) else None
                elif target[0] == "torch":
                    judge_path(n, target[1])
                elif target[0] == "setup" and n.id in v.names:
                    add(n, f"the exercise's own `{n.id}`", f"{v.topic} (`{n.id}` is outside)")
        return found

    def _imports_own_module(self, call: ast.Call) -> bool:
        """``importlib.import_module("m")`` (or ``__import__("m")``) of a module the notebook wrote itself."""
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in ("import_module", "__import__") and bool(call.args) and _const(call.args[0]) in self.modules

    def _bases(self, cls: str) -> list[str]:
        """``cls`` and the student's classes it derives from, nearest first."""
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if c in self.classes and c not in out:
                out.append(c)
                todo += [b.id for b in self.classes[c].bases if isinstance(b, ast.Name)]
        return out

    def _members(self, cls: str) -> set[str]:
        return set().union(*(_class_members(self.classes[c]) for c in self._bases(cls)))

    def _visit_method(self, cls: str, method: str, todo: list, seen: set[int], chain: tuple = ()) -> bool:
        """Queue ``cls.method`` (a method of the student's class, or of a student base class, reached through an
        instance or the class); whether the student's classes define it."""
        for c in self._bases(cls):
            for s in self.classes[c].body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == method:
                    if id(s) not in seen:
                        seen.add(id(s))
                        todo.append((s, self.binders[(None, c)][0], c, chain if c in chain else chain + (c,)))
                    return True
        return False

    def _method(self, n: ast.AST, name: str, v: Vocabulary, add) -> None:
        """``<value>.name``: a tensor (or module, or array) method, outside when its name is."""
        why = v.why(name) if name in _value_attrs() else None
        if why:
            add(n, f"the method `.{name}`", why)

    def _global(self, name: str, unit: _Unit, visit_name, others: set[str], depth: int = 0) -> tuple[str, str] | None:
        """What a global (or builtin) name is, queueing the student's units that bind it. A name bound several
        ways resolves to the one the rule must judge first: a torch path, then a star import's, then a value."""
        module = unit.module
        units = self.binders.get((module, name), [])
        if not units:
            for star in self.own_stars.get(module, []):  # ``from my_module import *``: the student's own names
                if (star, name) in self.binders:
                    visit_name(star, name)
                    return ("own", "")
            if module is not None:
                return self._global(name, _Unit(unit.stmt, None), visit_name, others, depth)
            if name in self.setup_names:
                path = self.setup_names[name]
                if path is not None:
                    return ("module", path) if _is_module(path) else ("torch", path)
                return ("setup", name)
            if hasattr(builtins, name):
                return ("builtin", name)
            if _is_module(name):
                return ("module", name)  # a module's name no cell imports (the setup's, or NameError at run time)
            return None if self.stars else ("value", "")
        if name in others and module is None:
            return ("own", "")  # another part: judged by its own vocabulary
        for star in self.own_stars.get(module, []):  # the name may be the module's until a later cell rebinds it
            if (star, name) in self.binders:
                visit_name(star, name)
        found: list[tuple[str, str] | None] = []
        queue = False
        for u in units:
            st = u.stmt
            if isinstance(st, (ast.Import, ast.ImportFrom)):
                for a in st.names:
                    if (a.asname or a.name).split(".")[0] != name:
                        continue
                    if isinstance(st, ast.Import):
                        mod = a.name if a.asname else a.name.split(".")[0]
                        found.append(("student-module", mod) if mod in self.modules else ("module", mod))
                    elif (st.module or "") in self.modules:
                        visit_name(st.module, a.name)
                        found.append(("own", ""))
                    else:
                        found.append(("torch", f"{st.module}.{a.name}") if not st.level else ("own", ""))
            elif isinstance(st, ast.ClassDef):
                queue = True
                found.append(("class", name) if name in self.classes else ("own", ""))
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                queue = True
                found.append(("own", ""))
            else:
                queue = True
                value = st.value if isinstance(st, (ast.Assign, ast.AnnAssign)) else None
                reads_itself = any(isinstance(x, ast.Name) and x.id == name and isinstance(x.ctx, ast.Load)
                                   for x in ast.walk(st))
                if reads_itself and self.stars:
                    found.append(None)  # ``Categorical = Categorical`` after a star import: the import's value
                elif isinstance(value, ast.Call) and self._imports_own_module(value):
                    found.append(("student-module", _const(value.args[0]) or ""))
                elif name in self.instances:
                    found.append(("class", self.instances[name]))
                elif isinstance(value, (ast.Name, ast.Attribute)) and depth < 8:
                    found.append(self._alias(value, u, visit_name, others, depth + 1))  # ``F = torch.nn.functional``
                else:
                    found.append(("value", ""))
        if queue:
            visit_name(module, name)
        for kind in ("torch", "module", None, "value", "student-module", "class", "own"):
            for f in found:
                if (f is None and kind is None) or (f is not None and f[0] == kind):
                    return f
        return ("value", "")

    def _alias(self, expr: ast.AST, unit: _Unit, visit_name, others: set[str], depth: int) -> tuple[str, str] | None:
        """What a module-level ``name = <expr>`` makes ``name``, when ``expr`` is a name or an attribute path."""
        if isinstance(expr, ast.Name):
            return self._global(expr.id, unit, visit_name, others, depth)
        if isinstance(expr, ast.Attribute):
            base = self._alias(expr.value, unit, visit_name, others, depth)
            if base is not None and base[0] in ("module", "torch"):
                return ("torch", f"{base[1]}.{expr.attr}")
            if base is not None and base[0] == "student-module":
                visit_name(base[1], expr.attr)
                return ("own", "")
            return base if base is None else ("value", "")
        return ("value", "")


_VALUE_ATTRS: set[str] = set()


def _value_attrs() -> set[str]:
    """Names of the methods and attributes of a tensor, a module and an array: what a method call on a value is."""
    if not _VALUE_ATTRS:
        import numpy
        import torch

        _VALUE_ATTRS.update(dir(torch.Tensor), dir(torch.nn.Module), dir(numpy.ndarray))
    return _VALUE_ATTRS


def _is_module(path: str) -> bool:
    import importlib.util
    import sys

    if path in sys.modules:
        return True
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _parse(src: str) -> ast.Module | None:
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def outside(cells: Sequence[str], parts: Iterable[str], assignment: str, *, setup: Sequence[str] = (),
            modules: Mapping[str, str] | None = None, entries: Mapping[str, Iterable[str]] | None = None,
            latest: bool = False, table: Mapping[str, Vocabulary] | None = None) -> dict[str, list[Finding]]:
    """For each part, what it reaches that is outside its vocabulary (empty lists left out).

    ``cells``: the student's code, cell by cell, as plain Python (magics already turned into Python);
    ``setup``: the exercise's own cells (their names are the course's); ``modules``: the modules the notebook
    writes (``%%writefile NAME.py``: name -> source), the student's own; ``entries``: per class part, the methods
    the grader may call besides ``__init__``, ``forward`` and dunders; ``latest``: only the newest definition of
    each name counts (a live notebook's history); ``table``: part -> vocabulary, instead of the assignment's."""
    parts = list(parts)
    reader = _Reader(cells, setup, modules or {}, latest)
    out = {}
    for part in parts:
        v = table[part] if table is not None and part in table else vocabulary(assignment, part)
        found = reader.part(part, v, parts, (entries or {}).get(part, _reference_methods(part)))
        if found:
            out[part] = sorted(found, key=lambda f: f.line)
    return out


def _reference_methods(part: str) -> set[str]:
    """The methods of attnkit's class of the same name (the ones the grader may call), if there is one."""
    import attnkit

    ref = getattr(attnkit, part, None)
    if not inspect.isclass(ref):
        return set()
    return {name for klass in ref.__mro__ if klass.__module__.startswith("attnkit") for name in vars(klass)
            if callable(vars(klass)[name])}


# -- the visible test ------------------------------------------------------------------------------------------------

_MAGIC = re.compile(r"get_ipython\(\)\.run_cell_magic\(\s*'(?:writefile|file)',\s*'(?:-a\s+)?([\w.]+)\.py'")


def check_vocabulary(assignment: str, part: str, namespace: Mapping[str, object] | None = None) -> None:
    """The visible test: raise ``AssertionError`` naming each call of ``part`` outside its vocabulary.

    ``namespace``: the notebook's ``globals()``; its ``In`` (IPython's history of the cells run) is read, the
    newest definition of each name counting. Outside IPython, the sources of the namespace's functions and
    classes are read instead."""
    namespace = namespace if namespace is not None else {}
    history = namespace.get("In")
    cells: list[str] = []
    modules: dict[str, str] = {}
    if isinstance(history, list) and history:
        for src in history:
            if not isinstance(src, str):
                continue
            m = _MAGIC.search(src)
            if m:
                try:
                    call = ast.parse(src).body[0].value  # type: ignore[attr-defined]
                    modules[m.group(1)] = _const(call.args[2]) or ""
                except (SyntaxError, AttributeError, IndexError):
                    pass
                continue
            cells.append(src)
    else:
        for value in namespace.values():
            if inspect.isfunction(value) or inspect.isclass(value):
                try:
                    cells.append(inspect.getsource(value))
                except (OSError, TypeError):
                    pass
    found = outside(cells, [part], assignment, modules=modules, latest=True).get(part, [])
    if found:
        raise AssertionError("\n".join(f.sentence() for f in found) + "\nSee 'What your code may call' at the top "
                             "of the exercise.")
    print(f"{part}: every call is inside its vocabulary")
