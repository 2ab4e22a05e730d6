"""requirements.txt installs from the public registry alone, on each Python the course supports.

A dry run of ``pip install -r requirements.txt`` against PyPI and nothing else: no pip configuration
(``PIP_CONFIG_FILE`` set to the null device, so neither /etc/xdg/pip's cap on torch nor a local
find-links or index is read), no ``PIP_*`` variable that names packages or places, no cache, binary
wheels only, for a manylinux x86_64 machine. It is what a new reader's ``pip install`` resolves on a
fresh Linux machine, where ``torch==2.13.0`` is the CUDA build that pins its own Triton; this
machine's CPU wheel of torch (whose metadata asks for no Triton) is never seen.

Each Python version runs in a real interpreter of that version where one is found (pip then
evaluates every environment marker for it); otherwise in this one with ``--python-version``, and the
markers of requirements.txt are evaluated for the target version first, since pip evaluates them for
the Python it runs in. Without a registry (CI is offline) every case skips, saying why.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
INDEX = "https://pypi.org/simple"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# a fresh Linux x86_64 machine: every manylinux tag a glibc 2.28 system takes, and plain linux wheels
PLATFORMS = ([f"manylinux_2_{x}_x86_64" for x in range(28, 4, -1)]
             + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])
# the pip variables kept: how to reach the registry, never which packages or where else to look
KEPT_PIP_VARIABLES = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_DEFAULT_TIMEOUT", "PIP_TIMEOUT"}
# the Triton releases chapter 10 and tests/test_flash_triton.py were run on (interpreter); the
# requirement must admit no release outside them but patch releases of these
TRITONS_CHECKED = ("3.7.1", "3.8.0", "3.9.0")


def _requirements() -> list[str]:
    return (ROOT / "requirements.txt").read_text().splitlines()


def _triton_specifier() -> SpecifierSet:
    for line in _requirements():
        text = line.split("#")[0].strip()
        if text.startswith("triton"):
            return Requirement(text).specifier
    raise AssertionError("requirements.txt has no triton line")


def _registry_unreachable() -> str | None:
    try:
        with urllib.request.urlopen(f"{INDEX}/pip/", timeout=15) as response:
            response.read(1)
    except Exception as e:  # offline, a proxy that refuses, DNS: all mean no registry here
        return f"no registry answers ({INDEX}: {type(e).__name__}: {e}); the resolution needs the public index"
    return None


def _interpreter(version: str) -> str | None:
    """A Python of exactly ``version`` with a pip that writes --report (>= 22.2), or None."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"), reverse=True)
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    probe = "import sys, pip; print('%d.%d' % sys.version_info[:2], pip.__version__)"
    for path in filter(None, candidates):
        try:
            out = subprocess.run([path, "-c", probe], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        fields = out.stdout.split()
        if out.returncode == 0 and len(fields) == 2 and fields[0] == version:
            if Version(re.match(r"[0-9.]+", fields[1]).group().rstrip(".")) >= Version("22.2"):
                return path
    return None


def _for_python(version: str, dest: Path) -> Path:
    """requirements.txt with its markers evaluated for Linux x86_64 and Python ``version``."""
    env = {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    kept = []
    for line in _requirements():
        text = line.split("#")[0].strip() if not line.lstrip().startswith("-") else line.strip()
        if not text:
            continue
        if ";" in text and not text.startswith("-"):
            requirement, marker = text.split(";", 1)
            if not Marker(marker.strip()).evaluate(env):
                continue
            text = requirement.strip()
        kept.append(text)
    dest.write_text("\n".join(kept) + "\n")
    return dest


def _pip_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in KEPT_PIP_VARIABLES}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def test_triton_requirement_admits_the_checked_releases_only():
    """Offline: the Triton line admits PyPI's torch==2.13.0 pin (3.7.1) and 3.9, and nothing untried."""
    spec = _triton_specifier()
    for version in TRITONS_CHECKED:
        assert spec.contains(version), f"requirements.txt's triton{spec} refuses {version}, which chapter 10 runs on"
    for version in ("3.6.0", "3.7.0", "3.10.0", "4.0.0"):
        assert not spec.contains(version), f"requirements.txt's triton{spec} admits {version}, never tried"


def test_triton_requirement_admits_the_installed_triton():
    pytest.importorskip("triton")
    from importlib.metadata import version

    assert _triton_specifier().contains(version("triton")), (
        f"the Triton installed here ({version('triton')}) is outside requirements.txt's triton{_triton_specifier()}")


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """Every Python's dry run, started at once (the time is mostly waiting on the registry)."""
    why = _registry_unreachable()
    if why:
        pytest.skip(why)
    running = {}
    for python in PYTHONS:
        work = tmp_path_factory.mktemp(f"resolve-{python}")
        interpreter = _interpreter(python)
        command = [interpreter or sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-cache-dir",
                   "--index-url", INDEX, "--only-binary=:all:", "--target", str(work / "target"),
                   "--report", str(work / "report.json")]
        command += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
        if interpreter:
            command += ["-r", str(ROOT / "requirements.txt")]
        else:
            command += ["--python-version", python, "-r", str(_for_python(python, work / "requirements.txt"))]
        log = open(work / "pip.log", "w+")
        running[python] = (subprocess.Popen(command, cwd=ROOT, env=_pip_environment(), stdout=log,
                                            stderr=subprocess.STDOUT, text=True), log, work)
    done = {}
    for python, (process, log, work) in running.items():
        try:
            returncode = process.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        log.seek(0)
        done[python] = (returncode, log.read(), work / "report.json")
        log.close()
    return done


@pytest.mark.parametrize("python", PYTHONS)
def test_requirements_resolve_from_pypi_alone(resolutions, python):
    returncode, log, report = resolutions[python]
    if returncode != 0 and re.search(r"NewConnectionError|ConnectTimeout|ReadTimeout|Temporary failure in name "
                                     r"resolution|Max retries exceeded|SSLError", log):
        pytest.skip(f"the registry stopped answering during the resolution: {log.strip()[-300:]}")
    assert returncode == 0, f"pip cannot install requirements.txt on Python {python} from {INDEX}:\n{log[-3000:]}"

    chosen = {item["metadata"]["name"].lower(): item["metadata"]
              for item in json.loads(report.read_text())["install"]}
    assert chosen["torch"]["version"] == "2.13.0"
    triton = chosen.get("triton")
    assert triton is not None, "no Triton in the resolution: chapter 10 would have no kernel compiler"
    assert _triton_specifier().contains(triton["version"])
    # the Triton torch's own wheel pins (the CUDA build does) is the one resolved
    pins = [Requirement(r) for r in chosen["torch"].get("requires_dist", []) if r.startswith("triton")]
    for pin in pins:
        assert pin.specifier.contains(triton["version"]), (pin, triton["version"])
    assert any(Version(triton["version"]).release[:2] == Version(v).release[:2] for v in TRITONS_CHECKED)
