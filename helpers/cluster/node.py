"""One process of the cluster: `python -m helpers.cluster.node --cluster c.json --job ps --task 0`.

A node connects to the PS's TensorFlow server (or, as the PS, starts it), then takes part in
training runs as its job: ps.py's loop on the PS, worker.py's on a worker, evaluator.py's on
the evaluator; wire.py declares the shared resources they talk through. Under a launcher
(--control) the node reads run commands from stdin and answers on stdout; standalone
(--run config.json) it runs one run and exits. On another host than its launcher (--remote:
through ssh, or a task of an srun step) its stdin is its lifeline and it answers the
launcher's pings.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from helpers.system import clock
from helpers.system.control import Cmd, Event, event_writer
from helpers.system.processes import die_with_parent, lean_keras_import
from helpers.system.remote import remote_lifeline


def wait_until_closed(
    address: str, who: str, every: float = 1.0, misses: int = 3, never_s: float = 600.0
) -> None:
    """Return once PS task 0's port (`address`) has refused `misses` times in a row after it was
    reached (task 0's process exits when the run ends); raise if it was never reached in
    `never_s` seconds (task 0 never started, or is unreachable). `who` names the caller."""
    import socket
    import time

    host, port = address.rsplit(":", 1)
    reached, missed, start = False, 0, time.monotonic()
    while missed < misses:
        try:
            socket.create_connection((host, int(port)), timeout=every).close()
            reached, missed = True, 0
        except OSError as err:
            missed += reached
            if not reached and time.monotonic() - start > never_s:
                raise RuntimeError(
                    f"{who}: PS task 0 at {address} was never reachable in {never_s:.0f} s; "
                    f"start it (or check the address in the cluster file)"
                ) from err
        time.sleep(every)


class Node:
    """The TF side of one process: connect, then run training runs."""

    def __init__(self, cluster: dict, job: str, task: int, say=None):
        import tensorflow as tf

        self.tf, self.cluster, self.job, self.task, self._say = tf, cluster, job, task, say
        self.on_dead = None  # PS task 0 on another host: called with a worker the launcher lost
        self.ps_addrs = list(cluster["ps"])
        self.ps_devices = [
            f"/job:ps/replica:0/task:{t}/device:CPU:0" for t in range(len(self.ps_addrs))
        ]
        self.ps_device = self.ps_devices[0]  # PS task 0: the protocol's queues and counters
        self.server = None
        spec = tf.train.ClusterSpec({"ps": self.ps_addrs})
        if job == "ps" and task > 0:
            # another PS task of a sharded cluster only holds pieces of the parameters: a
            # plain TF server, which the others reach (eager clients each waiting for the
            # others at their first op would deadlock, as workers listed in one spec do)
            self.server = tf.distribute.Server(spec, job_name="ps", task_index=task, start=True)
        elif job == "ps":
            # every worker blocked in a dequeue holds one inter-op thread of the PS: with the
            # default (one per core) a third waiting worker starves everyone else
            tf.config.threading.set_inter_op_parallelism_threads(64)
            tf.config.experimental_connect_to_cluster(spec, job_name="ps", task_index=0)
            int(tf.constant(1) + 1)  # the context, and with it the server, starts lazily
        elif task < len(cluster.get(job, [])):
            # a worker lists only the PS and itself (listing all workers deadlocks, see the
            # facts note); its own address must be one the PS can reach to fetch tensors
            own = tf.train.ClusterSpec({"ps": self.ps_addrs, job: {task: cluster[job][task]}})
            tf.config.experimental_connect_to_cluster(own, job_name=job, task_index=task)
            with tf.device(self.ps_device):
                int(tf.constant(1) + 1)  # blocks until the PS answers
        else:  # on one machine: a client server on a random localhost port is enough
            tf.config.experimental_connect_to_cluster(spec)
            with tf.device(self.ps_device):
                int(tf.constant(1) + 1)  # blocks until the PS answers

    def say(self, event: Event, **fields) -> None:
        """Send one message to the launcher (helpers.system.control)."""
        if self._say is not None:
            self._say(event, **fields)

    # ---------------------------------------------------------------- entry
    def run(
        self, cfg, run_dir: Path, worker_pids: dict | None = None, ps_pids: dict | None = None
    ) -> dict:
        """Take part in one training run as this node's job; return a result for the launcher."""
        if self.server is not None:  # another PS task: its server does the work
            return {"ps_task": self.task}
        from helpers.cluster import wire
        from helpers.cluster.rundir import RunDir
        from helpers.data import arrays
        from helpers.training import models

        log = RunDir(run_dir).log(f"{self.job}-{self.task}")
        if self.job == "worker":  # its own shard of the training images only
            shard = (cfg.worker_ids.index(self.task), cfg.workers)
            x_tr, y_tr, _, _, classes = arrays.load_arrays(
                cfg.data, cfg.train_size, cfg.test_size, cfg.seed, shard, ("train",)
            )
            data = (x_tr, y_tr)
        else:  # the PS and the evaluator only test
            _, _, x_te, y_te, classes = arrays.load_arrays(
                cfg.data, cfg.train_size, cfg.test_size, cfg.seed, images=("test",)
            )
            data = (x_te, y_te)
        model = models.build(cfg.model, data[0].shape[1:], classes, cfg.seed)
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        res = wire.declare(self.tf, self.ps_devices, cfg, shapes)
        try:
            if self.job == "ps":
                from helpers.cluster.ps import PSLoop

                loop = PSLoop(self, cfg, run_dir, log, model, res, worker_pids, data, ps_pids)
            elif self.job == "evaluator":
                from helpers.cluster.evaluator import EvaluatorLoop

                loop = EvaluatorLoop(self, run_dir, log, model, res, data)
            else:
                from helpers.cluster.worker import WorkerLoop

                loop = WorkerLoop(self, cfg, log, model, res, *data)
            return loop.run()
        finally:
            log.close()
            self.on_dead = None
            # a node serves many runs: drop this run's model, traced functions and data
            # (each loop's tf.function refers back to the loop), or every run adds its memory again
            loop = model = data = res = None
            import keras

            keras.backend.clear_session(free_memory=True)
            try:  # hand the freed heap back to the OS (glibc keeps it otherwise)
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):
                pass


def _channel(args, me: str, node_ref: list):
    """The launcher's channel under --control: `say` (thread-safe) and, on another host, the
    queue of its commands (remote_lifeline: pings answered, DEAD passed to node_ref[0]). Fd 1
    goes to the log (stderr) from here on."""
    say = event_writer(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)

    if not args.remote:
        die_with_parent(args.parent_pid)
        return say, None

    def dead(msg) -> None:  # PS task 0: the launcher lost a worker on another host
        if node_ref and node_ref[0].on_dead is not None:
            node_ref[0].on_dead(int(msg["worker"]))

    return say, remote_lifeline(me, say, {Cmd.DEAD: dead})


def main(argv=None) -> int:
    """Parse arguments, start the TF server or client, then serve run commands."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True, help="JSON file: {'ps': ['host:port'], ...}")
    p.add_argument("--job", required=True, choices=["ps", "worker", "evaluator"])
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--run", help="standalone: the run config JSON to train once, then exit")
    p.add_argument("--control", action="store_true", help="read run commands from stdin")
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument(
        "--remote",
        action="store_true",
        help="on another host than the launcher: stdin is the lifeline; answer its pings",
    )
    args = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    lean_keras_import()
    me = f"{args.job}:{args.task}"
    clock.use_shift_of(me)
    node_ref: list = []
    say, commands = _channel(args, me, node_ref) if args.control else (None, None)
    os.environ.setdefault("TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE", "false")
    from helpers.cluster.protocol import validate
    from helpers.cluster.rundir import RunDir, read_cluster

    cluster = read_cluster(args.cluster)

    node = Node(cluster, args.job, args.task, say)
    node_ref.append(node)
    node.say(Event.READY, job=args.job, task=args.task, pid=os.getpid())
    print(f"{args.job}:{args.task} ready (pid {os.getpid()})", file=sys.stderr, flush=True)
    if args.run:
        cfg, record = RunDir.read_config(args.run)
        result = node.run(validate(cfg), record.path)
        if node.server is not None:  # another PS task: serve the run until task 0 has ended it
            wait_until_closed(node.ps_addrs[0], f"PS task {node.task}")
        print(json.dumps(result), flush=True)
        return 0
    # what this node has built so far (TensorFlow, Keras, its server) lives as long as it:
    # frozen, the collection after every run scans only what the runs made
    gc.freeze()
    lines = iter(commands.get, None) if commands is not None else map(json.loads, sys.stdin)
    for cmd in lines:  # EOF: the launcher is gone
        if cmd["cmd"] == Cmd.EXIT:
            break
        cfg, record = RunDir.read_config(cmd["config"])
        if (args.job == "worker" and node.task not in cfg.worker_ids) or (
            args.job == "evaluator" and not cfg.evaluator
        ):
            node.say(Event.DONE, run=cfg.run_id, result={"idle": True})
            continue
        try:
            result = node.run(cfg, record.path, cmd.get("worker_pids"), cmd.get("ps_pids"))
            node.say(Event.DONE, run=cfg.run_id, result=result)
        except Exception as exc:  # reported to the launcher, which raises it with the log tail
            traceback.print_exc()
            node.say(Event.ERROR, run=cfg.run_id, error=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
