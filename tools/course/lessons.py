"""The course's definition: its exercises' ids, the points of each test, and what a lesson
reads from an earlier one. The grader reads it; change the course here."""

from __future__ import annotations

import re

# An exercise's cells: prompt (markdown), solution and test, by nbgrader grade id `nbNN-exK-part`;
# an exercise may have more cells (nb02-ex3-reference, read-only), with ids of the same form.
EXERCISE_ID = re.compile(r"^(nb\d\d-ex\d+)-(prompt|solution|test)$")
EXERCISE_CELL = re.compile(r"^(nb\d\d-ex\d+)-([a-z]+)$")

# Points of each exercise's test cell, by nbgrader grade id: the one place to change them.
POINTS: dict[str, int] = {
    "nb01-ex1-test": 3,
    "nb01-ex2-test": 2,
    "nb01-ex3-test": 2,
    "nb01-ex4-test": 2,
    "nb02-ex1-test": 3,
    "nb02-ex2-test": 2,
    "nb02-ex3-test": 3,
    "nb03-ex1-test": 2,
    "nb03-ex2-test": 2,
    "nb03-ex3-test": 3,
    "nb03-ex4-test": 2,
    "nb04-ex1-test": 3,
    "nb04-ex2-test": 2,
    "nb04-ex3-test": 2,
    "nb04-ex4-test": 2,
    "nb05-ex1-test": 3,
    "nb05-ex2-test": 2,
    "nb05-ex3-test": 3,
    "nb06-ex1-test": 3,
    "nb06-ex2-test": 2,
    "nb06-ex3-test": 3,
    "nb07-ex1-test": 2,
    "nb07-ex2-test": 2,
    "nb07-ex3-test": 3,
    "nb08-ex1-test": 2,
    "nb08-ex2-test": 2,
    "nb08-ex3-test": 2,
    "nb08-ex4-test": 2,
    "nb09-ex1-test": 3,
    "nb09-ex2-test": 3,
    "nb09-ex3-test": 2,
}

# What a lesson reads from an earlier one: {notebook: [(earlier notebook, path under runs/)]}.
# When a notebook is graded, these come from the course's own reference run of the earlier
# lesson (its solutions, made once per mode and reused), never from the student's own copy: a
# notebook's grade never depends on the student's other notebooks.
NEEDS: dict[str, list[tuple[str, str]]] = {
    "02_logreg_lr_schedules": [("01_doc2vec_dbpedia", "features/doc2vec_dbpedia")],
}


def exercise_of(grade_id: str | None) -> str | None:
    """The exercise a cell belongs to ('nb02-ex3-test' -> 'nb02-ex3'), or None."""
    m = EXERCISE_CELL.match(grade_id or "")
    return m.group(1) if m else None


def cell_id(exercise: str, part: str) -> str:
    """The grade id of an exercise's prompt, solution or test cell: 'nb02-ex3', 'test'."""
    return f"{exercise}-{part}"
