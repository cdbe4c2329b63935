"""Autograde a class's submissions with nbgrader, one process per (student, notebook).

`python -m tools.course grade SUBMISSIONS` (or `make grade SUBMISSIONS=...`) calls `grade`.
nbgrader does the grading and keeps the gradebook; this module is what it lacks for a class
handing in files (see tools/course/__init__.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.data.downloads import sha256_of
from helpers.files import atomic_path, write_json
from tools.course import sandbox
from tools.course.merge import copy_submission, forget_submission, has_submission, replace_files
from tools.course.nbgrader_course import (DEFAULT_COURSE, KILLED, ROOT, STOPPING,
                                          end_processes, gradebook_at, nbgrader, nbgrader_cells,
                                          stop_all, with_points, write_config)
from tools.course.progress import GradingProgress
from tools.course.release import release
from tools.course.report import cell_errors, gradebook_rows, write_report
from tools.course.submissions import Found, find_submissions, repair
from tools.notebooks import NOTEBOOK_DIR, read

# What a lesson reads from an earlier one: {notebook: [(earlier notebook, path under runs/)]}.
# When a notebook is graded, these come from the course's own reference run of the earlier
# lesson (its solutions, made once per mode and reused), never from the student's own copy: a
# notebook's grade never depends on the student's other notebooks.
NEEDS: dict[str, list[tuple[str, str]]] = {
    "02_logreg_lr_schedules": [("01_doc2vec_dbpedia", "features/doc2vec_dbpedia")],
}


KEPT = "not in this folder: kept its grade from an earlier run"
NOT_HANDED_IN = "not handed in: 0 points"
UNSANDBOXED = "graded without the sandbox (SANDBOX=0): its code ran with the grader's rights"


def autograde(work: Path, assignment: str, student: str, nb, target: Path, env: dict,
              timeout: int, notes: list[str], logs: Path, guard=None) -> tuple[int | str, str]:
    """nbgrader autograde of one submitted notebook (already at `target`) in course `work`.

    When a cell of the student's kills the kernel (or hangs it past interrupting, or passes
    the memory limit of `guard`), nbgrader fails the whole notebook; that cell is then
    replaced by an error and the notebook graded again, so the tests before and after it
    still count. At most two such cells.
    """
    trace = work / "trace"
    limit = timeout * (sum(c.cell_type == "code" for c in nb.cells) + 2)
    for _ in range(3):
        trace.unlink(missing_ok=True)
        tripped = False
        if guard is not None:
            guard.tripped = False
        status, log = nbgrader(work, "autograde", assignment, "--student", student, "--force",
                               env=dict(env, LABS_GRADING_TRACE=str(trace)), limit=limit,
                               log=logs / f"autograde-{student}-{assignment}.log", guard=guard)
        tripped = guard is not None and guard.tripped
        stuck = isinstance(status, str)  # nbgrader itself ran past the wall-clock limit
        died = stuck or tripped or "DeadKernelError" in log or "UnresponsiveKernelError" in log
        if status == 0 and not tripped or not died or not trace.is_file():
            return status, log
        index = int(trace.read_text())
        meta = nb.cells[index].get("metadata", {}).get("nbgrader", {})
        if not meta.get("solution"):
            notes.append(f"the kernel died in cell {index}, which is not a solution cell")
            return status, log
        how = (f"it used more than the memory limit of {guard.limit_mb:,.0f} MB" if tripped
               else "Kernel died" if "DeadKernelError" in log else f"kernel stuck, {status}")
        notes.append(f"{meta['grade_id']}: ended the kernel ({how}); graded again with that "
                     f"cell replaced by an error")
        nb.cells[index].source = KILLED
        nbformat.write(nb, str(target))
    return status, log


def reference_runs(course: Path, lesson: str, quick: bool, timeout: int,
                   src: Path | None = None, say=print) -> Path:
    """The runs/ folder of the course's own run of `lesson` (its reference solutions).

    Made once per mode (quick or full) and reused while the lesson's source is unchanged
    (its sha256 is kept beside it); a failed run leaves nothing behind and raises.
    """
    path = Path(src or NOTEBOOK_DIR) / f"{lesson}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the course's reference run of {lesson} "
                                f"provides what later notebooks read")
    digest = sha256_of(path)
    home = course / "reference" / ("quick" if quick else "full") / lesson
    stamp = home / "source.sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return home / "runs"
    say(f"reference run of {lesson} ({'quick' if quick else 'full'} mode), made once for the "
        f"notebooks that read its outputs ...")
    token = uuid.uuid4().hex
    with atomic_path(home, directory=True) as tmp:  # all or nothing: a failed run leaves none
        env = dict(os.environ, LABS_RUNS_DIR=str(tmp / "runs"), LABS_GRADING_TOKEN=token,
                   LABS_QUICK="1" if quick else "0", MPLBACKEND="Agg")
        cmd = [sys.executable, "-m", "tools.run_notebooks", "--only", lesson, "--dir",
               str(path.parent), "--out", str(tmp / "build"), "--timeout", str(timeout)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate()
        finally:
            end_processes(token, proc)
        if proc.returncode != 0:
            raise RuntimeError(f"the course's reference run of {lesson} failed (exit "
                               f"{proc.returncode}):\n" + "\n".join(out.splitlines()[-10:]))
        (tmp / "source.sha256").write_text(digest)
    return home / "runs"


def prepare_runs(runs: Path, assignment: str, references: dict[str, Path]) -> Path:
    """A fresh runs/ folder at `runs` for one (student, notebook), holding what the notebook
    reads from earlier lessons, copied from the course's reference runs (`references`, by
    lesson, as reference_runs returned them)."""
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    for lesson, part in NEEDS.get(assignment, []):
        shutil.copytree(references[lesson] / part, runs / part)
    return runs


def submission_stamp(f: Found, source_sha256: str, quick: bool) -> str | None:
    """What a notebook's grade depends on, hashed: the file handed in, the lesson's source
    (tests and points, hashed once per grading) and the mode. None when nothing gradable
    was handed in."""
    if f.path is None:
        return None
    parts = f"{sha256_of(f.path)} {source_sha256} {'quick' if quick else 'full'}"
    return hashlib.sha256(parts.encode()).hexdigest()




@dataclass
class Settings:
    """How one grading run grades each pair (the same for every pair)."""
    course: Path
    quick: bool
    timeout: int
    sandbox: bool
    memory_mb: int
    hidden: list[Path]          # folders the sandbox hides besides the course's own
    references: dict[str, Path]  # runs/ of the course's reference run of each lesson needed


def grade_pair(st: Settings, student: str, a: str, path: Path, release_nb) -> tuple[Path, bool,
                                                                                      list[str]]:
    """Grade one student's notebook `a` (the file at `path`) in a course folder of its own,
    course/work/<student>/<a>/: its own gradebook, nbgrader process, kernel, runs/ folder,
    ports and cluster, so that pairs can run at once. The course's gradebook and folders are
    not touched (merge_pair does that, in one thread).

    Returns (that folder, whether autograde succeeded, what happened: deleted cells put back,
    a failed autograde, the kernel ended, cells that raised)."""
    notes: list[str] = []
    work = st.course / "work" / student / a
    shutil.rmtree(work, ignore_errors=True)
    (work / "source" / a).mkdir(parents=True)
    shutil.copy(st.course / "source" / a / f"{a}.ipynb", work / "source" / a)
    shutil.copy(st.course / "work" / "assignments.db", work / "gradebook.db")
    nb = with_points(nbformat.read(str(path), as_version=4), strict=False)
    restored = repair(nb, release_nb)
    if restored:
        notes.append("put back deleted cells: " + ", ".join(restored))
    target = work / "submitted" / student / a / f"{a}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(nb, str(target))
    # Its own runs/ folder: what it reads from earlier lessons comes from the course's
    # reference runs, not from this student's other notebooks.
    runs = prepare_runs(work / "runs", a, st.references)
    here = work / "autograded" / student / a  # nbgrader runs the notebook in this folder
    here.mkdir(parents=True)
    env = dict(os.environ, LABS_RUNS_DIR=str(runs), LABS_QUICK="1" if st.quick else "0",
               MPLBACKEND="Agg")
    # the kernel's sockets: a short path of its own (a Unix socket's path has ~100 bytes)
    sockets = Path(tempfile.mkdtemp(prefix="labs-kernel-"))
    try:
        if st.sandbox:
            sandbox.write_kernel(work / "jupyter", sandbox.bwrap_command(
                writable=[runs, sockets], hidden=[st.course, *st.hidden], workdir=here,
                readable=[here]))
            # the kernel's connection file is a temporary file of nbgrader's: it goes there too
            env.update(JUPYTER_PATH=str(work / "jupyter"), TMPDIR=str(sockets))
        write_config(work, st.timeout, sandbox.KERNEL_NAME if st.sandbox else None,
                     sockets / "kernel")
        guard = sandbox.MemoryGuard(st.memory_mb)
        status, log = autograde(work, a, student, nb, target, env, st.timeout, notes,
                                st.course / "logs", guard)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    ok = status == 0 and (here / f"{a}.ipynb").is_file()
    if not ok:
        last = [line for line in log.splitlines() if "ERROR" in line][-1:]
        notes.append(f"nbgrader autograde failed ({status}): 0 points for this notebook; "
                     f"see logs/autograde-{student}-{a}.log"
                     + (f" ({last[0].strip()[:160]})" if last else ""))
        return work, False, notes
    notes += cell_errors(here / f"{a}.ipynb")
    return work, True, notes


def feedback(course: Path, assignment: str, students: list[str]) -> str | None:
    """nbgrader's feedback pages of `assignment` for `students`, all in one nbgrader process
    (its start costs about as much as grading a notebook that does no work); None, or what
    went wrong."""
    others = sorted({p.name for p in (course / "autograded").iterdir()} - set(students))
    status, _ = nbgrader(course, "generate_feedback", assignment, "--force",
                         f"--CourseDirectory.student_id_exclude={','.join(others)}",
                         log=course / "logs" / f"feedback-{assignment}.log")
    return None if status == 0 else (f"nbgrader generate_feedback failed ({status}); see "
                                     f"logs/feedback-{assignment}.log")


def merge_pair(course: Path, work: Path, student: str, a: str, ok: bool) -> None:
    """Bring one graded pair from its own folder into the course (gradebook and folders),
    then remove that folder. A failed autograde leaves no grade and no feedback."""
    if ok:
        copy_submission(work, course, a, student)
        replace_files(work, course, a, student)
    else:
        forget_submission(course, a, student)
        replace_files(work, course, a, student, parts=("submitted",))
        replace_files(work / "none", course, a, student, parts=("autograded", "feedback"))
    shutil.rmtree(work)
    if not any(work.parent.iterdir()):
        work.parent.rmdir()  # the student's folder under work/, once their last pair is merged


def assignments_db(course: Path) -> None:
    """course/work/assignments.db: the gradebook with the assignments and no student, from
    which each pair's own gradebook starts (it never holds another student's grades)."""
    target = course / "work" / "assignments.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        shutil.copy(course / "gradebook.db", tmp)
        with gradebook_at(tmp) as gb:
            for student in [s.id for s in gb.students]:
                gb.remove_student(student)
        con = sqlite3.connect(tmp)  # removed rows must not linger in free pages
        con.execute("VACUUM")
        con.close()


def grade(submissions: Path, course: Path = DEFAULT_COURSE, quick: bool = True,
          timeout: int = 600, src: Path | None = None, say=print,
          students: list[str] | None = None, regrade: bool = False,
          progress: bool = False, jobs: int = 1, sandboxed: bool = True,
          memory_mb: int | None = None, shard: tuple[int, int] | None = None) -> list[dict]:
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
        raise FileNotFoundError(f"SUBMISSIONS={submissions} is not a folder: give the folder "
                                f"that holds one sub-folder per student")
    folders = sorted(p.name for p in submissions.iterdir()
                     if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise ValueError(f"{submissions} holds no student folder: lay it out as "
                         f"<SUBMISSIONS>/<student>/<notebook>.ipynb")
    unknown = sorted(set(students or ()) - set(folders))
    if unknown:
        raise ValueError(f"STUDENTS names {', '.join(unknown)}, with no folder in {submissions}; "
                         f"its student folders: {', '.join(folders)}")
    if jobs < 1:
        raise ValueError(f"JOBS={jobs}: give how many notebooks to grade at once, 1 or more")
    if sandboxed:
        reason = sandbox.unavailable_reason()
        if reason:
            raise RuntimeError(f"cannot sandbox students' code here: {reason}. Grade on a Linux "
                               f"machine that has bubblewrap, or run it unsandboxed, with your "
                               f"own rights, with SANDBOX=0")
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
            if (stamp and not regrade and earlier.get("stamp") == stamp
                    and has_submission(course, a, student)):
                notes = earlier["notes"] + ["unchanged since it was graded: kept its grade "
                                            "(REGRADE=1 grades it again)"]
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
            bar.done(student, a, graded=False, failed=any("not a valid notebook" in n
                                                          for n in notes))
    if todo:
        assignments_db(course)
        needed = {lesson for _, a, _, _ in todo for lesson, _ in NEEDS.get(a, [])}
        st = Settings(course, quick, timeout, sandboxed,
                      memory_mb or sandbox.default_memory_mb(jobs),
                      hidden=hidden,
                      references={lesson: reference_runs(course, lesson, quick, timeout, src, say)
                                  for lesson in sorted(needed)})
        STOPPING.clear()
        graded_ok: dict[str, list[str]] = {}  # notebook -> students graded now, to give feedback
        pool = ThreadPoolExecutor(max_workers=jobs)
        running = {}
        for student, a, f, stamp in todo:
            future = pool.submit(_timed, bar, st, student, a, f.path, releases[a])
            running[future] = (student, a, f, stamp)
        try:
            for future in as_completed(running):  # merged here: one writer to the gradebook
                student, a, f, stamp = running[future]
                seconds, (work, ok, notes) = future.result()
                merge_pair(course, work, student, a, ok)
                notes = f.notes + notes + ([] if sandboxed else [UNSANDBOXED])
                if stamp:
                    write_json(course / "graded" / student / f"{a}.json",
                               {"stamp": stamp, "notes": notes})
                report[student, a] = (seconds, notes, "graded")
                if ok:
                    graded_ok.setdefault(a, []).append(student)
                bar.done(student, a, graded=True,
                         failed=any("autograde failed" in n for n in notes))
        except BaseException:  # Ctrl-C, or a pair failed in our code: end every pair's processes
            pool.shutdown(wait=False, cancel_futures=True)
            stop_all()
            pool.shutdown(wait=True)
            STOPPING.clear()
            bar.close()
            raise
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


def _timed(bar, st: Settings, student: str, a: str, path: Path, release_nb):
    bar.start(student, a)
    t0 = time.perf_counter()
    result = grade_pair(st, student, a, path, release_nb)
    return time.perf_counter() - t0, result
