"""Autograde a class's submissions with nbgrader, one process per (student, notebook).

`python -m tools.course grade SUBMISSIONS` (or `make grade SUBMISSIONS=...`) calls `grade`.
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
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from helpers.data.downloads import sha256_of
from helpers.files import atomic_path, write_json
from tools.course import sandbox
from tools.course.merge import forget_submission, has_submission, replace_files
from tools.course.nbgrader_course import (
    DEFAULT_COURSE,
    ROOT,
    STOPPING,
    end_processes,
    nbgrader_cells,
    stop_all,
)
from tools.course.pair import NEEDS, Settings, assignments_db, feedback, merge_pair, timed_pair
from tools.course.progress import GradingProgress
from tools.course.release import release
from tools.course.report import gradebook_rows, write_report
from tools.course.submissions import Found, find_submissions
from tools.notebooks import NOTEBOOK_DIR, read

KEPT = "not in this folder: kept its grade from an earlier run"
NOT_HANDED_IN = "not handed in: 0 points"
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
    token = uuid.uuid4().hex
    with atomic_path(home, directory=True) as tmp:  # all or nothing: a failed run leaves none
        env = dict(
            os.environ,
            LABS_RUNS_DIR=str(tmp / "runs"),
            LABS_GRADING_TOKEN=token,
            LABS_QUICK="1" if quick else "0",
            MPLBACKEND="Agg",
        )
        cmd = [
            sys.executable,
            "-m",
            "tools.run_notebooks",
            "--only",
            lesson,
            "--dir",
            str(path.parent),
            "--out",
            str(tmp / "build"),
            "--timeout",
            str(timeout),
        ]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            out, _ = proc.communicate()
        finally:
            end_processes(token, proc)
        if proc.returncode != 0:
            raise RuntimeError(
                f"the course's reference run of {lesson} failed (exit "
                f"{proc.returncode}):\n" + "\n".join(out.splitlines()[-10:])
            )
        (tmp / "source.sha256").write_text(digest)
    return home / "runs"


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
    if sandboxed:
        reason = sandbox.unavailable_reason()
        if reason:
            raise RuntimeError(
                f"cannot sandbox students' code here: {reason}. Grade on a Linux "
                f"machine that has bubblewrap, or run it unsandboxed, with your "
                f"own rights, with SANDBOX=0"
            )
    students = sorted(set(students)) if students else folders
    course = Path(course).resolve()
    hidden = [course, submissions] + ([Path(src).resolve()] if src else [])
    if shard is not None:
        index, count = shard
        students = students[index::count]
        course = course / "shards" / f"{index}-of-{count}"
    release(course, src, timeout)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    sources = {a: read(course / "source" / a / f"{a}.ipynb") for a in assignments}
    releases = {a: read(course / "release" / a / f"{a}.ipynb") for a in assignments}
    cells = {a: nbgrader_cells(nb) for a, nb in sources.items()}
    source_sha256 = {a: sha256_of(course / "source" / a / f"{a}.ipynb") for a in assignments}
    report: dict[tuple[str, str], tuple[float, list[str]]] = {}
    bar = GradingProgress([(s, a) for s in students for a in assignments], quick, progress)
    todo = []  # (student, notebook, file, stamp) to run
    for student in students:
        found = find_submissions(submissions / student, cells)
        for a in assignments:
            f = found[a]
            stamp = submission_stamp(f, source_sha256[a], quick)
            kept = course / "graded" / student / f"{a}.json"
            earlier = json.loads(kept.read_text()) if kept.is_file() else {}
            if (
                stamp
                and not regrade
                and earlier.get("stamp") == stamp
                and has_submission(course, a, student)
            ):
                notes = earlier["notes"] + [
                    "unchanged since it was graded: kept its grade (REGRADE=1 grades it again)"
                ]
                outcome = "kept"
            elif f.path is not None:
                todo.append((student, a, f, stamp))
                continue
            elif not f.notes:  # absent, not broken: an earlier grade and its feedback stay
                notes = [KEPT if has_submission(course, a, student) else NOT_HANDED_IN]
                outcome = "absent"
            else:  # broken (not a notebook): an earlier grade and its files go
                forget_submission(course, a, student)
                replace_files(course / "work" / "none", course, a, student)
                notes, outcome = f.notes, "broken"
            report[student, a] = (0.0, notes, outcome)
            bar.done(
                student, a, graded=False, failed=any("not a valid notebook" in n for n in notes)
            )
    if todo:
        assignments_db(course)
        needed = {lesson for _, a, _, _ in todo for lesson, _ in NEEDS.get(a, [])}
        st = Settings(
            course,
            quick,
            timeout,
            sandboxed,
            memory_mb or sandbox.default_memory_mb(jobs),
            hidden=hidden,
            references={
                lesson: reference_runs(course, lesson, quick, timeout, src, say)
                for lesson in sorted(needed)
            },
        )
        STOPPING.clear()
        graded_ok: dict[str, list[str]] = {}  # notebook -> students graded now, to give feedback
        pool = ThreadPoolExecutor(max_workers=jobs)
        running = {}
        for student, a, f, stamp in todo:
            future = pool.submit(timed_pair, bar, st, student, a, f.path, releases[a])
            running[future] = (student, a, f, stamp)
        # Ctrl-C only sets a flag, read between waits: a KeyboardInterrupt raised in the middle
        # of concurrent.futures' own locking could leave a future's lock held, and the pool
        # would then never shut down
        interrupted = threading.Event()
        previous = (
            signal.signal(signal.SIGINT, lambda *_: interrupted.set())
            if threading.current_thread() is threading.main_thread()
            else None
        )
        try:
            pending = set(running)
            finished = []
            while pending or finished:
                if not finished:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    finished = sorted(done, key=lambda fu: running[fu][:2])
                if interrupted.is_set():
                    raise KeyboardInterrupt
                if not finished:
                    continue
                future = finished.pop(0)  # merged here: one writer to the gradebook
                student, a, f, stamp = running[future]
                seconds, (work, ok, notes) = future.result()
                merge_pair(course, work, student, a, ok)
                notes = f.notes + notes + ([] if sandboxed else [UNSANDBOXED])
                if stamp:
                    write_json(
                        course / "graded" / student / f"{a}.json", {"stamp": stamp, "notes": notes}
                    )
                report[student, a] = (seconds, notes, "graded")
                if ok:
                    graded_ok.setdefault(a, []).append(student)
                bar.done(
                    student, a, graded=True, failed=any("autograde failed" in n for n in notes)
                )
        except BaseException:  # Ctrl-C, or a pair failed in our code: end every pair's processes
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            pool.shutdown(wait=True)
            STOPPING.clear()
            bar.close()
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        pool.shutdown()
        for a, done in sorted(graded_ok.items()):
            problem = feedback(course, a, done)
            for student in done if problem else []:
                report[student, a][1].append(problem)
    bar.close()
    rows = gradebook_rows(course, students, assignments)
    pairs = [(s, a, *report[s, a]) for s in students for a in assignments]
    write_report(course, rows, [p[:4] for p in pairs], say)
    write_json(course / "report.json", [list(p) for p in pairs], indent=0)  # merge_shards reads it
    return rows
