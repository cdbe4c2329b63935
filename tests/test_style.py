"""One code style: ruff's linter and formatter, as configured in pyproject.toml, pass over the
tree (helpers/, tools/, bench/, tests/ and the notebooks' code cells)."""

import subprocess
import sys

from helpers.config import REPO_ROOT


def _ruff(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ruff", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_passes():
    done = _ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"ruff check finds (fix, or `ruff check --fix`):\n{done.stdout}"


def test_ruff_format_leaves_every_file_as_it_is():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, f"run `ruff format` on these:\n{done.stdout}"


def test_the_check_catches_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    done = _ruff("check", "--no-cache", "--isolated", "--select", "F401", str(bad))
    assert done.returncode == 1 and "F401" in done.stdout


def test_every_lesson_imports_helpers_before_tensorflow():
    """helpers/__init__.py quiets TensorFlow's import notices only if it is imported first; an
    import sorter moves or drops a bare `import helpers`, so this checks it stayed first."""
    import nbformat

    late = []
    for path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        lines = [
            line
            for cell in nbformat.read(path, as_version=4).cells
            if cell.cell_type == "code"
            for line in cell.source.splitlines()
        ]
        tf = [
            i
            for i, line in enumerate(lines)
            if line.startswith(("import tensorflow", "from tensorflow"))
        ]
        ours = [
            i for i, line in enumerate(lines) if line.startswith(("import helpers", "from helpers"))
        ]
        if tf and (not ours or ours[0] > tf[0]):
            late.append(path.name)
    assert not late, f"import helpers before tensorflow in: {late}"
