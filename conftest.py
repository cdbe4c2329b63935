"""Pytest plumbing shared by the unit tests and the notebook runs (nbval)."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
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


# The files that take longest, longest first: `make test` spreads files over two workers
# (pytest-xdist, --dist loadfile), and starting the long ones first keeps one worker from
# finishing long before the other. The rest follow in collection order.
LONGEST_FIRST = (
    "tests/test_grading_answers.py",  # grades every lesson twice
    "tests/test_cluster_integration.py",
    "tests/test_course.py",
    "tests/test_executed_copies.py",  # runs 01, 02 and 05
    "tests/test_jupyterlab.py",
    "notebooks/06_stragglers_and_backup_workers.ipynb",
    "notebooks/08_multi_worker_strategies.ipynb",
    "notebooks/04_multi_device_mnist.ipynb",
    "notebooks/07_fault_tolerance.ipynb",
    "notebooks/03_optimizer_sweep.ipynb",
    "notebooks/09_past_the_laptop.ipynb",
    "tests/test_placement.py",  # clusters on three namespaced hosts over SSH
    "tests/test_slurm.py",  # and through a real Slurm on them
)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(items):
    """Longest files first (LONGEST_FIRST), each file's items in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item.nodeid), len(rank)))  # a stable sort


def _cpu_seconds() -> float:
    """CPU seconds of this process and every child it has waited for (kernels, clusters)."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )


_SESSION_TMP: list[str] = []


def pytest_sessionstart(session):
    """Give the processes the tests start (kernels, clusters, TF subprocesses) a temporary
    folder of this session's, removed at its end. TF writes a file per traced function into
    the temporary folder and removes it only when its process exits normally; a kernel or
    node that a test ends with a signal would leave its files in /tmp. This process keeps its
    own temporary folder (pytest's tmp_path lives there and is kept as pytest keeps it)."""
    tempfile.gettempdir()  # this process's, fixed before TMPDIR changes for its children
    _SESSION_TMP.append(tempfile.mkdtemp(prefix="labs-tests-"))
    os.environ["TMPDIR"] = _SESSION_TMP[-1]


_PHASE_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Mark where the first phase (set-up) of an item starts, for pytest_runtest_makereport."""
    item.stash[_PHASE_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Carry the CPU seconds of each phase (set-up, call, teardown) on its report: from the end
    of the previous phase to this report. With pytest-xdist, the worker that ran it measures
    them and the report takes them along."""
    outcome = yield
    now = _cpu_seconds()
    outcome.get_result().cpu_seconds = now - item.stash[_PHASE_START]
    item.stash[_PHASE_START] = now


_FILE_SECONDS: dict[str, float] = defaultdict(float)
_FILE_CPU: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    """Add up wall time and CPU seconds per test file (a notebook is one file), set-up and
    teardown included."""
    _FILE_SECONDS[_file_of(report.nodeid)] += report.duration
    _FILE_CPU[_file_of(report.nodeid)] += getattr(report, "cpu_seconds", 0.0)


def pytest_terminal_summary(terminalreporter):
    """Print seconds per file, slowest first, so CI's time budget can be watched, with the CPU
    seconds each cost: a file whose CPU seconds are far below its wall time mostly waits."""
    if not _FILE_SECONDS:
        return
    terminalreporter.section("wall time per file, and CPU seconds (its processes and children)")
    for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s {_FILE_CPU[name]:8.1f} cpu-s  {name}")
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f} s {sum(_FILE_CPU.values()):8.1f} cpu-s  total")


def _left_running() -> list[str]:
    """Processes this one started (and their children) still alive after a grace period:
    killed, by PID (they are ours), and named. This process's fork servers, which serve its
    clusters one after another, are ended first (they would end at its exit)."""
    from helpers.system import forkserver

    forkserver.end_shared()
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
    lines = []
    for p in survivors:
        try:
            lines.append(f"  pid {p.pid}: {' '.join(p.cmdline())[:160]}")
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return lines


def _remove_session_tmp() -> None:
    """Remove the session's temporary folder (pytest_sessionstart), once its processes ended."""
    while _SESSION_TMP:
        shutil.rmtree(_SESSION_TMP.pop(), ignore_errors=True)


_WORKERS_LEFT: list[str] = []


def pytest_testnodedown(node, error):
    """pytest-xdist's controller: what a worker found left running (see pytest_sessionfinish)."""
    _WORKERS_LEFT.extend(getattr(node, "workeroutput", {}).get("left_running", []))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the run if any process started under pytest is still alive at the end. With
    pytest-xdist each worker looks at its own children (a worker's orphans would leave the
    controller's tree) and hands what it found to the controller, which fails the run."""
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker
        config.workeroutput["left_running"] = _left_running()
        _remove_session_tmp()
        return
    controller = config.pluginmanager.has_plugin("dsession")
    lines = _WORKERS_LEFT if controller else _left_running()
    _remove_session_tmp()
    if not lines:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    msg = "processes left running after the test session (now killed):\n" + "\n".join(lines)
    if reporter:
        reporter.write_line(msg, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
