"""Process plumbing shared by every helper that starts child processes.

The cluster engine (`cluster.launcher`), TF_CONFIG clusters (`cluster.tfconfig`), the private
network namespace (`system.netns`), the PS demo (`cluster.psdemo`) and notebook 04's one process
per configuration (`training.mirrored`) all start Python children that must end with their parent,
report on stdout and be ended by PID. This module is that plumbing, in one place:

- `spawn` / `die_with_parent`: a child ends within a second of its parent's death, on any
  POSIX system, mid-run too. The portable mechanism is a lifeline: every child inherits the
  read end of a pipe whose only write end its parent holds; when the parent dies, however it
  dies, the kernel closes that end and a watchdog thread in the child reads end-of-file and
  kills the child's process group. Linux's `prctl(PR_SET_PDEATHSIG)` (`child_setup`) is kept
  as an extra; `LABS_PDEATHSIG=0` turns it off, to test the portable path alone.
- `free_ports`: unused TCP ports, from `portpicker` (what TensorFlow's own multi-process tests
  use; it honours a port server through PORTSERVER_ADDRESS). A cluster in a private network
  namespace needs none of it: every port is free there.
- `ChildProcess`: one child with its log file and a thread that turns its stdout's JSON lines
  into messages, spawned or forked from a fork server (`forkserver.py`); `wait_for_results`
  collects the {"event": "done"} messages of several.
- `hang`: stop a process (the hang fault) so that it still ends with its parent: a stopped
  process runs no watchdog thread, so a small guard process outside it holds the lifeline.
- `messages`: the one loop through which a parent reads its children's messages.
- `end_all`: the one teardown: end several children at once, stopped ones included, and say
  how each ended (for launch timelines).
- `log_tail`: the end of a child's log, for error messages.

Our own code, not a library's: subprocess and psutil have no parent-death signal (portable
or not), no process-group kill with SIGCONT for a stopped child, and no JSON message channel.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from helpers import config
from helpers.system.control import Event

_PR_SET_PDEATHSIG = 1
LIFELINE_ENV = "LABS_LIFELINE"  # "<fd>:<parent pid>", set by spawn for the child only
PDEATHSIG_ENV = "LABS_PDEATHSIG"  # 0: leave Linux's parent-death signal out (tests, macOS-like)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Send `sig` to this process when its parent dies; False where the OS has no such call
    (anything but Linux), or where LABS_PDEATHSIG=0 turns it off."""
    if not config.env_flag(PDEATHSIG_ENV, True):
        return False
    try:
        ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        return False
    return True


def child_setup() -> None:
    """`preexec_fn` for Popen: the child is SIGTERMed when its parent dies (Linux only; the
    lifeline of `spawn` does the same everywhere). It runs in the child between fork and exec.
    """
    set_parent_death_signal()


_lifeline: tuple[int, int, int] | None = None  # (read fd, write fd, pid that made them)
_watched_fd: int | None = None  # the read end of the lifeline this process watches (its parent's)
# PIDs of this process's fork servers (helpers.system.forkserver): their children are this
# process's as far as `hang` is concerned
FORK_SERVERS: set[int] = set()


def watched_lifeline() -> int | None:
    """The read end of the lifeline this process watches (its parent's), if it watches one."""
    return _watched_fd


def _lifeline_fd() -> int:
    """The read end of this process's lifeline pipe, made on first use (again after a fork).

    Both ends are non-inheritable: only `spawn` hands the read end to a child, and the write
    end stays in this process, so it closes when this process dies, whatever kills it.
    """
    global _lifeline
    if _lifeline is None or _lifeline[2] != os.getpid():
        read_fd, write_fd = os.pipe()
        _lifeline = (read_fd, write_fd, os.getpid())
    return _lifeline[0]


def spawn(cmd: list[str], env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
    """Popen `cmd` in a process group of its own, holding this process's lifeline.

    The child (a Python program of this package) calls `die_with_parent` to watch it; Linux's
    parent-death signal is set too. Other Popen arguments pass through.
    """
    fd = _lifeline_fd()
    env = dict(os.environ if env is None else env)
    env[LIFELINE_ENV] = f"{fd}:{os.getpid()}"
    popen_kwargs.setdefault("start_new_session", True)
    return subprocess.Popen(
        cmd,
        env=env,
        pass_fds=(fd, *popen_kwargs.pop("pass_fds", ())),
        preexec_fn=child_setup,
        **popen_kwargs,
    )


def end_self(sig: int) -> None:
    """Kill this process, and its group when it leads one (its own children go too)."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), sig)
        os.kill(os.getpid(), sig)
    finally:
        os._exit(1)  # a signal this process ignores or catches


def watch_lifeline(sig: int = signal.SIGKILL) -> bool:
    """Start a daemon thread that ends this process and its group with `sig` when its parent
    dies. A child of this child that it started with `spawn` watches a lifeline of its own, so
    it goes too even where Linux's parent-death signal ends this process first.

    No Python handler for SIGTERM is added: one would wait for the main thread to leave a
    blocking C call (a TF server's join), so a SIGTERM would no longer end the process.

    Returns False when this process holds no lifeline: it was not started by `spawn`, or the
    variable was inherited from a grandparent (the pid in it is not this process's parent).
    """
    fd_text, _, parent = os.environ.pop(LIFELINE_ENV, "").partition(":")
    if not fd_text or not parent or int(parent) != os.getppid():
        return False
    fd = int(fd_text)
    try:
        os.fstat(fd)
    except OSError:  # not passed down after all: nothing to watch
        return False
    os.set_inheritable(fd, False)  # this process's own children get a lifeline of their own
    global _watched_fd
    _watched_fd = fd

    def watch():
        try:
            while os.read(fd, 1):  # nobody writes: read returns b"" once the parent is gone
                pass
        except OSError:
            pass
        end_self(sig)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return True


def die_with_parent(parent_pid: int | None, sig: int = signal.SIGKILL) -> None:
    """Called by a child itself, first thing: end when the parent dies, or now if it has.

    Watches the lifeline that `spawn` passed down (any POSIX system; the child then gets
    SIGKILL, with its process group), and on Linux also asks for `sig` by prctl, which
    `nsenter` and `unshare` clear when they start the child. SIGKILL, because a stopped
    process (see `hang`) keeps a SIGTERM pending until it is continued, and TF's
    MultiWorkerMirroredStrategy catches SIGTERM and carries on.
    `parent_pid` catches a parent that died before this call.
    """
    watch_lifeline()
    set_parent_death_signal(sig)
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)


def guard_with(fd: int) -> None:
    """Let hang()'s guard watch `fd` (a pipe whose end means this process's parent is gone),
    for a process whose lifeline is not `spawn`'s: one on another host watches its stdin."""
    global _watched_fd
    _watched_fd = fd


# A stopped process's guard: SIGKILL process (group) PID when the lifeline read end FD reads
# end-of-file (the parent of both is gone); end once PID has ended. Standard library only.
_GUARD = """
import os, select, signal, sys
fd, pid = int(sys.argv[1]), int(sys.argv[2])
while True:
    if select.select([fd], [], [], 0.2)[0] and not os.read(fd, 1):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
        break
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
"""
_guards: list[subprocess.Popen] = []


def hang(pid: int) -> None:
    """Stop process `pid` with SIGSTOP, a hung process: it keeps its sockets open and answers
    nothing, until it is continued or killed.

    A stopped process runs neither its lifeline watcher nor a pending SIGTERM, so when `pid`
    is a child of this process (or of a fork server of this process), or of this process's
    parent (a node stopping itself or a sibling), a guard process is started first: it holds
    the lifeline that ends with `pid`'s parent and SIGKILLs `pid`'s process group when that
    parent dies, on any POSIX system; it exits by itself once `pid` has ended. Any other `pid`
    is only stopped: no lifeline here ends with its parent.
    """
    import psutil

    _guards[:] = [g for g in _guards if g.poll() is None]  # reap the guards that have exited
    parent = psutil.Process(pid).ppid()
    if parent in FORK_SERVERS:  # forked for this process: its child in all but name
        parent = os.getpid()
    fd = _lifeline_fd() if parent == os.getpid() else _watched_fd
    if fd is not None and (parent == os.getpid() or parent == os.getppid()):
        cmd = [sys.executable, "-I", "-S", "-c", _GUARD, str(fd), str(pid)]
        _guards.append(
            subprocess.Popen(cmd, pass_fds=(fd,), start_new_session=True, stdin=subprocess.DEVNULL)
        )
    os.kill(pid, signal.SIGSTOP)


def is_stopped(pid: int) -> bool:
    """True while process `pid` is stopped (SIGSTOP, the hang fault)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


_NAMES = itertools.count()


def lean_keras_import() -> None:
    """In a process that trains but never plots, makes tables or uses scikit-learn (a cluster
    node, a TF_CONFIG task, a replica configuration): make importing those libraries fail,
    before TensorFlow is imported. TensorFlow imports all of Keras, and Keras imports
    scikit-learn (for its wrappers), matplotlib (image plots) and pandas (DataFrame inputs)
    when it can, and does without them when it cannot: over a third of every such process's
    start-up, repeated for each process of a cluster."""
    for name in ("sklearn", "matplotlib", "pandas"):
        sys.modules.setdefault(name, None)  # None: the import system raises ImportError


def unique_name(prefix: str) -> str:
    """A name no other process group of this machine uses: prefix-date-time-pid-counter."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_NAMES)}"


def log_section(log_path: Path, start: int = 0) -> str:
    """A failure's evidence: the last lines of a child's log, from `start` (a byte offset)."""
    return (
        f"\n--- last lines of {log_path}{' (this run)' if start else ''} ---\n"
        f"{log_tail(log_path, start=start)}"
    )


def group_has_members(pgid: int) -> bool:
    """True while some process of this machine is in process group `pgid`. While one is, no
    new process can take the number, so signalling the group reaches only its own members."""
    import psutil

    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                return True
        except OSError:  # gone meanwhile, or not ours to ask about
            continue
    return False


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`, every process in it at once (gone: no-op)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exec_as_module(module: str) -> None:
    """Replace this process by `python -m module` with the same arguments, the repository on
    PYTHONPATH: a tool run as a file (`python tools/x.py`) runs as the module it is."""
    from helpers.config import REPO_ROOT

    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.execve(
        sys.executable,
        [sys.executable, "-m", module, *sys.argv[1:]],
        dict(os.environ, PYTHONPATH=path),
    )


def free_ports(n: int) -> list[int]:
    """n distinct unused TCP ports on this machine."""
    import portpicker

    return [portpicker.pick_unused_port() for _ in range(n)]


def log_tail(path: Path, lines: int = 15, start: int = 0) -> str:
    """The last lines of a log file from byte `start` on, or a note that there are none."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or (
        "(nothing logged during this run)" if start else "(empty log)"
    )


class ChildProcess:
    """One child process in a process group of its own, dying with its parent (`spawn`).

    Its stderr goes to `log_path`; each JSON line it prints on stdout is put on `inbox` as
    (name, message), and {"event": "eof"} when its stdout closes. `send` writes a JSON line
    to its stdin. With `server` (a ForkServer), `cmd` (`python -m module ...`) is forked from
    it rather than started anew.
    """

    def __init__(self, name: str, cmd: list[str], env: dict, log_path: Path, inbox, server=None):
        self.name, self.log_path = name, Path(log_path)
        self.eof_at: float | None = None
        self.log = open(log_path, "wb")
        self._send_lock = threading.Lock()  # a pinger thread writes too
        if server is not None:  # forked from a fork server (helpers.system.forkserver)
            self.popen = server.fork(cmd, env, self.log)
        else:
            self.popen = spawn(
                cmd, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log
            )
        self.pid = self.popen.pid
        self.thread = threading.Thread(target=self._read, args=(inbox,), daemon=True)
        self.thread.start()

    def _read(self, inbox):
        for line in self.popen.stdout:
            try:
                inbox.put((self.name, json.loads(line)))
            except ValueError:
                pass
        self.eof_at = time.time()  # its stdout closed: it is exiting (or has exited)
        inbox.put((self.name, {"event": Event.EOF}))

    def send(self, msg: dict) -> None:
        """Write one JSON message to the child's stdin."""
        with self._send_lock:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()

    def died(self) -> str | None:
        """None while running, else how it ended."""
        rc = self.popen.poll()
        if rc is None:
            return None
        return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"

    def terminate(self) -> None:
        """SIGTERM the process group (and SIGCONT, for a stopped one); do not wait. A child
        that ended and was reaped earlier no longer holds its PID: once no process is left in
        its group, the number may be another program's (PIDs wrap around early on many Linux
        machines, within minutes of a busy test run), so nothing is sent."""
        if self.popen.poll() is not None and not group_has_members(self.pid):
            return
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self, timeout: float = 5.0) -> None:
        """End the process group: SIGTERM (and SIGCONT for a stopped one), then SIGKILL."""
        end_all([self], timeout)

    def reap(self, timeout: float) -> None:
        """Wait up to `timeout` s for the process to end, SIGKILL its group if it has not,
        and close its pipes and log."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.pid)
            self.popen.wait()
        for f in (self.popen.stdin, self.popen.stdout, self.log):
            try:
                f.close()
            except OSError:
                pass


def end_all(procs, timeout: float = 5.0) -> dict[str, dict]:
    """End several children at once, by PID: the teardown of every cluster. SIGTERM every
    process group and SIGCONT it (a stopped process acts on the SIGTERM only once continued),
    then wait, and SIGKILL the groups still there after `timeout`: n children cost one grace
    period, not n.

    Returns, per child name, how it ended ("exited with code 0 before the teardown",
    "killed by SIGKILL", ...), when its stdout closed ("eof_at") and when it was gone."""
    procs = list(procs)
    before = {p.name: p.died() for p in procs}  # None: still running when we came to end it
    for proc in procs:
        proc.terminate()
    ended, deadline = {}, time.monotonic() + timeout
    for proc in procs:
        proc.reap(max(0.0, deadline - time.monotonic()))  # one grace period shared by all
        how = before[proc.name]
        ended[proc.name] = {
            "how": f"{how} before the teardown" if how else proc.died(),
            "eof_at": proc.eof_at,
            "gone_at": time.time(),
        }
    return ended


def messages(inbox: queue.Queue, every: float = 0.2):
    """Yield each (name, message) the children put on `inbox` as it comes, and (None, {})
    whenever `every` seconds pass without one: the one loop through which a parent reads its
    children, checking on them (deaths, deadlines, progress) between messages."""
    while True:
        try:
            yield inbox.get(timeout=every)
        except queue.Empty:
            yield None, {}


class NoResult(RuntimeError):
    """A child ended, or the time ran out, before it reported its result."""

    def __init__(self, name: str, how: str, waiting: list[str]):
        super().__init__(f"{name} {how}")
        self.name, self.how, self.waiting = name, how, waiting


def wait_for_results(
    procs: dict[str, ChildProcess], inbox: queue.Queue, names, timeout: float
) -> dict:
    """The `result` of each named child's {"event": "done", "result": ...} message, by name.

    Raises:
        NoResult: a child ended without reporting (`how` says how it ended, `name` is the
            child; a child not named, e.g. a server, must not end either), or `timeout`
            seconds passed (`name` is the first child still owed, `waiting` all of them).
    """
    waiting, results = set(names), {}
    deadline = time.monotonic() + timeout
    for name, msg in messages(inbox) if waiting else ():
        if msg.get("event") == Event.DONE and name in waiting:
            results[name] = msg["result"]
            waiting.discard(name)
        elif msg.get("event") == Event.EOF and name not in results:  # stdout closed: it is ending
            procs[name].popen.wait()
            raise NoResult(name, procs[name].died(), sorted(waiting))
        if not waiting:
            break
        if time.monotonic() > deadline:
            raise NoResult(sorted(waiting)[0], f"timed out after {timeout:.0f} s", sorted(waiting))
    return results
