"""Command line: ``python -m autograder {release,grade} ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder import course
from autograder.batch import add_grade_parser
from autograder.similarity import add_similarity_parser


def _release(args: argparse.Namespace) -> int:
    names = course.assignments() if args.all else args.assignment
    if not names:
        print("name an assignment or pass --all", file=sys.stderr)
        return 2
    for name in names:
        target = course.generate_release(name, Path(args.out))
        print(f"released {name} -> {target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rel = sub.add_parser("release", help="generate exercises/ from solutions/assignments/ with nbgrader")
    rel.add_argument("assignment", nargs="*", help="assignment names (NN_topic)")
    rel.add_argument("--all", action="store_true", help="every assignment")
    rel.add_argument("--out", default=str(course.RELEASE), help="release folder (default: exercises/)")
    rel.set_defaults(func=_release)
    add_grade_parser(sub)
    add_similarity_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
