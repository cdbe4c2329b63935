"""The handout builder empties solutions and keeps checkers, on a notebook made here."""
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tools import make_handout
from tools.notebooks import read, tags

v4 = nbformat.v4


def tagged(cell, *names):
    cell.metadata["tags"] = list(names)
    return cell


@pytest.fixture
def lesson(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        v4.new_markdown_cell("# Tiny lesson\n\n**Learning objectives**\n- add\n- check"),
        v4.new_code_cell("x = 20"),
        tagged(v4.new_markdown_cell("**Exercise 1.** Set `y` to twice `x`."), "exercise"),
        tagged(v4.new_code_cell("y = 2 * x"), "solution"),
        tagged(v4.new_code_cell("assert y == 40, f'y should be 40, got {y}'\nprint('correct')"), "checker"),
    ]
    nb.cells[1].outputs = [v4.new_output("stream", text="left over\n")]
    nb.cells[1].execution_count = 3
    nbformat.write(nb, str(src / "01_tiny.ipynb"))
    nbformat.write(nb, str(src / "notes.ipynb"))  # not NN_name.ipynb: not a lesson
    return src


def test_handout_empties_solutions_keeps_checkers_and_clears_outputs(lesson, tmp_path):
    written = make_handout.build(lesson, tmp_path / "handout")
    assert [p.name for p in written] == ["01_tiny.ipynb"]
    original, handed = read(lesson / "01_tiny.ipynb"), read(written[0])
    assert len(handed.cells) == len(original.cells)
    for before, after in zip(original.cells, handed.cells):
        assert tags(before) == tags(after)
        if "solution" in tags(after):
            assert after.source == make_handout.PLACEHOLDER and "2 * x" not in after.source
        else:
            assert after.source == before.source  # prompts, checkers and setup kept verbatim
        if after.cell_type == "code":
            assert after.outputs == [] and after.execution_count is None


def test_checker_passes_on_the_solution_and_fails_on_the_handout(lesson, tmp_path):
    [handout] = make_handout.build(lesson, tmp_path / "handout")
    solved = read(lesson / "01_tiny.ipynb")
    NotebookClient(solved, timeout=120, kernel_name="python3").execute()
    assert "correct" in solved.cells[-1].outputs[0]["text"]
    student = read(handout)
    with pytest.raises(CellExecutionError, match="NameError"):
        NotebookClient(student, timeout=120, kernel_name="python3").execute()
