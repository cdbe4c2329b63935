"""Write student copies of the notebooks: solution cells emptied, checkers kept, no outputs.

Cells are told apart by tags: `exercise` (the prompt), `solution` (emptied here),
`checker` (asserts the solution; kept so students can check their own work).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nbformat  # noqa: E402

from tools.notebooks import notebook_paths, read, tags  # noqa: E402

PLACEHOLDER = "# Your solution here: replace this line, then run the checker cell below.\n"


def handout(nb):
    """Return a copy of `nb` with solutions emptied and every output cleared."""
    out = nbformat.from_dict(nb)  # deep copy
    for cell in out.cells:
        if cell.cell_type != "code":
            continue
        if "solution" in tags(cell):
            cell.source = PLACEHOLDER
        cell.outputs = []
        cell.execution_count = None
    return out


def build(src: Path, dest: Path) -> list[Path]:
    """Write the handout of every notebook in `src` into `dest`; return the paths written."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebook_paths(src):
        target = dest / path.name
        nbformat.write(handout(read(path)), str(target))
        written.append(target)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("src", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    for path in build(args.src, args.dest):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
