"""A reviewer's list of a chapter's checks and the requirements its text states, printed from the data
(``STATED_REQUIREMENTS`` and the checks' descriptions): ``python -m autograder.judging.checks --requirements 01``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path


def chapter_module(chapter: str):
    """The checks module of chapter ``chapter`` (``01``, ``1`` or ``01_single_head``)."""
    number = chapter.split("_")[0].zfill(2)
    names = [m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith(f"ch{number}_")]
    if not names:
        raise SystemExit(f"no checks module for chapter {chapter!r} in {Path(__file__).parent}")
    return importlib.import_module(f"{__package__}.{names[0]}")


def requirements_list(chapter: str) -> str:
    module = chapter_module(chapter)
    stated = getattr(module, "STATED_REQUIREMENTS", {})
    lines = [f"{module.SUITE.assignment}: {len(module.SUITE.checks)} checks, {len(stated)} stated requirements"]
    for gid, check in module.SUITE.checks.items():
        points = "" if check.points is None else f" [{check.points:g} pt]"
        lines.append(f"\n{gid} ({', '.join(check.parts)}){points}: {check.doc}")
        for name, req in stated.items():
            if gid in req.checks:
                lines.append(f"  - {name}: \"{req.phrase}\" -> message names {req.message!r}"
                             + (f"; also fails {', '.join(req.also)}" if req.also else ""))
    unmapped = sorted({g for r in stated.values() for g in r.checks + r.also} - set(module.SUITE.checks))
    if unmapped:
        lines.append(f"\nrequirements name checks that do not exist: {', '.join(unmapped)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.judging.checks", description=__doc__)
    parser.add_argument("--requirements", metavar="CHAPTER", required=True,
                        help="print the checks and stated requirements of CHAPTER (01, 02, ...)")
    print(requirements_list(parser.parse_args(argv).requirements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
