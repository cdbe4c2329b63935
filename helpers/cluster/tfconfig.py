"""Start a TF_CONFIG cluster for TF's own strategies: one OS process per task, always cleaned up.

Each task runs `python -m helpers.cluster.strategies job.json` with its own TF_CONFIG environment
variable, which tells it the cluster and its role. The process plumbing (free ports,
dying with the parent, one process group each, log tails) is helpers/processes.py.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import time
from pathlib import Path

from helpers import config
from helpers.cluster import netns
from helpers.processes import ChildProcess, NoResult, free_ports, log_tail, wait_for_results

ROLES = ("chief", "worker", "ps")
_COUNTER = itertools.count()


class TFConfigError(RuntimeError):
    """A task of a TF_CONFIG cluster failed, died or timed out."""


def cluster_spec(roles: dict, host: str = "localhost") -> dict:
    """A cluster dict {"worker": ["localhost:PORT", ...], ...} with fresh ports."""
    for role, count in roles.items():
        if role not in ROLES:
            raise ValueError(f"unknown task type {role!r}: use {', '.join(ROLES)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"the number of {role} tasks must be an integer >= 1, got {count!r}")
    if roles.get("chief", 0) > 1:
        raise ValueError(f"a cluster has at most one chief, got {roles['chief']}")
    if "worker" not in roles:
        raise ValueError(f"a cluster needs at least one worker, got roles {roles}")
    ports = iter(free_ports(sum(roles.values())))
    return {role: [f"{host}:{next(ports)}" for _ in range(count)] for role, count in roles.items()}


def tf_config(cluster: dict, task_type: str, index: int) -> str:
    """The TF_CONFIG value for one task: the whole cluster plus this task's role."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


class TFConfigCluster:
    """The processes of one TF_CONFIG cluster, running one job; use as a context manager.

    Args:
        roles: tasks per type, e.g. {"worker": 2} (MultiWorkerMirroredStrategy) or
            {"chief": 1, "worker": 2, "ps": 1} (ParameterServerStrategy).
        job: the job dict every task reads (see helpers.cluster.strategies). Task types listed in
            `servers` get {"kind": "server"} instead.
        servers: task types that only serve (never finish on their own); they are ended
            once every other task is done.
        timeout: seconds to wait for the job before ending every process.
        isolate: "auto" runs every task in a private network namespace when the OS allows it
            (warning once when not), True insists, False never isolates (see netns.py).
    Raises:
        ValueError: for bad roles or timeout, before any process starts.
    """

    def __init__(self, roles: dict, job: dict, servers=(), timeout: float = 600.0,
                 name: str | None = None, module: str = "helpers.cluster.strategies",
                 isolate="auto"):
        self.cluster = cluster_spec(roles)
        if module == "helpers.cluster.strategies":
            from helpers.cluster.strategies import validate

            validate(job, workers=roles.get("worker", 1))
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if set(servers) >= set(roles):
            raise ValueError(f"servers={list(servers)} leaves no task to run the job {roles}")
        self.job, self.servers, self.timeout, self.module = job, tuple(servers), timeout, module
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.name = name or f"tfconfig-{stamp}-{os.getpid()}-{next(_COUNTER)}"
        self.dir: Path | None = None
        self.procs: dict[str, ChildProcess] = {}
        self.inbox: queue.Queue = queue.Queue()
        self.network = netns.PrivateNetwork(isolate, "TF_CONFIG cluster")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def pids(self) -> dict[str, int]:
        """PID of each task, by name ("worker:0", "ps:0", ...)."""
        return {name: p.pid for name, p in self.procs.items()}

    def start(self) -> "TFConfigCluster":
        """Start one process per task (returns at once; the tasks find each other)."""
        try:
            prefix = self.network.start().prefix  # only loopback inside, when possible
        except netns.IsolationError as exc:
            raise TFConfigError(str(exc)) from None
        self.dir = config.runs_dir("tfconfig", self.name)
        files = {}
        for kind, job in (("job", self.job), ("server", {"kind": "server"})):
            files[kind] = self.dir / f"{kind}.json"
            files[kind].write_text(json.dumps(job))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            for role, addresses in self.cluster.items():
                for index in range(len(addresses)):
                    name = f"{role}:{index}"
                    job_file = files["server" if role in self.servers else "job"]
                    cmd = prefix + [sys.executable, "-m", self.module, str(job_file)]
                    self.procs[name] = ChildProcess(name, cmd, dict(env, TF_CONFIG=tf_config(
                        self.cluster, role, index)), self.dir / f"{role}-{index}.log", self.inbox)
        except BaseException:
            self.stop()
            raise
        return self

    def wait(self) -> dict:
        """Wait until every non-server task reports its result; return them by task name.

        Raises:
            TFConfigError: a task exited without a result, or the timeout passed (every
                process is ended first, and the error shows the failing task's log tail).
        """
        tasks = [n for n in self.procs if n.split(":")[0] not in self.servers]
        try:
            return wait_for_results(self.procs, self.inbox, tasks, self.timeout)
        except NoResult as exc:
            failed = exc
        if failed.how.startswith("timed out"):
            self._fail(f"{failed.how} waiting for {failed.waiting}", failed.name)
        self._fail(f"{failed.name} (pid {self.procs[failed.name].pid}) {failed.how} "
                   "before reporting a result", failed.name)

    def _fail(self, what: str, name: str):
        log = self.procs[name].log_path
        self.stop()
        raise TFConfigError(f"{what}\n--- last lines of {log} ---\n{log_tail(log)}")

    def stop(self) -> None:
        """End every task's process group (idempotent)."""
        for proc in self.procs.values():
            proc.kill()
        self.procs.clear()
        self.network.stop()


def run(roles: dict, job: dict, servers=(), timeout: float = 600.0, name: str | None = None,
        isolate="auto"):
    """Start a cluster, run `job`, end every process; return (results, resources, wall seconds).

    `resources` maps task name -> {"cpu_percent", "peak_rss_mb"} sampled with psutil.
    """
    from helpers.resources import ResourceMonitor

    t0 = time.perf_counter()
    with TFConfigCluster(roles, job, servers, timeout, name, isolate=isolate) as cluster:
        names = {pid: n for n, pid in cluster.pids.items()}
        with ResourceMonitor(list(names), interval=0.5) as monitor:
            results = cluster.wait()
    resources = {names[pid]: v for pid, v in monitor.summary().items()}
    return results, resources, time.perf_counter() - t0
