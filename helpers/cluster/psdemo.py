"""A printable parameter-server demo: one tf.distribute.Server and two client processes.

`run_demo()` starts a driver process (inside a private network namespace when the OS
allows it); the driver starts the PS and two clients, lets client A work and then
client B, and every process reports what it saw as JSON lines. The clients' code is `client()`
below,
short enough to print in a notebook. Every process is ended by PID, even on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from helpers.system import netns
from helpers.system.processes import (
    die_with_parent,
    free_ports,
    kill_group,
    lean_keras_import,
    spawn,
    watch_lifeline,
)

SHARED = "demo/counter"  # shared_name of the PS variable every client can find
MAILBOX = "demo/mailbox"  # shared_name of a PS queue of messages


def serve(port: int) -> None:
    """Be the parameter server: start a TF server for job 'ps' and wait to be ended."""
    import tensorflow as tf

    spec = tf.train.ClusterSpec({"ps": [f"localhost:{port}"]})
    server = tf.distribute.Server(spec, job_name="ps", task_index=0, start=True)
    _say(role="ps", pid=os.getpid(), target=server.target, cluster=spec.as_dict())
    server.join()  # serves until the driver ends this process


def client(port: int, first: bool) -> dict:
    """Connect to the PS, add 1 to a plain and a shared variable there, use a shared queue."""
    import tensorflow as tf

    raw = tf.raw_ops
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [f"localhost:{port}"]}))
    with tf.device("/job:ps/task:0"):
        plain = tf.Variable(0.0, name="counter")  # anonymous: a new one for each client
        plain.assign_add(1.0)
        shared = raw.VarHandleOp(dtype=tf.float32, shape=[], shared_name=SHARED)
        if first:
            raw.AssignVariableOp(resource=shared, value=tf.constant(0.0))
        raw.AssignAddVariableOp(resource=shared, value=tf.constant(1.0))
        mailbox = raw.FIFOQueueV2(
            component_types=[tf.string], shapes=[[]], capacity=10, shared_name=MAILBOX
        )
        raw.QueueEnqueueV2(
            handle=mailbox, components=[tf.constant(f"hello from pid {os.getpid()}")]
        )
        size = int(raw.QueueSizeV2(handle=mailbox))
        letters = (
            []
            if first
            else [
                raw.QueueDequeueV2(handle=mailbox, component_types=[tf.string])[0].numpy().decode()
                for _ in range(size)
            ]
        )
        return {
            "role": "client " + ("A" if first else "B"),
            "pid": os.getpid(),
            "plain_device": plain.device,
            "plain_value": float(plain.numpy()),
            "shared_value": float(raw.ReadVariableOp(resource=shared, dtype=tf.float32)),
            "queue_size": size,
            "letters": letters,
        }


def _say(**msg) -> None:
    print(json.dumps(msg), flush=True)


def _start(args: list[str]) -> subprocess.Popen:
    """Start `python -m helpers.cluster.psdemo ARGS` in this process group, dying with its
    parent."""
    return spawn(
        [sys.executable, "-m", "helpers.cluster.psdemo", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,  # stderr: the driver's
        start_new_session=False,
    )


def _read_report(proc: subprocess.Popen, what: str) -> dict:
    line = proc.stdout.readline()  # blocks until the process reports (or dies)
    if not line:
        proc.wait()
        raise RuntimeError(
            f"{what} (pid {proc.pid}) exited with code {proc.returncode} "
            "before reporting (its error output is above)"
        )
    return json.loads(line)


def drive(port: int) -> None:
    """Start the PS and clients A and B; let A work, then B; report all three; end every child."""
    children = []
    try:
        ps = _start(["ps", "--port", str(port)])
        children.append(ps)
        # all three import TensorFlow at once; each client connects when told to
        clients = [
            _start(["client", "--port", str(port), "--first"]),
            _start(["client", "--port", str(port)]),
        ]
        children += clients
        _say(**_read_report(ps, "the PS"))
        for c, name in zip(clients, ("client A", "client B")):  # B only after A has finished
            c.stdin.write("go\n")
            c.stdin.flush()
            _say(**_read_report(c, name))
            c.wait()
        _say(role="ps", pid=ps.pid, still_running=ps.poll() is None)
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.terminate()
        for proc in children:
            proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def run_demo(isolate: bool | None = None, timeout: float = 300.0) -> list[dict]:
    """Run the whole demo in fresh processes and return what each process reported.

    Args:
        isolate: run inside a private network namespace (only loopback); None = when possible.
        timeout: seconds before the demo is declared hung and ended.
    Returns:
        One dict per report: the PS, client A, client B, and the PS's final state.
    Raises:
        RuntimeError: when a process fails or the demo times out (with its error output).
    """
    network = netns.PrivateNetwork("auto" if isolate is None else isolate, "The PS demo")
    isolated = network.start().isolated
    # in a private namespace every port is free; outside, ask the kernel for one
    port = 2222 if isolated else free_ports(1)[0]
    cmd = network.prefix + [
        sys.executable,
        "-m",
        "helpers.cluster.psdemo",
        "drive",
        "--port",
        str(port),
        "--parent-pid",
        str(os.getpid()),
    ]
    try:
        driver = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(driver.pid)  # the driver and its children share a group
            out, err = driver.communicate()
            raise RuntimeError(
                f"the PS demo took more than {timeout:.0f} s and was ended:\n{err[-2000:]}"
            ) from None
        finally:
            kill_group(driver.pid)  # anything left of the group
            if driver.poll() is None:
                driver.wait()
    finally:
        network.stop()
    if driver.returncode != 0:
        raise RuntimeError(f"the PS demo failed (exit code {driver.returncode}):\n{err[-3000:]}")
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in reports:
        r["isolated"] = isolated
    return reports


def main(argv=None) -> int:
    """Entry point of the demo's processes: `python -m helpers.cluster.psdemo drive|ps|client`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["drive", "ps", "client"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--first", action="store_true", help="client: initialise the shared state")
    p.add_argument("--parent-pid", type=int, default=None)
    args = p.parse_args(argv)
    lean_keras_import()
    if args.role == "drive":
        die_with_parent(args.parent_pid)  # entering the namespace may clear PDEATHSIG
        drive(args.port)
    elif args.role == "ps":
        watch_lifeline()
        serve(args.port)
    else:
        watch_lifeline()
        import tensorflow  # noqa: F401  (import while the PS starts, connect once it is up)

        sys.stdin.readline()  # the driver's go: the PS is serving
        _say(**client(args.port, args.first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
