"""The course folder nbgrader works in: its config, a lesson's copy with points, the gradebook,
and running nbgrader; and ending every process a submission started, by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import nbformat
import psutil

import helpers  # noqa: F401  (quiets TensorFlow in every kernel: they inherit os.environ)
from helpers.config import REPO_ROOT as ROOT
from tools.course.lessons import POINTS
from tools.notebooks import grade_id

COURSE_ID = "scaling-ml-labs"
DEFAULT_COURSE = ROOT / "build" / "course"

CONFIG = """\
# Written by python -m tools.course: the nbgrader configuration of this course folder.
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
# `nbgrader export` here writes grades.csv as grading does: points per student and exercise.
import sys  # noqa: E402
sys.path.insert(0, {repo!r})
c.ExportApp.plugin_class = "tools.course.export.ExerciseCsvExport"
"""
# Appended as is (not formatted): note which cell runs, so that a cell that kills the kernel
# can be named and set aside (tools/course/grade.py), instead of costing the whole notebook.
TRACE_HOOK = """
import os


def _note_cell(cell, cell_index, **_):
    path = os.environ.get("LABS_GRADING_TRACE")
    if path:
        with open(path, "w") as f:
            f.write(str(cell_index))


c.Execute.on_cell_execute = _note_cell
"""
# Appended when the kernel runs in the grading sandbox (tools/course/sandbox.py): its kernelspec,
# and Unix sockets to talk to it, as it has no network of its own beyond its loopback.
SANDBOX_CONFIG = """
c.Execute.kernel_name = {kernel!r}
c.KernelManager.transport = "ipc"
c.KernelManager.ip = {sockets!r}
"""
KILLED = (
    'raise RuntimeError("This cell ended the Python kernel while it was graded, so it was '
    'not run again: 0 points for the tests that need it.")\n'
)


def nbgrader_cells(nb) -> dict[str, dict]:
    """The cells of a notebook that nbgrader tracks, by grade id."""
    return {grade_id(c): c for c in nb.cells if grade_id(c) is not None}


def db_url(course: Path) -> str:
    """The URL of the course's gradebook, nbgrader's SQLite database."""
    return f"sqlite:///{Path(course) / 'gradebook.db'}"


def gradebook(course: Path):
    """nbgrader's Gradebook of the course, as a context manager."""
    return gradebook_at(Path(course) / "gradebook.db")


def gradebook_at(path: Path):
    """nbgrader's Gradebook in the SQLite file at `path`, as a context manager."""
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{path}", COURSE_ID)


def with_points(nb, points: dict[str, int] = POINTS, strict: bool = True):
    """A copy of a lesson with the points of every test cell set from `points`.

    Not strict (a student's copy): cells unknown to `points` are left as they are.
    """
    out = nbformat.from_dict(nb)
    for gid, cell in nbgrader_cells(out).items():
        if cell.metadata["nbgrader"].get("grade"):
            if gid not in points and not strict:
                continue
            if gid not in points:
                raise KeyError(f"test cell {gid!r} has no points: add it to POINTS in lessons.py")
            cell.metadata["nbgrader"]["points"] = points[gid]
    return out


def write_config(
    course: Path, timeout: int, kernel: str | None = None, sockets: Path | None = None
) -> None:
    """nbgrader_config.py of a course folder; `kernel` names the kernelspec to grade with
    (a sandboxed one, reached over Unix sockets whose paths start with `sockets`), else the
    notebook's own."""
    (course / "nbgrader_config.py").write_text(
        CONFIG.format(
            course_id=COURSE_ID,
            root=str(course),
            db_url=db_url(course),
            timeout=int(timeout),
            repo=str(ROOT),
        )
        + TRACE_HOOK
        + (SANDBOX_CONFIG.format(kernel=kernel, sockets=str(sockets)) if kernel else "")
    )


class GradingStopped(RuntimeError):
    """stop_all() was called (Ctrl-C): no nbgrader command starts any more."""


STOPPING = threading.Event()
_running: dict[str, subprocess.Popen] = {}  # token -> nbgrader process, of every thread
_lock = threading.Lock()


def stop_all() -> None:
    """End every nbgrader command running (in any thread) and all they started; refuse new
    ones until STOPPING is cleared."""
    STOPPING.set()
    with _lock:
        running = dict(_running)
    end_processes(set(running), procs=list(running.values()))  # killed at once, waited once


def nbgrader(
    course: Path,
    *args: str,
    env: dict | None = None,
    limit: float | None = None,
    log: Path | None = None,
    guard=None,
) -> tuple[int | str, str]:
    """Run one nbgrader command in the course folder; end everything it started, by PID.

    Returns (exit code, or "timed out after N s"; its output). Every process it starts (the
    kernel, and whatever a submission starts from there) carries a token in its environment,
    so those that outlive it are found and ended even when they left its process tree.
    `guard` (a sandbox.MemoryGuard) watches the memory of those processes while it runs.
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
        with _lock:
            if STOPPING.is_set():
                raise GradingStopped(f"grading was stopped: nbgrader {args[0]} not started")
            proc = subprocess.Popen(
                cmd,
                cwd=course,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            _running[token] = proc
        try:
            if guard is not None:
                guard.watch(token, spare={proc.pid})
            status: int | str = proc.wait(limit)
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
        finally:
            if guard is not None:
                guard.stop()
            end_processes(token, proc)
            with _lock:
                _running.pop(token, None)
    return status, (log.read_text(errors="replace") if log else "")


def end_processes(
    token: str | set[str], proc: subprocess.Popen | None = None, procs: list[subprocess.Popen] = ()
) -> list[int]:
    """SIGKILL every process whose environment holds LABS_GRADING_TOKEN=token (one token or
    several), and `proc`/`procs`; wait for them all at once; their PIDs."""
    tokens = {token} if isinstance(token, str) else set(token)
    mine = [q for q in [proc, *procs] if q is not None]
    found = [psutil.Process(q.pid) for q in mine if q.poll() is None] + token_processes(tokens)
    for p in found:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=10)
    for q in mine:
        q.wait()
    return [p.pid for p in found]


def token_processes(tokens: set[str], spare: set[int] = frozenset()) -> list[psutil.Process]:
    """Processes (not this one, nor `spare`) whose environment holds LABS_GRADING_TOKEN in
    `tokens`: everything a grading command started, even what left its process tree."""
    found = []
    for p in psutil.process_iter():
        try:
            if (
                p.pid != os.getpid()
                and p.pid not in spare
                and p.environ().get("LABS_GRADING_TOKEN") in tokens
            ):
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found
