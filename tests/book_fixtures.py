"""Fixtures shared by the book tests: build the book once per session, serve it, drive Chromium.

Loaded as a plugin (``pytest_plugins = ["book_fixtures"]`` in test_book.py and
test_browser.py) so that the session fixtures exist once: ``make test`` builds the
book a single time, into the same ``_build/`` as ``make book``, so the execution
cache (``_build/.jupyter_cache``) makes an unchanged rebuild fast.
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
HTML = BUILD / "html"
SCREENSHOTS = BUILD / "screenshots"
BUILD_TIMEOUT_S = 1500  # chapter 07 trains a model; the whole of `make test` must stay under ~20 min
CHROMIUM = Path(os.environ.get("ATTN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL|SEVERE): ")
_REPORT = re.compile(r"traceback saved in:? (\S+)")


def toc_docnames() -> list[str]:
    """Every page of the book, in _toc.yml order (globs expanded), as Sphinx docnames."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                names.append(str(Path(entry["file"]).with_suffix("")))
            if "glob" in entry:
                found = {p.with_suffix("") for p in ROOT.glob(entry["glob"])
                         if p.suffix in {".md", ".ipynb"} and ".ipynb_checkpoints" not in p.parts}
                names.extend(sorted(str(p.relative_to(ROOT)) for p in found))
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return names


def chapter_docnames() -> list[str]:
    return [d for d in toc_docnames() if d.startswith("book/") and (ROOT / f"{d}.ipynb").exists()]


def exercise_docnames() -> list[str]:
    return [d for d in toc_docnames() if d.startswith("exercises/")]


def executed_notebook(docname: str):
    """The chapter as the build last executed it (from the jupyter-cache), or None if it never ran."""
    import nbformat
    from jupyter_cache import get_cache

    source = nbformat.read(ROOT / f"{docname}.ipynb", as_version=4)
    try:
        _, executed = get_cache(BUILD / ".jupyter_cache").merge_match_into_notebook(source)
    except KeyError:  # no cached execution matches the current code cells
        return None
    return executed


@dataclass
class BookBuild:
    """The outcome of one `jupyter-book build`: exit code, Sphinx problems, where the HTML is."""

    returncode: int
    log: str = field(repr=False)
    seconds: float
    html: Path = HTML
    problems: list[str] = field(default_factory=list)
    execution_reports: dict[str, str] = field(default_factory=dict)

    def describe(self, limit: int = 40) -> str:
        lines = [f"jupyter-book build exited {self.returncode} after {self.seconds:.0f} s "
                 f"(full log: {BUILD / 'book-build.log'})"]
        lines += [f"  {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more")
        for path, text in self.execution_reports.items():
            lines.append(f"--- execution report {path} (last lines) ---")
            lines.extend(text.strip().splitlines()[-25:])
        if self.returncode and not self.problems:
            lines.append("--- end of the build log ---")
            lines.extend(self.log.strip().splitlines()[-30:])
        return "\n".join(lines)


def _jupyter_book() -> str:
    local = Path(sys.executable).with_name("jupyter-book")
    found = str(local) if local.exists() else shutil.which("jupyter-book")
    if not found:
        pytest.fail("jupyter-book is not installed: run `make install` (it is in requirements.txt)")
    return found


@pytest.fixture(scope="session")
def book_build() -> BookBuild:
    """Build the book exactly as `make book` does (warnings are errors, cached execution)."""
    BUILD.mkdir(exist_ok=True)
    with open(BUILD / ".book-build.lock", "w") as lock:  # another `make test` in this checkout waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        start = time.monotonic()
        # As `make book`: --all re-reads every page (fast: executions come from the cache),
        # so warnings of unchanged pages are reported again and no page is stale.
        cmd = [_jupyter_book(), "build", str(ROOT), "--all", "--warningiserror", "--keep-going"]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"building the book took more than {BUILD_TIMEOUT_S} s: {exc}")
        seconds = time.monotonic() - start
    log = _ANSI.sub("", proc.stdout + proc.stderr)
    (BUILD / "book-build.log").write_text(log)
    problems = [line.strip() for line in log.splitlines() if _PROBLEM.search(line)]
    reports = {}
    for path in _REPORT.findall(log):
        p = Path(path)
        if p.exists():
            reports[path] = _ANSI.sub("", p.read_text(errors="replace"))
    return BookBuild(proc.returncode, log, seconds, problems=problems, execution_reports=reports)


@pytest.fixture(scope="session")
def built_html(book_build: BookBuild) -> Path:
    """The built HTML, even when the build had warnings (they fail test_book, not the browser checks)."""
    if not (book_build.html / "index.html").exists():
        pytest.fail("the book produced no HTML:\n" + book_build.describe())
    return book_build.html


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output readable
        pass


# The server and the browser live only while test_browser.py runs: later tests fork
# worker processes (the grader), and a fork should not inherit their threads.
@pytest.fixture(scope="module")
def book_url(built_html: Path) -> Iterator[str]:
    """Serve _build/html on a free localhost port."""
    handler = functools.partial(_QuietHandler, directory=str(built_html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright (the Playwright-downloaded browsers are never used)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: run `make install` (it is in requirements.txt)")
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not found at {CHROMIUM}: `make test` installs the Debian package "
                    "`chromium` when run as root (apt-get install -y chromium); set ATTN_CHROMIUM "
                    "to use another Chromium binary")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()
