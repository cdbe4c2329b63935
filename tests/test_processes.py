"""The process plumbing every launcher shares: ports, children, their results and their end."""
import queue
import socket
import sys
import time

import psutil
import pytest

from helpers.system.processes import ChildProcess, NoResult, end_all, free_ports, log_tail, wait_for_results


def _child(tmp_path, name, code):
    inbox = queue.Queue()
    proc = ChildProcess(name, [sys.executable, "-c", code], {}, tmp_path / f"{name}.log", inbox)
    return {name: proc}, inbox


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("", port))


def test_a_child_reports_its_result_and_is_ended_by_pid(tmp_path):
    procs, inbox = _child(tmp_path, "ok", 'import json, sys; print("noise"); '
                          'print(json.dumps({"event": "done", "result": {"x": 1}})); '
                          'print("to the log", file=sys.stderr)')
    assert wait_for_results(procs, inbox, ["ok"], timeout=60) == {"ok": {"x": 1}}
    procs["ok"].kill()
    assert not psutil.pid_exists(procs["ok"].pid)
    assert log_tail(procs["ok"].log_path) == "to the log"


def test_a_child_that_ends_without_a_result_is_named_with_how_it_ended(tmp_path):
    procs, inbox = _child(tmp_path, "bad", "import sys; sys.exit(3)")
    with pytest.raises(NoResult, match="bad exited with code 3") as err:
        wait_for_results(procs, inbox, ["bad"], timeout=60)
    assert err.value.name == "bad" and err.value.how == "exited with code 3"
    procs["bad"].kill()


def test_a_silent_child_times_out_and_its_group_is_killed(tmp_path):
    procs, inbox = _child(tmp_path, "slow", "import time; time.sleep(300)")
    with pytest.raises(NoResult, match=r"slow timed out after 1 s") as err:
        wait_for_results(procs, inbox, ["slow"], timeout=1)
    assert err.value.waiting == ["slow"]
    procs["slow"].kill()
    assert not psutil.pid_exists(procs["slow"].pid)


def test_end_all_ends_children_together_and_says_how_each_ended(tmp_path):
    """Children that ignore SIGTERM (as MultiWorkerMirroredStrategy's workers do: its
    preemption notifier catches it) cost one grace period together, not one each."""
    inbox = queue.Queue()
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('{\"event\": \"up\"}', flush=True); time.sleep(300)")
    procs = [ChildProcess(f"stubborn{i}", [sys.executable, "-c", stubborn], {},
                          tmp_path / f"s{i}.log", inbox) for i in range(2)]
    procs.append(ChildProcess("quick", [sys.executable, "-c", "pass"], {},
                              tmp_path / "q.log", inbox))
    up = set()
    while up != {"stubborn0", "stubborn1"}:  # both handlers are installed
        name, msg = inbox.get(timeout=60)
        if msg.get("event") == "up":
            up.add(name)
    procs[2].popen.wait(60)
    t0 = time.monotonic()
    ended = end_all(procs, timeout=4.0)
    took = time.monotonic() - t0
    assert 4.0 <= took < 7.0, took  # one grace period for both (one each would be >= 8 s)
    assert ended["stubborn0"]["how"] == ended["stubborn1"]["how"] == "killed by SIGKILL"
    assert ended["quick"]["how"] == "exited with code 0 before the teardown"
    assert ended["quick"]["eof_at"] <= ended["quick"]["gone_at"]
    assert not any(psutil.pid_exists(p.pid) for p in procs)
