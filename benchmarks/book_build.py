"""Book build times: a clean build (every chapter executed) and an unchanged rebuild (target: under 15 s).

    .venv/bin/python benchmarks/book_build.py [--json FILE] [--keep]

Copies the committed tree (``git ls-files``) to a temporary folder so the
measurement starts truly clean (no ``_build``, no execution cache), builds the
book there twice with the same command as ``make book`` and prints both times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(where: Path) -> float:
    cmd = [str(ROOT / ".venv" / "bin" / "jupyter-book"), "build", ".", "--warningiserror", "--keep-going", "-q"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=where, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"the book build failed in {where}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attn-book-"))
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
        for name in filter(None, files):
            src, dst = ROOT / name.decode(), tmp / name.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        vendor = ROOT / "_vendor"  # the offline MathJax copy that `make book` installs (not committed)
        if vendor.is_dir():
            shutil.copytree(vendor, tmp / "_vendor")
        clean = build(tmp)
        rebuild = build(tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = {"clean_build_seconds": round(clean, 1), "unchanged_rebuild_seconds": round(rebuild, 1),
            "rebuild_target_seconds": 15, "rebuild_within_target": rebuild < 15}
    print(f"clean build (every chapter executed): {clean:7.1f} s")
    print(f"unchanged rebuild (cached execution): {rebuild:7.1f} s   target < 15 s: {'met' if rebuild < 15 else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
