"""The package's map (``autograder/__init__.py``'s docstring) is the code's: every module has a row,
imports only the package modules its row allows, and appears in ``autograder/README.md`` too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import autograder

PACKAGE = Path(autograder.__file__).parent
MODULES = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
MODULES |= {f"checks.{p.stem}" if p.stem != "__init__" else "checks": p for p in (PACKAGE / "checks").glob("*.py")}
CHAPTER = re.compile(r"checks\.ch(\d\d)_\w+")


def table() -> dict[str, str]:
    """Module (or pattern) -> its "may import" column, continuation lines joined."""
    rows: dict[str, str] = {}
    current = None
    for line in (autograder.__doc__ or "").splitlines():
        if not line.startswith((" ", "``")):  # a border, a header, a blank line or prose
            current = None
            continue
        if name := re.match(r"``([\w.*]+)``\s", line):
            current = name.group(1)
            rows[current] = ""
        if current is not None and len(line) > 80:
            rows[current] += " " + line[80:]
    return rows


def row_for(module: str, rows: dict[str, str]) -> str:
    if module in rows:
        return rows[module]
    chapter = CHAPTER.fullmatch(module)
    assert chapter and "checks.chNN_*" in rows, f"{module} has no row in autograder/__init__.py's map"
    return rows["checks.chNN_*"]


def allowed(module: str, column: str) -> set[str]:
    names = set(re.findall(r"``([\w.]+)``", column))
    if "earlier ``checks.chNN_*``" in column and (chapter := CHAPTER.fullmatch(module)):
        names |= {m for m in MODULES if (c := CHAPTER.fullmatch(m)) and c.group(1) < chapter.group(1)}
    return names


def package_imports(path: Path) -> set[str]:
    """The modules of this package a file imports, by the names of the map (``checks.mistakes``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autograder":
            base = node.module.removeprefix("autograder").lstrip(".")
            for alias in node.names:  # `from autograder.checks import mistakes` imports a module
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if sub in MODULES else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                if name.startswith("autograder."):
                    found.add(name.removeprefix("autograder."))
                elif name in MODULES and (PACKAGE / f"{name}.py").exists():  # the sandbox's flat copy
                    found.add(name)
    found.discard("")
    return found


def test_every_module_imports_only_what_its_row_allows():
    rows = table()
    assert {"cli", "batch", "judge", "harness", "sandbox", "checks"} <= set(rows), sorted(rows)
    wrong = {}
    for module, path in sorted(MODULES.items()):
        extra = package_imports(path) - allowed(module, row_for(module, rows)) - {module}
        if extra:
            wrong[module] = sorted(extra)
    assert not wrong, f"imports the map does not allow (fix the code or the map): {wrong}"


def test_the_readme_names_every_module():
    readme = (PACKAGE / "README.md").read_text()
    missing = [m for m in MODULES if not CHAPTER.fullmatch(m) and f"{m.replace('.', '/')}.py" not in readme
               and m != "checks"]
    assert not missing, f"autograder/README.md does not say where these live: {missing}"


def test_the_map_catches_a_forbidden_import(tmp_path):
    # The check itself can fail: a results module importing batch is caught.
    bad = tmp_path / "results.py"
    bad.write_text("from autograder.batch import grade_job\nfrom autograder import judge\n")
    assert package_imports(bad) - allowed("results", table()["results"]) == {"batch"}
