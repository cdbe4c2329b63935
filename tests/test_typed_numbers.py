"""No number about a measured result is typed into the lessons' prose, comments or the
helpers' docstrings (tools/typed_numbers.py says what counts; tools/typed_numbers_allowed.py
lists the rest with reasons)."""

from __future__ import annotations

import nbformat

from tools import typed_numbers as tn
from tools.typed_numbers_allowed import ALLOWED, unaccounted, unused


def test_no_typed_number_is_left_in_the_lessons_or_the_helpers():
    found = tn.scan()
    left = unaccounted(found)
    assert not left, "typed numbers; print them from the code instead:\n" + "\n".join(
        map(str, left)
    )
    assert not unused(found), f"allow-list entries that match nothing: {unused(found)}"
    assert all(a.reason for a in ALLOWED)


def test_a_measured_figure_is_found_and_named_with_its_sentence():
    text = "Bigger vectors cost time: the sweep printed 82.0 s for 50 dims. Then 56 % dropped."
    found = dict(tn.typed_numbers(text, settings={50.0}))
    assert set(found) == {"82.0", "56"}, found
    assert "the sweep printed 82.0 s" in found["82.0"]


def test_settings_references_names_and_formulas_are_not_typed_numbers():
    text = (
        "Batch 100 in notebook 05 and notebooks 05-07, exercise 3, Keras 3, Lau and Baldwin "
        "(2016), a 2-D function, Doc2Vec, $\\eta > 2/50$, `LABS_QUICK=1`, "
        "[a link](https://example.org/1234), keras-team/keras#20585, arXiv:1604.00981, "
        "l2/2*w^2, on PS task 0, 90 % of the runs.\n"
        "**Expected run time:** ~8 min full, measured by `make run` (2026-11-26)."
    )
    assert tn.typed_numbers(text, settings={100.0, 0.9}) == []


def test_examples_in_docstrings_are_not_typed_numbers_but_prose_in_them_is():
    doc = (
        "Use it like this:\n"
        "    cfg = validate(RunConfig(workers=100, steps=1000))\n"
        'A process as errors name it: "worker:1 (pid 123)"; run --workers 4.\n'
        "A TF process takes 440 MB."
    )
    found = tn.typed_numbers(doc, settings=set(), prose=False)
    assert [n for n, _ in found] == ["440"], found


def test_a_notebook_is_scanned_cell_by_cell_with_its_own_literals_as_settings(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("EPOCHS = 40  # passes over the corpus, 3.5 s each"),
        nbformat.v4.new_markdown_cell("We train for 40 epochs; each took 3.5 s here."),
    ]
    path = tmp_path / "probe.ipynb"
    nbformat.write(nb, str(path))
    found = tn.scan_notebook(path, root=tmp_path)
    assert [(t.where.split("ipynb ")[1], t.number) for t in found] == [
        ("cell 0 line 1", "3.5"),
        ("cell 1", "3.5"),
    ], found
    assert str(found[1]).startswith("probe.ipynb cell 1: '3.5' in 'We train")
