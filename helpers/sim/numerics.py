"""Real gradients in the simulated order: what a simulated run would have learned.

    from helpers.sim.numerics import Numerics
    result = simulate(cfg, costs, numerics=Numerics(cfg, eval_every=100))
    result.test_accuracy, result.accuracy   # final; [(simulated s, version, accuracy), ...]

The simulator decides who pushes what when; this computes each push's gradient for real, in
one process, on the parameter version that worker read, on the batch that worker would have
drawn, and applies the updates in the simulated order with the simulated weights (backup's
fold) and the engine's own update (update.apply_update: SGD or momentum, the learning-rate
schedule of protocol.learning_rate). So a prediction has accuracy, not only throughput.

As the engine does it: the model and its first parameters are models.build(cfg.model, ...,
cfg.seed), as the PS builds them; worker w's data is its shard of the training subset
(arrays.load_arrays' rule: every `workers`-th example from its position); its batches come
from np.random.default_rng([cfg.seed, w]), a new permutation each pass (worker.py's
_batches). The engine also draws a straggler's random delays from that generator; here they
come from the simulator's, so a run with random straggler delays draws other batches.

Not simulated numerically (refused by name): Downpour (n_fetch, n_push > 1: the worker's local
steps) and compressed pushes.

Parameters are kept for the versions some worker may still push against: every version from
the oldest a live worker has read, pruned every `workers` updates.
"""

from __future__ import annotations

import functools

import numpy as np

from helpers.cluster import protocol


@functools.lru_cache(maxsize=2)
def _arrays(data, train_size, test_size, seed):
    """The run's training and test arrays, loaded once for every Numerics of the same data (a
    notebook simulating many runs would otherwise hold a copy of MNIST per run)."""
    from helpers.data import arrays

    loaded = arrays.load_arrays(data, train_size, test_size, seed)
    for a in loaded[:4]:
        a.setflags(write=False)  # shared between runs: nobody may change them
    return loaded


class Numerics:
    """Gradients and updates of one simulated run (pass to simulate(..., numerics=...))."""

    def __init__(self, cfg: protocol.RunConfig, eval_every: int = 0):
        """Args:
        cfg: the run's validated configuration (model, data, sizes, lr, momentum, seed).
        eval_every: score the test set every this many updates (0: at the end only).
        """
        if cfg.n_fetch != 1 or cfg.n_push != 1 or cfg.compress:
            raise ValueError(
                "numerics simulate plain pushes only: drop n_fetch, n_push and compress from "
                f"the configuration (got n_fetch={cfg.n_fetch}, n_push={cfg.n_push}, "
                f"compress={cfg.compress!r}), or simulate timing only (numerics=None)"
            )
        if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
            raise ValueError(f"eval_every must be an integer >= 0, got {eval_every!r}")
        import keras
        import tensorflow as tf

        from helpers.training import models

        self.cfg, self.eval_every = cfg, eval_every
        x, y, self.x_test, self.y_test, classes = _arrays(
            cfg.data, cfg.train_size, cfg.test_size, cfg.seed
        )
        n = cfg.workers
        self.data = {w: (x[i::n], y[i::n]) for i, w in enumerate(cfg.worker_ids)}
        self.batches = {w: self._batches(w) for w in cfg.worker_ids}
        self.drawn = {w: 0 for w in cfg.worker_ids}  # the worker's batches drawn so far
        self.model = models.build(cfg.model, x.shape[1:], classes, cfg.seed)
        variables = self.model.trainable_variables
        self.velocity = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.version_var = tf.Variable(0, dtype=tf.int64)
        self.params = {0: [v.numpy() for v in variables]}
        self.version = 0
        self.oldest = 0
        self.accuracy: list[tuple[float, int, float]] = []
        self.weight_sums: list[float] = []  # each update's total weight (1 + backup's fold)
        self.offset = 0.0  # simulated seconds before this attempt (a resumed run's)
        self.saved = (0, self.params[0], [v.numpy() for v in self.velocity])  # last checkpoint
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(reduce_retracing=True)
        def gradient(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, self.model(xb, training=True))
            return tape.gradient(loss, variables)

        self._gradient = gradient

    def _batches(self, w: int):
        rng = np.random.default_rng([self.cfg.seed, w])
        return protocol.batches(rng, len(self.data[w][0]), self.cfg.batch_size)

    def _batch(self, w: int, step: int):
        """Worker w's batch of its step `step` (the batches of steps whose push no update took
        are drawn and passed over, as the worker drew them)."""
        while True:
            idx = next(self.batches[w])
            self.drawn[w] += 1
            if self.drawn[w] > step:
                return idx

    def _load(self, version: int) -> None:
        for var, value in zip(self.model.trainable_variables, self.params[version]):
            var.assign(value)

    def update(self, pushes: list, weights: list[float], now: float) -> None:
        """Apply one update made of `pushes` (protocol.Push: worker, step, version read) with
        `weights`, at simulated time `now`: each push's gradient on the version it read."""
        from helpers.cluster.update import apply_update

        grads = []
        for version in sorted({p.version for p in pushes}):
            self._load(version)
            for p in pushes:
                if p.version == version:
                    idx = self._batch(p.worker, p.step)
                    x, y = self.data[p.worker]
                    grads.append((p, self._gradient(x[idx], y[idx])))
        order = {id(p): i for i, p in enumerate(pushes)}
        grads.sort(key=lambda pg: order[id(pg[0])])
        cfg = self.cfg
        self._load(self.version)
        variables = self.model.trainable_variables
        apply_update(
            [v.handle for v in variables],
            self.version_var.handle,
            [g for _, g in grads],
            list(weights),
            protocol.learning_rate(cfg.lr, cfg.lr_schedule, self.version),
            cfg.momentum,
            [v.handle for v in self.velocity],
        )
        self.version += 1
        self.weight_sums.append(float(sum(weights)))
        self.params[self.version] = [v.numpy() for v in variables]
        if self.eval_every and self.version % self.eval_every == 0:
            self.accuracy.append((now + self.offset, self.version, self.test_accuracy()))

    def checkpoint(self) -> None:
        """Keep the current parameters and momentum, as a checkpoint of PS task 0 does."""
        self.saved = (self.version, self.params[self.version], [v.numpy() for v in self.velocity])

    def restore(self) -> None:
        """Back to the last checkpoint, as a resumed run starts: its parameters and momentum,
        and every worker's batches drawn anew (new worker processes)."""
        self.version, params, velocity = self.saved
        self.params, self.oldest = {self.version: params}, self.version
        for var, value in zip(self.velocity, velocity):
            var.assign(value)
        self.batches = {w: self._batches(w) for w in self.cfg.worker_ids}
        self.drawn = {w: 0 for w in self.cfg.worker_ids}

    def prune(self, oldest_read: int) -> None:
        """Forget the versions older than any a live worker has read."""
        for v in range(self.oldest, min(oldest_read, self.version)):
            self.params.pop(v, None)
        self.oldest = max(self.oldest, min(oldest_read, self.version))

    def test_accuracy(self) -> float:
        """Test accuracy of the current parameters."""
        from helpers.training import models

        self._load(self.version)
        return models.accuracy(self.model, self.x_test, self.y_test)
