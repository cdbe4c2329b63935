"""The no-cluster baseline of notebook 05 and the benchmarks: the same model, data and SGD here."""

from __future__ import annotations

import time

import numpy as np


def one_process(
    model: str = "logreg",
    data: str = "mnist",
    steps: int = 200,
    batch_size: int = 64,
    lr: float = 0.1,
    train_size: int | None = 6000,
    test_size: int | None = 2000,
    seed: int = 0,
    compress=None,
) -> dict:
    """Train the same model on the same data with plain SGD in this process: the baseline.

    Args:
        compress: optional compressor from helpers.training.compression, applied to each gradient
            before the update, as a worker would before pushing it.
    Returns:
        {"losses": per-step training loss, "elapsed": seconds at each step,
         "test_accuracy": final accuracy, "steps_per_s": throughput,
         "bytes_per_push": payload of one (compressed) gradient push}.
    """
    import keras
    import tensorflow as tf

    from helpers.data import arrays
    from helpers.training import models

    x_tr, y_tr, x_te, y_te, classes = arrays.load_arrays(data, train_size, test_size, seed)
    net = models.build(model, x_tr.shape[1:], classes, seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    shapes = [tuple(v.shape) for v in net.trainable_variables]
    if compress is None:
        from helpers.training.compression import Float32

        compress = Float32()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
        grads = compress(tape.gradient(loss, net.trainable_variables))
        for var, g in zip(net.trainable_variables, grads):
            var.assign_sub(lr * g)
        return loss

    rng = np.random.default_rng([seed, 0])
    order, pos = rng.permutation(len(x_tr)), 0
    initial = [v.numpy() for v in net.trainable_variables]
    step(x_tr[:batch_size], y_tr[:batch_size])  # trace outside the clock, as the workers do
    for var, value in zip(net.trainable_variables, initial):
        var.assign(value)
    for r in getattr(compress, "residual", None) or []:  # the tracing step's error feedback
        r.assign(tf.zeros_like(r))
    losses, elapsed = [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        if pos + batch_size > len(x_tr):
            order, pos = rng.permutation(len(x_tr)), 0
        idx = order[pos : pos + batch_size]
        pos += batch_size
        losses.append(float(step(x_tr[idx], y_tr[idx])))
        elapsed.append(time.perf_counter() - t0)
    return {
        "losses": np.array(losses),
        "elapsed": np.array(elapsed),
        "test_accuracy": models.accuracy(net, x_te, y_te),
        "steps_per_s": steps / elapsed[-1],
        "bytes_per_push": compress.bytes_for(shapes),
    }
