"""The formgrader round trip in a real browser: an instructor grades a written answer by hand in nbgrader's
formgrader (served on loopback with a token, Chromium through Playwright), the grader runs again and with
``--regrade``, and the manual score and comment are still there and shown in the student's feedback.

And students' text is inert: mallory's written answer and a markdown cell she added carry a <script>, an
<img onerror>, javascript: links and an <iframe srcdoc>; formgrader's page of her submission and her feedback
page are opened in the browser, links clicked, and no script may run, no handler fire, no dialog open."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autograder import batch, course
from test_grader_records import A, AUTO, LIMITS, ON_TIME, WRITTEN, read_csv, submit

pytestmark = pytest.mark.slow
NB = "single_head.ipynb"
# Each payload would set window.__pwned and the page title if it ran.
PAYLOAD = "\n\n".join([
    '<script>window.__pwned = 1; document.title = "pwned"</script>',
    '<img src="x" onerror="window.__pwned = 2; document.title = \'pwned\'">',
    "[click me](javascript:window.__pwned=3;document.title='pwned')",
    '<a href="javascript:window.__pwned=4;document.title=\'pwned\'">or me</a>',
    '<iframe srcdoc="<script>parent.__pwned = 5; parent.document.title = \'pwned\'</script>"></iframe>',
    "The scores grow with d_k.",
])
LINK_NAME = "[Read my notes](javascript:alert(document.domain)).ipynb"
CHROMIUM = Path(os.environ.get("ATTN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def course_root(tmp_path_factory):
    """A course root with its own nbgrader_config.py (the course's, with this root), graded once."""
    root = tmp_path_factory.mktemp("course")
    with pytest.MonkeyPatch.context() as mp:
        shutil.copytree(course.SOURCE / A, root / "source" / A)
        mp.setattr(course, "SOURCE", root / "source")
        shutil.copytree(course.RELEASE / A, root / "release" / A)  # current: tests/test_exercises_sync.py
        mp.setattr(course, "RELEASE", root / "release")
        (root / "nbgrader_config.py").write_text(
            "c = get_config()  # noqa: F821\n"
            f"load_subconfig({str(course.ROOT / 'autograder' / 'nbgrader_config.py')!r})  # noqa: F821\n"
            f"c.CourseDirectory.root = {str(root)!r}\n"
            f"c.CourseDirectory.source_directory = {str(root / 'source')!r}\n"
            f"c.CourseDirectory.release_directory = {str(root / 'release')!r}\n"
            f"c.CourseDirectory.db_url = 'sqlite:///{root / 'grading' / 'gradebook.db'}'\n")
        submit(root / "grading" / "submitted", "alice", written="The scores grow with d_k.", timestamp=ON_TIME)
        nb_path = submit(root / "grading" / "submitted", "mallory", written=PAYLOAD, timestamp=ON_TIME) / NB
        nb = json.loads(nb_path.read_text())
        nb["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": "My notes\n\n" + PAYLOAD})
        nb_path.write_text(json.dumps(nb))
        # a lone notebook under a name that is a markdown link with a script target (issue 29): graded in place of
        # single_head.ipynb, and its name quoted in the autograded notebook's note, which formgrader renders
        notes = submit(root / "grading" / "submitted", "notes", written="The scores grow with d_k.", timestamp=ON_TIME)
        (notes / NB).rename(notes / LINK_NAME)
        out, work = root / "grading" / "grades.csv", root / "grading"
        grade = lambda **kw: batch.run(work / "submitted", A, out, work, LIMITS, workers=1, log=print, **kw)  # noqa: E731
        grade()
        yield {"root": root, "work": work, "out": out, "grade": grade}


@pytest.fixture(scope="module")
def formgrader(course_root):
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "JUPYTER_CONFIG_DIR": str(course_root["root"] / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(course_root["root"] / ".runtime")}
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={course_root['root']}",
           '--ServerApp.jpserver_extensions={"nbgrader.server_extensions.formgrader": True}']
    if os.geteuid() == 0:  # containers run the tests as root
        cmd.append("--allow-root")
    log = open(course_root["root"] / "formgrader.log", "w")
    proc = subprocess.Popen(cmd, cwd=course_root["root"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"formgrader did not start:\n{(course_root['root'] / 'formgrader.log').read_text()[-3000:]}")
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("formgrader did not start in 120 s")
    yield {"base": base, "token": token}
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (it is in requirements.txt)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; or set ATTN_CHROMIUM)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def gradebook(work: Path):
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{work / 'gradebook.db'}")


def wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_manual_grade_set_in_formgrader_survives_the_grader(course_root, formgrader, browser):
    work = course_root["work"]
    with gradebook(work) as gb:
        notebook_id = gb.find_submission_notebook("single_head", A, "alice").id
        assert gb.find_grade(WRITTEN, "single_head", A, "alice").needs_manual_grade
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{formgrader['base']}/formgrader?token={formgrader['token']}")
    assert "Manage Assignments" in page.content() or "formgrader" in page.url
    page.goto(f"{formgrader['base']}/formgrader/submissions/{notebook_id}/")
    page.wait_for_selector(f"#{WRITTEN}", timeout=30000)
    assert "The scores grow with d_k." in page.content()  # the student's written answer is shown
    page.fill(f"#{WRITTEN}", "1.5")
    page.press(f"#{WRITTEN}", "Tab")
    page.fill(f"#{WRITTEN}-comment", "Good start: say what happens to the softmax.")
    page.press(f"#{WRITTEN}-comment", "Tab")

    def saved() -> bool:
        with gradebook(work) as gb:
            return (gb.find_grade(WRITTEN, "single_head", A, "alice").manual_score == 1.5 and
                    (gb.find_comment(WRITTEN, "single_head", A, "alice").manual_comment or "").startswith("Good start"))

    wait_for(saved, "formgrader to save the manual score and comment")
    assert not [e for e in errors if "MathJax" not in e], errors  # MathJax comes from a CDN: offline here
    for kw in ({}, {"regrade": True}):
        course_root["grade"](**kw)
        assert saved(), f"the manual grade was lost by a run with {kw}"
        assert float(read_csv(course_root["out"])["alice"]["score"]) == AUTO + 1.5
        html = (work / "feedback" / "alice" / A / "single_head.html").read_text()
        assert "Good start: say what happens to the softmax." in html
    page.reload()
    page.wait_for_selector(f"#{WRITTEN}", timeout=30000)
    assert page.input_value(f"#{WRITTEN}") == "1.5"
    assert page.input_value(f"#{WRITTEN}-comment").startswith("Good start")
    page.close()


def assert_inert(page, what: str) -> None:
    """Nothing of PAYLOAD ran on ``page``: no flag, no title, no dialog; no live handler, frame or script link."""
    page.wait_for_timeout(1000)
    for link in page.query_selector_all("a"):  # a javascript: link would run when clicked
        href = link.get_attribute("href") or ""
        if "pwned" in href or "unsafe-link" in href:
            link.click(no_wait_after=True)
    page.wait_for_timeout(500)
    found = page.evaluate("""() => ({pwned: window.__pwned === undefined ? null : window.__pwned,
        title: document.title,
        handlers: document.querySelectorAll('[onerror], [onload]:not(body)').length,
        frames: document.querySelectorAll('iframe[srcdoc]').length,
        scripts: Array.from(document.scripts).filter(s => s.text.includes('__pwned')).length,
        jslinks: Array.from(document.querySelectorAll('a[href]')).filter(
            a => a.getAttribute('href').replace(/\\s/g, '').toLowerCase().startsWith('javascript:')).length})""")
    assert found == {"pwned": None, "title": found["title"], "handlers": 0, "frames": 0, "scripts": 0,
                     "jslinks": 0}, (what, found)
    assert found["title"] != "pwned", what
    assert "grow with d_k" in page.content(), f"{what}: the answer's text is not shown"


def test_students_html_is_inert_in_formgrader_and_feedback(course_root, formgrader, browser):
    with gradebook(course_root["work"]) as gb:
        notebook_id = gb.find_submission_notebook("single_head", A, "mallory").id
    dialogs: list[str] = []
    for what, url in (
            ("formgrader", f"{formgrader['base']}/formgrader/submissions/{notebook_id}/?token={formgrader['token']}"),
            ("feedback", (course_root["work"] / "feedback" / "mallory" / A / "single_head.html").as_uri())):
        page = browser.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(url)
        if what == "formgrader":
            page.wait_for_selector(f"#{WRITTEN}", timeout=30000)
        assert_inert(page, what)
        assert "&lt;script&gt;" in page.content() or "<script>window.__pwned" not in page.content()
        page.close()
    assert not dialogs, dialogs


def script_links(page) -> list[str]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))
        .filter(h => h.replace(/[\\s\\x00-\\x1f]/g, '').toLowerCase().match(/^(javascript|vbscript|data):/))""")


def test_a_file_name_shaped_like_a_link_is_text_in_formgrader(course_root, formgrader, browser):
    """The note quoting the student's file name is markdown-escaped: formgrader shows the name, with no link."""
    with gradebook(course_root["work"]) as gb:
        notebook_id = gb.find_submission_notebook("single_head", A, "notes").id
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{formgrader['base']}/formgrader/submissions/{notebook_id}/?token={formgrader['token']}")
    page.wait_for_selector(f"#{WRITTEN}", timeout=30000)
    text = page.inner_text("body")
    assert "[Read my notes](javascript:alert(document.domain)).ipynb" in text  # shown as the name it is
    assert script_links(page) == []
    for link in page.query_selector_all("a"):
        if "Read my notes" in (link.inner_text() or ""):
            raise AssertionError(f"the file name became a link: {link.get_attribute('href')}")
    page.close()
    assert not dialogs


def test_math_is_typeset_in_the_feedback_page_offline(course_root, browser):
    """The course's MathJax, embedded in the page, typesets every formula with the network off: rendered math
    elements appear and no raw $...$ is left in the text (before the fix, the loader ran before its data and
    every formula stayed raw)."""
    if not (course.ROOT / "_vendor" / "mathjax" / "tex-svg.js").exists():
        pytest.skip("no _vendor/mathjax (make install vendors it)")
    context = browser.new_context(offline=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((course_root["work"] / "feedback" / "alice" / A / "single_head.html").as_uri())
    page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 0", timeout=60000)
    page.wait_for_timeout(1000)
    typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
    raw = page.evaluate("""() => Array.from(document.querySelectorAll('.rendered_html'))
        .map(e => e.innerText).filter(t => /\\$[^$\\n]+\\$/.test(t))""")
    context.close()
    assert typeset >= 3 and raw == [], (typeset, raw[:3])
    assert not errors, errors


def test_math_is_typeset_in_formgrader_offline(course_root, formgrader, browser):
    """Formgrader's submission page carries the course's MathJax (autograder/records/templates/formgrade): with
    every request off the loopback server refused, formulas are typeset, formgrade.js's MathJax start-up call is
    answered (no "MathJax is not defined"), and no raw $...$ is left."""
    if not (course.ROOT / "_vendor" / "mathjax" / "tex-svg.js").exists():
        pytest.skip("no _vendor/mathjax (make install vendors it)")
    with gradebook(course_root["work"]) as gb:
        notebook_id = gb.find_submission_notebook("single_head", A, "alice").id
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(formgrader["base"])
                  else route.abort())
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{formgrader['base']}/formgrader/submissions/{notebook_id}/?token={formgrader['token']}")
    page.wait_for_selector(f"#{WRITTEN}", timeout=30000)
    page.wait_for_function("() => window.attnMathJaxTypeset === true", timeout=60000)
    typeset = page.evaluate("() => document.querySelectorAll('mjx-container').length")
    raw = page.evaluate("""() => Array.from(document.querySelectorAll('.rendered_html'))
        .map(e => e.innerText).filter(t => /\\$[^$\\n]+\\$/.test(t))""")
    loaded = page.evaluate("() => window.MathJax.loaded")
    labelled = "before the late penalty" in page.inner_text("body")  # its totals differ from the CSV's: said so
    context.close()
    assert labelled
    assert typeset >= 3 and raw == [], (typeset, raw[:3])
    assert loaded is True  # formgrade.js's start-up callback ran
    assert not errors, errors
