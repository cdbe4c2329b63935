"""Read the lesson notebooks: their order, titles, objectives and tagged cells."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


def notebook_paths(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The NN_snake_case.ipynb notebooks of a folder, in order."""
    return sorted(p for p in Path(folder).glob("*.ipynb") if NAME.match(p.name))


def read(path: Path):
    """Load a notebook as nbformat v4."""
    return nbformat.read(str(path), as_version=4)


def title_and_objectives(nb) -> tuple[str, list[str]]:
    """Parse the first markdown cell: its '# Title' and the bullets after 'Learning objectives'."""
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None:
        raise ValueError("notebook has no markdown cell: its first cell must be '# Title ...'")
    lines = first.source.splitlines()
    titles = [l[2:].strip() for l in lines if l.startswith("# ")]
    if not titles:
        raise ValueError(f"first markdown cell has no '# Title' line: {first.source[:60]!r}")
    objectives, inside = [], False
    for line in lines:
        if "learning objectives" in line.lower():
            inside = True
            continue
        if inside:
            if line.startswith(("- ", "* ")):
                objectives.append(line[2:].strip())
            elif line.strip() and objectives:
                break
    return titles[0], objectives


def tags(cell) -> set[str]:
    """The tags of a cell."""
    return set(cell.get("metadata", {}).get("tags", []))
