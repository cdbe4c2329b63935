"""The fork server (helpers/system/forkserver.py): a real server process that imports TensorFlow
and forks children that run a module as `python -m` would, with the launcher's pipes, log and
environment, in process groups of their own, reaped by the server, gone with it.

The clusters built on it (every LocalCluster on Linux) are tested in
tests/test_cluster_integration.py, where the launcher is SIGKILLed with nodes running and hung,
forked and (LABS_FORK=0) spawned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from helpers.system import forkserver

# starts a process that imports TensorFlow: `make unit` leaves it out
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only (see module)"),
]

CHILD = textwrap.dedent("""
    import json, os, sys
    line = sys.stdin.readline()
    print("to the log", file=sys.stderr)
    print(json.dumps({"read": line.strip(), "argv": sys.argv[1:], "x": os.environ.get("X"),
                      "leads_group": os.getpgid(0) == os.getpid(), "ppid": os.getppid(),
                      "tf_loaded": "tensorflow" in sys.modules}), flush=True)
    if line.strip() == "wait":
        sys.stdin.readline()
    sys.exit(3)
""")


NS_CHILD = "import os; print(os.readlink('/proc/self/ns/net'), flush=True)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forkserver")
    (folder / "labs_child.py").write_text(CHILD)
    (folder / "labs_ns_child.py").write_text(NS_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), *sys.path]))
    srv = forkserver.ForkServer([], env, folder / "fork-server.log")
    yield srv, env, folder
    srv.stop()


def _fork(server, extra_env=None):
    srv, env, folder = server
    log = open(folder / "child.log", "wb")
    child = srv.fork(
        [sys.executable, "-m", "labs_child", "a", "b"], dict(env, **(extra_env or {})), log
    )
    log.close()  # the child has its own copy
    return child, folder / "child.log"


def test_a_forked_child_runs_its_module_with_the_launchers_streams(server):
    child, log = _fork(server, {"X": "from the launcher"})
    child.stdin.write(b"hello\n")
    child.stdin.flush()
    said = json.loads(child.stdout.readline())
    assert child.wait(60) == 3 and child.poll() == 3
    assert said == {
        "read": "hello",
        "argv": ["a", "b"],
        "x": "from the launcher",
        "leads_group": True,  # a session and process group of its own, as spawn gives
        "ppid": server[0].pid,
        "tf_loaded": True,  # imported once, by the server
    }
    assert "to the log" in log.read_text()


def test_a_killed_child_reports_the_signal_and_wait_times_out_before(server):
    child, _ = _fork(server)
    child.stdin.write(b"wait\n")
    child.stdin.flush()
    assert json.loads(child.stdout.readline())["read"] == "wait"
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.5)
    assert child.poll() is None
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL


def test_children_end_with_their_server(tmp_path):
    (tmp_path / "labs_child.py").write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    srv = forkserver.ForkServer([], env, tmp_path / "fork-server.log")
    try:
        child = srv.fork(
            [sys.executable, "-m", "labs_child"], env, open(tmp_path / "child.log", "wb")
        )
        child.stdin.write(b"wait\n")
        child.stdin.flush()
        child.stdout.readline()
        os.kill(child.pid, signal.SIGSTOP)  # a hung child too: SIGKILL reaches it
        os.kill(srv.pid, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL  # the server gone, the child gone with it
        assert not psutil.pid_exists(child.pid)
    finally:
        srv.stop()
    assert srv.pid not in psutil.Process().children()


def test_a_server_that_cannot_start_says_why_and_leaves_nothing(tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    refuse = [sys.executable, "-c", "import sys; sys.exit('no server here')"]  # a bad prefix
    with pytest.raises(RuntimeError, match=r"(?s)ended while it started \(exit 1\).*no server"):
        forkserver.ForkServer(refuse, dict(os.environ), tmp_path / "fs.log")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_module_that_does_not_import_fails_in_its_child_as_if_spawned(tmp_path):
    srv = forkserver.ForkServer([], dict(os.environ), tmp_path / "fs.log", ("no_such_labs_mod",))
    try:  # the server started all the same
        with open(tmp_path / "child.log", "wb") as log:
            child = srv.fork([sys.executable, "-m", "no_such_labs_mod"], dict(os.environ), log)
        assert child.wait(60) == 1
        assert "python: No module named no_such_labs_mod" in (tmp_path / "child.log").read_text()
    finally:
        srv.stop()


def test_clusters_fork_on_linux_unless_turned_off(monkeypatch):
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    assert forkserver.enabled()
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    assert not forkserver.enabled()
    monkeypatch.setenv(forkserver.FORK_ENV, "maybe")
    with pytest.raises(ValueError, match="LABS_FORK must be one of"):
        forkserver.enabled()


def test_a_child_joins_the_private_network_it_is_given_and_fails_clearly_without_it(server):
    """fork(netns=holder): the child runs in the holder's network namespace, as a cluster's
    node does (joined after the fork, the server staying where it is); a holder that is gone
    fails the child, with the reason in its log."""
    from helpers.system import netns

    if netns.unavailable_reason():
        pytest.skip(netns.unavailable_reason())
    srv, env, folder = server
    mine = os.readlink("/proc/self/ns/net")
    cmd = [sys.executable, "-m", "labs_ns_child"]
    with netns.PrivateNetwork(isolate=True) as net:
        theirs = os.readlink(f"/proc/{net.pid}/ns/net")
        for holder, expect in ((net.pid, theirs), (None, mine)):
            with open(folder / "ns.log", "wb") as log:
                child = srv.fork(cmd, env, log, netns=holder)
            assert child.stdout.readline().decode().strip() == expect
            assert child.wait(60) == 0
        assert theirs != mine and os.readlink(f"/proc/{srv.pid}/ns/net") == mine
        gone = net.pid
    with open(folder / "ns.log", "wb") as log:
        child = srv.fork(cmd, env, log, netns=gone)
    assert child.wait(60) == 1
    assert f"/proc/{gone}/ns/user" in (folder / "ns.log").read_text()


def test_a_process_keeps_one_server_per_environment_until_it_ends_them(tmp_path):
    """shared(): the same server for the same environment (a child's TMPDIR and pytest's
    current test apart) and preload, another for another environment, a new one for one that
    died; end_shared() ends them all."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    env = dict(os.environ, X="1")
    try:
        first = forkserver.shared(env, (), tmp_path)
        assert forkserver.shared(dict(env, TMPDIR=str(tmp_path)), (), tmp_path) is first
        assert forkserver.shared(dict(env, PYTEST_CURRENT_TEST="x (call)"), (), tmp_path) is first
        other = forkserver.shared(dict(env, X="2"), (), tmp_path)
        assert other.pid != first.pid and forkserver.shared_pids() >= {first.pid, other.pid}
        os.kill(first.pid, signal.SIGKILL)
        first.popen.wait(30)
        again = forkserver.shared(env, (), tmp_path)
        assert again.pid not in (first.pid, other.pid) and again.popen.poll() is None
    finally:
        forkserver.end_shared()
    assert forkserver.shared_pids() == set()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_shared_server_without_children_ends_after_its_idle_time(tmp_path, monkeypatch):
    """A kernel that stopped its last cluster does not keep TensorFlow's memory for long."""
    monkeypatch.setattr(forkserver, "IDLE_S", 1.0)
    (tmp_path / "labs_ns_child.py").write_text(NS_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    try:
        srv = forkserver.shared(env, (), tmp_path)
        with open(tmp_path / "child.log", "wb") as log:
            child = srv.fork([sys.executable, "-m", "labs_ns_child"], env, log)
        assert child.wait(60) == 0
        assert srv.popen.wait(15) is not None  # ended by this process, not killed
        assert forkserver.shared_pids() == set() and not psutil.pid_exists(srv.pid)
        again = forkserver.shared(env, (), tmp_path)  # the next cluster gets another
        assert again.pid != srv.pid and again.popen.poll() is None
    finally:
        forkserver.end_shared()
