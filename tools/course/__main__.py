"""`python -m tools.course release|grade|merge|collect`: the course's command line (__init__.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import tools.course
from tools.course.collect import collect
from tools.course.grade import grade
from tools.course.nbgrader_course import DEFAULT_COURSE
from tools.course.release import release
from tools.course.shards import merge_shards, parse_shard


def build_parser() -> argparse.ArgumentParser:
    """The command line: release, grade and merge, with their options."""
    parser = argparse.ArgumentParser(
        description=tools.course.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("release", "grade", "merge"):
        p = sub.add_parser(name)
        p.add_argument("--course", type=Path, default=DEFAULT_COURSE)
        p.add_argument(
            "--timeout",
            type=int,
            default=600,
            help="seconds a single cell may run before it is interrupted",
        )
        p.add_argument(
            "--lessons",
            type=Path,
            default=None,
            help="the folder of the course's notebooks (default: notebooks/)",
        )
        if name == "grade":
            p.add_argument("submissions", type=Path)
            p.add_argument("--full", action="store_true", help="run the notebooks in full mode")
            p.add_argument(
                "--students",
                default="",
                help="comma-separated student folders to grade (default: all)",
            )
            p.add_argument(
                "--regrade",
                action="store_true",
                help="grade again notebooks unchanged since they were last graded",
            )
            p.add_argument(
                "--jobs",
                type=int,
                default=max(1, (os.cpu_count() or 2) // 2),
                help="notebooks graded at once (default: half the cores)",
            )
            p.add_argument(
                "--no-sandbox",
                action="store_true",
                help="run students' code with your own rights, outside the sandbox",
            )
            p.add_argument(
                "--memory-mb",
                type=int,
                default=None,
                help="memory limit of one graded notebook (default: 80%% of the "
                "machine's, shared by the jobs)",
            )
            p.add_argument(
                "--shard",
                default="",
                help="i/m: grade the i-th (from 0) of m slices of the students into "
                "COURSE/shards/ (m alone: i from Slurm or Kubernetes)",
            )
    p = sub.add_parser("collect", help="an LMS's submission zip into one folder per student")
    p.add_argument("zip", type=Path, help="Canvas's or Moodle's download of one assignment")
    p.add_argument("--roster", type=Path, required=True, help="nbgrader_id and the LMS's ids")
    p.add_argument("--into", type=Path, default=Path("build/submissions"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "collect":
        try:
            collect(args.zip, args.roster, args.into)
        except (FileNotFoundError, ValueError) as exc:
            print(f"make collect: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "release":
        for path in release(args.course, args.lessons, timeout=args.timeout):
            print(f"released {path}")
        return 0
    try:
        if args.command == "merge":
            merge_shards(args.course, args.lessons, timeout=args.timeout)
            return 0
        grade(
            args.submissions,
            args.course,
            quick=not args.full,
            timeout=args.timeout,
            src=args.lessons,
            students=[s for s in args.students.split(",") if s.strip()] or None,
            regrade=args.regrade,
            progress=True,
            jobs=args.jobs,
            sandboxed=not args.no_sandbox,
            memory_mb=args.memory_mb,
            shard=parse_shard(args.shard) if args.shard else None,
        )
    except KeyboardInterrupt:
        print(
            "make grade: interrupted; every grading process was ended, and the notebooks "
            "graded so far are in the gradebook (run it again to go on)",
            file=sys.stderr,
        )
        return 130
    except (FileNotFoundError, ValueError, RuntimeError) as exc:  # RuntimeError: a lesson's
        print(
            f"make {'grade-merge' if args.command == 'merge' else 'grade'}: {exc}", file=sys.stderr
        )  # own reference run failed, or no sandbox here
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
