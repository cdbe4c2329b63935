"""What autograding a class costs: seconds per (student, notebook) at JOBS=1 and JOBS=2, the
fixed cost of one pair, and the wall time projected for a class.

    python bench/grading_bench.py [--students 2] [--notebooks 02,05] [--full]

Every generated student hands in the lessons with their reference solutions (full points, so
every cell runs). Each JOBS setting grades the same submissions into a fresh copy of one
prepared course folder (release and the reference runs made once, before any timing). The
fixed cost is measured on a lesson of one exercise that does no work: nbgrader's start, the
sandboxed kernel's start,
the feedback page and the merge into the gradebook, with no lesson work.

Figures are measured side by side in one run; the machine's speed drifts between runs.
"""

from __future__ import annotations

if (
    __name__ == "__main__" and not __package__
):  # run as a file: become `python -m bench.grading_bench`
    from helpers.system.processes import exec_as_module

    exec_as_module("bench.grading_bench")

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
from nbformat.corpus.words import generate_corpus_id

from tools.course import grade, release
from tools.course.grade import reference_runs
from tools.course.lessons import NEEDS, exercise_of
from tools.course.report import read_outcomes
from tools.notebooks import grade_id, notebook_paths, read

CLASS, CORES = 150, 16  # the projection's class and machine


def trivial_lesson(folder: Path) -> Path:
    """A lesson of one exercise that does no work (notebook 07's exercise 2, a formula, with
    its reference solution): grading it costs only the fixed per-pair work."""
    folder.mkdir(parents=True)
    source = next(p for p in notebook_paths() if p.name.startswith("07_"))
    lesson = read(source)
    nb = nbformat.v4.new_notebook(metadata=lesson.metadata)
    nb.cells = [c for c in lesson.cells if exercise_of(grade_id(c)) == "nb07-ex2"]
    for cell in nb.cells:  # cells from nbformat 4.4 lessons have no id; 4.5 wants one
        cell.setdefault("id", generate_corpus_id())
    nbformat.write(nb, str(folder / "99_trivial.ipynb"))
    return folder


def hand_in(subs: Path, students: int, lessons: list[Path]) -> None:
    for i in range(students):
        for path in lessons:
            (subs / f"student{i:03d}").mkdir(parents=True, exist_ok=True)
            shutil.copy(path, subs / f"student{i:03d}" / path.name)


def timed_grading(
    template: Path, subs: Path, src: Path | None, quick: bool, jobs: int, work: Path
) -> tuple[float, dict]:
    """Grade `subs` into a fresh copy of `template` with `jobs`; (wall seconds, seconds per
    pair by notebook)."""
    course = work / f"course-jobs{jobs}-{src.name if src else 'lessons'}"
    shutil.copytree(template, course)
    t0 = time.perf_counter()
    rows = grade.grade(
        subs, course, quick=quick, timeout=900, src=src, say=lambda _: None, jobs=jobs
    )
    wall = time.perf_counter() - t0
    handed = {p.stem for p in next(subs.iterdir()).iterdir()}  # grades.csv has every lesson
    short = [
        f"{r['student']} {r['exercise']}: {r['points']}/{r['max_points']}"
        for r in rows
        if r["points"] != r["max_points"] and r["notebook"] in handed
    ]
    if short:  # reference solutions: anything less means the grading itself went wrong
        raise SystemExit(
            f"JOBS={jobs}: reference solutions lost points ({', '.join(short)})."
            f" The report:\n{(course / 'report.txt').read_text()}"
        )
    per = {}
    for pair in read_outcomes(course):
        if pair.outcome == "graded":
            per.setdefault(pair.notebook, []).append(pair.seconds)
    shutil.rmtree(course)
    return wall, per


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--students", type=int, default=2)
    parser.add_argument(
        "--notebooks", default="", help="comma-separated lesson numbers (default: every lesson)"
    )
    parser.add_argument("--full", action="store_true", help="full mode (default: quick)")
    args = parser.parse_args(argv)
    quick = not args.full
    lessons = [p for p in notebook_paths() if p.name != "00_index.ipynb"]
    if args.notebooks:
        wanted = {n.strip().zfill(2) for n in args.notebooks.split(",")}
        unknown = wanted - {p.name[:2] for p in lessons}
        if unknown:
            raise SystemExit(
                f"--notebooks names {', '.join(sorted(unknown))}: the lessons are "
                f"{', '.join(p.name[:2] for p in lessons)}"
            )
        lessons = [p for p in lessons if p.name[:2] in wanted]
    work = Path(tempfile.mkdtemp(prefix="grading-bench-"))
    try:
        subs, trivial_subs = work / "submissions", work / "trivial-submissions"
        hand_in(subs, args.students, lessons)
        trivial = trivial_lesson(work / "trivial")
        hand_in(trivial_subs, args.students, [trivial / "99_trivial.ipynb"])
        print(f"preparing: release and reference runs ({'quick' if quick else 'full'} mode) ...")
        template, trivial_template = work / "template", work / "trivial-template"
        release.release(template)
        for lesson in sorted({n for p in lessons for n, _ in NEEDS.get(p.stem, [])}):
            reference_runs(template, lesson, quick, 900, say=lambda _: None)
        release.release(trivial_template, trivial)
        rows = []
        for jobs in (1, 2):
            wall_fixed, _ = timed_grading(
                trivial_template, trivial_subs, trivial, quick, jobs, work
            )
            wall, per = timed_grading(template, subs, None, quick, jobs, work)
            rows.append((jobs, wall, per, wall_fixed))
            print(
                f"JOBS={jobs}: {wall:.0f} s for {args.students} students x {len(lessons)} notebooks"
            )
        pairs = args.students * len(lessons)
        base = rows[0][1]
        print(
            f"\n{os.cpu_count()} cores; {args.students} students x {len(lessons)} notebooks "
            f"({pairs} pairs), {'quick' if quick else 'full'} mode\n"
        )
        print(
            "| JOBS | wall time (s) | s per pair, wall | s per student, wall | speed-up "
            "| fixed cost per pair, wall (s) |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for jobs, wall, _, fixed in rows:
            print(
                f"| {jobs} | {wall:.0f} | {wall / pairs:.1f} | {wall / args.students:.0f} | "
                f"{base / wall:.2f}x | {fixed / args.students:.1f} |"
            )
        print("\n| notebook | s per pair at JOBS=1 (mean) | at JOBS=2 (mean, each) |")
        print("| --- | ---: | ---: |")
        for path in lessons:
            a = path.stem
            one, two = rows[0][2].get(a, [float("nan")]), rows[1][2].get(a, [float("nan")])
            print(f"| {a} | {sum(one) / len(one):.1f} | {sum(two) / len(two):.1f} |")
        # On CORES cores: JOBS=CORES/2 gives each pair 2 cores, as JOBS=1 does here; JOBS=CORES
        # gives each 1, as JOBS=2 does here. A machine with CORES cores is CORES/2 of these.
        per_student = {jobs: wall / args.students for jobs, wall, _, _ in rows}
        halves = CORES // 2
        print(
            f"\nProjected for {CLASS} students x {len(lessons)} notebooks on {CORES} cores "
            f"(as {halves} of these 2-core machines, with their per-student cost measured "
            f"above; memory and disk assumed sufficient):"
        )
        for jobs, label in (
            (1, f"JOBS={CORES // 2} (2 cores per pair)"),
            (2, f"JOBS={CORES} (1 core per pair)"),
        ):
            hours = CLASS * per_student[jobs] / halves / 3600
            print(f"- {label}: {hours:.1f} h")
        print(f"- one pair after another on this machine: {CLASS * per_student[1] / 3600:.1f} h")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
