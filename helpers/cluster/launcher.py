"""LocalCluster: start a PS and N workers as real OS processes, train, and always clean up.

The processes are `python -m helpers.cluster.node` (see node.py), one ChildProcess each
(helpers/system/processes.py); a run is a command sent to all of them, watched until every one
reports done, while the launcher checks for dead processes and for a run that stalls.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

from helpers import config
from helpers.cluster import protocol
from helpers.cluster.dashboard import Dashboard
from helpers.cluster.nodes import Nodes
from helpers.cluster.placement import HostError
from helpers.cluster.run import Run
from helpers.cluster.rundir import RunDir, write_cluster
from helpers.cluster.watch import RunWatch
from helpers.system import netns, resources
from helpers.system.control import Cmd, Event, command
from helpers.system.processes import (
    ChildProcess,
    end_all,
    free_ports,
    hang,
    is_stopped,
    log_section,
    messages,
    unique_name,
)

_LIVE: "weakref.WeakSet[LocalCluster]" = weakref.WeakSet()
_COUNTER = itertools.count()


class ClusterError(RuntimeError):
    """A cluster process died, hung or reported an error."""


@atexit.register
def _stop_all() -> None:
    """Backstop: end every cluster still running when the interpreter exits."""
    for cluster in list(_LIVE):
        cluster.stop()


def _size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


class LocalCluster:
    """Parameter server task(s) and N workers on this machine, as separate OS processes.

    Args:
        workers: number of worker processes (>= 1).
        ps: number of PS tasks (>= 1). With more than one the parameters are sharded over
            them (wire.plan); task 0 also runs the protocol (tokens, decisions, checkpoints).
        isolate: "auto" runs the cluster in a private network namespace when the OS allows
            it (else warns once that ports are reachable from the network); True requires
            it; False never isolates.
        evaluator: also start an evaluator process that tests every checkpoint the PS writes.
        start_timeout: seconds to wait for every process to report ready.
        stall_timeout: seconds without any progress before a run is declared hung.
        placement: None (this machine) or other hosts, e.g. `placement.SSH(["n1", "n2"])`;
            a node there silent for `silent_s` seconds fails the run, naming its host.
    Raises:
        ValueError: for a bad argument, before any process starts.
    """

    def __init__(
        self,
        workers: int = 2,
        isolate="auto",
        evaluator: bool = False,
        start_timeout: float = 120.0,
        stall_timeout: float = 60.0,
        name: str | None = None,
        ps: int = 1,
        placement=None,
        silent_s: float = 5.0,
    ):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        if isinstance(ps, bool) or not isinstance(ps, int) or ps < 1:
            raise ValueError(f"ps must be an integer >= 1 (the number of PS tasks), got {ps!r}")
        self.n_ps = ps  # how many PS tasks hold the parameters (LocalCluster(ps=...))
        for label, value in (("start_timeout", start_timeout), ("stall_timeout", stall_timeout)):
            if not value > 0:
                raise ValueError(f"{label} must be > 0 seconds, got {value!r}")
        self.nodes = Nodes(placement, isolate, silent_s)  # validates `placement`
        self.workers, self.isolate, self.evaluator = workers, isolate, bool(evaluator)
        self.start_timeout, self.stall_timeout = start_timeout, stall_timeout
        self.name = name or unique_name("cluster")
        self.procs: dict[str, ChildProcess] = {}
        self.network = netns.PrivateNetwork(False if self.remote else isolate, "Cluster")
        self.dead_workers: set[int] = set()
        self.log_starts: dict[str, int] = {}  # each log's size when the current run began
        self.inbox: queue.Queue = queue.Queue()
        self.dir = None
        self.startup_s = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self) -> "LocalCluster":
        """Start every process and block until all report ready; raise with a log tail if not."""
        t0 = time.perf_counter()
        processes = self.n_ps + self.workers + self.evaluator
        try:
            resources.check_memory(
                processes,
                f"A cluster of {'1 PS' if self.n_ps == 1 else f'{self.n_ps} PS tasks'}, "
                f"{self.workers} worker(s)"
                f"{' and an evaluator' if self.evaluator else ''}",
                lambda fit: (
                    f"Start fewer workers "
                    f"(workers={max(1, fit - self.n_ps - self.evaluator)} would fit)"
                ),
            )
        except resources.NotEnoughMemory as exc:
            raise ClusterError(str(exc)) from None
        _LIVE.add(self)
        try:
            try:
                prefix = self.network.start().prefix
            except netns.IsolationError as exc:
                raise ClusterError(str(exc)) from None
            self.dir = config.runs_dir(self.name)
            # the other PS tasks first: task 0 connects to them as it starts
            jobs = [("ps", t) for t in range(1, self.n_ps)] + [("ps", 0)]
            jobs += [("worker", i) for i in range(self.workers)]
            jobs += [("evaluator", 0)] if self.evaluator else []
            try:
                spec = self.nodes.spec(jobs, self.dir, self._ps_ports)
            except HostError as exc:
                raise ClusterError(str(exc)) from None
            write_cluster(self.dir / "cluster.json", spec)
            env = dict(
                os.environ,
                TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE="false",
                PYTHONUNBUFFERED="1",
                MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2"),
            )
            argv = {
                f"{job}:{task}": prefix
                + [sys.executable, "-m", "helpers.cluster.node", "--cluster"]
                + [str(self.dir / "cluster.json"), "--job", job, "--task", str(task), "--control"]
                for job, task in jobs
            }
            started = self.nodes.start(argv, env, self.dir, self.inbox, netns=self.network.pid)
            self.procs.update(started)
            self.nodes.start_pinging(self.procs)
            waiting = set(self.procs)
            deadline = time.monotonic() + self.start_timeout
            while waiting:
                name, msg = self._next_message(deadline, "start-up", waiting)
                if msg.get("event") == Event.READY:
                    waiting.discard(name)
                    self.nodes.node_pids[name] = msg.get("pid")
            self.startup_s = time.perf_counter() - t0
            return self
        except BaseException:
            self.stop()
            raise

    def where(self, name: str) -> str:
        """A process as errors name it: "worker:1 (pid 123)", or with its host when remote."""
        proc = self.procs.get(name)
        return self.nodes.where(name, proc.pid if proc else None)

    def stop(self) -> None:
        """End every process of the cluster at once (idempotent): ask each to exit, then the
        teardown every launcher shares (end_all), stopped processes included."""
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                try:
                    proc.send(command(Cmd.EXIT))
                except (BrokenPipeError, OSError, ValueError):
                    pass
        end_all(self.procs.values())
        self.nodes.stop()  # after end_all: it removes the processes' temporary files
        self.procs.clear()
        self.network.stop()
        _LIVE.discard(self)

    @property
    def pids(self) -> dict[str, int]:
        """PID of each process, by name ("ps:0", "worker:1", ...)."""
        return {name: p.pid for name, p in self.procs.items()}

    def kill(self, name: str, sig=signal.SIGKILL) -> None:
        """Send a signal to one process of the cluster (fault injection by hand); SIGSTOP
        stops it as the hang fault does, so that it still ends with this process."""
        if self.remote:
            raise ValueError(
                f"kill() signals processes of this machine; {name} runs on "
                f"{self.nodes.hosts.get(name)}: inject the fault with train(faults=...)"
            )
        if sig == signal.SIGSTOP:
            hang(self.procs[name].pid)
        else:
            os.kill(self.procs[name].pid, sig)

    # ------------------------------------------------------------------ waiting
    def _fail(self, what: str, name: str | None):
        detail = ""
        if name is not None and name in self.procs:
            proc = self.procs[name]
            # a process serves many runs: show only what it logged during this one
            start = self.log_starts.get(name, 0)
            detail = log_section(proc.log_path, start)
        self.stop()
        raise ClusterError(what + detail)

    def _check_deaths(self, during: str, tolerate_workers: bool):
        for name, proc in self.procs.items():
            how = proc.died()
            if how is None:
                continue
            if tolerate_workers and name.startswith("worker:"):
                task = int(name.split(":")[1])
                if task not in self.dead_workers:
                    self.dead_workers.add(task)
                    self.nodes.tell_ps_lost(self.procs, task)
                continue
            hint = ""
            if name.startswith("worker:") and during == "sync":
                hint = (
                    "; sync (BSP) training cannot finish without every worker: "
                    "use mode='backup' with k < workers to tolerate a lost worker"
                )
            self._fail(f"{self.where(name)} {how} during {during}{hint}", name)

    def _messages(self, during: str):
        """messages(inbox), less the pongs of nodes on other hosts, which it records; a node
        silent for silent_s seconds (once it has answered) fails the run, naming its host."""
        for name, msg in messages(self.inbox):
            if msg.get("event") == Event.PONG:
                self.nodes.pong(name, msg)
                continue
            silent = self.nodes.silent(self.procs) if name is None else None
            if silent:
                self._fail(
                    f"{self.where(silent[0])} has not answered for {silent[1]:.1f} s during "
                    f"{during}: the host is down or cut off from this one",
                    silent[0],
                )
            yield name, msg

    def _next_message(self, deadline, during, waiting=(), tolerate_workers=False):
        for name, msg in self._messages(during):
            if name is not None:
                return name, msg
            self._check_deaths(during, tolerate_workers)
            if time.monotonic() > deadline:
                slow = sorted(waiting)
                self._fail(
                    f"timed out after {self.start_timeout:.0f} s waiting for {slow} "
                    f"during {during}",
                    slow[0] if slow else None,
                )

    # ------------------------------------------------------------------ training
    def train(self, progress: bool | str = True, **kwargs) -> Run:
        """Train one model on the cluster; return the Run with its events and summary.

        Args:
            progress: show the live dashboard (dashboard.py): True for a widget in Jupyter
                and a text line elsewhere, "text" or "widget" to choose, False for none.
            **kwargs: the fields of protocol.RunConfig except `workers` (mode, model, data,
                steps, batch_size, lr, staleness, k, stale, stragglers, faults, ...).
        Raises:
            ValueError: for a bad configuration, before anything is sent to the cluster.
            ClusterError: when a process dies, hangs (stall_timeout) or reports an error.
        """
        if progress not in (True, False, "auto", "widget", "text"):
            raise ValueError(f"progress must be True, False, 'widget' or 'text', got {progress!r}")
        if not self.procs:
            raise ClusterError(
                "the cluster is not running: use `with LocalCluster(...) as c:` "
                "or call start() (a failed run stops the cluster)"
            )
        live = [w for w in range(self.workers) if w not in self.dead_workers]
        kwargs.setdefault("worker_ids", live[: kwargs.get("workers", len(live))])
        kwargs.setdefault("workers", len(kwargs["worker_ids"]))
        kwargs["evaluator"] = self.evaluator and self.procs["evaluator:0"].died() is None
        if not kwargs.get("run_id"):
            kwargs["run_id"] = f"{self.name}-run{next(_COUNTER)}"
        cfg = protocol.validate(protocol.RunConfig(**kwargs))
        bad = [k for k in cfg.faults if (protocol.ps_fault_task(k) or 0) >= self.n_ps]
        if bad:
            raise ValueError(
                f"faults {bad} name PS tasks this cluster does not have: it has "
                f"ps={self.n_ps} (tasks 0 to {self.n_ps - 1})"
            )
        self.nodes.check_faults(cfg.faults)
        run_dir = config.runs_dir(cfg.run_id)
        cfg_path = RunDir(run_dir).write_config(cfg)
        missing = [w for w in cfg.worker_ids if w in self.dead_workers or w >= self.workers]
        if missing:
            raise ValueError(f"workers {missing} are dead or do not exist; live workers: {live}")
        pids = {w: self.procs[f"worker:{w}"].pid for w in cfg.worker_ids}
        ps_pids = {t: self.procs[f"ps:{t}"].pid for t in range(self.n_ps)}
        if self.remote:  # PIDs of this machine: the launcher watches them instead
            pids, ps_pids = {}, {}
            RunDir(run_dir).write_clock_offsets(self.nodes.clock_offsets())
        self.log_starts = {name: _size(proc.log_path) for name, proc in self.procs.items()}
        since = time.time()  # this attempt's START and JOINED are logged after it
        for proc in self.procs.values():
            if proc.died() is None:
                proc.send(command(Cmd.RUN, config=str(cfg_path), worker_pids=pids, ps_pids=ps_pids))
        return self._watch(cfg, run_dir, progress, since)

    def _watch(self, cfg, run_dir, progress, since: float) -> Run:
        """Route messages and watch deaths and progress until every process is done."""
        from helpers.system.resources import ResourceMonitor

        board = None
        if progress:
            board = Dashboard(
                cfg,
                progress if isinstance(progress, str) else "auto",
                status=lambda: self._worker_status(cfg),
            )
        waiting = {n for n, p in self.procs.items() if p.died() is None}
        watch = RunWatch(waiting, RunDir(run_dir).tail(), board, since)
        lo_before = self.loopback_bytes()
        t0 = time.perf_counter()
        with ResourceMonitor(list(self.pids.values()), interval=0.5, pss_every=2.0) as monitor:
            try:
                for name, msg in self._messages(cfg.mode) if watch.waiting else ():
                    # a dead PS explains the workers' errors: name it first
                    self._check_deaths(cfg.mode, tolerate_workers=True)
                    watch.waiting -= {f"worker:{w}" for w in self.dead_workers}
                    self._route(cfg, watch, name, msg)
                    self._check_progress(cfg, watch)
                    if not watch.waiting:
                        break
            finally:
                if watch.board:
                    watch.board.close(watch.tail.read())
        wall = time.perf_counter() - t0
        lo_after = self.loopback_bytes()
        if self.remote:  # the estimates improved while the run went on
            RunDir(run_dir).write_clock_offsets(self.nodes.clock_offsets())
        if watch.ps_error is not None:
            lost = [f"worker:{w}" for w in sorted(self.dead_workers) if w in cfg.worker_ids]
            lost = [f"{self.where(n)} {self.procs[n].died()}" for n in lost if n in self.procs]
            where = f" (lost: {'; '.join(lost)})" if lost else ""
            raise ClusterError(f"run {cfg.run_id} failed: {watch.ps_error}{where}")
        names = {pid: name for name, pid in self.pids.items()}
        resources = {names.get(pid, pid): v for pid, v in monitor.summary().items()}
        # this run's losses (the cluster's own dead_workers keeps every run's)
        died = sorted(w for w in self.dead_workers if w in cfg.worker_ids)
        run = Run(cfg, run_dir, watch.results, wall, resources, died)
        if lo_before is not None and lo_after is not None:
            run.loopback_bytes = lo_after - lo_before
        run.cpu_samples = {names.get(pid, pid): v for pid, v in monitor.cpu_times.items()}
        return run

    def _route(self, cfg, watch: RunWatch, name: str | None, msg: dict) -> None:
        """Act on one message of a process: done, or an error."""
        if msg.get("event") == Event.ERROR and name == "ps:0":
            # a protocol error (e.g. a lost worker in sync mode): the PS has closed the run's
            # queues, so the workers finish and the cluster lives
            watch.ps_error = msg["error"]
            watch.waiting.discard(name)
        elif msg.get("event") == Event.ERROR:
            # a worker may see the PS's sockets close before the PS is reapable: give a dying
            # PS a moment, so that the error names the real culprit
            try:
                self.procs["ps:0"].popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
            self._check_deaths(cfg.mode, tolerate_workers=True)
            self._fail(f"{name} failed during run {cfg.run_id}: {msg['error']}", name)
        elif msg.get("event") == Event.DONE:
            watch.waiting.discard(name)
            watch.results[name] = msg.get("result")

    def _worker_status(self, cfg) -> tuple[set[int], set[int], bool]:
        """For the dashboard: the run's workers whose process is stopped, those that died, and
        whether the PS's process is stopped."""
        stopped = {
            w
            for w in cfg.worker_ids
            if f"worker:{w}" in self.procs and is_stopped(self.procs[f"worker:{w}"].pid)
        }
        ps = self.procs.get("ps:0")
        return (
            stopped,
            {w for w in self.dead_workers if w in cfg.worker_ids},
            ps is not None and is_stopped(ps.pid),
        )

    def _check_progress(self, cfg, watch: RunWatch) -> None:
        """Feed the dashboard with new events; fail the run when none came for too long."""
        events = watch.read()
        if watch.board:  # with no new events still redrawn (a silent worker may be hung)
            watch.board.update(events)
        overdue = None if events else watch.overdue(self.start_timeout, self.stall_timeout)
        if overdue is None:
            return
        limit, which = overdue
        stopped = [n for n, p in self.procs.items() if is_stopped(p.pid)]
        self._fail(
            f"no progress for {limit:.0f} s ({which}) in run {cfg.run_id}; hung or "
            f"stopped processes: {stopped or 'none found'}",
            stopped[0] if stopped else "ps:0",
        )

    @property
    def remote(self) -> bool:
        """True when the processes run on other hosts (placement)."""
        return self.nodes.placement.remote

    def _ps_ports(self) -> list[int]:  # on this machine; any port is free in a namespace
        return [2222 + t for t in range(self.n_ps)] if self.isolated else free_ports(self.n_ps)

    @property
    def isolated(self) -> bool:
        """True when the processes run in a private network namespace (see netns)."""
        return self.network.isolated

    def loopback_bytes(self) -> int | None:
        """Bytes sent over the private namespace's loopback so far (None when not isolated)."""
        return self.network.loopback_bytes()
