"""The notebook collection: naming, skeleton, committed clean, index fresh, all collected."""

import json
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from helpers import config
from helpers.config import REPO_ROOT
from tools import make_index
from tools.notebooks import NOTEBOOK_DIR, notebook_paths, read, tags, title_and_objectives

NOTEBOOKS = notebook_paths()
LESSONS = [p for p in NOTEBOOKS if p.name != make_index.INDEX]


def test_every_ipynb_follows_the_naming_scheme():
    assert sorted(NOTEBOOK_DIR.glob("*.ipynb")) == NOTEBOOKS
    assert NOTEBOOKS[0].name == "00_index.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    for i, cell in enumerate(read(path).cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{path.name} cell {i} has output"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(path):
    """nbformat 4.5 requires cell ids (today a MissingIDFieldWarning, later an error); a cell
    added by a script rather than by Jupyter has none. Read raw: nbformat would add them."""
    raw = json.loads(path.read_text())
    if (raw["nbformat"], raw["nbformat_minor"]) < (4, 5):
        pytest.skip(f"{path.name} is nbformat {raw['nbformat']}.{raw['nbformat_minor']}: no ids")
    ids = [cell.get("id") for cell in raw["cells"]]
    assert None not in ids, f"{path.name}: cells {[i for i, x in enumerate(ids) if x is None]}"
    assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_follow_the_house_skeleton(path):
    nb = read(path)
    title, objectives = title_and_objectives(nb)
    assert title and len(objectives) >= 2, f"{path.name}: title and >= 2 learning objectives"
    assert "Expected run time" in nb.cells[0].source
    headings = [
        line
        for c in nb.cells
        if c.cell_type == "markdown"
        for line in c.source.splitlines()
        if line.startswith("## ")
    ]
    for needed in ("## Setup", "## Summary", "## Exercises"):
        assert needed in headings, f"{path.name} lacks a '{needed}' section"
    counts = {t: sum(t in tags(c) for c in nb.cells) for t in ("exercise", "solution", "checker")}
    assert counts["exercise"] >= 3 and counts["solution"] >= 3 and counts["checker"] >= 3, counts


def test_table_of_contents_is_fresh():
    assert make_index.main(["--check"]) == 0, "run `make index`"


def test_stale_table_of_contents_is_detected(tmp_path):
    folder = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, folder)
    lesson = folder / "99_new_lesson.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# A new lesson\n\nWhy.\n\n**Learning objectives**\n- one thing\n- another\n"
        )
    ]
    nbformat.write(nb, str(lesson))
    assert make_index.main(["--check", "--folder", str(folder)]) == 1
    assert make_index.main(["--folder", str(folder)]) == 0  # rewrites it
    assert make_index.main(["--check", "--folder", str(folder)]) == 0
    assert (
        "[A new lesson](99_new_lesson.ipynb) | one thing<br>another |"
        in make_index.toc_markdown(folder)
    )


def test_run_times_are_measured_for_every_notebook_in_both_modes():
    times = config.run_times()
    for path in NOTEBOOKS:
        assert {"full", "quick"} <= set(times.get(path.stem, {})), (
            f"{path.stem}: run it with `make run` and "
            "`python -m tools.run_notebooks --quick --record-times`"
        )


def test_a_new_measurement_makes_the_run_time_line_stale(tmp_path):
    from tools.run_notebooks import record_run_time

    folder = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOK_DIR, folder)
    assert make_index.main(["--check", "--folder", str(folder)]) == 0
    lesson = LESSONS[0].stem
    record_run_time(lesson, "full", 7540.0, folder)  # no lesson's figure
    assert make_index.main(["--check", "--folder", str(folder)]) == 1
    assert make_index.main(["--folder", str(folder)]) == 0
    header = read(folder / f"{lesson}.ipynb").cells[0].source
    assert "**Expected run time:** ~126 min full, " in header
    assert "| ~126 min full, " in make_index.toc_markdown(folder)
    assert make_index.main(["--check", "--folder", str(folder)]) == 0


# Student text is the lesson: no trace of how it was built (issues, debugging tools).
HISTORY = re.compile(r"\bissue #?\d+|[\w.-]+/[\w.-]+#\d+|py-spy|\bgdb\b", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lessons_carry_no_development_history(path):
    found = [
        (i, m.group(0)) for i, c in enumerate(read(path).cells) for m in HISTORY.finditer(c.source)
    ]
    assert not found, f"{path.name}: {found}"


def test_the_history_check_can_fail():
    assert HISTORY.search("as measured with py-spy (issue 14)")
    assert HISTORY.search("a gdb backtrace") and not HISTORY.search("debugging")
    assert HISTORY.search("it fails (keras-team/keras#20585)") and not HISTORY.search("C# 12")


def test_nbval_collects_every_notebook():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "--nbval-lax",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "notebooks",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    assert collected == {f"notebooks/{p.name}" for p in NOTEBOOKS}


def test_make_test_runs_each_notebook_once():
    """nbval leaves out exactly the notebooks test_executed_copies runs through the runner."""
    from tests.test_executed_copies import NOTEBOOKS as THROUGH_THE_RUNNER

    [line] = [
        line
        for line in (REPO_ROOT / "Makefile").read_text().splitlines()
        if line.startswith("RUNNER_CHECKED =")
    ]
    assert set(line.split("=", 1)[1].split()) == set(THROUGH_THE_RUNNER)
    assert "$(RUNNER_CHECKED:%=--ignore=notebooks/%.ipynb)" in (REPO_ROOT / "Makefile").read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_is_valid_for_its_nbformat_version(path):
    """JupyterLab warns on an invalid notebook (e.g. cell ids in nbformat 4.4) and nbgrader's
    validator rejects it: each lesson validates against the schema of the version it declares."""
    nb = json.loads(path.read_text())
    nbformat.validate(nb, version=nb["nbformat"], version_minor=nb["nbformat_minor"])


def test_make_test_starts_the_longest_files_first_and_each_names_a_file():
    """conftest.LONGEST_FIRST orders `make test`'s files over its xdist workers: a renamed
    file would silently drop to the back of the queue."""
    from conftest import LONGEST_FIRST

    for name in LONGEST_FIRST:
        assert (REPO_ROOT / name).is_file(), name
    assert "--no-loadscope-reorder" in (REPO_ROOT / "Makefile").read_text()


def test_make_test_runs_the_files_that_need_the_cores_alone_after_the_others():
    """The Makefile's ALONE files (a model of the machine checked against it) leave the
    xdist pool and run after it: a renamed file would be neither ignored nor run."""
    from conftest import LONGEST_FIRST

    makefile = (REPO_ROOT / "Makefile").read_text()
    [line] = [line for line in makefile.splitlines() if line.startswith("ALONE =")]
    alone = line.split("=", 1)[1].split()
    assert alone
    for name in alone:
        assert (REPO_ROOT / name).is_file(), name
        assert name not in LONGEST_FIRST, name
    assert "$(ALONE:%=--ignore=%)" in makefile
    assert "pytest $(ALONE);" in makefile
