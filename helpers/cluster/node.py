"""One process of the cluster: `python -m helpers.cluster.node --cluster c.json --job ps --task 0`.

The PS hosts every shared resource (created with raw ops and a shared_name, so all clients
see the same one) and runs the aggregation loop; workers compute gradients in one
tf.function per step and push them through a FIFO queue. The protocol rules come from
protocol.py. Under a launcher (--control) the node reads run commands from stdin and
answers on stdout; standalone (--run config.json) it runs one run and exits.
"""
from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

GRAD, DONE, DEAD = 0, 1, 2  # kinds of messages in the gradient queue


def die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if parent_pid and os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


class Node:
    """The TF side of one process: connect, then run training runs."""

    def __init__(self, cluster: dict, job: str, task: int, proto):
        import tensorflow as tf

        self.tf, self.cluster, self.job, self.task, self.proto = tf, cluster, job, task, proto
        self.ps_addr = cluster["ps"][0]
        self.ps = "/job:ps/replica:0/task:0/device:CPU:0"
        spec = tf.train.ClusterSpec({"ps": [self.ps_addr]})
        if job == "ps":
            # every worker blocked in a dequeue holds one inter-op thread of the PS: with the
            # default (one per core) a third waiting worker starves everyone else
            tf.config.threading.set_inter_op_parallelism_threads(64)
            tf.config.experimental_connect_to_cluster(spec, job_name="ps", task_index=0)
            int(tf.constant(1) + 1)  # the context, and with it the server, starts lazily
        elif task < len(cluster.get(job, [])):
            # a worker lists only the PS and itself (listing all workers deadlocks, see the
            # facts note); its own address must be one the PS can reach to fetch tensors
            own = tf.train.ClusterSpec({"ps": [self.ps_addr], job: {task: cluster[job][task]}})
            tf.config.experimental_connect_to_cluster(own, job_name=job, task_index=task)
            with tf.device(self.ps):
                int(tf.constant(1) + 1)  # blocks until the PS answers
        else:  # on one machine: a client server on a random localhost port is enough
            tf.config.experimental_connect_to_cluster(spec)
            with tf.device(self.ps):
                int(tf.constant(1) + 1)  # blocks until the PS answers

    def say(self, **msg) -> None:
        """Send one JSON message to the launcher."""
        if self.proto is not None:
            self.proto.write(json.dumps(msg) + "\n")
            self.proto.flush()

    # ---------------------------------------------------------------- shared resources
    def resources(self, cfg, shapes):
        """Handles of the run's shared variables and queues, all placed on the PS."""
        from helpers import compression

        tf, raw = self.tf, self.tf.raw_ops
        prefix = f"{cfg.run_id}/"
        # a push carries the compressor's wire tensors (e.g. top-k values + indices), so
        # only those cross the network; every node declares the queue with the same spec
        wire = compression.from_spec(cfg.compress).wire_spec(shapes)
        n_tasks = max(cfg.worker_ids) + 1
        with tf.device(self.ps):
            r = {
                "vars": [raw.VarHandleOp(dtype=tf.float32, shape=s, shared_name=f"{prefix}w{i}")
                         for i, s in enumerate(shapes)],
                "version": raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "version"),
                "stopped": raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "stopped"),
                "grads": raw.FIFOQueueV2(component_types=[tf.int64] + [tf.as_dtype(d)
                                                                       for d, _ in wire],
                                         shapes=[[4]] + [list(s) for _, s in wire],
                                         capacity=max(4, 2 * cfg.workers),
                                         shared_name=prefix + "grads"),
                "tokens": [raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[2]],
                                           capacity=100_000, shared_name=f"{prefix}tokens{w}")
                           for w in range(n_tasks)],
                "done": raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[]],
                                        capacity=1000, shared_name=prefix + "done"),
                "join": raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[]],
                                        capacity=1000, shared_name=prefix + "join"),
                "ckpt": raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[]],
                                        capacity=100_000, shared_name=prefix + "ckpt"),
            }
        r["wire"] = wire
        return r

    # ---------------------------------------------------------------- entry
    def run(self, cfg, run_dir: Path, worker_pids: dict | None = None) -> dict:
        """Take part in one training run as this node's job; return a result for the launcher."""
        from helpers.cluster import events, models

        log = events.EventLog(run_dir, f"{self.job}-{self.task}")
        if self.job == "worker":  # its own shard of the training images only
            shard = (cfg.worker_ids.index(self.task), cfg.workers)
            x_tr, y_tr, _, _, classes = models.load_part(cfg.data, cfg.train_size,
                                                         cfg.test_size, cfg.seed, shard, ("train",))
            data = (x_tr, y_tr)
        else:  # the PS and the evaluator only test
            _, _, x_te, y_te, classes = models.load_part(cfg.data, cfg.train_size, cfg.test_size,
                                                         cfg.seed, images=("test",))
            data = (x_te, y_te)
        model = models.build(cfg.model, data[0].shape[1:], classes, cfg.seed)
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        res = self.resources(cfg, shapes)
        try:
            if self.job == "ps":
                loop = PSLoop(self, cfg, run_dir, log, model, res, worker_pids, data)
            elif self.job == "evaluator":
                loop = EvaluatorLoop(self, run_dir, log, model, res, data)
            else:
                loop = WorkerLoop(self, cfg, log, model, res, *data)
            return loop.run()
        finally:
            log.close()
            # a node serves many runs: drop this run's model, traced functions and data
            # (each loop's tf.function refers back to the loop), or every run adds ~20 MB
            loop = model = data = res = None
            import keras

            keras.backend.clear_session(free_memory=True)
            try:  # hand the freed heap back to the OS (glibc keeps it otherwise)
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except (OSError, AttributeError):
                pass


def apply_update(var_handles, version_handle, grads_list, weights, lr, momentum=0.0,
                 velocity_handles=()):
    """One PS update: SGD (or momentum) with the weighted sum of the pushed gradients.

    var <- var - lr * sum_j weights[j] * grads_list[j] (with momentum m: v <- m v + g,
    var <- var - lr v), then version += 1. Eager raw ops, not a tf.function: in a process
    serving a cluster a tf.function call cost ~1.4 ms per update, these ops ~0.3 ms.
    """
    import tensorflow as tf

    raw = tf.raw_ops
    if weights == [1.0]:
        grads = grads_list[0]
    else:
        grads = [tf.add_n([w * g[i] for w, g in zip(weights, grads_list)])
                 for i in range(len(grads_list[0]))]
    lr = tf.constant(lr, tf.float32)
    if momentum:
        m = tf.constant(momentum, tf.float32)
        for h, g, v in zip(var_handles, grads, velocity_handles):
            raw.ResourceApplyMomentum(var=h, accum=v, lr=lr, grad=g, momentum=m)
    else:
        for h, g in zip(var_handles, grads):
            raw.ResourceApplyGradientDescent(var=h, alpha=lr, delta=g)
    raw.AssignAddVariableOp(resource=version_handle, value=tf.constant(1, tf.int64))


class PSLoop:
    """Hold the parameters, apply pushes by the rules of the mode, hand out step tokens."""

    def __init__(self, node, cfg, run_dir, log, model, res, worker_pids, test):
        from helpers.cluster import protocol

        self.node, self.tf, self.cfg, self.run_dir, self.log = node, node.tf, cfg, run_dir, log
        self.model, self.res, self.test, self.protocol = model, res, test, protocol
        self.worker_pids = {int(k): v for k, v in (worker_pids or {}).items()}
        self.alive = set(cfg.worker_ids)
        self.finished: set[int] = set()
        self.clock = {w: 0 for w in cfg.worker_ids}  # pushes applied per worker (SSP)
        self.granted = {w: 0 for w in cfg.worker_ids}
        self.waiting: list[tuple[int, int]] = []  # (worker, version) pushes owed a token
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.last_heard = {w: time.monotonic() for w in cfg.worker_ids}  # liveness
        self.timed_out = False
        tf = self.tf
        self.velocity = [tf.Variable(tf.zeros(v.shape)) for v in model.trainable_variables]
        from helpers import compression

        self.comp = compression.from_spec(cfg.compress)  # decodes pushes, eagerly (cheap)
        self.shapes = [tuple(v.shape) for v in model.trainable_variables]
        self.version = 0
        self.last_ckpt = None

    # ----------------------------------------------------------- helpers
    def _init_vars(self):
        tf, raw, res = self.tf, self.tf.raw_ops, self.res
        values = [v.numpy() for v in self.model.trainable_variables]
        ckpt_dir = self.run_dir / "ckpt"
        if self.cfg.resume and (ckpt_dir / "latest.json").exists():
            latest = json.loads((ckpt_dir / "latest.json").read_text())
            with np.load(ckpt_dir / latest["file"]) as f:
                values = [f[f"w{i}"] for i in range(len(values))]
            self.version = int(latest["version"])
            self.log.write("resume", version=self.version, file=latest["file"])
        for h, v in zip(res["vars"], values):
            raw.AssignVariableOp(resource=h, value=tf.constant(v))
        raw.AssignVariableOp(resource=res["version"], value=tf.constant(self.version, tf.int64))
        raw.AssignVariableOp(resource=res["stopped"], value=tf.constant(0, tf.int64))

    def _values(self):
        raw, tf = self.tf.raw_ops, self.tf
        return [raw.ReadVariableOp(resource=h, dtype=tf.float32).numpy() for h in self.res["vars"]]

    def _token(self, worker, a, b):
        raw, tf = self.tf.raw_ops, self.tf
        raw.QueueEnqueueV2(handle=self.res["tokens"][worker],
                           components=[tf.constant([a, b], tf.int64)])

    def _apply(self, grads_list, weights):
        lr = self.protocol.learning_rate(self.cfg.lr, self.cfg.lr_schedule, self.version)
        apply_update(self.res["vars"], self.res["version"], grads_list, weights, lr,
                     self.cfg.momentum, [v.handle for v in self.velocity])
        self.version += 1
        return lr

    def _checkpoint(self):
        ckpt_dir = self.run_dir / "ckpt"
        ckpt_dir.mkdir(exist_ok=True)
        name = f"ckpt-{self.version:07d}.npz"
        tmp = ckpt_dir / f".{name}.tmp.npz"
        np.savez(tmp, **{f"w{i}": v for i, v in enumerate(self._values())})
        os.replace(tmp, ckpt_dir / name)
        from helpers.cluster.events import atomic_write_json

        atomic_write_json(ckpt_dir / "latest.json", {"file": name, "version": self.version})
        self.log.write("checkpoint", version=self.version, file=name)
        self.last_ckpt = self.version
        if self.cfg.evaluator:
            self.tf.raw_ops.QueueEnqueueV2(handle=self.res["ckpt"],
                                           components=[self.tf.constant(self.version, self.tf.int64)])

    def _watch_workers(self):
        """Tell the PS loop (through its own queue) when a worker process dies."""
        import psutil

        raw, tf = self.tf.raw_ops, self.tf
        while not self.stop_event.wait(0.2):
            if self._silent_too_long():
                return
            for w, pid in self.worker_pids.items():
                with self.lock:
                    if w not in self.alive or w in self.finished:
                        continue
                try:
                    gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    gone = True
                if not gone:
                    continue
                with self.lock:
                    self.alive.discard(w)
                self.log.write("dead", worker=w, pid=pid)
                comps = [tf.constant([w, -1, -1, DEAD], tf.int64)] + [
                    tf.zeros(shape, dtype) for dtype, shape in self.res["wire"]]
                for handle, c in ((self.res["grads"], comps),
                                  (self.res["done"], [tf.constant(w, tf.int64)]),
                                  (self.res["join"], [tf.constant(w, tf.int64)])):
                    try:
                        raw.QueueEnqueueV2(handle=handle, components=c)
                    except tf.errors.OpError:
                        pass  # queue already closed at the end of the run

    def _heard(self, worker: int) -> None:
        self.last_heard[worker] = time.monotonic()

    def _silent_too_long(self) -> bool:
        """worker_timeout: with no word from any live worker for that long, close the queues
        so the blocked main loop wakes up, and report it (standalone runs have no launcher)."""
        timeout = self.cfg.worker_timeout
        with self.lock:
            live = self.alive - self.finished
        if not timeout or not live or time.monotonic() - max(self.last_heard.values()) < timeout:
            return False
        self.timed_out = True
        self.log.write("timeout", silent_s=timeout, workers=sorted(live))
        raw = self.tf.raw_ops
        for name in ("grads", "join", "done"):
            raw.QueueCloseV2(handle=self.res[name], cancel_pending_enqueues=True)
        return True

    def _timeout_error(self) -> RuntimeError:
        now = time.monotonic()
        with self.lock:
            live = sorted(self.alive - self.finished)
        heard = ", ".join(f"worker {w} {now - self.last_heard[w]:.0f} s ago" for w in live)
        return RuntimeError(
            f"no message from any worker for worker_timeout={self.cfg.worker_timeout} s "
            f"(last heard: {heard}): a worker host may be down or unreachable, or was never "
            f"started; check the workers' logs, then restart the run (resume=True continues "
            f"from the last checkpoint)")

    def _fault(self):
        spec = self.cfg.faults.get("ps")
        if spec and self.version == spec["at"]:
            self.log.write("fault", what=spec["kind"], version=self.version)
            os.kill(os.getpid(), signal.SIGKILL if spec["kind"] == "kill" else signal.SIGSTOP)

    def _owe_tokens(self):
        still = []
        for w, v in self.waiting:
            if v < self.version and w in self.alive:
                self._token(w, self.version, 0)
            elif w in self.alive:
                still.append((w, v))
        self.waiting = still

    def _ssp_grants(self):
        with self.lock:  # the watcher thread may remove a dead worker meanwhile
            alive = sorted(self.alive - self.finished)
        live = [self.clock[w] for w in alive]
        for w in alive:
            more = self.protocol.ssp_grants(self.granted[w], live, self.cfg.staleness)
            for _ in range(more):
                self._token(w, self.granted[w], min(live) if live else 0)
                self.granted[w] += 1

    # ----------------------------------------------------------- main loop
    def run(self) -> dict:
        tf, cfg, protocol = self.tf, self.cfg, self.protocol
        self._init_vars()
        watcher = threading.Thread(target=self._watch_workers, daemon=True)
        watcher.start()
        types = [tf.int64] + [tf.as_dtype(d) for d, _ in self.res["wire"]]
        mode = cfg.mode
        agg = None
        if mode in ("sync", "backup"):
            k = cfg.workers if mode == "sync" else cfg.k
            agg = protocol.BackupAggregator(k, cfg.stale if mode == "backup" else "drop",
                                            cfg.decay, cfg.fold_bound)
            agg.version = self.version
        pushes: dict[tuple[int, int], list] = {}
        t0 = time.time()
        self.log.write("start", mode=mode, workers=cfg.worker_ids, version=self.version)
        try:
            for w in cfg.worker_ids:  # "parameters are ready": the workers warm up, then join
                self._token(w, self.version, 0)
            self._wait_all("join", set())
            with self.lock:
                joined = sorted(self.alive)
            self.log.write("joined", workers=joined)
            if mode == "ssp":
                self._ssp_grants()
            else:
                with self.lock:
                    alive = sorted(self.alive)
                for w in alive:
                    self._token(w, self.version, 0)
            self._loop(agg, pushes, types)
            self._finish()
            return self._final(t0)
        except BaseException as exc:
            self._finish()
            self.stop_event.set()
            if self.cfg.evaluator:
                self.tf.raw_ops.QueueCloseV2(handle=self.res["ckpt"],
                                             cancel_pending_enqueues=True)
            if self.timed_out:
                raise self._timeout_error() from exc
            raise

    def _loop(self, agg, pushes, types):
        raw, cfg, protocol, mode = self.tf.raw_ops, self.cfg, self.protocol, self.cfg.mode
        while self.version < cfg.steps:
            comps = raw.QueueDequeueV2(handle=self.res["grads"], component_types=types)
            worker, step, version_read, kind = (int(v) for v in comps[0].numpy())
            self._heard(worker)
            if kind == DEAD:
                self._on_dead(worker, agg)
                continue
            grads = self.comp.decode(comps[1:], self.shapes)
            push = protocol.Push(worker, step, version_read)
            if agg is None:  # async and ssp apply every push at once
                stale = protocol.staleness(version_read, self.version)
                lr = self._apply([grads], [1.0])
                self.log.write("update", version=self.version, lr=lr, workers=[worker],
                               steps=[step], versions=[version_read], staleness=[stale],
                               weights=[1.0], fresh=[stale == 0])
                if mode == "ssp":
                    self.clock[worker] += 1
                    self._ssp_grants()
            else:
                pushes[(worker, step)] = grads
                update = agg.offer(push)
                for p in agg.dropped:
                    self.log.write("drop", worker=p.worker, step=p.step, version=p.version,
                                   staleness=self.version - p.version)
                    pushes.pop((p.worker, p.step))
                agg.dropped.clear()
                if update is not None:
                    before = self.version
                    lr = self._apply([pushes.pop((p.worker, p.step)) for p in update.pushes],
                                     update.weights)
                    self.log.write(
                        "update", version=self.version, lr=lr,
                        workers=[p.worker for p in update.pushes],
                        steps=[p.step for p in update.pushes],
                        versions=[p.version for p in update.pushes],
                        staleness=[before - p.version for p in update.pushes],
                        weights=update.weights, fresh=update.fresh)
                self.waiting.append((worker, version_read))
                self._owe_tokens()
            if cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0:
                self._checkpoint()
            self._fault()

    def _on_dead(self, worker, agg):
        cfg = self.cfg
        with self.lock:
            live = sorted(self.alive - self.finished)
        if cfg.mode == "sync":
            raise RuntimeError(f"worker {worker} died: sync (BSP) training cannot finish without "
                               f"all {cfg.workers} workers; use mode='backup' with k < "
                               f"{cfg.workers} to tolerate a lost worker")
        if cfg.mode == "backup" and len(live) < cfg.k:
            raise RuntimeError(f"worker {worker} died: backup mode needs k={cfg.k} live workers, "
                               f"only {len(live)} left ({live}); lower k or restart the run")
        if cfg.mode == "ssp":
            self._ssp_grants()

    def _finish(self):
        """Stop the workers: set the flag, close the queues so blocked ops return."""
        raw, tf = self.tf.raw_ops, self.tf
        raw.AssignVariableOp(resource=self.res["stopped"], value=tf.constant(1, tf.int64))
        raw.QueueCloseV2(handle=self.res["grads"], cancel_pending_enqueues=True)
        for h in self.res["tokens"]:
            raw.QueueCloseV2(handle=h, cancel_pending_enqueues=True)

    def _wait_all(self, queue_name: str, seen: set) -> None:
        """Dequeue worker ids from a queue until every live worker is in `seen`."""
        raw, tf = self.tf.raw_ops, self.tf
        while True:  # the watcher enqueues the id of a worker that dies, so this ends
            with self.lock:
                if not (self.alive - seen):
                    return
            w = int(raw.QueueDequeueV2(handle=self.res[queue_name], component_types=[tf.int64])[0])
            self._heard(w)
            with self.lock:
                seen.add(w)

    def _final(self, t0) -> dict:
        self._wait_all("done", self.finished)
        self.stop_event.set()
        if (self.cfg.checkpoint_every or self.cfg.evaluator) and self.last_ckpt != self.version:
            self._checkpoint()
        if self.cfg.evaluator:  # -1: no more checkpoints in this run
            self.tf.raw_ops.QueueEnqueueV2(handle=self.res["ckpt"],
                                           components=[self.tf.constant(-1, self.tf.int64)])
        for var, value in zip(self.model.trainable_variables, self._values()):
            var.assign(value)
        from helpers.cluster import models

        acc = models.accuracy(self.model, *self.test)
        self.log.write("final", version=self.version, test_accuracy=acc, wall_s=time.time() - t0)
        return {"test_accuracy": acc, "version": self.version}


class EvaluatorLoop:
    """Evaluate each checkpoint the PS announces; log test accuracy against wall time."""

    def __init__(self, node, run_dir, log, model, res, test):
        self.node, self.tf, self.run_dir, self.log = node, node.tf, run_dir, log
        self.model, self.res, self.test = model, res, test

    def run(self) -> dict:
        from helpers.cluster import models

        tf, raw = self.tf, self.tf.raw_ops
        evaluated = 0
        while True:
            try:
                with tf.device(self.node.ps):
                    version = int(raw.QueueDequeueV2(handle=self.res["ckpt"],
                                                     component_types=[tf.int64])[0])
            except tf.errors.OutOfRangeError:  # the PS closed the queue: the run failed
                break
            if version < 0:
                break
            path = self.run_dir / "ckpt" / f"ckpt-{version:07d}.npz"
            with np.load(path) as f:
                for i, var in enumerate(self.model.trainable_variables):
                    var.assign(f[f"w{i}"])
            acc = models.accuracy(self.model, *self.test)
            self.log.write("eval", version=version, test_accuracy=acc, file=path.name)
            evaluated += 1
        return {"evaluated": evaluated}


def pack(tensors):
    """One flat tensor from tensors of one dtype."""
    import tensorflow as tf

    return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)


def pack_by_dtype(tensors):
    """[(positions, flat tensor)] per dtype, in order of first appearance."""
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return [(idx, pack([tensors[i] for i in idx])) for idx in groups.values()]


def unpack(packed, shapes):
    """Inverse of pack_by_dtype: the tensors of these shapes, in their original order."""
    import tensorflow as tf

    out = [None] * len(shapes)
    for idx, flat in packed:
        sizes = [int(np.prod(shapes[i])) for i in idx]
        for i, part in zip(idx, tf.split(flat, sizes)):
            out[i] = tf.reshape(part, shapes[i])
    return out


class WorkerLoop:
    """Pull parameters, compute a gradient on a local batch, push it; wait when the mode says."""

    def __init__(self, node, cfg, log, model, res, x, y):
        from helpers.cluster import protocol

        self.node, self.tf, self.cfg, self.log = node, node.tf, cfg, log
        self.model, self.res, self.x, self.y = model, res, x, y
        self.downpour = protocol.Downpour(cfg.n_fetch, cfg.n_push)
        tf = self.tf
        self.acc = [tf.Variable(tf.zeros(v.shape), trainable=False)
                    for v in model.trainable_variables]
        self.version_read = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self.rng = np.random.default_rng([cfg.seed, node.task])
        from helpers import compression

        shapes = [tuple(v.shape) for v in model.trainable_variables]
        self.comp = compression.from_spec(cfg.compress)
        # what a compressed push did not send, added to the next push (error feedback)
        self.residual = ([tf.Variable(tf.zeros(s), trainable=False) for s in shapes]
                         if self.comp.feedback else None)
        self.bytes = compression.Float32().bytes_for(shapes)  # one pull: float32 parameters
        self.bytes_push = self.comp.bytes_for(shapes) + 32  # + the int64[4] header
        self._build_step()

    def _build_step(self):
        tf, raw, model, res, cfg = self.tf, self.tf.raw_ops, self.model, self.res, self.cfg
        import keras

        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        variables = model.trainable_variables
        shapes = [tuple(v.shape) for v in variables]
        ps, task, n_push = self.node.ps, self.node.task, cfg.n_push
        local_lr = cfg.lr
        comp, residual = self.comp, self.residual
        here = self.acc[0].device  # this worker's CPU (acc: local tf.Variables)
        # every tensor crossing between devices is its own RPC, so a pull or a push sends one
        # flat tensor per dtype (LeNet: 2 transfers instead of 10 + 1) and unpacks it there
        push_shapes = [(4,)] + [s for _, s in res["wire"]]

        @tf.function
        def step(x, y, local_step, fetch: bool, push: bool):
            if fetch:
                with tf.device(ps):
                    packed = pack_by_dtype([raw.ReadVariableOp(resource=h, dtype=tf.float32)
                                            for h in res["vars"]])
                    version = raw.ReadVariableOp(resource=res["version"], dtype=tf.int64)
                with tf.device(here):
                    values = unpack(packed, shapes)
                for var, value in zip(variables, values):
                    var.assign(value)
                self.version_read.assign(version)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, variables)
            for a, g in zip(self.acc, grads):
                a.assign_add(g)
            if cfg.n_fetch > 1:  # Downpour: keep training the local copy between fetches
                for var, g in zip(variables, grads):
                    var.assign_sub(local_lr * g)
            if push:
                meta = tf.stack([tf.constant(task, tf.int64), local_step, self.version_read,
                                 tf.constant(GRAD, tf.int64)])
                # compressed on this worker: only `wire` goes to the PS
                wire = comp.compress([a / n_push for a in self.acc], residual)
                with tf.device(here):
                    packed = pack_by_dtype([meta] + wire)
                with tf.device(ps):
                    raw.QueueEnqueueV2(handle=res["grads"],
                                       components=unpack(packed, push_shapes))
                for a in self.acc:
                    a.assign(tf.zeros_like(a))
            return loss, self.version_read.read_value()

        self.step = step

    def _warm_up(self):
        """Trace the step function and run it once without pushing, so all start together."""
        tf, b = self.tf, self.cfg.batch_size
        x, y = self.x[:b], self.y[:b]
        self.step(x, y, tf.constant(0, tf.int64), True, False)
        for a in self.acc:
            a.assign(tf.zeros_like(a))
        pushes = {True} if self.cfg.n_push == 1 else {True, False}
        fetches = {True} if self.cfg.n_fetch == 1 else {True, False}
        for fetch in fetches:
            for push in pushes:
                self.step.get_concrete_function(x, y, tf.constant(0, tf.int64), fetch, push)

    def _token(self):
        tf, raw = self.tf, self.tf.raw_ops
        with tf.device(self.node.ps):
            tok = raw.QueueDequeueV2(handle=self.res["tokens"][self.node.task],
                                     component_types=[tf.int64])
        return [int(v) for v in tok[0].numpy()]

    def _delay(self, compute_s):
        spec = self.cfg.stragglers.get(str(self.node.task))
        if spec is None:
            return 0.0
        if isinstance(spec, dict):
            delay = (self.rng.exponential(spec["mean"]) if spec["dist"] == "exponential"
                     else self.rng.uniform(0, 2 * spec["mean"]))
        else:
            delay = (spec - 1) * compute_s
        time.sleep(delay)  # the simulated slowdown itself, not a wait for a condition
        return delay

    def run(self) -> dict:
        tf, cfg = self.tf, self.cfg
        n = len(self.x)
        order = self.rng.permutation(n)
        pos, step = 0, 0
        waits_every_step = cfg.mode in ("sync", "backup", "ssp")
        fault = cfg.faults.get(str(self.node.task))
        ended = (tf.errors.OutOfRangeError, tf.errors.CancelledError, tf.errors.AbortedError)
        try:
            self._token()  # the PS has initialised the parameters
            self._warm_up()
            with tf.device(self.node.ps):
                self.tf.raw_ops.QueueEnqueueV2(handle=self.res["join"],
                                               components=[tf.constant(self.node.task, tf.int64)])
            while True:
                if fault and step == fault["at"]:
                    self.log.write("fault", what=fault["kind"], step=step)
                    os.kill(os.getpid(), signal.SIGKILL if fault["kind"] == "kill"
                            else signal.SIGSTOP)
                wait_s = 0.0
                if step == 0 or waits_every_step:
                    t = time.perf_counter()
                    gap = self._token()
                    wait_s = time.perf_counter() - t
                if pos + cfg.batch_size > n:
                    order, pos = self.rng.permutation(n), 0
                idx = order[pos:pos + cfg.batch_size]
                pos += cfg.batch_size
                fetch = self.downpour.fetch(step)
                push = self.downpour.accumulate()
                t = time.perf_counter()
                loss, version_read = self.step(self.x[idx], self.y[idx],
                                               tf.constant(step, tf.int64), fetch, push)
                loss, version_read = float(loss), int(version_read)
                compute_s = time.perf_counter() - t
                delay = self._delay(compute_s)
                self.log.write("step", worker=self.node.task, step=step,
                               version_read=version_read, fetched=fetch,
                               pushed=push, loss=loss, compute_s=compute_s, wait_s=wait_s,
                               delay_s=delay, bytes_pulled=self.bytes if fetch else 0,
                               bytes_pushed=self.bytes_push if push else 0,
                               gap=(step - gap[1]) if cfg.mode == "ssp" else None)
                step += 1
        except ended:
            with tf.device(self.node.ps):
                stopped = int(self.tf.raw_ops.ReadVariableOp(resource=self.res["stopped"],
                                                             dtype=tf.int64))
            if not stopped:
                raise
        with tf.device(self.node.ps):
            self.tf.raw_ops.QueueEnqueueV2(handle=self.res["done"],
                                           components=[tf.constant(self.node.task, tf.int64)])
        self.log.write("done", worker=self.node.task, steps=step)
        return {"steps": step}


def main(argv=None) -> int:
    """Parse arguments, start the TF server or client, then serve run commands."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True, help="JSON file: {'ps': ['host:port'], ...}")
    p.add_argument("--job", required=True, choices=["ps", "worker", "evaluator"])
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--run", help="standalone: the run config JSON to train once, then exit")
    p.add_argument("--control", action="store_true", help="read run commands from stdin")
    p.add_argument("--parent-pid", type=int, default=None)
    args = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    if args.control:
        die_with_parent(args.parent_pid)
        proto = os.fdopen(os.dup(1), "w")  # the launcher's channel; fd 1 now goes to the log
        os.dup2(2, 1)
    else:
        proto = None
    os.environ.setdefault("TF_ENABLE_EAGER_CLIENT_STREAMING_ENQUEUE", "false")
    cluster = json.loads(Path(args.cluster).read_text())
    from helpers.cluster.protocol import RunConfig, validate

    node = Node(cluster, args.job, args.task, proto)
    node.say(event="ready", job=args.job, task=args.task, pid=os.getpid())
    print(f"{args.job}:{args.task} ready (pid {os.getpid()})", file=sys.stderr, flush=True)
    if args.run:
        body = json.loads(Path(args.run).read_text())
        cfg = validate(RunConfig.from_dict(body))
        run_dir = Path(body.get("run_dir") or Path(args.run).parent)
        result = node.run(cfg, run_dir)
        print(json.dumps(result), flush=True)
        return 0
    for line in sys.stdin:  # EOF: the launcher is gone
        cmd = json.loads(line)
        if cmd["cmd"] == "exit":
            break
        cfg = RunConfig.from_dict(json.loads(Path(cmd["config"]).read_text()))
        if (args.job == "worker" and node.task not in cfg.worker_ids) or (
                args.job == "evaluator" and not cfg.evaluator):
            node.say(event="done", run=cfg.run_id, result={"idle": True})
            continue
        try:
            result = node.run(cfg, Path(cmd["config"]).parent, cmd.get("worker_pids"))
            node.say(event="done", run=cfg.run_id, result=result)
        except Exception as exc:  # reported to the launcher, which raises it with the log tail
            traceback.print_exc()
            node.say(event="error", run=cfg.run_id, error=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
