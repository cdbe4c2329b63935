"""The process plumbing every launcher shares: ports, children, their results and their end."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from helpers.config import REPO_ROOT
from helpers.system.processes import (
    ChildProcess,
    NoResult,
    end_all,
    free_ports,
    log_tail,
    messages,
    wait_for_results,
)
from tests.process_cleanup import end_parent_and_pids


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
    procs, inbox = _child(
        tmp_path,
        "ok",
        'import json, sys; print("noise"); '
        'print(json.dumps({"event": "done", "result": {"x": 1}})); '
        'print("to the log", file=sys.stderr)',
    )
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


def test_messages_yields_each_message_then_a_tick_when_none_comes():
    """The one inbox loop: what the children sent, in order, and (None, {}) between."""
    inbox = queue.Queue()
    inbox.put(("a", {"event": "ready"}))
    inbox.put(("b", {"event": "done"}))
    stream = messages(inbox, every=0.05)
    assert [next(stream), next(stream)] == [("a", {"event": "ready"}), ("b", {"event": "done"})]
    t0 = time.monotonic()
    assert next(stream) == (None, {})
    assert 0.04 <= time.monotonic() - t0 < 2.0


def test_end_all_ends_children_together_and_says_how_each_ended(tmp_path):
    """Children that ignore SIGTERM (as MultiWorkerMirroredStrategy's workers do: its
    preemption notifier catches it) cost one grace period together, not one each."""
    inbox = queue.Queue()
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        'print(\'{"event": "up"}\', flush=True); time.sleep(300)'
    )
    procs = [
        ChildProcess(
            f"stubborn{i}", [sys.executable, "-c", stubborn], {}, tmp_path / f"s{i}.log", inbox
        )
        for i in range(2)
    ]
    procs.append(
        ChildProcess("quick", [sys.executable, "-c", "pass"], {}, tmp_path / "q.log", inbox)
    )
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


# A parent that starts one child with `spawn`, prints the PIDs to watch, then waits to be
# killed. The child is busy (mid-run) and starts a child of its own with `spawn` (as the PS
# demo's driver does); with GROUPED=1 also one that knows nothing of lifelines, in its process
# group. With WATCH=0 the child does not watch its lifeline at all.
CHILD = """
import json, os, subprocess, sys
from helpers.system.processes import spawn, watch_lifeline
watching = watch_lifeline() if os.environ["WATCH"] == "1" else False
sleeper = "from helpers.system.processes import watch_lifeline; import time; "
own = spawn([sys.executable, "-c", sleeper + "watch_lifeline(); time.sleep(300)"],
            start_new_session=False)
pids = [own.pid]
if os.environ["GROUPED"] == "1":
    pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]).pid)
print(json.dumps({"watching": watching, "pids": pids}), flush=True)
while True:  # busy: a node in the middle of a run never looks at its parent
    sum(range(10000))
"""
ORPHAN_PARENT = f"""
import json, subprocess, sys
from helpers.system.processes import spawn
child = spawn([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE, text=True)
report = json.loads(child.stdout.readline())
print(json.dumps({{"watching": report["watching"], "pids": [child.pid] + report["pids"]}}),
      flush=True)
sys.stdin.read()
"""


def _parent(script: str, **env) -> subprocess.Popen:
    """A parent process running `script` with these environment variables set."""
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **env),
        cwd=REPO_ROOT,
    )


def _kill_parent_and_count_survivors(
    pdeathsig: str, watch: str, grouped: str
) -> tuple[bool, list[int]]:
    parent = _parent(ORPHAN_PARENT, LABS_PDEATHSIG=pdeathsig, WATCH=watch, GROUPED=grouped)
    pids = []
    try:
        started = json.loads(parent.stdout.readline())
        pids = started["pids"]
        assert all(psutil.pid_exists(p) for p in pids)
        parent.kill()
        parent.wait(10)
        alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        survivors = psutil.wait_procs(alive, timeout=10)[1]
        return started["watching"], [p.pid for p in survivors]
    finally:
        end_parent_and_pids(parent, pids)


@pytest.mark.parametrize("pdeathsig", ["0", "1"], ids=["lifeline-only", "with-prctl"])
def test_a_busy_child_and_its_own_child_end_with_a_sigkilled_parent(pdeathsig):
    """The portable lifeline alone (as on macOS) and with Linux's prctl: 0 survivors."""
    watching, survivors = _kill_parent_and_count_survivors(pdeathsig, watch="1", grouped="0")
    assert watching
    assert survivors == [], f"orphans left running: {survivors}"


def test_the_lifeline_ends_the_childs_whole_process_group():
    """A process in the child's group that watches nothing goes with the child."""
    watching, survivors = _kill_parent_and_count_survivors("0", watch="1", grouped="1")
    assert watching
    assert survivors == [], f"orphans left running: {survivors}"


def test_without_the_lifeline_and_prctl_the_child_survives():
    """The control: LABS_PDEATHSIG=0 really turns the Linux call off, so the tests above
    measure the lifeline alone."""
    watching, survivors = _kill_parent_and_count_survivors("0", watch="0", grouped="0")
    assert not watching
    assert len(survivors) == 2  # the child, and its own child, whose parent is still alive


def test_a_lifeline_inherited_from_a_grandparent_is_not_watched():
    """The variable names the parent's PID: a grandchild that inherits it (with a file
    descriptor number that means something else there) does not read that descriptor."""
    env = dict(os.environ, LABS_LIFELINE=f"0:{os.getpid() + 1}")
    code = "from helpers.system.processes import watch_lifeline; print(watch_lifeline())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout.strip() == "False", out.stderr


def test_end_all_ends_a_stopped_child_at_once(tmp_path):
    """SIGTERM then SIGCONT: a stopped child acts on the SIGTERM without the grace period."""
    procs, _ = _child(tmp_path, "stopped", "import time; time.sleep(300)")
    child = procs["stopped"]
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    ended = end_all([child], timeout=10.0)
    assert time.monotonic() - t0 < 5.0
    assert ended["stopped"]["how"] == "killed by SIGTERM"
    assert not psutil.pid_exists(child.pid)


# A parent that starts one child with `spawn` and waits to be killed. WHO=child: the child
# stops itself with `hang` (a node in the hang fault); WHO=parent: the parent stops the child
# (LocalCluster.kill with SIGSTOP); WHO=plain: the child stops itself with a bare SIGSTOP.
HUNG_CHILD = """
import json, os, signal, sys
from helpers.system.processes import hang, watch_lifeline
watch_lifeline()
print(json.dumps(os.getpid()), flush=True)
if os.environ["WHO"] == "child":
    hang(os.getpid())
elif os.environ["WHO"] == "plain":
    os.kill(os.getpid(), signal.SIGSTOP)
sys.stdin.read()
"""
HUNG_PARENT = f"""
import json, os, subprocess, sys, time
import psutil
from helpers.system.processes import hang, spawn
child = spawn([sys.executable, "-c", {HUNG_CHILD!r}], stdout=subprocess.PIPE,
              stdin=subprocess.PIPE, text=True)
child.stdout.readline()
if os.environ["WHO"] == "parent":
    hang(child.pid)
while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
    time.sleep(0.05)
guards = [p.pid for p in psutil.Process(child.pid).children() + psutil.Process().children()
          if p.pid != child.pid]
print(json.dumps({{"pids": [child.pid], "guards": guards}}), flush=True)
sys.stdin.read()
"""


def _kill_the_parent_of_a_stopped_child(who: str, pdeathsig: str) -> tuple[list, list]:
    """(guards started, processes left 10 s after the parent's SIGKILL)."""
    parent = _parent(HUNG_PARENT, LABS_PDEATHSIG=pdeathsig, WHO=who)
    pids = []
    try:
        started = json.loads(parent.stdout.readline())
        pids = started["pids"] + started["guards"]
        assert psutil.Process(started["pids"][0]).status() == psutil.STATUS_STOPPED
        parent.kill()
        parent.wait(10)
        alive = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
        return started["guards"], [p.pid for p in psutil.wait_procs(alive, timeout=10)[1]]
    finally:
        end_parent_and_pids(parent, pids)


@pytest.mark.parametrize("who", ["child", "parent"])
@pytest.mark.parametrize("pdeathsig", ["0", "1"], ids=["lifeline-only", "with-prctl"])
def test_a_hung_child_and_its_guard_end_with_a_sigkilled_parent(who, pdeathsig):
    """A stopped child runs no lifeline watcher: its guard ends it, on any system (and with
    prctl too); the guard goes as well."""
    guards, survivors = _kill_the_parent_of_a_stopped_child(who, pdeathsig)
    assert len(guards) == 1
    assert survivors == [], f"left running: {survivors}"


def test_without_a_guard_a_stopped_child_survives_its_parent():
    """The control: the lifeline alone cannot end a stopped process."""
    guards, survivors = _kill_the_parent_of_a_stopped_child("plain", "0")
    assert guards == [] and len(survivors) == 1


def test_a_guard_exits_once_its_stopped_process_is_ended(tmp_path):
    inbox = queue.Queue()
    child = ChildProcess(
        "hung", [sys.executable, "-c", HUNG_CHILD], {"WHO": "child"}, tmp_path / "hung.log", inbox
    )
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(child.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, log_tail(child.log_path)
            time.sleep(0.05)
        guards = psutil.Process(child.pid).children()
        assert len(guards) == 1
    finally:
        end_all([child])
    assert psutil.wait_procs(guards, timeout=5)[1] == []


def test_a_training_process_starts_keras_lean_keras_import():
    """Cluster nodes, TF_CONFIG tasks and replica configurations call
    lean_keras_import() first: TensorFlow's Keras then trains without importing
    either (a third of the import)."""
    code = (
        "import sys\n"
        "from helpers.system.processes import lean_keras_import\n"
        "lean_keras_import()\n"
        "import tensorflow as tf, keras\n"
        "m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])\n"
        "m.compile(optimizer='sgd', loss='mse')\n"
        "m.fit(tf.zeros((4, 3)), tf.zeros((4, 2)), verbose=0)\n"
        "print(all(sys.modules[m] is None for m in ('sklearn', 'matplotlib', 'pandas')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
    for module in ("node", "strategies", "psdemo"):
        assert "lean_keras_import()" in (REPO_ROOT / f"helpers/cluster/{module}.py").read_text()
    assert "lean_keras_import()" in (REPO_ROOT / "helpers/training/mirrored.py").read_text()


def test_terminate_skips_a_reaped_child_whose_group_is_empty(tmp_path, monkeypatch):
    """A reaped child's number may be another program's by now: nothing is signalled. While
    a process of its group lives on (here its own child), the group is still its own and
    ends."""
    procs, inbox = _child(
        tmp_path,
        "parent",
        "import json, subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        'print(json.dumps({"event": "child", "pid": p.pid}), flush=True)',
    )
    lone = _child(tmp_path, "lone", "pass")[0]["lone"]
    parent = procs["parent"]
    name, msg = inbox.get(timeout=60)
    assert (name, msg["event"]) == ("parent", "child")
    for p in (lone, parent):
        p.popen.wait(60)  # reaped: their numbers are free once their groups are empty
    sent = []
    killpg = os.killpg
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: (sent.append(pgid), killpg(pgid, sig)))
    try:
        lone.terminate()
        assert sent == []
        parent.terminate()  # its child is still in its group
        assert sent == [parent.pid, parent.pid]  # SIGTERM, SIGCONT
        psutil.Process(msg["pid"]).wait(30)
    finally:
        for p in (lone, parent):
            p.reap(5)
