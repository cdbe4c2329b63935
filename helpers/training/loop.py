"""A small custom training loop: any index plan per epoch, per-step losses, divergence stop."""

from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf

from helpers.training.batches import batch_size_at, epoch_batches
from helpers.training.models import accuracy, predictions


def train_loop(
    model,
    optimizer,
    loss_fn,
    train_data,
    eval_data,
    epochs: int,
    batch_size=100,
    overlap: float = 0.0,
    seed: int = 0,
) -> dict:
    """Train with minibatches from epoch_batches; stop early if the loss is not finite.

    Args:
        model: a Keras model mapping inputs to logits.
        optimizer: a Keras 3 optimizer (fresh: it builds its slots on first use).
        loss_fn: loss(labels, logits) -> scalar (see helpers.training.losses.make_loss).
        train_data, eval_data: (x, y) NumPy arrays with integer labels; eval_data is the
            held-out set scored after every epoch (a dev set while choosing settings).
        epochs: passes over the training data.
        batch_size: an int, or a growing schedule accepted by batch_size_at.
        overlap: fraction shared by consecutive batches (0 = disjoint).
        seed: shuffling seed (epoch e uses seed + e).

    Returns:
        dict with step_loss (every step), epoch_loss, train_acc, eval_acc (per epoch),
        epoch_seconds (each epoch's training steps, without the scoring), batch_sizes, steps,
        seconds (all of it), diverged, and eval_pred: the predicted label of every eval example
        after the last epoch (for paired comparisons of two runs on the same examples).
    """
    x, y = (tf.constant(a) for a in train_data)

    @tf.function(reduce_retracing=True)
    def step(
        x, y, idx
    ):  # data passed in, not captured: a captured tensor lives as long as the graph
        xb, yb = tf.gather(x, idx), tf.gather(y, idx)
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    keys = ("step_loss", "epoch_loss", "train_acc", "eval_acc", "epoch_seconds", "batch_sizes")
    hist = {k: [] for k in keys}
    diverged, t0, pred = False, time.perf_counter(), None
    for epoch in range(epochs):
        size = batch_size_at(batch_size, epoch)
        t_epoch = time.perf_counter()
        losses = [
            step(x, y, tf.constant(b, tf.int32))
            for b in epoch_batches(len(train_data[0]), size, overlap, seed + epoch)
        ]
        losses = [float(v) for v in losses]  # waits for the last step
        hist["epoch_seconds"].append(time.perf_counter() - t_epoch)
        hist["step_loss"] += losses
        hist["batch_sizes"].append(size)
        hist["epoch_loss"].append(float(np.mean(losses)))
        if not all(math.isfinite(v) for v in losses) or abs(hist["epoch_loss"][-1]) > 1e6:
            diverged = True
            break
        hist["train_acc"].append(accuracy(model, *train_data, batch=2000))
        pred = predictions(model, eval_data[0], batch=2000)  # one pass: the score and, last,
        hist["eval_acc"].append(float(np.mean(pred == np.asarray(eval_data[1]))))  # eval_pred
    hist.update(steps=len(hist["step_loss"]), seconds=time.perf_counter() - t0, diverged=diverged)
    if pred is None:  # no epoch ran
        pred = predictions(model, eval_data[0], batch=2000)
    hist["eval_pred"] = [] if diverged else pred.tolist()
    return hist
