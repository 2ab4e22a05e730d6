"""The grader's folders are its trust boundary, and the code keeps to them.

``autograder.IMPORTS`` says what each folder (``in_sandbox``, ``isolation``, ``judging``, ``records``)
and each top-level module may import of the package; every module is listed in its folder's
``__init__`` docstring and named in ``autograder/README.md``; what is copied into the sandbox imports
nothing but its siblings, the standard library, numpy and torch.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import autograder

PACKAGE = Path(autograder.__file__).parent
FOLDERS = ("in_sandbox", "isolation", "judging", "records")
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def component(path: Path) -> str:
    """The folder or top-level module a file belongs to (``judging`` for ``judging/checks/ch01_x.py``)."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def package_imports(path: Path) -> set[str]:
    """The components of this package a file imports (``records`` for ``from autograder.records import x``)."""
    found: set[str] = set()
    flat = {p.stem for p in (PACKAGE / "in_sandbox").glob("*.py")} - {"__init__"}
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] if node.module != "autograder" else [f"autograder.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "autograder" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] in flat and component(path) == "in_sandbox":  # the sandbox's flat copies
                found.add("in_sandbox")
    return found


def test_every_folder_and_module_has_a_rule():
    assert set(FOLDERS) <= set(autograder.IMPORTS)
    missing = {component(p) for p in MODULES if p.name != "__init__.py" or p.parent != PACKAGE} - set(autograder.IMPORTS)
    assert not missing, f"no rule in autograder.IMPORTS for: {sorted(missing)}"


def test_every_module_imports_only_what_its_folder_allows():
    wrong = {}
    for path in MODULES:
        if path == PACKAGE / "__init__.py":
            continue
        extra = package_imports(path) - autograder.IMPORTS[component(path)]
        if extra:
            wrong[str(path.relative_to(PACKAGE))] = sorted(extra)
    assert not wrong, f"imports across the boundary (fix the code or autograder.IMPORTS): {wrong}"


def test_what_runs_in_the_sandbox_imports_only_stdlib_numpy_and_torch():
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "IPython", "__future__"}
    allowed |= {p.stem for p in (PACKAGE / "in_sandbox").glob("*.py")}
    wrong = {}
    for path in (PACKAGE / "in_sandbox").glob("*.py"):
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                tops.add(node.module.split(".")[0])
        tops -= allowed | {"autograder"}  # autograder.in_sandbox itself, checked above
        if tops:
            wrong[path.name] = sorted(tops)
    assert not wrong, wrong


def test_each_folder_lists_its_files_and_the_readme_names_every_module():
    readme = (PACKAGE / "README.md").read_text()
    unlisted, unnamed = [], []
    for path in MODULES:
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue
        folder = PACKAGE / rel.parts[0] if len(rel.parts) > 1 else PACKAGE
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        stem = ".".join(rel.with_suffix("").parts[1:] if len(rel.parts) > 1 else rel.with_suffix("").parts)
        stem = stem.removesuffix(".__init__")
        chapter = stem.startswith("checks.ch")
        if f"``{stem}``" not in doc and not (chapter and "``checks.chNN_*``" in doc) and stem != "__init__":
            unlisted.append(str(rel))
        if not chapter and path.name != "__init__.py" and str(rel) not in readme:
            unnamed.append(str(rel))
    assert not unlisted, f"not listed in their folder's __init__ docstring: {unlisted}"
    assert not unnamed, f"autograder/README.md does not say where these live: {unnamed}"


def test_the_rule_catches_an_import_across_the_boundary(tmp_path):
    # The check itself can fail: a records module importing the judge is caught.
    bad = tmp_path / "records" / "results.py"
    bad.parent.mkdir()
    bad.write_text("from autograder.judging.judge import grade_notebook\nfrom autograder import batch\n")
    assert package_imports(bad) - autograder.IMPORTS["records"] == {"judging", "batch"}
