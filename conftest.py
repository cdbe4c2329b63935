"""Pytest plumbing shared by the unit tests and the notebook runs (nbval)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parent


def shared_data_dir() -> Path | None:
    """The folder of real datasets for tests: LABS_DATA_MIRROR if a folder, else ../shared/data."""
    mirror = os.environ.get("LABS_DATA_MIRROR", "")
    for candidate in (
        Path(mirror) if mirror and "://" not in mirror else None,
        REPO_ROOT.parent / "shared" / "data",
    ):
        if candidate is not None and (candidate / "mnist.npz").is_file():
            return candidate.resolve()
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real datasets (mnist.npz, dbpedia_subset/) that tests may read but never write."""
    found = shared_data_dir()
    if found is None:
        pytest.skip(
            "no real test data: set LABS_DATA_MIRROR to a folder holding mnist.npz "
            "and dbpedia_subset/ (CI uses ../shared/data)"
        )
    return found


_FILE_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    """Add up wall time per test file (a notebook is one file), set-up and teardown included."""
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Print seconds per file, slowest first, so CI's time budget can be watched."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("wall time per file")
    for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
    terminalreporter.write_line(f"{sum(_FILE_SECONDS.values()):8.1f} s  total")


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if any process started under pytest is still alive at the end."""
    me = psutil.Process()
    deadline = time.monotonic() + 10  # grace for kernels and clusters still shutting down
    survivors = me.children(recursive=True)
    while survivors and time.monotonic() < deadline:
        time.sleep(0.2)
        survivors = [
            p
            for p in me.children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]
    if not survivors:
        return
    lines = []
    for p in survivors:
        try:
            lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:160]}")
            p.kill()  # by PID: these are ours
        except psutil.NoSuchProcess:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = "processes left running after the test session (now killed):\n" + "\n".join(lines)
    if reporter:
        reporter.write_line(msg, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
