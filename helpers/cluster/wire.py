"""The wire protocol of the cluster: what lives on the PS, and what each message holds.

Every run declares its shared resources on the parameter server with raw ops and a
`shared_name` prefixed by the run id, so every process that declares the same name gets a
handle to the same variable or queue (tf.Variable would give each process its own).

    resource       type                       message                      who puts / takes
    vars[i]        float32 variable           the model's i-th weights     PS writes, workers read
                                                                           (async: workers write)
    velocity[i]    float32 variable           momentum of vars[i]          whoever applies
    version        int64 variable             updates applied so far       whoever applies
    stopped        int64 variable             1 once the run has ended     PS
    grads          FIFO queue                 Header + compressed grads    workers (and the PS's
                                                                           death watcher) / PS
    tokens[w]      FIFO queue, one per worker Token: "take one step"       PS / worker w
    join, done     FIFO queues                a worker id                  workers / PS
    ckpt           FIFO queue                 a checkpoint version, -1 end PS / evaluator
    tickets        FIFO queue (async)         Ticket: "apply as update t"  PS / workers
    applied        FIFO queue (async)         Applied: what a worker did   workers / PS

The rules that decide when the PS applies a push or grants a token are in protocol.py;
the processes that move these messages are ps.py, worker.py and evaluator.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# kinds of message in the `grads` queue
GRAD = 0  # a worker's (accumulated, compressed) gradient
WARMUP = 1  # a worker's warm-up step before it joins (sync, SSP, backup): the PS skips it
DEAD = 2  # sent by the PS's own watcher thread: this worker's process is gone


class Header(NamedTuple):
    """The int64[4] that leads every message in the `grads` queue."""

    worker: int
    step: int  # the worker's step counter when it pushed (-1 for DEAD)
    version: int  # the parameter version the gradient was computed on (-1 for DEAD)
    kind: int  # GRAD, WARMUP or DEAD


class Token(NamedTuple):
    """The int64[2] in `tokens[w]`: permission for worker w to take its next step."""

    clock: int  # SSP: the step it may take; other modes: the parameter version at issue
    slowest: int  # SSP: the slowest live worker's clock (the worker logs its gap); else 0


class Ticket(NamedTuple):
    """One element of `tickets` (async): the right to apply one update, and its learning rate."""

    ticket: int  # the update's number: the version the parameters had before it (0-based),
    #              or WARMUP_TICKET: a warm-up step's, which applies and reports nothing
    lr: float  # the learning rate the schedule gives that version


WARMUP_TICKET = -1


class Applied(NamedTuple):
    """The int64[4] a worker puts in `applied` (async) once it has applied its gradient."""

    ticket: int
    worker: int
    step: int
    version: int  # the parameter version the gradient was computed on


@dataclass
class Resources:
    """Handles of one run's shared resources (all on the PS), as every process declares them."""

    vars: list
    velocity: list
    version: object
    stopped: object
    grads: object
    tokens: list
    join: object
    done: object
    ckpt: object
    tickets: object
    applied: object
    wire: list  # (dtype, shape) of each tensor a push carries after the Header


def declare(tf, ps_device: str, cfg, shapes) -> Resources:
    """Declare (or find) the run's shared resources on the PS; same call in every process."""
    from helpers.training import compression

    raw = tf.raw_ops
    prefix = f"{cfg.run_id}/"
    # a push carries the compressor's wire tensors (e.g. top-k values + indices), so only
    # those cross the network; every node declares the queue with the same spec
    wire = compression.from_spec(cfg.compress).wire_spec(shapes)

    def ids(name, capacity):  # a queue of int64 scalars (worker ids, versions)
        return raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[]], capacity=capacity,
                               shared_name=prefix + name)

    with tf.device(ps_device):
        return Resources(
            vars=[raw.VarHandleOp(dtype=tf.float32, shape=s, shared_name=f"{prefix}w{i}")
                  for i, s in enumerate(shapes)],
            velocity=[raw.VarHandleOp(dtype=tf.float32, shape=s, shared_name=f"{prefix}v{i}")
                      for i, s in enumerate(shapes)],
            version=raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "version"),
            stopped=raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "stopped"),
            grads=raw.FIFOQueueV2(component_types=[tf.int64] + [tf.as_dtype(d) for d, _ in wire],
                                  shapes=[[len(Header._fields)]] + [list(s) for _, s in wire],
                                  capacity=max(4, 2 * cfg.workers), shared_name=prefix + "grads"),
            tokens=[raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[len(Token._fields)]],
                                    capacity=100_000, shared_name=f"{prefix}tokens{w}")
                    for w in range(max(cfg.worker_ids) + 1)],
            join=ids("join", 1000),
            done=ids("done", 1000),
            ckpt=ids("ckpt", 100_000),
            tickets=raw.FIFOQueueV2(component_types=[tf.int64, tf.float32], shapes=[[], []],
                                    capacity=-1, shared_name=prefix + "tickets"),
            applied=raw.FIFOQueueV2(component_types=[tf.int64], shapes=[[len(Applied._fields)]],
                                    capacity=-1, shared_name=prefix + "applied"),
            wire=wire,
        )


# integers cross the wire as float32 words (a lossless bitcast), so that a message of floats and
# integers is one transfer; other dtypes (float16) keep a flat tensor of their own
WORDS = {"int64": 2, "int32": 1, "float32": 1}


def _words(t):
    """t as a flat float32 tensor of its bits when its dtype is in WORDS, else flat as it is."""
    import tensorflow as tf

    if t.dtype.name in ("int64", "int32"):
        t = tf.bitcast(t, tf.float32)
    return tf.reshape(t, [-1])


def pack_by_dtype(tensors):
    """[(positions, dtypes, flat tensor)] per wire dtype, in order of first appearance.

    Every tensor crossing between devices is an RPC of its own, so a pull or a push sends one
    flat tensor per wire dtype (LeNet's parameters and version: 1 transfer instead of 8 + 1)
    and unpacks it on arrival. float32, int32 and int64 share one float32 tensor.
    """
    import tensorflow as tf

    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault("float32" if t.dtype.name in WORDS else t.dtype.name, []).append(i)
    return [(idx, [tensors[i].dtype for i in idx], tf.concat([_words(tensors[i]) for i in idx], 0))
            for idx in groups.values()]


def unpack(packed, shapes):
    """Inverse of pack_by_dtype: the tensors of these shapes, in their original order."""
    import tensorflow as tf

    out = [None] * len(shapes)
    for idx, dtypes, flat in packed:
        sizes = [int(np.prod(shapes[i])) * WORDS.get(d.name, 1) for i, d in zip(idx, dtypes)]
        for i, d, part in zip(idx, dtypes, tf.split(flat, sizes)):
            if d.name == "int64":
                part = tf.bitcast(tf.reshape(part, [-1, 2]), tf.int64)
            elif d.name == "int32":
                part = tf.bitcast(part, tf.int32)
            out[i] = tf.reshape(part, shapes[i])
    return out
