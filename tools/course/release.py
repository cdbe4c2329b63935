"""The student release: the course's source/ copies with points, and nbgrader's release/."""

from __future__ import annotations

from pathlib import Path

import nbformat

from tools.course.nbgrader_course import (
    DEFAULT_COURSE,
    gradebook,
    nbgrader,
    nbgrader_cells,
    with_points,
    write_config,
)
from tools.notebooks import notebook_paths, read


def release(
    course: Path = DEFAULT_COURSE, src: Path | None = None, timeout: int = 600
) -> list[Path]:
    """Write the course folder: source/ with points, release/ for students; their paths.

    A lesson whose source copy (with its points) is unchanged since it was released, and is
    in the gradebook, is not released again: grading calls this every time."""
    course = Path(course).resolve()  # nbgrader reads the root relative to the course folder
    course.mkdir(parents=True, exist_ok=True)
    write_config(course, timeout)
    released = []
    for path in notebook_paths(src) if src else notebook_paths():
        if not nbgrader_cells(read(path)):
            continue  # no exercises: nothing to grade (the index)
        source = course / "source" / path.stem / path.name
        target = course / "release" / path.stem / path.name
        text = nbformat.writes(with_points(read(path)))
        if (
            source.is_file()
            and source.read_text() == text
            and target.is_file()
            and has_assignment(course, path.stem)
        ):
            released.append(target)  # released before from the same lesson and points
            continue
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        status, log = nbgrader(
            course,
            "generate_assignment",
            path.stem,
            "--force",
            log=course / "logs" / f"release-{path.stem}.log",
        )
        if status != 0 or not target.is_file():
            raise RuntimeError(
                f"nbgrader generate_assignment {path.stem} failed ({status}):\n"
                + "\n".join(log.splitlines()[-15:])
            )
        released.append(target)
    return released


def has_assignment(course: Path, assignment: str) -> bool:
    """Whether the course's gradebook knows the assignment (nbgrader released it)."""
    from nbgrader.api import MissingEntry

    if not (course / "gradebook.db").is_file():
        return False
    with gradebook(course) as gb:
        try:
            gb.find_assignment(assignment)
        except MissingEntry:
            return False
    return True
