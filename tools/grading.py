"""Autograde a class's submissions with nbgrader, one process per (student, notebook).

`python tools/course.py grade SUBMISSIONS` (or `make grade SUBMISSIONS=...`) calls `grade`.
nbgrader does the grading and keeps the gradebook; this module is what it lacks for a class
handing in files (see tools/course.py), and reads grades.csv back from nbgrader's database.
"""
from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tools.course import (DEFAULT_COURSE, KILLED, ROOT, end_processes, grade_id, gradebook,
                          nbgrader, nbgrader_cells, release, with_points)
from helpers.files import atomic_path
from tools.notebooks import NOTEBOOK_DIR, read

# What a lesson reads from an earlier one: {notebook: [(earlier notebook, path under runs/)]}.
# When a notebook is graded, these come from the course's own reference run of the earlier
# lesson (its solutions, made once per mode and reused), never from the student's own copy: a
# notebook's grade never depends on the student's other notebooks.
NEEDS: dict[str, list[tuple[str, str]]] = {
    "02_logreg_lr_schedules": [("01_doc2vec_dbpedia", "features/doc2vec_dbpedia")],
}

# How a cell's error reads in the report: an interrupted cell is one that ran past the timeout.
_ERROR_NAMES = {"KeyboardInterrupt": "ran past the timeout and was interrupted",
                "CellTimeoutError": "ran past the timeout and was interrupted"}


@dataclass
class Found:
    """What was handed in for one (student, notebook), and what was done about it."""
    path: Path | None = None
    notes: list[str] = field(default_factory=list)


def find_submissions(student_dir: Path, notebooks: dict[str, object]) -> dict[str, Found]:
    """Each lesson's notebook in a student's folder (any depth), by assignment id.

    A notebook under another name is matched by the grade ids of its cells; a file that is
    not a notebook is reported and graded as missing.
    """
    found = {nb_id: Found() for nb_id in notebooks}
    strays = []
    for path in sorted(student_dir.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        if path.stem in found and found[path.stem].path is None:
            found[path.stem].path = path
        else:
            strays.append(path)
    for path in strays:
        try:
            ids = set(nbgrader_cells(nbformat.read(str(path), as_version=4)))
        except Exception:  # not a notebook at all: reported below if it is a lesson's name
            ids = set()
        owner = next((nb_id for nb_id, cells in notebooks.items()
                      if ids & set(cells) and found[nb_id].path is None), None)
        if owner:
            found[owner].path = path
            found[owner].notes.append(f"graded {path.name} as {owner}.ipynb (renamed)")
    for nb_id, f in found.items():
        if f.path is None:
            continue
        try:
            with warnings.catch_warnings():  # cells without ids: fixed on writing, not an error
                warnings.simplefilter("ignore", nbformat.validator.MissingIDFieldWarning)
                nbformat.validate(nbformat.read(str(f.path), as_version=4))
        except Exception as exc:  # nbformat raises JSON, schema and encoding errors alike
            what = str(exc).strip().splitlines()[0][:120]
            f.notes.append(f"{f.path.name} is not a valid notebook ({what}): 0 points")
            f.path = None
    return found


def repair(nb, reference) -> list[str]:
    """Put back the release's nbgrader cells a student deleted; what was put back.

    A deleted test cell would make nbgrader fail the whole notebook; put back, it grades
    what the student did (nbgrader then overwrites every locked cell from the source anyway).
    """
    have = set(nbgrader_cells(nb))
    restored = []
    for i, cell in enumerate(reference.cells):
        if grade_id(cell) is None or grade_id(cell) in have:
            continue
        before = [grade_id(c) for c in reference.cells[:i]]
        ids = [grade_id(c) for c in nb.cells]
        anchor = max((ids.index(g) for g in before if g in ids), default=len(nb.cells) - 1)
        nb.cells.insert(anchor + 1, nbformat.from_dict(cell))
        restored.append(grade_id(cell))
    return restored


def _heading(cells, index: int) -> str:
    """The nbgrader id of cell `index`, or the last '## ' heading above it."""
    if grade_id(cells[index]):
        return grade_id(cells[index])
    for cell in reversed(cells[:index]):
        if cell.cell_type == "markdown":
            found = [l.lstrip("#").strip() for l in cell.source.splitlines() if l.startswith("#")]
            if found:
                return f'"{found[-1]}"'
    return "the top of the notebook"


def _error(cell) -> dict | None:
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def _describe(error: dict) -> str:
    name = error.get("ename", "error")
    if name in _ERROR_NAMES:
        return _ERROR_NAMES[name]
    value = " ".join(str(error.get("evalue", "")).split())
    return f"raised {name}: {value[:160]}" if value else f"raised {name}"


def cell_errors(autograded: Path, mark: bool = True) -> list[str]:
    """Which solution and test cells raised in an autograded notebook, and why.

    A cell that failed after a cell it may depend on had failed (a lesson cell, or the
    exercise's own solution; not another exercise's cells) names the first such failure: its
    heading or grade id and the last line of its error. With `mark`, the same sentence is added
    to the failing cell's outputs, so the student's feedback page says it too.
    """
    if not autograded.is_file():
        return []
    nb = read(autograded)
    failed = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _error(c)]
    out = []
    for i in failed:
        gid = grade_id(nb.cells[i])
        if gid is None:
            continue
        own = gid.rsplit("-", 1)[0] + "-solution"
        causes = [j for j in failed if j < i and grade_id(nb.cells[j]) in (None, own)]
        name = _error(nb.cells[i]).get("ename", "error")
        line = f"{gid}: {_ERROR_NAMES.get(name, name)}"
        if causes:
            first = causes[0]
            cause = (f"after cell {first} {_heading(nb.cells, first)} "
                     f"{_describe(_error(nb.cells[first]))}")
            line += f", {cause}"
            if mark:
                nb.cells[i].outputs.append(nbformat.v4.new_output(
                    "stream", name="stderr", text=f"This cell failed {cause}.\n"))
        out.append(line)
    if mark and out:
        nbformat.write(nb, str(autograded))
    return out


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


def gradebook_rows(course: Path, students: list[str], assignments: list[str]) -> list[dict]:
    """(student, notebook, exercise, points, max points) for every test cell, from the gradebook."""
    from nbgrader.api import MissingEntry

    rows = []
    with gradebook(course) as gb:
        for student in students:
            for assignment in assignments:
                try:
                    grades = gb.find_submission_notebook(assignment, assignment, student).grades
                except MissingEntry:
                    grades = None
                if grades is None:  # never graded: every test cell scores 0
                    cells = gb.find_notebook(assignment, assignment).grade_cells
                    pairs = [(c.name, 0.0, c.max_score) for c in cells]
                else:
                    pairs = [(g.cell.name, g.score, g.max_score) for g in grades
                             if g.cell.name.endswith("-test")]
                for name, score, max_score in sorted(pairs):
                    rows.append({"student": student, "notebook": assignment,
                                 "exercise": name.removesuffix("-test"),
                                 "points": float(score or 0), "max_points": float(max_score)})
    return rows


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
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
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


def grade(submissions: Path, course: Path = DEFAULT_COURSE, quick: bool = True,
          timeout: int = 600, src: Path | None = None, say=print) -> list[dict]:
    """Autograde every student's folder in `submissions`; write grades.csv and feedback.

    Returns the rows of grades.csv, for the students in `submissions`. Other students'
    grades in the gradebook are kept, and so is a student's earlier grade for a notebook that
    is not in their folder this time (notebooks can be handed in one at a time).
    """
    submissions = Path(submissions).resolve()
    if not submissions.is_dir():
        raise FileNotFoundError(f"SUBMISSIONS={submissions} is not a folder: give the folder "
                                f"that holds one sub-folder per student")
    students = sorted(p.name for p in submissions.iterdir()
                      if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise ValueError(f"{submissions} holds no student folder: lay it out as "
                         f"<SUBMISSIONS>/<student>/<notebook>.ipynb")
    course = Path(course).resolve()
    release(course, src, timeout)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    sources = {a: read(course / "source" / a / f"{a}.ipynb") for a in assignments}
    releases = {a: read(course / "release" / a / f"{a}.ipynb") for a in assignments}
    cells = {a: nbgrader_cells(nb) for a, nb in sources.items()}
    report = []
    for student in students:
        found = find_submissions(submissions / student, cells)
        shutil.rmtree(course / "runs" / student, ignore_errors=True)
        for a in assignments:
            f, t0 = found[a], time.perf_counter()
            target = course / "submitted" / student / a / f"{a}.ipynb"
            shutil.rmtree(target.parent, ignore_errors=True)
            if f.path is not None:
                nb = with_points(nbformat.read(str(f.path), as_version=4), strict=False)
                restored = repair(nb, releases[a])
                if restored:
                    f.notes.append("put back deleted cells: " + ", ".join(restored))
                target.parent.mkdir(parents=True)
                nbformat.write(nb, str(target))
            autograded = course / "autograded" / student / a / f"{a}.ipynb"
            shutil.rmtree(autograded.parent, ignore_errors=True)
            if f.path is None and not f.notes:  # absent, not broken: keep an earlier grade
                f.notes.append("not in this folder: kept its grade from an earlier run"
                               if has_submission(course, a, student)
                               else "not handed in: 0 points")
            elif f.path is None:
                forget_submission(course, a, student)  # broken: an earlier grade must go
            else:
                # Its own runs/ folder: what it reads from earlier lessons comes from the
                # course's reference runs, not from this student's other notebooks.
                runs = prepare_runs(course, student, a, quick, timeout, src, say)
                env = dict(os.environ, LABS_RUNS_DIR=str(runs),
                           LABS_QUICK="1" if quick else "0", MPLBACKEND="Agg")
                status, log = autograde(course, a, student, nb, target, env, timeout, f.notes)
                if status != 0 or not autograded.is_file():
                    forget_submission(course, a, student)
                    last = [l for l in log.splitlines() if "ERROR" in l][-1:]
                    f.notes.append(f"nbgrader autograde failed ({status}): 0 points for this "
                                   f"notebook; see logs/autograde-{student}-{a}.log"
                                   + (f" ({last[0].strip()[:160]})" if last else ""))
                f.notes += cell_errors(autograded)
            report.append((student, a, time.perf_counter() - t0, f.notes))
        feedback = course / "feedback" / student
        shutil.rmtree(feedback, ignore_errors=True)
        nbgrader(course, "generate_feedback", "*", "--student", student, "--force",
                 log=course / "logs" / f"feedback-{student}.log")
    rows = gradebook_rows(course, students, assignments)
    with atomic_path(course / "grades.csv") as tmp, open(tmp, "w", newline="") as out:
        writer = csv.DictWriter(out, ["student", "notebook", "exercise", "points", "max_points"])
        writer.writeheader()
        writer.writerows(rows)
    lines = []
    for student, a, seconds, notes in report:
        got = sum(r["points"] for r in rows if r["student"] == student and r["notebook"] == a)
        top = sum(r["max_points"] for r in rows if r["student"] == student and r["notebook"] == a)
        lines.append(f"{student:16s} {a:34s} {got:5.1f} / {top:4.1f}  {seconds:6.1f} s")
        lines += [f"{'':18s}- {note}" for note in notes]
    with atomic_path(course / "report.txt") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    for line in lines:
        say(line)
    say(f"grades: {course / 'grades.csv'}; feedback: {course / 'feedback'}/<student>/<notebook>/")
    return rows
