"""A fork server: one process that imports TensorFlow once and forks a cluster's processes.

Every process of a cluster on this machine is `python -m <module> ...`, and each would import
TensorFlow itself: seconds of CPU time and much of a process's memory, paid again by every
process of the cluster, all at once on a laptop's few cores. A fork server pays it once:
`ForkServer` starts `python -m helpers.system.forkserver`, which imports TensorFlow, Keras and
what the processes import, and then, for each process asked for, forks a child that runs the
module as `python -m` would. A module that fails to import in the server is left to the child,
which fails the same way, in its own log. A forked child shares the imported libraries' pages
with the server until it writes to them, so the cluster's memory (PSS) falls too; the server
freezes what it imported (`gc.freeze`) before it forks, so that a child's garbage collections
neither scan those objects nor write to their pages.

Forking after `import tensorflow` is safe here because the import starts no TensorFlow runtime:
each child builds its own (its server, its eager context) after the fork, as a fresh process
would. It is not safe on macOS, whose system frameworks refuse to run in a child forked from a
process that has used them, so the server is used on Linux only; `LABS_FORK=0` turns it off
there too, and a cluster then starts each process with `spawn` as before (tests run both ways).

What a child keeps of the `spawn` contract, so that the teardown and the faults treat it like
any other child: its own session and process group; stdin, stdout and stderr are the pipes and
log file its launcher made (passed over a Unix socket); it watches the launcher's lifeline,
which the server holds too, and on Linux gets SIGKILL when the server dies (so a stopped child
goes with it); `hang` guards it as the launcher's own child. Its exit status comes back from
the server, which reaps it (`ForkedPopen` stands in for a Popen).

A process keeps its fork servers (`shared`): the clusters it starts one after another are forked
from the same server, so TensorFlow is imported once per process (a notebook's kernel, a test
worker), not once per cluster. A cluster in a private network namespace (netns.py) is not
started inside it: each of its children joins the namespace itself, right after the fork, as
`nsenter --user --net` would (a child of a fork is single-threaded, which joining a user
namespace requires).

Our own code, not a library's: multiprocessing's fork server is one per program, and its
children run a function with pickled arguments, not a module with its launcher's pipes for
standard streams, in a network namespace of its cluster's.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

from helpers import config
from helpers.system import processes
from helpers.system.resources import Sampler

FORK_ENV = "LABS_FORK"  # 0: start every process of a cluster with spawn (the portable path)


def enabled() -> bool:
    """Whether clusters on this machine fork their processes from a server (Linux, unless
    LABS_FORK=0)."""
    return sys.platform.startswith("linux") and config.env_flag(FORK_ENV, True)


class ForkedPopen:
    """A forked child, as much of a subprocess.Popen as the launchers use: pid, stdin,
    stdout, poll(), wait(), returncode."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], stdin, stdout):
        self.server, self.pid, self.args = server, pid, args
        self.stdin, self.stdout = stdin, stdout
        self.returncode: int | None = None
        self.ended = threading.Event()

    def _ended(self, code: int) -> None:
        self.returncode = code
        self.ended.set()

    def _gone_with_server(self) -> bool:
        """The server ended (so no status will come) and this child is gone: it was killed."""
        if self.server.popen.poll() is None:
            return False
        try:
            os.kill(self.pid, 0)
            return False
        except (ProcessLookupError, PermissionError):  # gone (or the number is another's now)
            self._ended(-signal.SIGKILL)
            return True

    def poll(self) -> int | None:
        if self.returncode is None:
            self._gone_with_server()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ended.wait(0.1):
            if self._gone_with_server():
                break
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


class ForkServer:
    """A server process that has imported TensorFlow, Keras and the modules `preload` names
    (what its children import anyway; "module:function" also calls the function, as data its
    children read), started with `prefix` and `env` (those of the processes it will fork), its
    log in `log_path`. `fork(...)` forks one child."""

    def __init__(
        self,
        prefix: list[str],
        env: dict,
        log_path: Path,
        preload: tuple[str, ...] = (),
        timeout: float = 300.0,
    ):
        ours, theirs = socket.socketpair()
        self.log = open(log_path, "wb")
        self.log_path = Path(log_path)
        cmd = prefix + [sys.executable, "-m", "helpers.system.forkserver", str(theirs.fileno())]
        cmd += ["--parent-pid", str(os.getpid()), "--preload", ",".join(preload)]
        self.popen = processes.spawn(
            cmd, env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log,
        )  # fmt: skip
        theirs.close()
        self.pid = self.popen.pid
        processes.FORK_SERVERS.add(self.pid)
        self.sock, self._lock = ours, threading.Lock()
        self.children: dict[int, ForkedPopen] = {}  # those alive
        self.used = time.monotonic()  # when it last forked a child, or one ended
        self._started: list[int] = []
        self._early: dict[int, int] = {}  # exit codes of children not yet registered
        self._got = threading.Condition()
        self._ready = self._gone = False
        threading.Thread(target=self._read, daemon=True).start()
        with self._got:
            answered = self._got.wait_for(lambda: self._ready or self._gone, timeout)
        if not self._ready:
            self.stop()
            why = (
                f"ended while it started (exit {self.popen.returncode})"
                if answered
                else f"did not import TensorFlow in {timeout:.0f} s"
            )
            raise RuntimeError(f"the fork server {why}" + processes.log_section(self.log_path))

    def _read(self) -> None:
        """The server's messages: ready, each child's PID as it forks it, and each child's
        exit status as it reaps it."""
        for line in self.sock.makefile("rb"):
            msg = json.loads(line)
            with self._got:
                if "ready" in msg:
                    self._ready = True
                elif "started" in msg:
                    self._started.append(msg["started"])
                elif "exited" in msg:
                    child = self.children.pop(msg["exited"], None)
                    self.used = time.monotonic()
                    if child is not None:
                        child._ended(msg["code"])
                    else:  # ended before fork() took its PID: kept for it
                        self._early[msg["exited"]] = msg["code"]
                self._got.notify_all()
        with self._got:  # the server is gone
            self._gone = True
            self._got.notify_all()

    @staticmethod
    def module_of(cmd: list[str]) -> tuple[list[str], str, list[str]]:
        """Split `prefix + [python, "-m", module, *args]` into (prefix, module, args)."""
        for i, word in enumerate(cmd[:-2]):
            if word == sys.executable and cmd[i + 1] == "-m":
                return cmd[:i], cmd[i + 2], cmd[i + 3 :]
        raise ValueError(f"not this Python running a module (python -m ...): {cmd}")

    def fork(self, cmd: list[str], env: dict, stderr, netns: int | None = None) -> ForkedPopen:
        """Fork `cmd` (`[python, "-m", module, *args]`, after the server's own prefix) with
        `env`; stdin and stdout are pipes, stderr goes to the open file `stderr`. `netns`: the
        PID of a private network namespace's holder (netns.PrivateNetwork.pid), whose user
        and network namespaces the child joins before it runs anything."""
        _, module, args = self.module_of(cmd)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        request = {"module": module, "args": args, "env": env, "netns": netns}
        request = json.dumps(request).encode() + b"\n"
        with self._lock:  # one request at a time: the next "started" answers this one
            try:
                socket.send_fds(self.sock, [request], [in_r, out_w, stderr.fileno()])
            finally:
                os.close(in_r)
                os.close(out_w)
            with self._got:
                if (
                    not self._got.wait_for(lambda: self._started or self._gone, 60)
                    or not self._started
                ):
                    os.close(in_w)
                    os.close(out_r)
                    raise RuntimeError(
                        f"the fork server did not fork {module}"
                        + processes.log_section(self.log_path)
                    )
                pid = self._started.pop(0)
                self.used = time.monotonic()
                child = ForkedPopen(
                    self, pid, [module, *args], os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb")
                )
                self.children[pid] = child
                if pid in self._early:
                    child._ended(self._early.pop(pid))
        return child

    def joining(self, netns: int | None):
        """What `ChildProcess(server=...)` forks from: this server, its children joining the
        network namespace that process `netns` holds (None: the server's own)."""
        return types.SimpleNamespace(fork=functools.partial(self.fork, netns=netns))

    def idle_s(self) -> float:
        """Seconds since it last had a child alive (0 while it has one)."""
        return 0.0 if self.children else time.monotonic() - self.used

    def stop(self) -> None:
        """End the server (its children are ended first, by the launcher's teardown)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            processes.kill_group(self.pid)
            self.popen.wait()
        self.log.close()
        processes.FORK_SERVERS.discard(self.pid)


_SHARED: dict[tuple, ForkServer] = {}  # this process's fork servers, by what they preloaded
_SHARED_LOCK = threading.Lock()
_NUMBERS = itertools.count()  # their logs' numbers in this process
# a shared server with no child alive for this long ends, and its memory (TensorFlow's) with
# it; a cluster started later in the same process starts another
IDLE_S = 120.0
# variables each child gets with its request that change between one caller's requests (pytest
# sets PYTEST_CURRENT_TEST anew in each phase of each test): not what a server is kept by
_PER_CHILD = ("TMPDIR", "PYTEST_CURRENT_TEST")


def shared(env: dict, preload: tuple[str, ...] = (), log_dir: Path | None = None) -> ForkServer:
    """This process's fork server for children that run with `env` and import `preload`:
    started at the first call (its log in `log_dir`, by default runs/fork-servers), the same
    one for every later call with the same `env` (_PER_CHILD apart: each child's come with its
    request) and `preload`, until it has had no child for IDLE_S seconds, `end_shared()` or
    this process's exit; a server that died is replaced. The environment is part of what it
    is kept by because the server imported TensorFlow and `preload` under it, and its children
    inherit what those imports read."""
    key = (tuple(preload), tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CHILD)))
    with _SHARED_LOCK:
        server = _SHARED.get(key)
        if server is not None and server.popen.poll() is not None:
            server.stop()  # it died: close its socket and log before starting another
            server = None
        if server is None:
            folder = log_dir if log_dir is not None else config.runs_dir("fork-servers")
            log = Path(folder) / f"fork-server-{os.getpid()}-{next(_NUMBERS)}.log"
            server = _SHARED[key] = ForkServer([], env, log, preload)
        server.used = time.monotonic()  # its caller forks next: not idle meanwhile
    if not _IDLE_CHECK.running:  # from the first server on, for this process's life
        _IDLE_CHECK.start()
    return server


def _end_idle() -> None:
    """End the shared servers that have been idle for IDLE_S (every second, in a thread)."""
    with _SHARED_LOCK:
        idle = [key for key, server in _SHARED.items() if server.idle_s() > IDLE_S]
        servers = [_SHARED.pop(key) for key in idle]
    for server in servers:
        server.stop()


_IDLE_CHECK = Sampler(_end_idle, 1.0)


def shared_pids() -> set[int]:
    """PIDs of this process's shared fork servers (they outlive the clusters they forked)."""
    with _SHARED_LOCK:
        return {s.pid for s in _SHARED.values() if s.popen.poll() is None}


def end_shared() -> None:
    """End this process's shared fork servers (after the processes they forked have ended)."""
    with _SHARED_LOCK:
        servers = list(_SHARED.values())
        _SHARED.clear()
    for server in servers:
        server.stop()


# at exit, after the launchers' own exit handlers have ended their clusters (registered later:
# the launchers import this module first, and exit handlers run last registered first)
atexit.register(end_shared)


# ---------------------------------------------------------------------- the server's side
def _join_network(holder: int) -> None:
    """Join the user and network namespaces of process `holder`, in that order, as
    `nsenter --target=holder --user --net --preserve-credentials` does (setns(2))."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for ns, flag in (("user", 0x10000000), ("net", 0x40000000)):  # CLONE_NEWUSER, CLONE_NEWNET
        fd = os.open(f"/proc/{holder}/ns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, flag) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot join the {ns} namespace of process {holder}")
        finally:
            os.close(fd)


def _child(sock: socket.socket, request: dict, fds: list[int]) -> None:
    """In a forked child: become `python -m module *args` with the launcher's streams."""
    import runpy
    import tempfile
    import traceback

    code = 1
    try:
        sock.close()
        os.setsid()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        if request.get("netns"):  # its cluster's private network (an error lands in its log)
            _join_network(request["netns"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR as the child's environment says
        if processes.watched_lifeline() is not None:  # the launcher's, which the server holds
            os.environ[processes.LIFELINE_ENV] = f"{processes.watched_lifeline()}:{os.getppid()}"
        processes.set_parent_death_signal(signal.SIGKILL)  # goes with the server (Linux)
        sys.argv = [request["module"], *request["args"]]
        try:
            # what `python -m` itself calls: the same sys.argv[0], the same error for a
            # module that is not there ("...python: No module named x", exit code 1)
            runpy._run_module_as_main(request["module"])
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def serve(sock_fd: int, parent_pid: int, preload: list[str]) -> None:
    """The server: import what the cluster's processes import, then fork one child per
    request until the launcher closes the socket (or dies: the lifeline)."""
    import gc
    import importlib
    import warnings

    processes.die_with_parent(parent_pid)
    processes.lean_keras_import()
    for name in ["tensorflow", "keras", *preload]:
        module, _, call = name.partition(":")  # "module:function": import it, then call it
        try:
            loaded = importlib.import_module(module)
            if call:
                getattr(loaded, call)()
        except Exception:  # noqa: BLE001 - a child doing the same fails the same way, in its log
            pass
    # the server's own threads (its reapers, the lifeline's, TF's idle pools) hold nothing a
    # child needs; Python 3.12+ warns about forking with threads at all
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
    sock = socket.socket(fileno=sock_fd)
    send_lock = threading.Lock()

    def send(msg: dict) -> None:
        with send_lock:
            sock.sendall(json.dumps(msg).encode() + b"\n")

    def reap(pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        try:
            send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass

    # what is imported lives as long as every child: frozen, the garbage collector leaves it
    # out of every collection, so a child's collections neither scan it (a node collects after
    # every run) nor write to its pages, which then stay shared with the server
    gc.freeze()
    send({"ready": os.getpid()})
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not data:
            return  # the launcher closed its end
        while not data.endswith(b"\n"):  # a long request comes in pieces
            more = sock.recv(1 << 20)
            if not more:
                return
            data += more
        request = json.loads(data)
        with send_lock:  # no other thread is inside sendall while the child is forked
            pid = os.fork()
        if pid == 0:
            _child(sock, request, fds)
        for fd in fds:
            os.close(fd)
        send({"started": pid})
        threading.Thread(target=reap, args=(pid,), daemon=True).start()


if __name__ == "__main__":
    code = 0
    try:
        serve(
            int(sys.argv[1]),
            int(sys.argv[sys.argv.index("--parent-pid") + 1]),
            [m for m in sys.argv[sys.argv.index("--preload") + 1].split(",") if m],
        )
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)  # at once: an interpreter's exit can wait on TensorFlow's threads
