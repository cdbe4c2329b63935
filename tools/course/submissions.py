"""What a student handed in: each lesson's notebook found in their folder, and repaired."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tools.course.nbgrader_course import nbgrader_cells
from tools.notebooks import grade_id


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
        owner = next(
            (
                nb_id
                for nb_id, cells in notebooks.items()
                if ids & set(cells) and found[nb_id].path is None
            ),
            None,
        )
        if owner:
            found[owner].path = path
            found[owner].notes.append(f"graded {path.name} as {owner}.ipynb (renamed)")
    for f in found.values():
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
    Ours, not nbgrader's own `OverwriteCells.add_missing_cells` (0.9): that one puts back
    grade and task cells only, so a deleted read-only cell that a test reads (e.g.
    nb02-ex3-reference, which binds our_loop_acc) would still cost the exercise its points.
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
