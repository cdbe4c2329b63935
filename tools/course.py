"""The collection as an nbgrader course: a student release, and autograding into a gradebook.

    python tools/course.py release [--course build/course]
    python tools/course.py grade SUBMISSIONS [--course build/course] [--full] [--timeout 600]

Each lesson notebook is one nbgrader assignment of one notebook (id = its file stem, e.g.
`01_doc2vec_dbpedia`), so a course can release them one at a time and a broken notebook costs
only its own points. The lessons already carry nbgrader's cell metadata and BEGIN/END SOLUTION
and HIDDEN TESTS regions; the points of every test cell are set here, in POINTS, and written
into the course's source copies.

The work is nbgrader's: generate_assignment, autograde, generate_feedback, and its SQLite
gradebook, which grades.csv is read back from. Ours (here and in tools/grading.py) is only
what nbgrader lacks for a class handing in files: finding each student's notebooks in a folder
(renamed ones too), setting aside notebooks that are not valid JSON, putting back test cells a
student deleted, one process per (student, notebook) with a wall-clock limit, grading again
without a cell that killed the kernel, and ending every process a submission started, by PID.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402
import psutil  # noqa: E402

import helpers  # noqa: E402,F401  (quiets TensorFlow in every kernel: they inherit os.environ)
from tools.notebooks import notebook_paths, read  # noqa: E402

COURSE_ID = "scaling-ml-labs"
DEFAULT_COURSE = ROOT / "build" / "course"

# Points of each exercise's test cell, by nbgrader grade id: the one place to change them.
POINTS: dict[str, int] = {
    "nb01-ex1-test": 3, "nb01-ex2-test": 2, "nb01-ex3-test": 2, "nb01-ex4-test": 2,
    "nb02-ex1-test": 3, "nb02-ex2-test": 2, "nb02-ex3-test": 3,
    "nb03-ex1-test": 2, "nb03-ex2-test": 2, "nb03-ex3-test": 3, "nb03-ex4-test": 2,
    "nb04-ex1-test": 3, "nb04-ex2-test": 2, "nb04-ex3-test": 2, "nb04-ex4-test": 2,
    "nb05-ex1-test": 3, "nb05-ex2-test": 2, "nb05-ex3-test": 3,
    "nb06-ex1-test": 3, "nb06-ex2-test": 2, "nb06-ex3-test": 3,
    "nb07-ex1-test": 2, "nb07-ex2-test": 2, "nb07-ex3-test": 3,
    "nb08-ex1-test": 2, "nb08-ex2-test": 2, "nb08-ex3-test": 2, "nb08-ex4-test": 2,
}

CONFIG = """\
# Written by tools/course.py: the nbgrader configuration of this course folder.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True
# nbclient waits 4 s for a cell's last output after its reply, then fails the whole notebook:
# on a loaded machine (or after interrupting a hung cell) that comes too soon.
c.Execute.iopub_timeout = 30
c.Execute.raise_on_iopub_timeout = False
"""
# Appended as is (not formatted): note which cell runs, so that a cell that kills the kernel
# can be named and set aside (tools/course.py), instead of costing the whole notebook.
TRACE_HOOK = """
import os


def _note_cell(cell, cell_index, **_):
    path = os.environ.get("LABS_GRADING_TRACE")
    if path:
        with open(path, "w") as f:
            f.write(str(cell_index))


c.Execute.on_cell_execute = _note_cell
"""
KILLED = ('raise RuntimeError("This cell ended the Python kernel while it was graded, so it was '
          'not run again: 0 points for the tests that need it.")\n')


def grade_id(cell) -> str | None:
    """A cell's nbgrader grade id, or None for a cell nbgrader does not track."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def nbgrader_cells(nb) -> dict[str, dict]:
    """The cells of a notebook that nbgrader tracks, by grade id."""
    return {grade_id(c): c for c in nb.cells if grade_id(c) is not None}


def db_url(course: Path) -> str:
    """The URL of the course's gradebook, nbgrader's SQLite database."""
    return f"sqlite:///{Path(course) / 'gradebook.db'}"


def gradebook(course: Path):
    """nbgrader's Gradebook of the course, as a context manager."""
    from nbgrader.api import Gradebook

    return Gradebook(db_url(course), COURSE_ID)


def with_points(nb, points: dict[str, int] = POINTS, strict: bool = True):
    """A copy of a lesson with the points of every test cell set from `points`.

    Not strict (a student's copy): cells unknown to `points` are left as they are.
    """
    out = nbformat.from_dict(nb)
    for grade_id, cell in nbgrader_cells(out).items():
        if cell.metadata["nbgrader"].get("grade"):
            if grade_id not in points and not strict:
                continue
            if grade_id not in points:
                raise KeyError(f"test cell {grade_id!r} has no points: add it to POINTS in "
                               f"{Path(__file__).name}")
            cell.metadata["nbgrader"]["points"] = points[grade_id]
    return out


def write_config(course: Path, timeout: int) -> None:
    (course / "nbgrader_config.py").write_text(CONFIG.format(
        course_id=COURSE_ID, root=str(course), db_url=db_url(course),
        timeout=int(timeout)) + TRACE_HOOK)


def nbgrader(course: Path, *args: str, env: dict | None = None, limit: float | None = None,
             log: Path | None = None) -> tuple[int | str, str]:
    """Run one nbgrader command in the course folder; end everything it started, by PID.

    Returns (exit code, or "timed out after N s"; its output). Every process it starts (the
    kernel, and whatever a submission starts from there) carries a token in its environment,
    so those that outlive it are found and ended even when they left its process tree.
    """
    token = uuid.uuid4().hex
    env = dict(env or os.environ, LABS_GRADING_TOKEN=token)
    # nbgrader runs `alembic` (its database migrations) by name: this Python's bin/ must be on
    # PATH, also when the venv was not activated (make calls .venv/bin/python directly).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [sys.executable, "-m", "nbgrader", *args]
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(cmd, cwd=course, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            status: int | str = proc.wait(limit)
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
        finally:
            end_processes(token, proc)
    return status, (log.read_text(errors="replace") if log else "")


def end_processes(token: str, proc: subprocess.Popen | None = None) -> list[int]:
    """SIGKILL every process whose environment holds LABS_GRADING_TOKEN=token; their PIDs."""
    found = []
    if proc is not None and proc.poll() is None:
        found.append(psutil.Process(proc.pid))
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("LABS_GRADING_TOKEN") == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    for p in found:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=10)
    if proc is not None:
        proc.wait()
    return [p.pid for p in found]


def release(course: Path = DEFAULT_COURSE, src: Path | None = None, timeout: int = 600
            ) -> list[Path]:
    """Write the course folder: source/ with points, release/ for students; their paths."""
    course = Path(course).resolve()  # nbgrader reads the root relative to the course folder
    course.mkdir(parents=True, exist_ok=True)
    write_config(course, timeout)
    released = []
    for path in notebook_paths(src) if src else notebook_paths():
        if not nbgrader_cells(read(path)):
            continue  # no exercises: nothing to grade (the index)
        source = course / "source" / path.stem / path.name
        source.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(with_points(read(path)), str(source))
        status, log = nbgrader(course, "generate_assignment", path.stem, "--force",
                               log=course / "logs" / f"release-{path.stem}.log")
        target = course / "release" / path.stem / path.name
        if status != 0 or not target.is_file():
            raise RuntimeError(f"nbgrader generate_assignment {path.stem} failed ({status}):\n"
                               + "\n".join(log.splitlines()[-15:]))
        released.append(target)
    return released


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
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
    args = parser.parse_args(argv)
    if args.command == "release":
        for path in release(args.course, timeout=args.timeout):
            print(f"released {path}")
        return 0
    from tools.grading import grade

    try:
        grade(args.submissions, args.course, quick=not args.full, timeout=args.timeout)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:  # RuntimeError: a lesson's
        print(f"make grade: {exc}", file=sys.stderr)  # own reference run failed
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
