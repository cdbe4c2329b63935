"""Grading a class in shards, on several machines or scheduler tasks, and merging them.

`make grade SUBMISSIONS=... SHARD=i/m` grades the i-th of m disjoint slices of the students
into COURSE/shards/<i>-of-<m>/, a course folder of its own; `make grade-merge` brings every
shard into the course: one gradebook, grades.csv, feedback and report, as if graded at once.
Slurm array jobs and Kubernetes Indexed Jobs give each task its index in a variable
(SLURM_ARRAY_TASK_ID, JOB_COMPLETION_INDEX): SHARD=m alone reads it (examples/grading/).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from tools.course.grade import KEPT
from tools.course.merge import copy_submission, forget_submission, has_submission, replace_files
from tools.course.nbgrader_course import DEFAULT_COURSE
from tools.course.release import release
from tools.course.report import PairOutcome, gradebook_rows, read_outcomes, write_report


def parse_shard(spec: str, env: dict = os.environ) -> tuple[int, int]:
    """SHARD=i/m (the i-th of m slices, from 0), or SHARD=m with i from the scheduler: Slurm's
    SLURM_ARRAY_TASK_ID (less SLURM_ARRAY_TASK_MIN) or Kubernetes' JOB_COMPLETION_INDEX."""
    text = spec.strip()
    try:
        if "/" in text:
            index, count = (int(x) for x in text.split("/"))
        else:
            count = int(text)
            if "SLURM_ARRAY_TASK_ID" in env:
                index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))
            elif "JOB_COMPLETION_INDEX" in env:
                index = int(env["JOB_COMPLETION_INDEX"])
            else:
                raise ValueError(
                    f"SHARD={spec} gives the number of shards only, and neither "
                    f"SLURM_ARRAY_TASK_ID nor JOB_COMPLETION_INDEX is set: give "
                    f"SHARD=i/m (i from 0 to m-1)"
                )
    except ValueError as exc:
        if "SHARD=" in str(exc):
            raise
        raise ValueError(
            f"SHARD={spec} is not i/m with whole numbers (e.g. SHARD=0/4), nor a number of shards"
        ) from None
    if not 0 <= index < count:
        raise ValueError(
            f"SHARD={spec}: shard {index} of {count} does not exist; shards are "
            f"numbered 0 to {count - 1}"
        )
    return index, count


def merge_shards(
    course: Path = DEFAULT_COURSE, src: Path | None = None, timeout: int = 600, say=print
) -> list[dict]:
    """Bring every shard graded into course/shards/ into the course itself: gradebook,
    submitted/, autograded/, feedback/ and graded/; then grades.csv and report.txt for the
    students of the shards. Each shard's folder is removed once it is merged. Returns the
    rows of grades.csv."""
    course = Path(course).resolve()
    shards = sorted(p for p in (course / "shards").glob("*-of-*") if (p / "report.json").is_file())
    if not shards:
        raise FileNotFoundError(
            f"no graded shard in {course / 'shards'}: grade with "
            f"SHARD=i/m first (make grade SUBMISSIONS=... SHARD=0/2)"
        )
    release(course, src, timeout)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    report = {}
    for shard in shards:
        for pair in read_outcomes(shard):
            report[pair.student, pair.notebook] = merge_shard_pair(shard, course, pair)
    students = sorted({s for s, _ in report})
    rows = gradebook_rows(course, students, assignments)
    pairs = [report[s, a] for s in students for a in assignments if (s, a) in report]
    write_report(course, rows, pairs, say)
    for shard in shards:
        shutil.rmtree(shard)
    say(f"merged {len(shards)} shard(s): {', '.join(p.name for p in shards)}")
    return rows


def merge_shard_pair(shard: Path, course: Path, pair: PairOutcome) -> PairOutcome:
    """Bring one pair from a shard's folder into the course; its outcome there."""
    student, a = pair.student, pair.notebook
    if pair.outcome == "absent":  # nothing handed in: an earlier grade here stays
        return replace(pair, notes=[KEPT]) if has_submission(course, a, student) else pair
    if has_submission(shard, a, student):
        copy_submission(shard, course, a, student)
    else:  # broken, or its autograde failed: an earlier grade goes
        forget_submission(course, a, student)
    replace_files(shard, course, a, student)
    stamp = shard / "graded" / student / f"{a}.json"
    if stamp.is_file():
        (course / "graded" / student).mkdir(parents=True, exist_ok=True)
        shutil.copy(stamp, course / "graded" / student)
    return pair
