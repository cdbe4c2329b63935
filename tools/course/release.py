"""The student release: the course's source/ copies with points, and nbgrader's release/."""
from __future__ import annotations

from pathlib import Path

import nbformat

from tools.course.nbgrader_course import (DEFAULT_COURSE, nbgrader, nbgrader_cells, with_points,
                                          write_config)
from tools.notebooks import notebook_paths, read


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
