"""`make run`'s runner: Ctrl-C stops it with an INTERRUPTED row, exit 130 and no kernel left;
the executed copies hold their figures whatever MPLBACKEND the shell sets, and a failed
notebook's copy still shows where its progress bars ended."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

# starts Jupyter kernels: `make unit` leaves it out
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def notebook(path: Path, source: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, str(path))


def run_runner(folder: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    """`python -m tools.run_notebooks` on the notebooks of `folder`, copies in folder/build."""
    return subprocess.run(
        [sys.executable, "-m", "tools.run_notebooks", "--dir", str(folder), *args]
        + ["--out", str(folder / "build")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def _sigint_default():
    """A shell's background job inherits SIGINT ignored; a terminal's Ctrl-C does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_reports_interrupted_and_leaves_no_kernel(tmp_path):
    pid_file = tmp_path / "kernel.pid"
    notebook(
        tmp_path / "01_sleeps.ipynb",
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)",
    )
    notebook(tmp_path / "02_never_runs.ipynb", "print('should not run')")
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.run_notebooks",
            "--dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "build"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_sigint_default,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the kernel never started the first cell"
            assert runner.poll() is None, runner.stdout.read()
            time.sleep(0.2)
        kernel = int(pid_file.read_text())
        runner.send_signal(signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert runner.returncode == 130, out
    assert "| 01_sleeps.ipynb | INTERRUPTED |" in out and "02_never_runs" not in out, out
    assert "Traceback" not in out.split("| notebook |")[-1]
    assert "without encryption" not in out  # the kernel's sockets use provisioned Curve keys
    assert (tmp_path / "build" / "01_sleeps.html").exists()  # the partial copy is kept
    deadline = time.monotonic() + 10
    while psutil.pid_exists(kernel) and psutil.Process(kernel).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"kernel pid {kernel} still running"
        time.sleep(0.2)


def test_figures_reach_the_executed_copy_when_the_shell_sets_a_backend(tmp_path):
    notebook(
        tmp_path / "01_plots.ipynb",
        "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()",
    )
    env = dict(os.environ, MPLBACKEND="Agg")  # as CI, or a server's image, sets
    out = run_runner(tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "MPLBACKEND=Agg is set" in out.stdout
    [cell] = nbformat.read(str(tmp_path / "build" / "01_plots.ipynb"), as_version=4).cells
    assert any("image/png" in o.get("data", {}) for o in cell.outputs), cell.outputs


def test_a_failed_notebook_s_copy_keeps_its_progress_bars(tmp_path):
    """nbclient stores the widgets' states only when every cell succeeded: without them, a
    failed run's copy lost every bar (a loaded full run of 01 timed out in a late cell and
    its training bars were gone)."""
    notebook(
        tmp_path / "01_fails.ipynb",
        "from tqdm.auto import tqdm\nfor _ in tqdm(range(7)): pass\nraise ValueError('late')",
    )
    out = run_runner(tmp_path)
    assert out.returncode != 0 and "FAILED" in out.stdout, out.stdout + out.stderr
    [cell] = nbformat.read(str(tmp_path / "build" / "01_fails.ipynb"), as_version=4).cells
    texts = [o.get("data", {}).get("text/plain", "") for o in cell.outputs]
    assert any("7/7" in t for t in texts), cell.outputs


def test_a_timed_out_cell_is_named_as_such_in_the_table(tmp_path):
    """The table's error column read '-------------------' for a cell past --timeout (the last
    line of nbclient's message, which ends with the cell's source between dashes)."""
    notebook(tmp_path / "01_slow.ipynb", "import time\ntime.sleep(60)")
    out = run_runner(tmp_path, "--timeout", "3")
    row = next(line for line in out.stdout.splitlines() if line.startswith("| 01_slow"))
    assert "FAILED" in row and "timed out" in row and "---" not in row, out.stdout
