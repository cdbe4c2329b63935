"""The test session itself fails, and cleans up, when a test leaves a process running: in a
plain run, and in one spread over pytest-xdist's workers (as `make test` runs). What that
process wrote into its temporary folder (as TensorFlow does for each traced function, removed
only at a normal exit) goes with the session's temporary folder."""

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from helpers.config import REPO_ROOT


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_session_fails_and_kills_a_leftover_child(tmp_path, workers):
    leaky = tmp_path / "test_leaky.py"
    pid_file, tmp_file = tmp_path / "pid", tmp_path / "tmp"
    child = (
        "import os, sys, tempfile, time\n"
        "path = os.path.join(tempfile.gettempdir(), '__autograph_generated_file_x.py')\n"
        "open(path, 'w').write('# a file its process removes only at a normal exit')\n"
        "open(sys.argv[1], 'w').write(path)\n"
        "time.sleep(300)\n"
    )
    leaky.write_text(
        textwrap.dedent(f"""
        import os, subprocess, sys, time
        def test_leaves_a_process_behind():
            p = subprocess.Popen([sys.executable, "-c", {child!r}, {str(tmp_file)!r}])
            open({str(pid_file)!r}, "w").write(str(p.pid))
            while not os.path.exists({str(tmp_file)!r}):
                time.sleep(0.05)
    """)
    )
    out = subprocess.run(
        # -p conftest: load the repo's root conftest.py, whose guard is under test.
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "conftest",
            "--rootdir",
            str(tmp_path),
            *workers,
            str(leaky),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout[-1500:]
    assert "1 passed" in out.stdout  # the test itself passed: the session check failed it
    assert "processes left running after the test session" in out.stdout
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    left = Path(tmp_file.read_text())
    assert "labs-tests-" in str(left.parent), left  # the session's folder, not /tmp itself
    assert not left.exists() and not left.parent.exists(), left
