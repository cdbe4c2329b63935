"""Autograde a class's submissions with nbgrader, one process per (student, notebook).

`python -m tools.course grade SUBMISSIONS` (or `make grade SUBMISSIONS=...`) calls `grade`, a
pipeline of named stages: plan (students, notebooks, shard, release) -> sort_pairs (what needs
no running: kept, absent, broken) -> grade_pairs (N at once) -> merge (each into the
gradebook, as it finishes) -> give_feedback -> report. Each pair's outcome is a PairOutcome.
nbgrader does the grading and keeps the gradebook; this module is what it lacks for a class
handing in files (see tools/course/__init__.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.files import atomic_path, sha256_of, write_json
from tools.course import sandbox
from tools.course.lessons import NEEDS
from tools.course.merge import forget_submission, has_submission, replace_files
from tools.course.nbgrader_course import (
    DEFAULT_COURSE,
    ROOT,
    STOPPING,
    end_processes,
    nbgrader_cells,
    stop_all,
)
from tools.course.pair import PairRun, Settings, assignments_db, feedback, merge_pair, timed_pair
from tools.course.progress import GradingProgress
from tools.course.release import release
from tools.course.report import PairOutcome, gradebook_rows, write_outcomes, write_report
from tools.course.submissions import Found, find_submissions
from tools.notebooks import NOTEBOOK_DIR, read

KEPT = "not in this folder: kept its grade from an earlier run"
NOT_HANDED_IN = "not handed in: 0 points"
UNCHANGED = "unchanged since it was graded: kept its grade (REGRADE=1 grades it again)"
UNSANDBOXED = "graded without the sandbox (SANDBOX=0): its code ran with the grader's rights"


def reference_runs(
    course: Path, lesson: str, quick: bool, timeout: int, src: Path | None = None, say=print
) -> Path:
    """The runs/ folder of the course's own run of `lesson` (its reference solutions).

    Made once per mode (quick or full) and reused while the lesson's source is unchanged
    (its sha256 is kept beside it); a failed run leaves nothing behind and raises.
    """
    path = Path(src or NOTEBOOK_DIR) / f"{lesson}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the course's reference run of {lesson} "
            f"provides what later notebooks read"
        )
    digest = sha256_of(path)
    home = course / "reference" / ("quick" if quick else "full") / lesson
    stamp = home / "source.sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return home / "runs"
    say(
        f"reference run of {lesson} ({'quick' if quick else 'full'} mode), made once for the "
        f"notebooks that read its outputs ..."
    )
    with atomic_path(home, directory=True) as tmp:  # all or nothing: a failed run leaves none
        run_lesson(path, tmp, quick, timeout)
        (tmp / "source.sha256").write_text(digest)
    return home / "runs"


def run_lesson(path: Path, into: Path, quick: bool, timeout: int) -> None:
    """Run the lesson at `path` (tools.run_notebooks) with its runs/ folder in `into`; end all
    it started, by PID; raise with the tail of its output if it failed."""
    token = uuid.uuid4().hex
    env = dict(
        os.environ,
        LABS_RUNS_DIR=str(into / "runs"),
        LABS_GRADING_TOKEN=token,
        LABS_QUICK="1" if quick else "0",
    )
    cmd = [sys.executable, "-m", "tools.run_notebooks", "--only", path.stem]
    cmd += ["--dir", str(path.parent), "--out", str(into / "build"), "--timeout", str(timeout)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate()
    finally:
        end_processes(token, proc)
    if proc.returncode != 0:
        raise RuntimeError(
            f"the course's reference run of {path.stem} failed (exit "
            f"{proc.returncode}):\n" + "\n".join(out.splitlines()[-10:])
        )


def submission_stamp(f: Found, source_sha256: str, quick: bool) -> str | None:
    """What a notebook's grade depends on, hashed: the file handed in, the lesson's source
    (tests and points, hashed once per grading) and the mode. None when nothing gradable
    was handed in."""
    if f.path is None:
        return None
    parts = f"{sha256_of(f.path)} {source_sha256} {'quick' if quick else 'full'}"
    return hashlib.sha256(parts.encode()).hexdigest()


def grade(
    submissions: Path,
    course: Path = DEFAULT_COURSE,
    quick: bool = True,
    timeout: int = 600,
    src: Path | None = None,
    say=print,
    students: list[str] | None = None,
    regrade: bool = False,
    progress: bool = False,
    jobs: int = 1,
    sandboxed: bool = True,
    memory_mb: int | None = None,
    shard: tuple[int, int] | None = None,
) -> list[dict]:
    """Autograde every student's folder in `submissions`; write grades.csv and feedback.

    Returns the rows of grades.csv, for the students graded. Other students' grades in the
    gradebook are kept, and so is a student's earlier grade for a notebook that is not in
    their folder this time (notebooks can be handed in one at a time).

    Args:
        students: grade only these (folder names); all when None.
        regrade: grade again a notebook that is unchanged since it was last graded (same
            file, same lesson, same mode); otherwise its grade is kept without running it.
        progress: show a progress line with an ETA (GradingProgress) on stderr.
        jobs: how many (student, notebook) pairs to grade at once.
        sandboxed: run students' code in the sandbox (tools/course/sandbox.py); where it
            cannot be made, grading stops with the reason, unless this is False.
        memory_mb: the memory limit of one pair (default: 80% of the machine's over `jobs`).
        shard: (i, m): grade only the i-th (from 0) of m disjoint slices of the students, into
            the course folder course/shards/<i>-of-<m>/ (merge_shards brings them together).
    """
    submissions = Path(submissions).resolve()
    chosen = check_arguments(submissions, students, jobs, sandboxed)
    p = plan(submissions, course, src, chosen, quick, sandboxed, shard, timeout)
    bar = GradingProgress([(s, a) for s in p.students for a in p.assignments], quick, progress)
    outcomes, todo = sort_pairs(p, regrade, bar)
    if todo:
        st = pair_settings(p, todo, timeout, memory_mb or sandbox.default_memory_mb(jobs), say)
        autograded: dict[str, list[str]] = {}  # notebook -> students it was graded for now

        def merged(t: Todo, run: PairRun) -> None:
            outcomes[t.student, t.notebook] = merge(p, t, run, bar)
            if run.ok:
                autograded.setdefault(t.notebook, []).append(t.student)

        grade_pairs(p, todo, st, jobs, bar, merged)
        give_feedback(p.course, autograded, outcomes)
    bar.close()
    return report(p, outcomes, say)


@dataclass
class Plan:
    """What one grading run grades, and into which course folder."""

    submissions: Path  # one sub-folder per student
    course: Path  # the course folder graded into: with SHARD, the shard's own
    students: list[str]  # the student folders graded (of this shard)
    assignments: list[str]  # the course's notebooks
    src: Path | None  # the lessons' folder (None: notebooks/)
    hidden: list[Path]  # folders the sandbox hides besides the course's own
    quick: bool
    sandboxed: bool


@dataclass
class Todo:
    """A pair that runs: what was found in the student's folder, and what its grade hangs on."""

    student: str
    notebook: str
    found: Found
    stamp: str | None  # submission_stamp: an unchanged pair keeps its grade next time


def check_arguments(
    submissions: Path, students: list[str] | None, jobs: int, sandboxed: bool
) -> list[str]:
    """The student folders to grade, sorted; raise, saying what to do, on a wrong argument."""
    if not submissions.is_dir():
        raise FileNotFoundError(
            f"SUBMISSIONS={submissions} is not a folder: give the folder "
            f"that holds one sub-folder per student"
        )
    folders = sorted(
        p.name for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")
    )
    if not folders:
        raise ValueError(
            f"{submissions} holds no student folder: lay it out as "
            f"<SUBMISSIONS>/<student>/<notebook>.ipynb"
        )
    unknown = sorted(set(students or ()) - set(folders))
    if unknown:
        raise ValueError(
            f"STUDENTS names {', '.join(unknown)}, with no folder in {submissions}; "
            f"its student folders: {', '.join(folders)}"
        )
    if jobs < 1:
        raise ValueError(f"JOBS={jobs}: give how many notebooks to grade at once, 1 or more")
    reason = sandbox.unavailable_reason() if sandboxed else None
    if reason:
        raise RuntimeError(
            f"cannot sandbox students' code here: {reason}. Grade on a Linux "
            f"machine that has bubblewrap, or run it unsandboxed, with your "
            f"own rights, with SANDBOX=0"
        )
    return sorted(set(students)) if students else folders


def plan(
    submissions: Path,
    course: Path,
    src: Path | None,
    students: list[str],
    quick: bool,
    sandboxed: bool,
    shard: tuple[int, int] | None,
    timeout: int,
) -> Plan:
    """Stage 1: the students (of the shard) and notebooks to grade, into which course folder;
    the lessons released there."""
    course = Path(course).resolve()
    hidden = [course, submissions] + ([Path(src).resolve()] if src else [])
    if shard is not None:
        index, count = shard
        students = students[index::count]
        course = course / "shards" / f"{index}-of-{count}"
    release(course, src, timeout)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    return Plan(submissions, course, students, assignments, src, hidden, quick, sandboxed)


def sort_pairs(
    p: Plan, regrade: bool, bar: GradingProgress
) -> tuple[dict[tuple[str, str], PairOutcome], list[Todo]]:
    """Stage 2: the outcome of each pair that needs no running (kept, absent, broken), by
    (student, notebook); and the pairs to grade."""
    cells, source_sha256 = {}, {}
    for a in p.assignments:
        path = p.course / "source" / a / f"{a}.ipynb"
        cells[a], source_sha256[a] = nbgrader_cells(read(path)), sha256_of(path)
    outcomes, todo = {}, []
    for student in p.students:
        found = find_submissions(p.submissions / student, cells)
        for a in p.assignments:
            stamp = submission_stamp(found[a], source_sha256[a], p.quick)
            settled = without_running(p.course, student, a, found[a], stamp, regrade)
            if settled is None:
                todo.append(Todo(student, a, found[a], stamp))
                continue
            outcomes[student, a] = settled
            failed = any("not a valid notebook" in n for n in settled.notes)
            bar.done(student, a, graded=False, failed=failed)
    return outcomes, todo


def without_running(
    course: Path, student: str, a: str, f: Found, stamp: str | None, regrade: bool
) -> PairOutcome | None:
    """The outcome of a pair that need not run: unchanged since it was graded (its grade
    stays), absent (an earlier grade and its feedback stay) or broken, not a notebook (an
    earlier grade and its files go); None when it is to be graded."""
    kept = course / "graded" / student / f"{a}.json"
    earlier = json.loads(kept.read_text()) if kept.is_file() else {}
    if (
        stamp
        and not regrade
        and earlier.get("stamp") == stamp
        and has_submission(course, a, student)
    ):
        return PairOutcome(student, a, "kept", notes=earlier["notes"] + [UNCHANGED])
    if f.path is not None:
        return None
    if not f.notes:
        notes = [KEPT if has_submission(course, a, student) else NOT_HANDED_IN]
        return PairOutcome(student, a, "absent", notes=notes)
    forget_submission(course, a, student)
    replace_files(course / "work" / "none", course, a, student)
    return PairOutcome(student, a, "broken", notes=f.notes)


def pair_settings(p: Plan, todo: list[Todo], timeout: int, memory_mb: int, say=print) -> Settings:
    """How each pair of this run is graded; makes the pairs' starting gradebook and the
    reference runs of the lessons that the notebooks to grade read from."""
    assignments_db(p.course)
    needed = {lesson for t in todo for lesson, _ in NEEDS.get(t.notebook, [])}
    references = {
        lesson: reference_runs(p.course, lesson, p.quick, timeout, p.src, say)
        for lesson in sorted(needed)
    }
    return Settings(p.course, p.quick, timeout, p.sandboxed, memory_mb, p.hidden, references)


def grade_pairs(
    p: Plan,
    todo: list[Todo],
    st: Settings,
    jobs: int,
    bar: GradingProgress,
    merged: Callable[[Todo, PairRun], None],
) -> None:
    """Stage 3: grade the pairs, `jobs` at once, each handed to `merged` in this thread as it
    finishes (one writer to the gradebook). On Ctrl-C, or an error in our code, end every
    pair's processes and raise.

    The longest lessons (by their measured run time) start first, so that the pairs left at
    the end, when fewer than `jobs` run, are short ones.
    """
    releases = {a: read(p.course / "release" / a / f"{a}.ipynb") for a in p.assignments}
    todo = sorted(todo, key=lambda t: -bar.weight[t.notebook])
    STOPPING.clear()
    pool = ThreadPoolExecutor(max_workers=jobs)
    running = {
        pool.submit(
            timed_pair, bar, st, t.student, t.notebook, t.found.path, releases[t.notebook]
        ): t
        for t in todo
    }
    with ctrl_c_sets_a_flag() as interrupted:
        try:
            for future in as_they_finish(running, interrupted):
                merged(running[future], future.result())
        except BaseException:  # Ctrl-C, or a pair failed in our code
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            pool.shutdown(wait=True)
            STOPPING.clear()
            bar.close()
            raise
    pool.shutdown()


@contextmanager
def ctrl_c_sets_a_flag() -> Iterator[threading.Event]:
    """Within the block, Ctrl-C (in the main thread) only sets the event yielded.

    A KeyboardInterrupt raised in the middle of concurrent.futures' own locking could leave a
    future's lock held, and the pool would then never shut down: it is read between waits.
    """
    interrupted = threading.Event()
    previous = (
        signal.signal(signal.SIGINT, lambda *_: interrupted.set())
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        yield interrupted
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def as_they_finish(running: dict[Future, Todo], interrupted: threading.Event) -> Iterator[Future]:
    """The futures of `running` as they finish, those done together by (student, notebook);
    KeyboardInterrupt once `interrupted` is set."""
    pending, finished = set(running), []
    while pending or finished:
        if not finished:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            finished = sorted(done, key=lambda fu: (running[fu].student, running[fu].notebook))
        if interrupted.is_set():
            raise KeyboardInterrupt
        if finished:
            yield finished.pop(0)


def merge(p: Plan, t: Todo, run: PairRun, bar: GradingProgress) -> PairOutcome:
    """Stage 4: bring one graded pair into the course (gradebook and folders) and keep its
    stamp and notes, for the next grading to find it unchanged; its outcome."""
    merge_pair(p.course, run.work, t.student, t.notebook, run.ok)
    notes = t.found.notes + run.notes + ([] if p.sandboxed else [UNSANDBOXED])
    if t.stamp:
        write_json(
            p.course / "graded" / t.student / f"{t.notebook}.json",
            {"stamp": t.stamp, "notes": notes},
        )
    failed = any("autograde failed" in n for n in notes)
    bar.done(t.student, t.notebook, graded=True, failed=failed)
    return PairOutcome(t.student, t.notebook, "graded", run.seconds, notes)


def give_feedback(
    course: Path, autograded: dict[str, list[str]], outcomes: dict[tuple[str, str], PairOutcome]
) -> None:
    """Stage 5: nbgrader's feedback pages of the pairs `autograded` names, by notebook; a
    failure is noted in each of their outcomes."""
    for a, students in feedback_runs(course, autograded):
        problem = feedback(course, a, students)
        for student in students if problem else []:
            for notebook in autograded if a == "*" else [a]:
                outcomes[student, notebook].notes.append(problem)


def feedback_runs(course: Path, autograded: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """(notebook, or "*" for all, students) of each nbgrader generate_feedback to run: one per
    notebook, or fewer: one for all notebooks for the students graded in every one (and
    holding no other graded notebook: a class handing in everything), then one per notebook
    for the others."""
    per_notebook = sorted((a, sorted(students)) for a, students in autograded.items())
    everywhere = sorted(
        s
        for s in set.intersection(*(set(students) for students in autograded.values()))
        if {p.name for p in (course / "autograded" / s).iterdir()} == set(autograded)
    )
    rest = [(a, [s for s in students if s not in everywhere]) for a, students in per_notebook]
    runs = [("*", everywhere)] + [(a, students) for a, students in rest if students]
    return runs if everywhere and len(runs) < len(per_notebook) else per_notebook


def report(p: Plan, outcomes: dict[tuple[str, str], PairOutcome], say=print) -> list[dict]:
    """Stage 6: grades.csv, report.txt and report.json of the students planned; the rows of
    grades.csv."""
    rows = gradebook_rows(p.course, p.students, p.assignments)
    pairs = [outcomes[s, a] for s in p.students for a in p.assignments]
    write_report(p.course, rows, pairs, say)
    write_outcomes(p.course, pairs)  # merge_shards reads it
    return rows
