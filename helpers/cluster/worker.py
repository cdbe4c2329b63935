"""A worker's side of a run: take a step token, pull the parameters, compute a gradient, push it.

`WorkerLoop` runs in each worker process (started by node.py). One tf.function per step is one
remote call: in the modes that wait (sync, SSP, backup) it takes the PS's step token, and the
parameters ride back with it; it computes the gradient on a local batch and pushes it to the
PS's queue, or in async applies it on the PS itself, as the update the PS's ticket numbers.
Tensors cross the network as one transfer per wire dtype and PS task (wire.pack_by_dtype);
with the parameters sharded over several PS tasks (wire.plan), the call reads and pushes every
task's pieces at once. The step is built from named parts (`_build_step` lists them); the
Python loop around it logs each step and simulates stragglers and faults.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import tensorflow as tf

from helpers.cluster import protocol, wire
from helpers.cluster.events import Kind, StepStamps
from helpers.cluster.update import apply_update
from helpers.cluster.wire import (
    GRAD,
    WARMUP,
    WARMUP_TICKET,
    Applied,
    Header,
    Ticket,
    Token,
    pack_by_dtype,
    unpack,
)
from helpers.system import clock
from helpers.training import compression

# For bench.step_profile's comparison only: the step's stamps are constants (0) instead of
# tf.timestamp() reads, so that a run with them and one without can be timed side by side
# (read as the step is traced, in the node's own environment)
NO_STAMPS_ENV = "LABS_BENCH_NO_STAMPS"


def _ps_stamp():
    """tf.timestamp() where the op is placed (on the PS: the PS's clock), traced into the step."""
    if os.environ.get(NO_STAMPS_ENV) == "1":
        return tf.constant(0.0, tf.float64)
    return tf.timestamp()


def _stamp():
    """tf.timestamp() on this worker's clock, as clock.now() reads it (traced into the step)."""
    return _ps_stamp() + clock.SHIFT if clock.SHIFT else _ps_stamp()


class WorkerLoop:
    """Pull parameters, compute a gradient on a local batch, push it; wait when the mode says."""

    def __init__(self, node, cfg, log, model, res, x, y):
        self.node, self.cfg, self.log = node, cfg, log
        self.model, self.res, self.x, self.y = model, res, x, y
        self.ps_device = node.ps_device  # PS task 0: the protocol's queues and counters
        self.downpour = protocol.Downpour(cfg.n_fetch, cfg.n_push)
        # the push's sum, kept only when pushes are n_push > 1 steps apart (Downpour)
        self.acc = [
            tf.Variable(tf.zeros(v.shape), trainable=False)
            for v in (model.trainable_variables if cfg.n_push > 1 else [])
        ]
        self.version_read = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self.rng = np.random.default_rng([cfg.seed, node.task])
        shapes = [tuple(v.shape) for v in model.trainable_variables]
        self.comp = compression.from_spec(cfg.compress)
        # what a compressed push did not send, added to the next push (error feedback); one
        # per piece of the parameters (sharded runs compress each PS task's pieces apart)
        self.residual = (
            [tf.Variable(tf.zeros(p.shape), trainable=False) for p in res.pieces]
            if self.comp.feedback
            else None
        )
        self.here = self.version_read.device  # this worker's CPU (a local tf.Variable's)
        self.bytes = compression.Float32().bytes_for(shapes)  # one pull: float32 parameters
        self.bytes_push = sum(
            self.comp.bytes_for([res.pieces[i].shape for i in idx]) for idx in res.task_pieces()
        ) + 8 * len(Header._fields)  # + header
        self._build_step()

    def _build_step(self):
        """Make `self.step`: pull, compute, push, traced into one tf.function (one remote call).

        The parts below are Python functions the trace runs through, so they add no call of
        their own: `_pull` (`_take_token`, `_read_params`), `_compute`, and `_push`, which
        hands the pushed pieces to the mode's way of delivering them (`_push_apply` in async,
        `_push_enqueue` with one PS task, `_push_stage` with the parameters sharded).
        """
        import keras

        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        res = self.res
        header = (len(Header._fields),)
        # per PS task: shapes of what a push sends it (task 0: the Header first)
        self.push_shapes = [
            [header] * (t == 0) + [s for _, s in res.task_push_spec[t]]
            for t in range(len(res.devices))
        ]
        if self.cfg.mode == "async":  # apply on the PS here, not through the PS's loop
            self._deliver = self._push_apply
        else:
            self._deliver = self._push_stage if res.sharded else self._push_enqueue

        @tf.function
        def step(x, y, local_step, fetch: bool, push: bool, wait: bool):
            if fetch:
                token, reached, granted, arrived = self._pull(wait)
            else:
                token = tf.zeros([len(Token._fields)], tf.int64)
                arrived = granted = reached = _stamp()
            loss, computed, grads = self._compute(x, y, arrived)
            pushed = self._push(local_step, computed, grads) if push else computed
            stamps = tf.stack([reached, granted, arrived, computed, pushed])
            return loss, self.version_read.read_value(), token, stamps

        self.step = step

    # ------------------------------------------------ the step's parts (traced into `step`)
    def _pull(self, wait: bool):
        """Take the token (modes that wait) and the parameters into the model; return the token
        and the stamps reached, granted, arrived."""
        token, version, reached, granted = self._take_token(wait)
        version, token, reached, granted, values = self._read_params(
            version, token, reached, granted
        )
        for var, value in zip(self.model.trainable_variables, values):
            var.assign(value)
        self.version_read.assign(version)
        with tf.control_dependencies(values):
            arrived = _stamp()  # the token and the parameters are here
        return token, reached, granted, arrived

    def _take_token(self, wait: bool):
        """On PS task 0: take this worker's token if the mode waits (else zeros), then read the
        version; the token is taken in this call, so it costs no remote call of its own."""
        raw = tf.raw_ops
        with tf.device(self.ps_device):  # the zeros too: made here, they would cross twice
            token = tf.zeros([len(Token._fields)], tf.int64)
            reached = _ps_stamp()  # no inputs: runs as the call reaches the PS
            after, granted = [], reached
            if wait:
                token = raw.QueueDequeueV2(
                    handle=self.res.tokens[self.node.task], component_types=[tf.int64]
                )[0]
                after = [token]
                with tf.control_dependencies([token, reached]):
                    granted = _ps_stamp()  # on the PS: the token is taken
            # the version first: the parameters read after it hold at least its updates
            with tf.control_dependencies(after + [granted]):
                version = raw.ReadVariableOp(resource=self.res.version, dtype=tf.int64)
        return token, version, reached, granted

    def _read_params(self, version, token, reached, granted):
        """Each PS task sends its pieces, all tasks at once (task 0 adds the version, the token
        and its two stamps, in the same transfer); return those four and the whole variables
        as they arrived here."""
        raw, res = tf.raw_ops, self.res
        tasks, pieces = res.task_pieces(), res.pieces
        extra = [version, token, reached, granted]  # task 0's
        packed = []
        for t, idx in enumerate(tasks):
            with tf.device(res.devices[t]), tf.control_dependencies([version]):
                params = [raw.ReadVariableOp(resource=res.vars[i], dtype=tf.float32) for i in idx]
                packed.append(pack_by_dtype(params + extra * (t == 0)))
        parts = [None] * len(pieces)
        with tf.device(self.here):
            for t, idx in enumerate(tasks):
                shapes = [pieces[i].shape for i in idx]
                got = unpack(packed[t], shapes + [(), (len(Token._fields),), (), ()] * (t == 0))
                if t == 0:
                    got, extra = got[: len(idx)], got[len(idx) :]
                for i, value in zip(idx, got):
                    parts[i] = value
            values = wire.join(parts, pieces, lambda v: tf.concat(v, 0))
        return (*extra, values)

    def _compute(self, x, y, arrived):
        """The gradient of a local batch, added to the push's sum when pushes are n_push > 1
        steps apart (Downpour: the local copy trained too); return the loss, the stamp
        computed, and what a push in this step sends: the gradient, or the sum's mean."""
        variables, n_push = self.model.trainable_variables, self.cfg.n_push
        with tf.control_dependencies([arrived]), tf.GradientTape() as tape:  # stamps in order
            loss = self.loss_fn(y, self.model(x, training=True))
        grads = tape.gradient(loss, variables)
        done = list(grads)  # one step a push: the gradient itself, no sum to keep
        if self.acc:  # Downpour's sum
            done = [a.assign_add(g) for a, g in zip(self.acc, grads)]
        if self.cfg.n_fetch > 1:  # Downpour: keep training the local copy between fetches
            done += [var.assign_sub(self.cfg.lr * g) for var, g in zip(variables, grads)]
        with tf.control_dependencies(done):
            computed = _stamp()  # the gradient is computed (and added up) here
            sent = grads if n_push == 1 else [a.read_value() / n_push for a in self.acc]
        return loss, computed, sent

    def _push(self, local_step, computed, grads):
        """Send `grads`, each PS task its pieces, as the mode delivers it; zero the sum (if
        any); return the stamp pushed (the PS holds the push; async: has applied it)."""
        kind = tf.where(
            local_step < 0, tf.constant(WARMUP, tf.int64), tf.constant(GRAD, tf.int64)
        )  # step -1: the warm-up's push
        meta = tf.stack(
            Header(
                worker=tf.constant(self.node.task, tf.int64),
                step=local_step,
                version=self.version_read.read_value(),
                kind=kind,
            )
        )
        meta, arrived_at = self._send_pieces(meta, grads)
        sent = self._deliver(meta, arrived_at, local_step)
        with tf.control_dependencies([sent, computed]):
            pushed = _stamp()  # the PS holds the push (async: has applied it)
        for a in self.acc:  # after its read in _compute (the same variable: in program order)
            a.assign(tf.zeros_like(a))
        return pushed

    def _send_pieces(self, meta, grads):
        """Compress each PS task's pieces of `grads` apart, on this worker, and send them (task
        0: after the header); return the header and, per PS task, what arrived there."""
        res, tasks, residual = self.res, self.res.task_pieces(), self.residual
        grad_parts = wire.split(grads, res.pieces)
        with tf.device(self.here):
            packed = [
                pack_by_dtype(
                    [meta] * (t == 0)
                    + self.comp.compress(
                        [grad_parts[i] for i in idx],
                        [residual[i] for i in idx] if residual else None,
                    )
                )
                for t, idx in enumerate(tasks)
            ]
        arrived_at = []  # per PS task: what it received
        for t in range(len(tasks)):
            with tf.device(res.devices[t]):
                arrived_at.append(unpack(packed[t], self.push_shapes[t]))
        meta, arrived_at[0] = arrived_at[0][0], arrived_at[0][1:]
        return meta, arrived_at

    def _push_apply(self, meta, arrived_at, local_step):
        """async: each PS task decodes its own pieces; the update is applied on the PS."""
        res = self.res
        grads = [None] * len(res.pieces)
        for t, idx in enumerate(res.task_pieces()):
            with tf.device(res.devices[t]):
                decoded = self.comp.decode(arrived_at[t], [res.pieces[i].shape for i in idx])
            for i, g in zip(idx, decoded):
                grads[i] = g
        with tf.device(self.ps_device):
            return self._apply_on_ps(meta, grads)

    def _push_enqueue(self, meta, arrived_at, local_step):
        """One PS task: the header and the gradient go into the PS loop's queue together."""
        with tf.device(self.ps_device):
            return tf.raw_ops.QueueEnqueueV2(
                handle=self.res.grads, components=[meta] + arrived_at[0]
            )

    def _push_stage(self, meta, arrived_at, local_step):
        """Sharded: each task keeps its pieces under the push's key; the header goes to the PS
        loop's queue on task 0 once they are all staged."""
        raw, res = tf.raw_ops, self.res
        key = wire.push_key(tf.constant(self.node.task, tf.int64), local_step)
        staged = []
        for t, idx in enumerate(res.task_pieces()):
            if idx:
                with tf.device(res.devices[t]):
                    staged.append(
                        raw.MapStage(
                            key=key,
                            indices=list(range(len(arrived_at[t]))),
                            values=arrived_at[t],
                            shared_name=res.stage,
                            dtypes=res.stage_dtypes(t),
                        )
                    )
        with tf.device(self.ps_device), tf.control_dependencies(staged):
            return raw.QueueEnqueueV2(handle=res.grads, components=[meta])

    def _apply_on_ps(self, meta, grads):
        """async, inside the step function on the PS's device: take the next ticket, apply the
        gradient as that update with its learning rate, then report it applied. A warm-up
        ticket applies and reports nothing. Returns a tensor that exists once it is done."""
        raw, res, cfg = tf.raw_ops, self.res, self.cfg
        with tf.control_dependencies(grads):  # hold no ticket while the gradient is in flight
            t = Ticket(
                *raw.QueueDequeueV2(handle=res.tickets, component_types=[tf.int64, tf.float32])
            )

        def apply():
            with tf.device(self.ps_device):  # each piece's sum and write on its own PS task
                bumped = apply_update(
                    res.vars,
                    res.version,
                    [grads],
                    [1.0],
                    t.lr,
                    cfg.momentum,
                    res.velocity,
                    [res.devices[p.task] for p in res.pieces],
                )
                h = Header(*tf.unstack(meta))
                with tf.control_dependencies([bumped]):
                    reported = raw.QueueEnqueueV2(
                        handle=res.applied,
                        components=[
                            tf.stack(
                                Applied(
                                    ticket=t.ticket, worker=h.worker, step=h.step, version=h.version
                                )
                            )
                        ],
                    )
                with tf.control_dependencies([reported]):
                    return tf.identity(t.ticket)

        return tf.cond(t.ticket != WARMUP_TICKET, apply, lambda: tf.identity(t.ticket))

    # ------------------------------------------------ the Python loop around the step
    def _warm_up(self):
        """Run the step function before joining, so that no timed step pays to set it up.

        The first call of a function with a part on the PS also sets that part up there, on
        top of tracing, and costs many steps' time (a slow starter could miss a whole short
        run). So each worker runs the very variant it trains with, and pushes once: the modes
        that wait take the PS's first token ("parameters are ready") inside it and push a
        WARMUP message, which the PS skips; an async worker takes that token first and applies
        under a warm-up ticket, which applies nothing. Downpour's other variants (n_fetch,
        n_push > 1) are traced only.
        """
        b, cfg = self.cfg.batch_size, self.cfg
        x, y = self.x[:b], self.y[:b]
        wait = cfg.mode in protocol.WAITING_MODES
        if not wait:
            self._token()
        self.step(x, y, tf.constant(-1, tf.int64), True, True, wait)
        if self.residual is not None:  # the warm-up's compression error is not owed
            for r in self.residual:
                r.assign(tf.zeros_like(r))
        fetches = {True} if cfg.n_fetch == 1 else {True, False}
        pushes = {True} if cfg.n_push == 1 else {True, False}
        for fetch in fetches:
            for push in pushes:
                self.step.get_concrete_function(x, y, tf.constant(0, tf.int64), fetch, push, wait)

    def _token(self) -> Token:
        """Block until the PS grants this worker its next step."""
        raw = tf.raw_ops
        with tf.device(self.ps_device):
            tok = raw.QueueDequeueV2(
                handle=self.res.tokens[self.node.task], component_types=[tf.int64]
            )
        return Token(*(int(v) for v in tok[0].numpy()))

    def _delay(self, compute_s):
        spec = self.cfg.stragglers.get(str(self.node.task))
        delay = protocol.straggler_delay(spec, compute_s, self.rng)
        if delay:
            time.sleep(delay)  # the simulated slowdown itself, not a wait for a condition
        return delay

    def _batches(self):
        """Yield each step's batch (indices into the local data), a new permutation each pass."""
        return protocol.batches(self.rng, len(self.x), self.cfg.batch_size)

    def _step_once(self, step: int, idx, waited, wait_s: float, token) -> Token:
        """Run step `step` on the batch `idx` and log it; return the token it ran under."""
        cfg, waits_every_step = self.cfg, self.cfg.mode in protocol.WAITING_MODES
        fetch = self.downpour.fetch(step)
        push = self.downpour.accumulate()
        t = clock.now()  # wall clock, as the step's own stamps
        loss, version_read, tok, stamps = self.step(
            self.x[idx],
            self.y[idx],
            tf.constant(step, tf.int64),
            fetch,
            push,
            waits_every_step,
        )
        loss, version_read = float(loss), int(version_read)
        returned = clock.now()
        reached, granted, arrived, computed, pushed = (float(v) for v in stamps.numpy())
        compute_s = returned - t
        if waits_every_step:  # the call waited for its token, then computed
            token = Token(*(int(v) for v in tok.numpy()))
            wait_s = arrived - t
            compute_s -= wait_s
        delay = self._delay(compute_s)
        # wall-clock stamps of the step's phases (StepStamps): its timeline
        when = StepStamps(
            waited if waited is not None else t,
            t,
            reached,
            granted,
            arrived,
            computed,
            pushed,
            returned,
        )
        self.log.write(
            Kind.STEP,
            worker=self.node.task,
            step=step,
            version_read=version_read,
            fetched=fetch,
            pushed=push,
            loss=loss,
            compute_s=compute_s,
            wait_s=wait_s,
            delay_s=delay,
            bytes_pulled=self.bytes if fetch else 0,
            bytes_pushed=self.bytes_push if push else 0,
            gap=(step - token.slowest) if cfg.mode == "ssp" else None,
            stamps=list(when),
        )
        return token

    def run(self) -> dict:
        cfg = self.cfg
        batches = self._batches()
        step, token = 0, None
        waits_every_step = cfg.mode in protocol.WAITING_MODES
        fault = cfg.faults.get(str(self.node.task))
        ended = (tf.errors.OutOfRangeError, tf.errors.CancelledError, tf.errors.AbortedError)
        try:
            self._warm_up()  # after the PS's first token: it has initialised the parameters
            with tf.device(self.ps_device):
                tf.raw_ops.QueueEnqueueV2(
                    handle=self.res.join, components=[tf.constant(self.node.task, tf.int64)]
                )
            while True:
                if fault and step == fault["at"]:
                    self.log.write(Kind.FAULT, what=fault["kind"], step=step)
                    if fault["kind"] == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    else:  # SIGSTOP, guarded so that it still ends with the launcher
                        from helpers.system.processes import hang

                        hang(os.getpid())
                wait_s, waited = 0.0, None
                if step == 0 and not waits_every_step:  # async: once, then never again
                    waited = clock.now()
                    token = self._token()
                    wait_s = clock.now() - waited
                token = self._step_once(step, next(batches), waited, wait_s, token)
                step += 1
        except ended:
            with tf.device(self.ps_device):
                stopped = int(tf.raw_ops.ReadVariableOp(resource=self.res.stopped, dtype=tf.int64))
            if not stopped:
                raise
        with tf.device(self.ps_device):
            tf.raw_ops.QueueEnqueueV2(
                handle=self.res.done, components=[tf.constant(self.node.task, tf.int64)]
            )
        self.log.write(Kind.DONE, worker=self.node.task, steps=step)
        return {"steps": step}
