"""Read the lesson notebooks: their order, titles, objectives, tagged cells and grade ids."""

from __future__ import annotations

import ast
import re
import threading
from html import unescape
from pathlib import Path

import nbformat

# Lines a cell of an executed lesson may write to stderr, each with why it is not ours to fix.
# tests/test_executed_copies.py fails on any other stderr line.
STDERR_ALLOWED: dict[str, str] = {}

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NAME = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")


# CPython 3.11's AST constructor keeps its recursion count per interpreter, not per thread:
# two threads parsing at once can fail with "AST constructor recursion depth mismatch"
# (python/cpython#106905); grading reads cells in several threads, so every parse takes turns.
_PARSING = threading.Lock()


def parse_code(code: str) -> ast.Module:
    """ast.parse(code), one thread at a time."""
    with _PARSING:
        return ast.parse(code)


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
    titles = [t[2:].strip() for t in lines if t.startswith("# ")]
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


def grade_id(cell) -> str | None:
    """A cell's nbgrader grade id, or None for a cell nbgrader does not track."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def tags(cell) -> set[str]:
    """The tags of a cell."""
    return set(cell.get("metadata", {}).get("tags", []))


def _strip_tags(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", html))


def widget_text(state: dict, model_id: str) -> str:
    """A widget's last state as text: a tqdm bar becomes 'epochs: 100%|██████████| 40/40 [...]',
    a slider 'initial: 0.5'."""
    model = state.get(model_id)
    if model is None:
        return ""
    name, values = model.get("model_name", ""), model.get("state", {})
    if name in ("HBoxModel", "VBoxModel"):
        parts = [
            widget_text(state, child.removeprefix("IPY_MODEL_"))
            for child in values.get("children", [])
        ]
        joined = (
            "".join(parts) if any("|" in p for p in parts) else "   ".join(p for p in parts if p)
        )
        return joined if name == "HBoxModel" else "\n".join(p for p in parts if p)
    if name in ("HTMLModel", "LabelModel"):  # tqdm pads with figure spaces (U+2007)
        return _strip_tags(values.get("value", "")).replace("\u2007", " ")
    if name in ("FloatProgressModel", "IntProgressModel"):
        low, high, value = values.get("min", 0), values.get("max", 100), values.get("value", 0)
        filled = round(10 * (value - low) / (high - low)) if high > low else 0
        return "|" + "█" * filled + " " * (10 - filled) + "|"
    if "value" in values and values.get("description"):  # sliders, check boxes, drop-downs
        return f"{values['description']}: {values['value']}"
    return ""


def freeze_widgets(nb, closed=frozenset()) -> None:
    """Replace each widget output by the text of its final state.

    An executed copy then shows where every progress bar ended (e.g. '40/40'), readable
    without a widget manager or network access. A widget closed while the notebook ran (a
    tqdm bar with leave=False; `closed` holds their ids) is dropped, as Jupyter hides it.
    The stored widget state is dropped too.
    """
    store = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    state = store.get("state", {})
    for cell in nb.cells:
        outputs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view is not None:
                if view.get("model_id") in closed or view.get("model_id") not in state:
                    continue
                text = widget_text(state, view["model_id"]) or "(a widget)"
                if not re.search(r"\d+%\|", text):  # controls, not a progress bar
                    text = f"[interactive controls: they work in a live Jupyter session]\n{text}"
                out["data"] = {"text/plain": text}
            outputs.append(out)
        if cell.cell_type == "code":
            cell.outputs = outputs
    nb.metadata.pop("widgets", None)
