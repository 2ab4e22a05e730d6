"""The package the chapters' install cell names provides every attnkit name each chapter uses.

On Colab the first cell of a chapter runs ``pip install "attnkit @ git+URL@TAG#subdirectory=solutions"``
(tools/install_cell.py, from _config.yml). That installs a *built* package, not this editable
checkout: a module left out of the build, or a name a chapter imports that the package lacks,
breaks the page for every reader and for no test that imports the editable package. So the wheel
is built here from this checkout, as pip builds it from the tag (offline: no build isolation, no
index), unpacked into a folder of its own, and every ``attnkit`` name of every chapter of
_toc.yml is resolved against it, in a fresh interpreter. The tag itself must exist when the book
is published: README.md ("Cutting the release") says how, and this checks that the tag the
cell pins is the package's version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tools import chapters

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"

RESOLVE = textwrap.dedent("""
    import importlib, json, sys
    site, wanted = sys.argv[1], json.loads(sys.argv[2])
    import attnkit
    assert attnkit.__file__.startswith(site), f"attnkit came from {attnkit.__file__}, not the built package"
    missing = []
    for chapter, module, name in wanted:
        try:
            mod = importlib.import_module(module)
            if name is not None and not hasattr(mod, name):
                importlib.import_module(f"{module}.{name}")  # `from attnkit import plotting`: a submodule
        except ImportError as err:
            missing.append(f"{chapter}: {module}" + (f".{name}" if name else "") + f" ({err})")
    print(json.dumps({"missing": missing, "version": attnkit.__version__}))
""")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """attnkit's wheel, built from a copy of solutions/ (pyproject.toml and the package) as pip would."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "solutions"
    src.mkdir()
    shutil.copy(SOLUTIONS / "pyproject.toml", src)
    shutil.copytree(SOLUTIONS / "attnkit", src / "attnkit", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", str(src), "-w", str(tmp / "dist")], check=True)
    (built,) = (tmp / "dist").glob("attnkit-*.whl")
    return built


def test_the_wheel_holds_every_module_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"attnkit/{p.relative_to(SOLUTIONS / 'attnkit').as_posix()}" for p in (SOLUTIONS / "attnkit").rglob("*.py")
            if "__pycache__" not in p.parts}
    assert want <= names, f"left out of the built package: {sorted(want - names)}"


def test_every_attnkit_name_a_chapter_uses_resolves_in_the_built_package(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    wanted = sorted({(path.stem, module, name) for path in chapters.toc_chapters()
                     for module, name in chapters.attnkit_imports(chapters.script(path))},
                    key=lambda t: (t[0], t[1], t[2] or ""))
    assert len({c for c, _, _ in wanted}) == len(chapters.toc_chapters()), "a chapter that uses no attnkit name?"
    proc = subprocess.run([sys.executable, "-c", RESOLVE, str(site), json.dumps(wanted)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert not result["missing"], "the installed package lacks: " + "; ".join(result["missing"])


def test_the_pinned_release_is_the_package_version():
    """The install cell pins ``course.release``; the tag to cut is ``v`` + the version pip will build."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    version = tomllib.loads((SOLUTIONS / "pyproject.toml").read_text())["project"]["version"]
    init = (SOLUTIONS / "attnkit" / "__init__.py").read_text()
    assert re.search(rf'^__version__ = "{re.escape(version)}"$', init, re.M), "attnkit.__version__ != pyproject's"
    assert config["course"]["release"] == f"v{version}", (
        f"_config.yml pins {config['course']['release']} but solutions/pyproject.toml builds {version}: "
        "bump both, run `python -m tools.install_cell`, and cut the tag (README.md, 'Cutting the release')")
    from tools.install_cell import install_cell_source
    assert "#subdirectory=solutions" in install_cell_source() and (SOLUTIONS / "pyproject.toml").is_file()


def test_readme_says_how_to_cut_the_release():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Cutting the release", 1)
    assert len(section) == 2, "README.md has no 'Cutting the release' section"
    assert "git tag -a v" in section[1] and "git push origin v" in section[1]
