"""`python -m tools.course release|grade`: the command line of the course (see __init__.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tools.course
from tools.course.grade import grade
from tools.course.nbgrader_course import DEFAULT_COURSE
from tools.course.release import release


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=tools.course.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("release", "grade"):
        p = sub.add_parser(name)
        p.add_argument("--course", type=Path, default=DEFAULT_COURSE)
        p.add_argument("--timeout", type=int, default=600,
                       help="seconds a single cell may run before it is interrupted")
        if name == "grade":
            p.add_argument("submissions", type=Path)
            p.add_argument("--full", action="store_true", help="run the notebooks in full mode")
            p.add_argument("--students", default="",
                           help="comma-separated student folders to grade (default: all)")
            p.add_argument("--regrade", action="store_true",
                           help="grade again notebooks unchanged since they were last graded")
    args = parser.parse_args(argv)
    if args.command == "release":
        for path in release(args.course, timeout=args.timeout):
            print(f"released {path}")
        return 0
    try:
        grade(args.submissions, args.course, quick=not args.full, timeout=args.timeout,
              students=[s for s in args.students.split(",") if s.strip()] or None,
              regrade=args.regrade, progress=True)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:  # RuntimeError: a lesson's
        print(f"make grade: {exc}", file=sys.stderr)  # own reference run failed
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
