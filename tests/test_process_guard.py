"""The test session itself fails, and cleans up, when a test leaves a process running: in a
plain run, and in one spread over pytest-xdist's workers (as `make test` runs)."""

import subprocess
import sys
import textwrap

import psutil
import pytest

from helpers.config import REPO_ROOT


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_session_fails_and_kills_a_leftover_child(tmp_path, workers):
    leaky = tmp_path / "test_leaky.py"
    pid_file = tmp_path / "pid"
    leaky.write_text(
        textwrap.dedent(f"""
        import subprocess, sys
        def test_leaves_a_process_behind():
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            open({str(pid_file)!r}, "w").write(str(p.pid))
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
