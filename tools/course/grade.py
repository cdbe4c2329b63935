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
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat

from helpers.data.downloads import sha256_of
from helpers.files import atomic_path, write_json
from tools.course.nbgrader_course import (DEFAULT_COURSE, KILLED, ROOT, end_processes, gradebook,
                                          nbgrader, nbgrader_cells, with_points)
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


def forget_submission(course: Path, assignment: str, student: str) -> None:
    """Remove a student's graded submission of one notebook from the gradebook, if any."""
    from nbgrader.api import MissingEntry

    with gradebook(course) as gb:
        try:
            gb.remove_submission(assignment, student)
        except MissingEntry:
            pass


def has_submission(course: Path, assignment: str, student: str) -> bool:
    """Whether the gradebook holds a graded submission of this notebook by this student."""
    from nbgrader.api import MissingEntry

    with gradebook(course) as gb:
        try:
            gb.find_submission_notebook(assignment, assignment, student)
        except MissingEntry:
            return False
    return True


def autograde(course: Path, assignment: str, student: str, nb, target: Path, env: dict,
              timeout: int, notes: list[str]) -> tuple[int | str, str]:
    """nbgrader autograde of one submitted notebook (already at `target`).

    When a cell of the student's kills the kernel (or hangs it past interrupting), nbgrader
    fails the whole notebook; that cell is then replaced by an error and the notebook graded
    again, so the tests before and after it still count. At most two such cells.
    """
    trace = course / "logs" / f"trace-{student}-{assignment}"
    limit = timeout * (sum(c.cell_type == "code" for c in nb.cells) + 2)
    for _ in range(3):
        trace.unlink(missing_ok=True)
        status, log = nbgrader(course, "autograde", assignment, "--student", student, "--force",
                               env=dict(env, LABS_GRADING_TRACE=str(trace)), limit=limit,
                               log=course / "logs" / f"autograde-{student}-{assignment}.log")
        stuck = isinstance(status, str)  # nbgrader itself ran past the wall-clock limit
        died = stuck or "DeadKernelError" in log or "UnresponsiveKernelError" in log
        if status == 0 or not died or not trace.is_file():
            return status, log
        index = int(trace.read_text())
        meta = nb.cells[index].get("metadata", {}).get("nbgrader", {})
        if not meta.get("solution"):
            notes.append(f"the kernel died in cell {index}, which is not a solution cell")
            return status, log
        how = "Kernel died" if "DeadKernelError" in log else f"kernel stuck, {status}"
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


def prepare_runs(course: Path, student: str, assignment: str, quick: bool, timeout: int,
                 src: Path | None = None, say=print) -> Path:
    """A fresh runs/ folder for one (student, notebook), holding what the notebook reads from
    earlier lessons, copied from the course's reference runs."""
    runs = course / "runs" / student / assignment
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    for lesson, part in NEEDS.get(assignment, []):
        shutil.copytree(reference_runs(course, lesson, quick, timeout, src, say) / part,
                        runs / part)
    return runs


def submission_stamp(f: Found, source_sha256: str, quick: bool) -> str | None:
    """What a notebook's grade depends on, hashed: the file handed in, the lesson's source
    (tests and points, hashed once per grading) and the mode. None when nothing gradable
    was handed in."""
    if f.path is None:
        return None
    parts = f"{sha256_of(f.path)} {source_sha256} {'quick' if quick else 'full'}"
    return hashlib.sha256(parts.encode()).hexdigest()


def grade_pair(course: Path, student: str, a: str, f: Found, release_nb, quick: bool,
               timeout: int, src: Path | None, say) -> None:
    """Grade one student's notebook `a` (what `f` found of it) into the gradebook; add to
    f.notes what happened (deleted cells put back, a failed autograde, cells that raised).

    A notebook not in the folder keeps its earlier grade, and with it its submitted and
    autograded copies, from which its feedback is made again."""
    if f.path is None and not f.notes:  # absent, not broken: keep an earlier grade
        f.notes.append("not in this folder: kept its grade from an earlier run"
                       if has_submission(course, a, student) else "not handed in: 0 points")
        return
    target = course / "submitted" / student / a / f"{a}.ipynb"
    shutil.rmtree(target.parent, ignore_errors=True)
    if f.path is not None:
        nb = with_points(nbformat.read(str(f.path), as_version=4), strict=False)
        restored = repair(nb, release_nb)
        if restored:
            f.notes.append("put back deleted cells: " + ", ".join(restored))
        target.parent.mkdir(parents=True)
        nbformat.write(nb, str(target))
    autograded = course / "autograded" / student / a / f"{a}.ipynb"
    shutil.rmtree(autograded.parent, ignore_errors=True)
    if f.path is None:
        forget_submission(course, a, student)  # broken: an earlier grade must go
        return
    # Its own runs/ folder: what it reads from earlier lessons comes from the course's
    # reference runs, not from this student's other notebooks.
    runs = prepare_runs(course, student, a, quick, timeout, src, say)
    env = dict(os.environ, LABS_RUNS_DIR=str(runs), LABS_QUICK="1" if quick else "0",
               MPLBACKEND="Agg")
    status, log = autograde(course, a, student, nb, target, env, timeout, f.notes)
    if status != 0 or not autograded.is_file():
        forget_submission(course, a, student)
        last = [line for line in log.splitlines() if "ERROR" in line][-1:]
        f.notes.append(f"nbgrader autograde failed ({status}): 0 points for this notebook; "
                       f"see logs/autograde-{student}-{a}.log"
                       + (f" ({last[0].strip()[:160]})" if last else ""))
    f.notes += cell_errors(autograded)


def grade(submissions: Path, course: Path = DEFAULT_COURSE, quick: bool = True,
          timeout: int = 600, src: Path | None = None, say=print,
          students: list[str] | None = None, regrade: bool = False,
          progress: bool = False) -> list[dict]:
    """Autograde every student's folder in `submissions`; write grades.csv and feedback.

    Returns the rows of grades.csv, for the students graded. Other students' grades in the
    gradebook are kept, and so is a student's earlier grade for a notebook that is not in
    their folder this time (notebooks can be handed in one at a time).

    Args:
        students: grade only these (folder names); all when None.
        regrade: grade again a notebook that is unchanged since it was last graded (same
            file, same lesson, same mode); otherwise its grade is kept without running it.
        progress: show a progress line with an ETA (GradingProgress) on stderr.
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
    students = sorted(set(students)) if students else folders
    course = Path(course).resolve()
    release(course, src, timeout)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    sources = {a: read(course / "source" / a / f"{a}.ipynb") for a in assignments}
    releases = {a: read(course / "release" / a / f"{a}.ipynb") for a in assignments}
    cells = {a: nbgrader_cells(nb) for a, nb in sources.items()}
    source_sha256 = {a: sha256_of(course / "source" / a / f"{a}.ipynb") for a in assignments}
    report = []
    bar = GradingProgress([(s, a) for s in students for a in assignments], quick, progress)
    for student in students:
        found = find_submissions(submissions / student, cells)
        shutil.rmtree(course / "runs" / student, ignore_errors=True)
        changed = False
        for a in assignments:
            t0, f = time.perf_counter(), found[a]
            bar.start(student, a)
            stamp = submission_stamp(f, source_sha256[a], quick)
            kept = course / "graded" / student / f"{a}.json"
            earlier = json.loads(kept.read_text()) if kept.is_file() else {}
            if (stamp and not regrade and earlier.get("stamp") == stamp
                    and has_submission(course, a, student)):
                f.notes += earlier["notes"] + ["unchanged since it was graded: kept its grade "
                                               "(REGRADE=1 grades it again)"]
                ran = False
            else:
                before = len(f.notes)
                broken = f.path is None and before > 0  # its earlier grade and feedback go
                grade_pair(course, student, a, f, releases[a], quick, timeout, src, say)
                ran = f.path is not None
                changed = changed or ran or broken
                if stamp:
                    write_json(kept, {"stamp": stamp, "notes": f.notes[before:]})
            failed = any("autograde failed" in n or "not a valid notebook" in n for n in f.notes)
            bar.done(a, ran, failed)
            report.append((student, a, time.perf_counter() - t0, f.notes))
        if changed:  # feedback for what was graded now; an unchanged student's stays as it was
            feedback = course / "feedback" / student
            shutil.rmtree(feedback, ignore_errors=True)
            nbgrader(course, "generate_feedback", "*", "--student", student, "--force",
                     log=course / "logs" / f"feedback-{student}.log")
    bar.close()
    rows = gradebook_rows(course, students, assignments)
    write_report(course, rows, report, say)
    return rows
