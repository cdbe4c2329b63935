"""The parameter server's side of a run: hold the parameters, apply pushes, grant steps.

`PSLoop` runs in the PS process (started by node.py). It dequeues gradient messages (see
wire.py), asks protocol.py's rules what to do with each (apply at once, aggregate k of them,
drop or fold a stale one, grant an SSP token), applies updates with update.apply_update, writes
checkpoints, and watches the worker processes so that a dead one cannot hang the run. With the
parameters sharded, this loop runs on PS task 0 only and applies each update on every task
(update.staged_apply); the other tasks only hold their pieces.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import tensorflow as tf

from helpers.cluster import protocol, wire
from helpers.cluster.events import Kind
from helpers.cluster.liveness import WorkerWatch
from helpers.cluster.rundir import RunDir
from helpers.cluster.update import apply_update, staged_apply, warm_staged
from helpers.cluster.wire import DEAD, WARMUP, WARMUP_TICKET, Applied, Header, Token
from helpers.training import compression, models

# async: applied updates the PS takes off its queue at a time (one dequeue, then one log line each)
ASYNC_CHUNK = 16


class PSLoop:
    """Hold the parameters, apply pushes by the rules of the mode, hand out step tokens."""

    def __init__(self, node, cfg, run_dir, log, model, res, worker_pids, test, ps_pids=None):
        self.node, self.cfg, self.run_dir, self.log = node, cfg, run_dir, log
        self.model, self.res, self.test = model, res, test
        self.ps_pids = {int(k): v for k, v in (ps_pids or {}).items()}  # other PS tasks' PIDs
        self.watch = WorkerWatch(cfg, res, log, worker_pids)  # who is alive, heard, done
        node.on_dead = self.watch.lost  # the launcher's word on a worker on another host
        self.ssp = protocol.SSPGate(cfg.worker_ids, cfg.staleness)  # SSP's step tokens
        self.owed = protocol.OwedTokens()  # sync, backup: workers that pushed, owed a token
        self.comp = compression.from_spec(cfg.compress)  # decodes pushes, eagerly (cheap)
        self.shapes = [tuple(v.shape) for v in model.trainable_variables]
        self.version = 0
        self.last_ckpt = None
        # sharded (P > 1): pushes wait in the PS tasks' stage buffers; PS task 0 applies them
        # by key, and removes dropped and warm-up pushes with the next update (weight 0)
        self.apply_staged = staged_apply(res, self.comp, cfg.momentum) if res.sharded else None
        self.discard: list[int] = []
        self.faulted: set = set()  # the PS faults already injected

    # ----------------------------------------------------------- helpers
    def _init_vars(self):
        raw, res = tf.raw_ops, self.res
        values = [v.numpy() for v in self.model.trainable_variables]
        record = RunDir(self.run_dir)
        latest = record.latest_checkpoint() if self.cfg.resume else None
        if latest is not None:
            values = record.load_checkpoint(latest)
            self.version = latest.version
            self.log.write(Kind.RESUME, version=self.version, file=latest.file)
        for h, v in zip(res.vars, wire.split(values, res.pieces)):  # on its PS task
            raw.AssignVariableOp(resource=h, value=tf.constant(v))
        for h, p in zip(res.velocity, res.pieces):  # momentum starts at rest, resumed runs too
            raw.AssignVariableOp(resource=h, value=tf.zeros(p.shape))
        raw.AssignVariableOp(resource=res.version, value=tf.constant(self.version, tf.int64))
        raw.AssignVariableOp(resource=res.stopped, value=tf.constant(0, tf.int64))

    def _values(self):
        """The whole variables, their pieces read from every PS task."""
        raw = tf.raw_ops
        parts = [raw.ReadVariableOp(resource=h, dtype=tf.float32).numpy() for h in self.res.vars]
        return wire.join(parts, self.res.pieces, np.concatenate)

    def _grant(self, worker: int, token: Token) -> None:
        """Put one step token in the worker's queue."""
        tf.raw_ops.QueueEnqueueV2(
            handle=self.res.tokens[worker], components=[tf.constant(token, tf.int64)]
        )

    def _tickets(self, numbers, lrs):
        """Hand out async tickets: (update number, learning rate) pairs, in this order."""
        tf.raw_ops.QueueEnqueueManyV2(
            handle=self.res.tickets,
            components=[tf.constant(numbers, tf.int64), tf.constant(lrs, tf.float32)],
        )

    def _apply(self, payloads, weights):
        """Apply one update: the pushes' payloads (decoded gradients; sharded: their keys)."""
        lr = protocol.learning_rate(self.cfg.lr, self.cfg.lr_schedule, self.version)
        if self.apply_staged is None:
            apply_update(
                self.res.vars,
                self.res.version,
                payloads,
                weights,
                lr,
                self.cfg.momentum,
                self.res.velocity,
            )
        else:
            self.apply_staged(
                tf.constant(payloads + self.discard, tf.int64),
                tf.constant(weights + [0.0] * len(self.discard), tf.float32),
                tf.constant(lr, tf.float32),
            )
            self.discard = []
            tf.raw_ops.AssignAddVariableOp(
                resource=self.res.version, value=tf.constant(1, tf.int64)
            )
        self.version += 1
        return lr

    def _checkpoint(self):
        ckpt = RunDir(self.run_dir).save_checkpoint(self.version, self._values())
        self.log.write(Kind.CHECKPOINT, version=ckpt.version, file=ckpt.file)
        self.last_ckpt = self.version
        if self.cfg.evaluator:
            tf.raw_ops.QueueEnqueueV2(
                handle=self.res.ckpt, components=[tf.constant(self.version, tf.int64)]
            )

    def _fault(self):
        """Kill or stop this PS task, or another one (`ps:J`, sharded), at its version."""
        for who, spec in self.cfg.faults.items():
            task = protocol.ps_fault_task(who)
            if task is None or self.version != spec["at"] or who in self.faulted:
                continue
            self.faulted.add(who)  # once: pushes that update nothing leave the version as it is
            self.log.write(Kind.FAULT, what=spec["kind"], version=self.version, ps=task)
            pid = os.getpid() if task == 0 else self.ps_pids.get(task)
            if pid is None:
                raise RuntimeError(
                    f"fault {who!r}: the PID of PS task {task} is unknown (faults "
                    f"on other PS tasks need a launcher: LocalCluster(ps=...))"
                )
            if spec["kind"] == "kill":
                os.kill(pid, signal.SIGKILL)
            else:  # SIGSTOP, guarded so that the stopped task still ends with the launcher
                from helpers.system.processes import hang

                hang(pid)

    def _owe_tokens(self):
        if self.version >= self.cfg.steps:  # the run is over: a token now would start a step
            return  # whose push may land before the queues close
        due = self.owed.due(self.version)
        alive = set(self.watch.alive()) if due else ()
        for w in due:
            if w in alive:
                self._grant(w, Token(clock=self.version, slowest=0))

    def _ssp_grants(self, grants=()):
        """Hand out SSP's tokens: `grants` (from the gate), and those that workers the
        watcher has seen dead or done free by leaving the gate."""
        grants = list(grants)
        running = self.watch.running()  # a snapshot: the watcher may remove a dead worker
        if len(running) != len(self.ssp.clock):
            for w in set(self.ssp.clock) - set(running):
                grants += self.ssp.remove(w)
        live = set(running)
        for w, clock, slowest in grants:
            if w in live:
                self._grant(w, Token(clock=clock, slowest=slowest))

    # ----------------------------------------------------------- main loop
    def run(self) -> dict:
        cfg = self.cfg
        self._init_vars()
        self.watch.start()
        mode = cfg.mode
        t0 = time.time()
        self.log.write(
            Kind.START,
            mode=mode,
            workers=cfg.worker_ids,
            version=self.version,
            ps=len(self.res.devices),
            pieces=[[p.var, p.start, p.stop, p.task] for p in self.res.pieces],
        )
        try:
            # a failed attempt of this run (same run id, resumed) may have left pushes staged
            self._clear_stage()
            if self.apply_staged is not None and mode != "async":
                self._warm_staged()
            if mode == "async":  # one for each worker's warm-up push (worker.py, _warm_up)
                self._tickets([WARMUP_TICKET] * len(cfg.worker_ids), [0.0] * len(cfg.worker_ids))
            for w in cfg.worker_ids:  # "parameters are ready": the workers warm up, then join
                self._grant(w, Token(clock=self.version, slowest=0))
            self.watch.wait_joined()
            if mode == "async":  # a worker that died warming up left its ticket: not a real one
                left = int(tf.raw_ops.QueueSizeV2(handle=self.res.tickets))
                if left:
                    tf.raw_ops.QueueDequeueManyV2(
                        handle=self.res.tickets, n=left, component_types=[tf.int64, tf.float32]
                    )
            self.log.write(Kind.JOINED, workers=self.watch.alive())
            if mode == "ssp":
                self._ssp_grants(self.ssp.start())
            else:
                for w in self.watch.alive():
                    self._grant(w, Token(clock=self.version, slowest=0))
            if mode == "async":
                self._async_loop()
            else:
                self._loop()
            self._finish()
            return self._final(t0)
        except BaseException as exc:
            self._finish()
            self.watch.stop()
            self._clear_stage()
            if self.cfg.evaluator:
                tf.raw_ops.QueueCloseV2(handle=self.res.ckpt, cancel_pending_enqueues=True)
            timed_out = self.watch.timeout_error()
            if timed_out is not None:
                raise timed_out from exc
            raise

    def _async_loop(self):
        """async: each worker applies its own gradient on the PS, in the same remote call that
        sent it (TF1's between-graph asynchronous training), so no push waits for this loop.

        This loop only numbers the updates: it hands out tickets (the update's number and its
        learning rate) up to the next checkpoint, PS fault or the end, and logs each update as
        the workers report it applied. Once all of a block's tickets are applied the parameters
        are exactly that version, so checkpoints and faults land where they do in the other
        modes; the workers wait for the next block meanwhile.
        """
        raw, cfg = tf.raw_ops, self.cfg
        faults = [
            spec["at"]
            for who, spec in cfg.faults.items()
            if protocol.ps_fault_task(who) is not None
        ]
        while self.version < cfg.steps:
            end = cfg.steps
            if cfg.checkpoint_every:
                end = min(end, (self.version // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
            for at in faults:  # any PS task's fault: task 0's own or another's ("ps:J")
                if at > self.version:
                    end = min(end, at)
            lrs = {
                t: protocol.learning_rate(cfg.lr, cfg.lr_schedule, t)
                for t in range(self.version, end)
            }
            self._tickets(list(lrs), list(lrs.values()))
            done: dict[int, Applied] = {}
            while self.version < end:  # log in ticket order; applies may finish out of order
                n = min(ASYNC_CHUNK, end - self.version - len(done))
                for row in raw.QueueDequeueManyV2(
                    handle=self.res.applied, n=n, component_types=[tf.int64]
                )[0].numpy():
                    a = Applied(*(int(v) for v in row))
                    done[a.ticket] = a
                    self.watch.heard(a.worker)
                while self.version in done:
                    a = done.pop(self.version)
                    stale = protocol.staleness(a.version, a.ticket)
                    self.version += 1
                    self._log_update(
                        lrs[a.ticket], [protocol.Push(a.worker, a.step, a.version)], [stale], [1.0]
                    )
            if cfg.checkpoint_every and self.version % cfg.checkpoint_every == 0:
                self._checkpoint()
            self._fault()

    def _log_update(self, lr, pushes, staleness, weights, fresh=None):
        """Record the update just applied: its pushes, how stale each was, with what weight."""
        self.log.write(
            Kind.UPDATE,
            version=self.version,
            lr=lr,
            workers=[p.worker for p in pushes],
            steps=[p.step for p in pushes],
            versions=[p.version for p in pushes],
            staleness=staleness,
            weights=weights,
            fresh=[s == 0 for s in staleness] if fresh is None else fresh,
        )

    def _loop(self):
        """sync, SSP and backup: take each push off the queue and apply it by the mode's rules."""
        raw, cfg, mode = tf.raw_ops, self.cfg, self.cfg.mode
        types = [tf.int64] + [tf.as_dtype(d) for d, _ in self.res.push_spec]
        agg = None  # SSP applies every push at once; sync and backup aggregate k of them
        if mode in ("sync", "backup"):
            k = cfg.workers if mode == "sync" else cfg.k
            agg = protocol.BackupAggregator(
                k, cfg.stale if mode == "backup" else "drop", cfg.decay, cfg.fold_bound
            )
            agg.version = self.version
        pushes: dict[tuple[int, int], list] = {}
        while self.version < cfg.steps:
            comps = raw.QueueDequeueV2(handle=self.res.grads, component_types=types)
            header = Header(*(int(v) for v in comps[0].numpy()))
            worker, step, version_read = header.worker, header.step, header.version
            self.watch.heard(worker)
            if header.kind == DEAD:
                self._on_dead(worker, agg)
                continue
            if header.kind == WARMUP:  # sent before the worker joined: first in the queue
                if self.apply_staged is not None:  # remove its pieces (learning rate 0)
                    self.apply_staged(
                        tf.constant([wire.push_key(worker, step)], tf.int64),
                        tf.zeros([1]),
                        tf.constant(0.0),
                    )
                continue
            if self.apply_staged is None:  # the gradient came with the header
                grads = self.comp.decode(comps[1:], self.shapes)
            else:  # it waits on the PS tasks, under its key
                grads = wire.push_key(worker, step)
            push = protocol.Push(worker, step, version_read)
            before = self.version
            if agg is None:  # SSP
                stale = protocol.staleness(version_read, self.version)
                lr = self._apply([grads], [1.0])
                self._log_update(lr, [push], [stale], [1.0])
                if mode == "ssp":
                    self._ssp_grants(self.ssp.pushed(worker) if worker in self.ssp.clock else ())
            else:
                pushes[(worker, step)] = grads
                self._aggregate(agg, push, pushes)
                self.owed.owe(worker, version_read)
                self._owe_tokens()
            # after an update only: a push that updated nothing leaves the last checkpoint's
            # version, which must not be written (and evaluated) again
            if (
                cfg.checkpoint_every
                and self.version > before
                and self.version % cfg.checkpoint_every == 0
            ):
                self._checkpoint()
            self._fault()

    def _aggregate(self, agg, push, pushes: dict) -> None:
        """sync and backup: offer a push to the aggregator; log what it drops, apply and log
        the update it completes. `pushes` holds the payloads not yet used, by (worker, step)."""
        before = self.version
        update = agg.offer(push)
        for p in agg.dropped:
            self.log.write(
                Kind.DROP,
                worker=p.worker,
                step=p.step,
                version=p.version,
                staleness=self.version - p.version,
            )
            dropped = pushes.pop((p.worker, p.step))
            if self.apply_staged is not None:
                self.discard.append(dropped)
        agg.dropped.clear()
        if update is not None:
            lr = self._apply(
                [pushes.pop((p.worker, p.step)) for p in update.pushes], update.weights
            )
            self._log_update(
                lr,
                update.pushes,
                [before - p.version for p in update.pushes],
                update.weights,
                update.fresh,
            )

    def _on_dead(self, worker, agg):
        cfg = self.cfg
        live = self.watch.running()
        if cfg.mode == "sync":
            raise RuntimeError(
                f"worker {worker} died: sync (BSP) training cannot finish without "
                f"all {cfg.workers} workers; use mode='backup' with k < "
                f"{cfg.workers} to tolerate a lost worker"
            )
        if cfg.mode == "backup" and len(live) < cfg.k:
            raise RuntimeError(
                f"worker {worker} died: backup mode needs k={cfg.k} live workers, "
                f"only {len(live)} left ({live}); lower k or restart the run"
            )
        if cfg.mode == "ssp":
            self._ssp_grants(self.ssp.remove(worker))

    def _finish(self):
        """Stop the workers: set the flag, close the queues so blocked ops return."""
        raw = tf.raw_ops
        raw.AssignVariableOp(resource=self.res.stopped, value=tf.constant(1, tf.int64))
        for h in [self.res.grads, self.res.tickets, self.res.applied] + self.res.tokens:
            raw.QueueCloseV2(handle=h, cancel_pending_enqueues=True)

    def _warm_staged(self):
        """Sharded: trace the update function now for the numbers of pushes an update takes in
        this mode (k to N in backup; 1 for a warm-up's removal), so that those updates do not
        pay for it (a larger number, e.g. a folded push and its worker's next, is traced then)."""
        n, k = self.cfg.workers, self.cfg.k
        counts = (
            range(k, n + 1) if self.cfg.mode == "backup" else [n if self.cfg.mode == "sync" else 1]
        )
        warm_staged(self.apply_staged, self.res, [1, *counts])

    def _clear_stage(self):
        """Sharded: drop the pushes no update took from every PS task's stage buffer."""
        if self.apply_staged is None:
            return
        for task, device in enumerate(self.res.devices):
            try:
                with tf.device(device):
                    tf.raw_ops.MapClear(
                        dtypes=self.res.stage_dtypes(task), shared_name=self.res.stage
                    )
            except tf.errors.OpError:
                pass  # that PS task is gone (a fault): nothing of it to free

    def _final(self, t0) -> dict:
        self.watch.wait_finished()
        self.watch.stop()
        self._clear_stage()
        if (self.cfg.checkpoint_every or self.cfg.evaluator) and self.last_ckpt != self.version:
            self._checkpoint()
        if self.cfg.evaluator:  # -1: no more checkpoints in this run
            tf.raw_ops.QueueEnqueueV2(handle=self.res.ckpt, components=[tf.constant(-1, tf.int64)])
        for var, value in zip(self.model.trainable_variables, self._values()):
            var.assign(value)
        acc = models.accuracy(self.model, *self.test)
        self.log.write(Kind.FINAL, version=self.version, test_accuracy=acc, wall_s=time.time() - t0)
        return {"test_accuracy": acc, "version": self.version}
