"""A cluster's processes on their hosts, as a launcher knows them (LocalCluster, TFConfigCluster):
where each runs and its address, how each is started with its lifeline, and, for those on other
hosts, their answers to the launcher's pings: liveness and clock offsets. The placements
themselves (this machine, Slurm, SSH) are placement.py.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from helpers.cluster import protocol
from helpers.cluster.placement import Hosts, Local
from helpers.system import clock, forkserver
from helpers.system.control import Cmd, command
from helpers.system.processes import ChildProcess

# what a node imports as it trains, besides TensorFlow and Keras: its fork server imports them,
# and holds MNIST's images (if downloaded), which the nodes would read again at every run
PRELOAD = (
    "helpers.cluster.wire",
    "helpers.cluster.ps",
    "helpers.cluster.worker",
    "helpers.cluster.evaluator",
    "helpers.training.models",
    "helpers.data.arrays",
    "helpers.data.mnist:hold",
)


class Nodes:
    """A cluster's processes on their hosts, as the launcher knows them: where each runs, its
    PID there, and for those on other hosts their answers to its pings (lifeline, liveness,
    clock offset).

    Args:
        placement: None (this machine) or a placement (SSH(...)).
        isolate: the cluster's `isolate`; True cannot be had on other hosts.
        silent_s: a node on another host that has answered before and is silent this long
            is lost (its host is down, or cut off).
    """

    def __init__(self, placement, isolate, silent_s: float = 5.0):
        self.placement = Local() if placement is None else placement
        if not isinstance(self.placement, (Local, Hosts)):
            raise ValueError(
                "placement must be None (this machine) or a placement such as "
                f"placement.SSH([...]), got {placement!r}"
            )
        if self.placement.remote and isolate is True:
            raise ValueError(
                "isolate=True keeps a cluster inside this machine; a cluster placed on other "
                "hosts cannot be: use isolate='auto' or False"
            )
        self.silent_s = silent_s
        self.hosts: dict[str, str] = {}  # process -> its host ("localhost" on this machine)
        self.node_pids: dict[str, int] = {}  # process -> its PID on its own host
        self.clocks: dict[str, clock.OffsetEstimate] = {}  # remote process -> its clock
        self.heard: dict[str, float] = {}  # remote process -> when it last answered
        self._stop = threading.Event()
        self.tmp: Path | None = None  # TMPDIR of every node: the cluster's folder/tmp
        self.server: forkserver.ForkServer | None = None  # forks them, on Linux (shared)

    def spec(self, jobs, folder: Path, local_ps_ports) -> dict[str, list[str]]:
        """The engine's cluster file: the PS tasks' addresses on this machine
        (`local_ps_ports()`); every process's when placed on other hosts (place())."""
        order = {"ps": 0, "worker": 1, "evaluator": 2}  # PS tasks first: on different hosts
        names = [f"{job}:{task}" for job, task in sorted(jobs, key=lambda j: (order[j[0]], j[1]))]
        if not self.placement.remote:
            self.hosts = {name: "localhost" for name in names}
            return {"ps": [f"localhost:{port}" for port in local_ps_ports()]}
        return self.place(names, folder)

    def place(self, names: list[str], folder: Path) -> dict[str, list[str]]:
        """Give each process ("ps:0", ...) a host, round robin in the order given (each job's
        tasks in order), check every host (HostError), and return each job's addresses
        ({"ps": ["10.0.0.2:2222", ...], ...}), which the others must reach."""
        placed = self.placement.assign(names)
        self.placement.check(placed, folder)
        self.hosts = {name: host for name, (host, _) in placed.items()}
        jobs: dict[str, list[str]] = {}
        for name, (host, port) in placed.items():
            jobs.setdefault(name.split(":")[0], []).append(f"{self.placement.address[host]}:{port}")
        return jobs

    def start(
        self, argv: dict, env: dict, folder: Path, inbox, envs=None, netns: int | None = None
    ) -> dict:
        """Start every process where it is placed (`argv`: name -> this Python and a module's
        arguments, in starting order; `envs`: name -> the variables a process adds to `env`),
        with its lifeline: the parent's PID on this machine (--parent-pid), stdin on another
        host (--remote). On this machine they are forked from this process's fork server for
        them (forkserver.shared), each joining the network namespace that process `netns`
        holds, if any; spawned with `argv`'s prefix where forking is off. Returns
        ChildProcess(-like) objects by name; logs <name>.log."""
        logs = {n: Path(folder) / f"{n.replace(':', '-')}.log" for n in argv}
        # TF writes a file for each function it traces and deletes it only at a normal exit:
        # a node ended by a signal would leave them in its host's temp folder. The cluster's
        # folder is on every host (placements check it), and stop() removes this one.
        self.tmp = Path(folder) / "tmp"
        self.tmp.mkdir(exist_ok=True)
        envs = {n: dict(env, **(envs or {}).get(n, {}), TMPDIR=str(self.tmp)) for n in argv}
        if not self.placement.remote:
            if forkserver.enabled():  # TensorFlow imported once per process, each node forked
                _, module, _ = forkserver.ForkServer.module_of(next(iter(argv.values())))
                self.server = forkserver.shared(env, (module, *PRELOAD))
            parent = ["--parent-pid", str(self.server.pid if self.server else os.getpid())]
            server = self.server.joining(netns) if self.server else None
            return {
                n: ChildProcess(n, c + parent, envs[n], logs[n], inbox, server)
                for n, c in argv.items()
            }
        self.clocks = {n: clock.OffsetEstimate() for n in argv}
        remote_argv = {n: cmd + ["--remote"] for n, cmd in argv.items()}
        return self.placement.start(list(argv), remote_argv, envs, logs, inbox, self.hosts)

    @property
    def server_pid(self) -> int | None:
        """PID of the fork server the processes on this machine were forked from, or None
        (spawned one by one, or on other hosts)."""
        return self.server.pid if self.server else None

    def start_pinging(self, procs: dict) -> None:
        """Ping every node on another host each second, in a thread, until stop()."""
        if self.placement.remote:
            threading.Thread(target=self._ping, args=(procs,), daemon=True).start()

    def _ping(self, procs: dict) -> None:
        while not self._stop.wait(1.0):
            # one ping per channel: an ssh client per process, or an srun step for all its
            # tasks (its stdin reaches every task; each answers)
            channels = {id(c): c for c in (getattr(p, "step", p) for p in list(procs.values()))}
            for channel in channels.values():
                try:
                    channel.send(command(Cmd.PING, t=time.time()))
                except (BrokenPipeError, OSError, ValueError):
                    pass

    def stop(self) -> None:
        """Stop pinging; once the processes have ended, remove their temporary files (their
        fork server is this process's, and serves its next cluster)."""
        self._stop.set()
        self.server = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def pong(self, name: str, msg: dict) -> None:
        """A node answered a ping: it is there, and its clock read msg["node_t"]."""
        self.heard[name] = time.monotonic()
        self.clocks[name].add(msg["t"], msg["node_t"], time.time())

    def silent(self, procs: dict) -> tuple[str, float] | None:
        """The running node silent longest past silent_s, and for how long (s), or None. Only
        nodes that have reported ready count: loading TensorFlow's library holds a starting
        node's interpreter for seconds on a busy machine (start_timeout covers start-up)."""
        now = time.monotonic()
        silent = {
            n: now - t
            for n, t in self.heard.items()
            if now - t > self.silent_s
            and n in self.node_pids
            and n in procs
            and procs[n].died() is None
        }
        return max(silent.items(), key=lambda kv: kv[1]) if silent else None

    def check_faults(self, faults: dict) -> None:
        """On other hosts, PS task 0 cannot signal another PS task (it signals a PID of its own
        host): refuse such a fault before the run starts (ValueError)."""
        other = [k for k in faults if (protocol.ps_fault_task(k) or 0) > 0]
        if self.placement.remote and other:
            raise ValueError(
                f"faults {other} stop or kill PS tasks other than 0, which PS task 0 does by "
                "PID on its own machine: on several hosts, fault PS task 0 ('ps') or a worker"
            )

    def tell_ps_lost(self, procs: dict, worker: int) -> None:
        """On other hosts the PS cannot see a worker's PID: tell it the worker is gone."""
        ps0 = procs.get("ps:0")
        if self.placement.remote and ps0 is not None and ps0.died() is None:
            try:
                ps0.send(command(Cmd.DEAD, worker=worker))
            except (BrokenPipeError, OSError, ValueError):
                pass

    def clock_offsets(self) -> dict[str, float]:
        """Each node's clock offset (s, ahead of this machine's; 0 when within its error) by
        its log's name ("worker-1"); {} on this machine."""
        return {
            name.replace(":", "-"): est.significant
            for name, est in self.clocks.items()
            if est.offset is not None
        }

    def where(self, name: str, local_pid: int | None) -> str:
        """A process as errors name it: "worker:1 (pid 123)", or with its host when remote."""
        if not self.placement.remote:
            return f"{name} (pid {local_pid or '?'})"
        pid = self.node_pids.get(name, "?")
        return f"{name} on host {self.hosts.get(name, '?')} (pid {pid} there)"
