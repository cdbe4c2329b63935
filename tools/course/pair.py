"""One (student, notebook) graded in a course folder of its own, and merged into the course.

Each pair gets course/work/<student>/<notebook>/: its own gradebook (the assignments only),
nbgrader process, kernel (sandboxed), runs/ folder, ports and cluster, so that several pairs
run at once; merge_pair, called by one thread only, brings the result into the course.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.files import atomic_path
from tools.course import sandbox, sentinel, tamper
from tools.course.lessons import NEEDS
from tools.course.merge import copy_submission, forget_submission, replace_files
from tools.course.nbgrader_course import KILLED, gradebook_at, nbgrader, with_points, write_config
from tools.course.report import cell_errors
from tools.course.submissions import repair
from tools.notebooks import grade_id


def autograde(
    work: Path,
    assignment: str,
    student: str,
    nb,
    target: Path,
    env: dict,
    timeout: int,
    notes: list[str],
    logs: Path,
    guard=None,
) -> tuple[int | str, str]:
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
        status, log = nbgrader(
            work,
            "autograde",
            assignment,
            "--student",
            student,
            "--force",
            env=dict(env, LABS_GRADING_TRACE=str(trace)),
            limit=limit,
            log=logs / f"autograde-{student}-{assignment}.log",
            guard=guard,
        )
        tripped = guard is not None and guard.tripped
        stuck = isinstance(status, str)  # nbgrader itself ran past the wall-clock limit
        died = stuck or tripped or "DeadKernelError" in log or "UnresponsiveKernelError" in log
        if status == 0 and not tripped or not died or not trace.is_file():
            return status, log
        index = int(trace.read_text())
        meta = nb.cells[index].get("metadata", {}).get("nbgrader", {})
        if not meta.get("solution"):
            where = sentinel.student_index(nb, index)
            notes.append(f"the kernel died in cell {where}, which is not a solution cell")
            return status, log
        how = (
            f"it used more than the memory limit of {guard.limit_mb:,.0f} MB"
            if tripped
            else "Kernel died"
            if "DeadKernelError" in log
            else f"kernel stuck, {status}"
        )
        notes.append(
            f"{grade_id(nb.cells[index])}: ended the kernel ({how}); graded again with that "
            f"cell replaced by an error"
        )
        nb.cells[index].source = KILLED
        nbformat.write(nb, str(target))
    return status, log


def prepare_runs(runs: Path, assignment: str, references: dict[str, Path]) -> Path:
    """A fresh runs/ folder at `runs` for one (student, notebook), holding what the notebook
    reads from earlier lessons, copied from the course's reference runs (`references`, by
    lesson, as reference_runs returned them)."""
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    for lesson, part in NEEDS.get(assignment, []):
        shutil.copytree(references[lesson] / part, runs / part)
    return runs


@dataclass
class Settings:
    """How one grading run grades each pair (the same for every pair)."""

    course: Path
    quick: bool
    timeout: int
    sandbox: bool
    memory_mb: int
    hidden: list[Path]  # folders the sandbox hides besides the course's own
    references: dict[str, Path]  # runs/ of the course's reference run of each lesson needed


@dataclass
class PairRun:
    """One pair graded in its own folder, not yet merged into the course."""

    work: Path  # its course folder, course/work/<student>/<notebook>/
    ok: bool  # whether nbgrader's autograde succeeded
    notes: list[str]  # what happened: cells put back, the kernel ended, cells that raised
    seconds: float = 0.0  # how long it took


def grade_pair(st: Settings, student: str, a: str, path: Path, release_nb) -> PairRun:
    """Grade one student's notebook `a` (the file at `path`) in a course folder of its own,
    course/work/<student>/<a>/: its own gradebook, nbgrader process, kernel, runs/ folder,
    ports and cluster, so that pairs can run at once. The course's gradebook and folders are
    not touched (merge_pair does that, in one thread).

    Returns that folder, whether autograde succeeded, and what happened: deleted cells put
    back, a failed autograde, the kernel ended, cells that raised."""
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
    # read before it runs (a cell that ends the kernel is replaced when graded again)
    source = nbformat.read(str(work / "source" / a / f"{a}.ipynb"), as_version=4)
    flagged = tamper.flag_notes(tamper.scan(nb, source), nb, source)
    target = work / "submitted" / student / a / f"{a}.ipynb"
    target.parent.mkdir(parents=True)
    nb = sentinel.guarded(nb, source)  # the runtime check's cells, taken out after grading
    nbformat.write(nb, str(target))
    # Its own runs/ folder: what it reads from earlier lessons comes from the course's
    # reference runs, not from this student's other notebooks.
    runs = prepare_runs(work / "runs", a, st.references)
    here = work / "autograded" / student / a  # nbgrader runs the notebook in this folder
    here.mkdir(parents=True)
    env = dict(
        os.environ, LABS_RUNS_DIR=str(runs), LABS_QUICK="1" if st.quick else "0", MPLBACKEND="Agg"
    )
    # the kernel's sockets: a short path of its own (a Unix socket's path has ~100 bytes)
    sockets = Path(tempfile.mkdtemp(prefix="labs-kernel-"))
    try:
        if st.sandbox:
            sandbox.write_kernel(
                work / "jupyter",
                sandbox.bwrap_command(
                    writable=[runs, sockets],
                    hidden=[st.course, *st.hidden],
                    workdir=here,
                    readable=[here],
                ),
            )
            # the kernel's connection file is a temporary file of nbgrader's: it goes there too
            env.update(JUPYTER_PATH=str(work / "jupyter"), TMPDIR=str(sockets))
        write_config(
            work, st.timeout, sandbox.KERNEL_NAME if st.sandbox else None, sockets / "kernel"
        )
        guard = sandbox.MemoryGuard(st.memory_mb)
        status, log = autograde(
            work, a, student, nb, target, env, st.timeout, notes, st.course / "logs", guard
        )
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    ok = status == 0 and (here / f"{a}.ipynb").is_file()
    if not ok:
        last = [line for line in log.splitlines() if "ERROR" in line][-1:]
        notes.append(
            f"nbgrader autograde failed ({status}): 0 points for this notebook; "
            f"see logs/autograde-{student}-{a}.log"
            + (f" ({last[0].strip()[:160]})" if last else "")
        )
        return PairRun(work, False, notes + [note for note, _ in flagged])
    flagged += seen_running(here / f"{a}.ipynb", source, flagged)
    notes += cell_errors(here / f"{a}.ipynb")
    if flagged:
        zero_tampered(work, a, student, flagged)
        notes += [note for note, _ in flagged]
    return PairRun(work, True, notes)


def seen_running(autograded: Path, source, flagged: list[tuple[str, dict]]):
    """The runtime check's findings (tools/course/sentinel.py) as report notes, with the
    grader's cells taken out of the autograded notebook; a finding is left out when the scan's
    findings (`flagged`) already cost every exercise it costs."""
    lost = {exercise for _, costs in flagged for exercise in costs}
    found, submitted = sentinel.verdicts(autograded, source)
    return [
        (note, costs)
        for note, costs in tamper.flag_notes(found, submitted, source)
        if not set(costs) <= lost
    ]


def zero_tampered(work: Path, a: str, student: str, flagged: list[tuple[str, dict]]) -> None:
    """In the pair's gradebook: 0 points (a manual score, which nbgrader's grade and feedback
    then show) for every exercise a finding costs, and the reason as the comment of the
    solution cell that holds it, so the student's feedback page says why."""
    from nbgrader.api import MissingEntry

    reasons: dict[str, list[str]] = {}
    for _, lost in flagged:
        for exercise, why in lost.items():
            reasons.setdefault(exercise, []).append(why)
    with gradebook_at(work / "gradebook.db") as gb:
        for exercise, whys in reasons.items():
            gb.find_grade(f"{exercise}-test", a, a, student).manual_score = 0.0
            try:
                comment = gb.find_comment(f"{exercise}-solution", a, a, student)
                comment.manual_comment = "0 points: " + "; ".join(whys)
            except MissingEntry:
                pass
        gb.db.commit()


def feedback(course: Path, assignment: str, students: list[str]) -> str | None:
    """nbgrader's feedback pages of `assignment` (a glob: "*" is every notebook) for
    `students`, all in one nbgrader process (its start costs about as much as grading a
    notebook that does no work); None, or what went wrong."""
    others = sorted({p.name for p in (course / "autograded").iterdir()} - set(students))
    name = "all" if assignment == "*" else assignment
    status, _ = nbgrader(
        course,
        "generate_feedback",
        assignment,
        "--force",
        f"--CourseDirectory.student_id_exclude={','.join(others)}",
        log=course / "logs" / f"feedback-{name}.log",
    )
    return (
        None
        if status == 0
        else (f"nbgrader generate_feedback failed ({status}); see logs/feedback-{name}.log")
    )


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


def timed_pair(bar, st: Settings, student: str, a: str, path: Path, release_nb) -> PairRun:
    """grade_pair, shown on the progress line while it runs, with the seconds it took."""
    bar.start(student, a)
    t0 = time.perf_counter()
    run = grade_pair(st, student, a, path, release_nb)
    run.seconds = time.perf_counter() - t0
    return run
