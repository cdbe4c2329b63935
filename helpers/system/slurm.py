"""Processes on the nodes of a Slurm allocation: its nodes and their addresses, and one `srun`
job step whose tasks talk to their parent as children do.

Slurm's own commands, not a library (pyslurm needs Slurm's headers at the cluster's exact
version; submitit submits jobs but does not start the tasks of a step inside an allocation):
`scontrol show hostnames` expands a node list, `scontrol show node` gives a node's address
(NodeAddr: node names need not resolve), and `srun` starts a step's tasks.

One step, many tasks: `srun --label` prefixes each line a task prints with its rank, and
`srun`'s stdin goes to every task. So a task's messages are told apart by their label, and a
message for one task carries its name (`to`); the others drop it. `--distribution=arbitrary`
with SLURM_HOSTFILE puts task i on the i-th node listed there: the parent chooses each task's
node. `--kill-on-bad-exit=0` and `--no-kill`: a task or node that fails does not end the
others (an async run goes on without a lost worker; the parent decides).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

from helpers.system.control import Event
from helpers.system.processes import kill_group, spawn

# What each task of a step runs first (standard library only): its own argv, variables and log
# from a JSON list, by SLURM_PROCID; then it becomes that program (exec: the same PID).
TASK = [
    "-I",
    "-S",
    "-c",
    "import json, os, sys\n"
    "me = json.load(open(sys.argv[1]))[int(os.environ['SLURM_PROCID'])]\n"
    "os.environ.update(me['env'])\n"
    "fd = os.open(me['log'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
    "os.dup2(fd, 2)\n"
    "os.execv(me['argv'][0], me['argv'])\n",
]
LABEL = re.compile(rb"^\s*(\d+): ?(.*)$")
ENDED = re.compile(r"task (\d+): (.+)$")  # srun: error: n2: task 3: Killed
# A step's tasks that have reported get GRACE_S to exit by themselves before srun is asked to
# cancel the step (MultiWorkerMirroredStrategy's workers catch SIGTERM and take over a second
# to leave after their result, quiet; with 3 s, a loaded CI run saw one not exit cleanly): the
# teardown of a local cluster (processes.end_all) gives as long. srun then gets CANCEL_S.
GRACE_S, CANCEL_S = 5.0, 3.0


class SlurmError(RuntimeError):
    """Slurm's commands are missing, or the allocation cannot be read."""


def _run(cmd: list[str], timeout: float = 30) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: run this inside a Slurm allocation") from None
    if done.returncode:
        raise SlurmError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")
    return done.stdout


def job_nodes(job_id: str) -> list[str]:
    """The nodes of job `job_id`, in Slurm's order."""
    nodelist = _run(["squeue", "-h", "-j", str(job_id), "-o", "%N"]).strip()
    if not nodelist:
        raise SlurmError(f"job {job_id} has no nodes (is it running? `squeue -j {job_id}`)")
    return _run(["scontrol", "show", "hostnames", nodelist]).split()


def node_addresses(nodes: list[str]) -> dict[str, str]:
    """The address Slurm reaches each node at (its NodeAddr), from one `scontrol` call."""
    out = _run(["scontrol", "--oneliner", "show", "node", ",".join(nodes)])
    found = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", out))
    return {node: found.get(node, node) for node in nodes}


class SrunStep:
    """One `srun` step; its tasks' messages reach `inbox` as (name, message), by rank."""

    def __init__(self, cmd: list[str], env: dict, names: list[str], log: Path, inbox):
        self.names, self.inbox = list(names), inbox
        self.ended: dict[str, str] = {}  # task -> how srun said it ended
        self.error: str | None = None  # srun's last error about the whole step
        self.eof_at: float | None = None
        self.log = open(log, "wb")
        self._lock = threading.Lock()
        self._terminated = False
        self.popen = spawn(
            cmd, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.pid = self.popen.pid
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        for line in self.popen.stdout:
            found = LABEL.match(line.rstrip(b"\n"))
            if not found or int(found.group(1)) >= len(self.names):
                continue
            try:
                self.inbox.put((self.names[int(found.group(1))], json.loads(found.group(2))))
            except ValueError:
                pass
        self.eof_at = time.time()
        for name in self.names:
            self.inbox.put((name, {"event": Event.EOF}))

    def _read_err(self) -> None:
        for line in self.popen.stderr:
            self.log.write(line)
            self.log.flush()
            text = line.decode(errors="replace").strip()
            found = ENDED.search(text)
            if found and int(found.group(1)) < len(self.names):
                self.ended[self.names[int(found.group(1))]] = found.group(2).lower()
            elif text.startswith("srun: error:"):  # e.g. the step could not be created
                self.error = text

    def send(self, msg: dict) -> None:
        """Write one JSON message to every task's stdin."""
        with self._lock:
            self.popen.stdin.write((json.dumps(msg) + "\n").encode())
            self.popen.stdin.flush()

    def terminate(self, grace: float = GRACE_S) -> None:
        """See StepTask.terminate (idempotent)."""
        if self._terminated:
            return
        self._terminated = True
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.popen.terminate()

    def tasks(self, logs: dict[str, Path]) -> dict[str, StepTask]:
        """Each task as a ChildProcess-like view, by name (`logs`: the log each task writes)."""
        return {name: StepTask(self, name, logs[name]) for name in self.names}


class StepTask:
    """One task of an SrunStep, looking to its parent like a processes.ChildProcess: what is
    sent to it goes to every task with its name; it has died when srun says so, or when the
    step has ended; its log is the file it writes itself."""

    def __init__(self, step: SrunStep, name: str, log_path: Path):
        self.step, self.name, self.log_path = step, name, Path(log_path)
        self.popen, self.pid = step.popen, step.pid

    @property
    def eof_at(self) -> float | None:
        return self.step.eof_at

    def send(self, msg: dict) -> None:
        self.step.send(dict(msg, to=self.name))

    def died(self) -> str | None:
        if self.name in self.step.ended:
            return self.step.ended[self.name]
        rc = self.popen.poll()
        if rc is None:
            return None
        # srun names each task that failed; with none named and 0, every task exited with 0
        if rc == 0:
            return "exited with code 0"
        said = f" ({self.step.error})" if self.step.error else ""
        return f"ended with its srun step (exit code {rc}){said}"

    def terminate(self) -> None:
        """End the whole step, once for all its tasks: GRACE_S for the tasks to exit by
        themselves (they were asked to, or have reported and are leaving), then SIGTERM to
        srun, which cancels the step (Slurm kills what is left)."""
        self.step.terminate()

    def reap(self, timeout: float) -> None:
        """Wait for srun to end (at least CANCEL_S: the step's grace can have used up the
        caller's `timeout`, and srun SIGKILLed leaves the step's tasks to Slurm's own
        clean-up), then SIGKILL its group."""
        try:
            self.popen.wait(max(timeout, CANCEL_S))
        except subprocess.TimeoutExpired:
            kill_group(self.pid)
            self.popen.wait()
        for f in (self.popen.stdin, self.step.log):
            try:
                f.close()
            except OSError:
                pass
