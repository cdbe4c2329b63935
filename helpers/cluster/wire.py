"""The wire protocol of the cluster: what lives on the PS, and what each message holds.

Every run declares its shared resources on the parameter server with raw ops and a
`shared_name` prefixed by the run id, so every process that declares the same name gets a
handle to the same variable or queue (tf.Variable would give each process its own).

    resource       type                       message                      who puts / takes
    vars[i]        float32 variable           the i-th piece of the        PS writes, workers read
                   (on its piece's PS task)   model's weights (`plan`)     (async: workers write)
    velocity[i]    float32 variable           momentum of vars[i]          whoever applies
    stage          keyed buffer (MapStage),   a push's gradient pieces     workers / PS task 0
                   one per PS task (P > 1)    on that task, by push key
    version        int64 variable             updates applied so far       whoever applies
    stopped        int64 variable             1 once the run has ended     PS
    grads          FIFO queue                 Header + compressed grads    workers (and the PS's
                                                                           death watcher) / PS
    tokens[w]      FIFO queue, one per worker Token: "take one step"       PS / worker w
    join, done     FIFO queues                a worker id                  workers / PS
    ckpt           FIFO queue                 a checkpoint version, -1 end PS / evaluator
    tickets        FIFO queue (async)         Ticket: "apply as update t"  PS / workers
    applied        FIFO queue (async)         Applied: what a worker did   workers / PS

With one PS task (P = 1) every resource is on it and a push carries its gradient in `grads`.
With P > 1 (sharding) the parameters are split into pieces over the P tasks (`plan`); the
queues stay on task 0, which runs the protocol. A push stages each task's gradient pieces on
that task (`stage`, keyed by `push_key`), and only its Header goes to task 0's `grads` queue:
gradient bytes go to the task that holds the parameters, and the decisions stay in one place.

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


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) along axis 0 of variable `var`, held by PS task `task`."""

    var: int
    start: int
    stop: int
    task: int
    shape: tuple


def plan(shapes, tasks: int) -> list[Piece]:
    """Split the variables into pieces and place them on `tasks` PS tasks, balanced by size.

    How many pieces a variable becomes is TensorFlow's own rule for sharded variables
    (`MinSizePartitioner`, pieces of at least a quarter of a task's fair share, at most one
    per task); the rows are split as TF splits them (the first pieces one row longer). The
    pieces are then placed largest first, each on the task holding the fewest entries so far
    (ties: the lower task). With one task every variable is one piece on task 0.
    """
    import math

    if tasks == 1:
        return [Piece(i, 0, s[0] if s else 1, 0, tuple(s)) for i, s in enumerate(shapes)]
    import tensorflow as tf

    total = sum(4 * math.prod(s) for s in shapes)
    part = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=max(256, total // (4 * tasks)), max_shards=tasks
    )
    pieces = []
    for i, s in enumerate(shapes):
        n = part(tf.TensorShape(s), tf.float32)[0] if len(s) else 1
        q, r = divmod(s[0], n) if len(s) else (1, 0)
        start = 0
        for k in range(n):
            rows = q + (k < r)
            shape = tuple(s) if n == 1 else (rows,) + tuple(s[1:])
            pieces.append((i, start, start + rows, shape))
            start += rows
    load = [0] * tasks
    placed = {}
    for i, a, b, shape in sorted(pieces, key=lambda p: -math.prod(p[3])):
        task = load.index(min(load))
        load[task] += math.prod(shape)
        placed[(i, a)] = Piece(i, a, b, task, shape)
    return [placed[(i, a)] for i, a, _, _ in pieces]


def split(tensors, pieces: list[Piece]):
    """The pieces of these whole tensors (TF ops or NumPy arrays), in plan order."""
    counts = {}
    for p in pieces:
        counts[p.var] = counts.get(p.var, 0) + 1
    return [
        tensors[p.var] if counts[p.var] == 1 else tensors[p.var][p.start : p.stop] for p in pieces
    ]


def join(parts, pieces: list[Piece], concat):
    """The whole variables from their pieces (plan order); `concat` joins a list on axis 0."""
    by_var: dict = {}
    for p, t in zip(pieces, parts):
        by_var.setdefault(p.var, []).append(t)
    return [v[0] if len(v) == 1 else concat(v) for _, v in sorted(by_var.items())]


def by_task(pieces: list[Piece], tasks: int) -> list[list[int]]:
    """For each PS task, the indices (in plan order) of the pieces it holds."""
    return [[i for i, p in enumerate(pieces) if p.task == t] for t in range(tasks)]


def push_key(worker, step):
    """The key of a push's pieces in the `stage` buffers (step -1, the warm-up's, included)."""
    return worker * 2**32 + step + 1


@dataclass
class Resources:
    """Handles of one run's shared resources (on the PS tasks), as every process declares them."""

    pieces: list  # Piece of each of `vars`
    devices: list  # the PS tasks' devices; queues and counters are on devices[0]
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
    push_spec: list  # (dtype, shape) of each tensor a push carries after the Header (P = 1)
    task_push_spec: list  # per PS task: (dtype, shape) of the wire tensors of its pieces
    stage: str  # shared_name of the `stage` buffers (P > 1)

    @property
    def sharded(self) -> bool:
        return len(self.devices) > 1

    def task_pieces(self) -> list[list[int]]:
        return by_task(self.pieces, len(self.devices))

    def stage_dtypes(self, task: int) -> list:
        """The TF dtypes of a push's wire tensors in PS task `task`'s stage buffer."""
        import tensorflow as tf

        return [tf.as_dtype(d) for d, _ in self.task_push_spec[task]]


def declare(tf, ps_devices: list[str], cfg, shapes) -> Resources:
    """Declare (or find) the run's shared resources on the PS tasks; same call in every process."""
    from helpers.training import compression

    raw = tf.raw_ops
    prefix = f"{cfg.run_id}/"
    pieces = plan(shapes, len(ps_devices))
    comp = compression.from_spec(cfg.compress)
    # a push carries the compressor's wire tensors (e.g. top-k values + indices), so only
    # those cross the network; every node declares the queue with the same spec
    task_push_spec = [
        comp.wire_spec([pieces[i].shape for i in idx]) for idx in by_task(pieces, len(ps_devices))
    ]
    push_spec = task_push_spec[0] if len(ps_devices) == 1 else []
    one = len(ps_devices) == 1

    def var(kind, i, p):  # one piece of a variable, on its task; P = 1: the whole variable
        name = f"{prefix}{kind}{p.var}" if one else f"{prefix}{kind}{p.var}r{p.start}"
        with tf.device(ps_devices[p.task]):
            return raw.VarHandleOp(dtype=tf.float32, shape=p.shape, shared_name=name)

    def ids(name, capacity):  # a queue of int64 scalars (worker ids, versions)
        return raw.FIFOQueueV2(
            component_types=[tf.int64], shapes=[[]], capacity=capacity, shared_name=prefix + name
        )

    vars_ = [var("w", i, p) for i, p in enumerate(pieces)]
    velocity = [var("v", i, p) for i, p in enumerate(pieces)]
    with tf.device(ps_devices[0]):
        return Resources(
            pieces=pieces,
            devices=list(ps_devices),
            vars=vars_,
            velocity=velocity,
            version=raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "version"),
            stopped=raw.VarHandleOp(dtype=tf.int64, shape=[], shared_name=prefix + "stopped"),
            grads=raw.FIFOQueueV2(
                component_types=[tf.int64] + [tf.as_dtype(d) for d, _ in push_spec],
                shapes=[[len(Header._fields)]] + [list(s) for _, s in push_spec],
                capacity=max(4, 2 * cfg.workers),
                shared_name=prefix + "grads",
            ),
            tokens=[
                raw.FIFOQueueV2(
                    component_types=[tf.int64],
                    shapes=[[len(Token._fields)]],
                    capacity=100_000,
                    shared_name=f"{prefix}tokens{w}",
                )
                for w in range(max(cfg.worker_ids) + 1)
            ],
            join=ids("join", 1000),
            done=ids("done", 1000),
            ckpt=ids("ckpt", 100_000),
            tickets=raw.FIFOQueueV2(
                component_types=[tf.int64, tf.float32],
                shapes=[[], []],
                capacity=-1,
                shared_name=prefix + "tickets",
            ),
            applied=raw.FIFOQueueV2(
                component_types=[tf.int64],
                shapes=[[len(Applied._fields)]],
                capacity=-1,
                shared_name=prefix + "applied",
            ),
            push_spec=push_spec,
            task_push_spec=task_push_spec,
            stage=prefix + "stage",
        )


# integers and float64 (the steps' time stamps) cross the wire as float32 words (a lossless
# bitcast), so that a message of floats, integers and stamps is one transfer; other dtypes
# (float16) keep a flat tensor of their own
WORDS = {"int64": 2, "float64": 2, "int32": 1, "float32": 1}


def _words(t):
    """t as a flat float32 tensor of its bits when its dtype is in WORDS, else flat as it is."""
    import tensorflow as tf

    if t.dtype.name in ("int64", "float64", "int32"):
        t = tf.bitcast(t, tf.float32)
    return tf.reshape(t, [-1])


def pack_by_dtype(tensors):
    """[(positions, dtypes, flat tensor)] per wire dtype, in order of first appearance.

    Every tensor crossing between devices is an RPC of its own, so a pull or a push sends one
    flat tensor per wire dtype (LeNet's parameters and version: 1 transfer instead of 8 + 1)
    and unpacks it on arrival. float32, int32, int64 and float64 share one float32 tensor.
    """
    import tensorflow as tf

    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault("float32" if t.dtype.name in WORDS else t.dtype.name, []).append(i)
    return [
        (idx, [tensors[i].dtype for i in idx], tf.concat([_words(tensors[i]) for i in idx], 0))
        for idx in groups.values()
    ]


def unpack(packed, shapes):
    """Inverse of pack_by_dtype: the tensors of these shapes, in their original order."""
    import tensorflow as tf

    out = [None] * len(shapes)
    for idx, dtypes, flat in packed:
        sizes = [int(np.prod(shapes[i])) * WORDS.get(d.name, 1) for i, d in zip(idx, dtypes)]
        for i, d, part in zip(idx, dtypes, tf.split(flat, sizes)):
            if d.name in ("int64", "float64"):
                part = tf.bitcast(tf.reshape(part, [-1, 2]), d)
            elif d.name == "int32":
                part = tf.bitcast(part, tf.int32)
            out[i] = tf.reshape(part, shapes[i])
    return out
